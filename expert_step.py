"""What one iteration's expert likelihood term alone does to a drift margin: an attribution check.

A dream run's update is loss = (1 - share) * L_rl + share * L_nll (dream.dream_update): the RL loss on
the dreams plus the negative log-likelihood of the iteration's real expert turns. When a margin
(reply_margin.py) falls in one iteration, this replays only the second part: from the checkpoint
before iteration N, with its optimizer state, one update on iteration N's expert draw (dream.dream_batch,
the run's own flags, seed and real ratio) and no dreams; then the margin again. A fall as large as the
run's own says the expert term did it; --drop-task / --only-task say which task's demonstrations.

    python expert_step.py runs/dream-d8 --iteration 4 --trajectories runs/bc/final/eval/trajectories.jsonl \\
        --task choose-list --click Submit [--drop-task choose-list] [--expert-loss kl]

Runs before --expert-draw existed drew their experts at random; their args.json has no expert_draw,
and this replays that draw (--expert-draw overrides).
"""
from __future__ import annotations

import argparse
import json
import os
from collections import Counter

import torch

import checkpoint
import dream
import policy
import reply_margin
import supervised
import train
import update


def run_args(run: str, expert_draw: str | None = None):
    """The parsed flags of the dream run in directory `run` (its first start's argv, args-history.jsonl),
    with --expert-draw as the run had it ("random" when its args.json predates the flag) unless given.
    Errors: FileNotFoundError when `run` has no args-history.jsonl; ValueError when it is not a dream run."""
    path = os.path.join(run, "args-history.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: pass a train.py --out directory")
    with open(path) as f:
        args = train.parse_args(json.loads(f.readline())["argv"])
    if args.mode != "dream":
        raise ValueError(f"{run} is a --mode {args.mode} run; the expert term replayed here is dream mode's")
    with open(os.path.join(run, "args.json")) as f:
        args.expert_draw = expert_draw or json.load(f).get("expert_draw", "random")
    return args


def expert_step(model, opt, tok, args, iteration: int, *, drop_task: str | None = None,
                only_task: str | None = None, ref=None) -> tuple[dict, list[str]]:
    """One optimizer update of `model` (with `opt`) on iteration `iteration`'s (1-based) expert draw
    alone, weighted as dream.dream_update weights it (nll_coef = the experts' share of the batch); no
    dreams, no KL on dreams. With --expert-loss kl the term is KL(ref || policy) along the experts'
    replies (`ref`: the run's start). drop_task / only_task filter the draw by task (the share stays
    the run's). Returns (update.policy_update's metrics, the draw's tasks before filtering).
    Errors: ValueError when the run mixes no expert trajectories (--real-ratio 0 or --expert-loss gspo)
    or --expert-loss kl comes without `ref`."""
    if args.real_ratio <= 0 or args.expert_loss == "gspo":
        raise ValueError("the run has no expert likelihood term (--real-ratio 0 or --expert-loss gspo)")
    if args.expert_loss == "kl" and ref is None:
        raise ValueError("--expert-loss kl needs the reference model (ref)")
    demos = supervised.expert_trajectories(args.demos, args.tasks)
    jobs, real = dream.dream_batch(args, iteration - 1, 0, 1, demos)
    share = len(real) / max(1, len(real) + len(jobs))
    drawn = [t["task"] for t in real]
    kept = [t for t in real if (drop_task is None or t["task"] != drop_task) and (only_task is None or t["task"] == only_task)]
    nll = [s for t in kept for s in supervised.expert_turns(t, tok, args)]
    cfg = train.update_config(args)
    cfg.kl_coef = 0.0
    stats = update.policy_update(model, opt, tok, [], cfg, torch.device("cpu"), 1, nll=nll, nll_coef=share,
                                 rl_scale=1.0 - share, seed=args.seed * 1_000_003 + iteration - 1,
                                 nll_ref=ref if args.expert_loss == "kl" else None)
    return stats, drawn


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a dream run's --out directory (with step-N checkpoints: --save-every 1)")
    ap.add_argument("--iteration", type=int, required=True, help="replay this iteration's (1-based) expert term")
    ap.add_argument("--ckpt", help="start from this checkpoint (default RUN/step-(N-1), or --init for N = 1)")
    ap.add_argument("--trajectories", required=True, help="an eval's trajectories.jsonl (reply_margin.py)")
    ap.add_argument("--task", required=True)
    ap.add_argument("--click", required=True)
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--drop-task", help="leave this task's expert trajectories out of the draw")
    ap.add_argument("--only-task", help="keep only this task's expert trajectories")
    ap.add_argument("--expert-draw", choices=["stratified", "random"], help="override the run's draw")
    ap.add_argument("--expert-loss", choices=["nll", "kl"], help="override the run's expert term")
    a = ap.parse_args(argv)
    args = run_args(a.run, a.expert_draw)
    args.expert_loss = a.expert_loss or args.expert_loss
    ref = None
    if args.expert_loss == "kl":
        ref, _ = policy.load_model(args.init or args.model)
        ref.eval().requires_grad_(False)
    ck = a.ckpt or (os.path.join(a.run, f"step-{a.iteration - 1:06d}") if a.iteration > 1 else args.init)
    model, tok = policy.load_model(ck)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr,
                            weight_decay=args.weight_decay)
    if os.path.exists(os.path.join(ck, "trainer_state.pt")):
        checkpoint.restore_state(ck, opt, 0, model)
    cases = reply_margin.cases_from(a.trajectories, a.task, a.click, limit=a.limit)
    before = reply_margin.margins(model.eval(), tok, cases)
    stats, drawn = expert_step(model, opt, tok, args, a.iteration, drop_task=a.drop_task, only_task=a.only_task,
                               ref=ref)
    after = reply_margin.margins(model.eval(), tok, cases)
    mean = lambda m: sum(m) / len(m)
    print(json.dumps({"ckpt": ck, "iteration": a.iteration, "expert_draw": args.expert_draw, "expert_loss": args.expert_loss,
                      "drawn": dict(Counter(drawn)), "drop_task": a.drop_task, "only_task": a.only_task,
                      "margin_before": round(mean(before), 3), "margin_after": round(mean(after), 3),
                      "nll": round(stats.get("loss/nll", 0.0), 4), "grad_norm": round(stats["loss/grad_norm"], 3)}))


if __name__ == "__main__":
    main()
