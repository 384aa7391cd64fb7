"""Supervised training: behaviour cloning on expert trajectories (--mode bc), the Δ world model on
real transitions (--mode wm) and the trajectory judge on real outcomes (--mode judge). One loop:
-log p(target | prompt), averaged over target tokens.

    python train.py --mode bc --demos runs/demos.jsonl --out runs/bc [--think]
    python train.py --mode wm --transitions runs/transitions.jsonl --out runs/wm
    python train.py --mode judge --transitions runs/transitions.jsonl --judge-trajectories runs/demos.jsonl --out runs/judge

BC (WebAgent-R1 Sec. 3.1): every turn of every successful expert trajectory is a sample, its
prompt built exactly as at rollout time (compress.py: compression, budget, system prompt), its
target the expert's reply, with --think a short grounded thought before the action
(experts.thought). WM (DynaWeb Sec. 3, Eq. 2): world_model.wm_samples, target the Δ. Judge
(DynaWeb's r(τ̂, q)): judge.judge_samples, target `yes` or `no`.

Each optimizer step takes a batch of --batch-size samples from a per-epoch permutation (the same on
every rank; each rank takes every world-th one), micro-batches sorted by length (less padding, the
same gradient). The loss is the token mean over the batch's target tokens on every rank together
(a global count, distributed.all_sums), and the ranks' gradients are summed.
"""
from __future__ import annotations

import os
import time
import warnings

import numpy as np
import torch
from tqdm import tqdm

import checkpoint
import compress
import distributed
import experts
import policy
import runlog
import update
from runlog import read_jsonl


def expert_trajectories(path: str, tasks: list[str]) -> list[dict]:
    """The successful expert trajectories of `tasks` in a demos file (experts.py).
    Errors: FileNotFoundError naming the command that writes it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"--demos {path} not found: write it with `python experts.py --out {path}`")
    return [t for t in read_jsonl(path) if t.get("success") and t["task"] in tasks]


def expert_deal(demos: list[dict], n: int, it: int, seed: int) -> list[dict]:
    """The `n` expert trajectories dealt to iteration `it` (0-based): positions [it * n, (it + 1) * n)
    of an endless deal over `demos` in passes. Each pass holds every demo once: each task's demos
    shuffled, then dealt in rounds (round r: the r-th demo of every task that has one, tasks in a
    shuffled order), all seeded by (seed, pass), so every rank and a resumed run deal the same.
    An iteration thus holds about n / (number of tasks) demos of each task and, while n <= len(demos),
    no demo twice. Why not independent random draws: a draw of 19 from 300 can hold four of the three
    choose-list demos whose target is already selected (the expert clicks Submit at once; one drawn
    twice), and one such batch's likelihood term alone turned the policy's first choose-list reply
    into a click on Submit (docs/dreams.md, d9). Returns [] when `demos` is empty or n <= 0."""
    if not demos or n <= 0:
        return []
    by_task: dict[str, list[int]] = {}
    for i, d in enumerate(demos):
        by_task.setdefault(d["task"], []).append(i)
    passes: dict[int, list[int]] = {}

    def order(p: int) -> list[int]:
        if p not in passes:
            rng = np.random.default_rng([seed % 2**32, p])
            lists = {t: [ix[j] for j in rng.permutation(len(ix))] for t, ix in sorted(by_task.items())}
            out = []
            for r in range(max(len(ix) for ix in lists.values())):
                for t in rng.permutation(sorted(lists)):
                    if r < len(lists[t]):
                        out.append(lists[t][r])
            passes[p] = out
        return passes[p]

    return [demos[order(pos // len(demos))[pos % len(demos)]] for pos in range(it * n, (it + 1) * n)]


def expert_turns(traj: dict, tokenizer, args) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reply ids + end-of-turn) for each turn of one expert trajectory, prompts built
    with args.prompt (compress.PromptSettings); with args.prompt.think a grounded thought comes
    before each action."""
    history, out = [], []
    for turn in traj["turns"]:
        prompt = args.prompt.build(tokenizer, history, turn["observation"])
        response = turn.get("response") or turn["action"]
        if args.prompt.think and not turn.get("response"):  # the thinking format: a short grounded thought first
            response = experts.thought_reply(turn["observation"], turn["action"])
        out.append((prompt, compress.encode_reply(tokenizer, response)))
        history.append({"observation": turn["observation"], "response": response})
    return out


def bc_samples(path: str, tokenizer, args) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, action ids + end-of-turn) for every turn of every successful expert trajectory of
    args.tasks. Errors: ValueError when there is none."""
    samples = [s for traj in expert_trajectories(path, args.tasks) for s in expert_turns(traj, tokenizer, args)]
    if not samples:
        raise ValueError(f"{path} holds no successful expert trajectory for tasks {args.tasks}")
    return samples


def wm_samples(path: str, tokenizer, args) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, Δ ids + end-of-turn) for every recorded real transition of args.tasks (world_model.py).
    Errors: FileNotFoundError naming the command that writes the file; ValueError when none is usable."""
    import world_model

    if not os.path.exists(path):
        raise FileNotFoundError(f"--transitions {path} not found: write it with `python world_model.py --collect`")
    trs = [t for t in read_jsonl(path) if t["task"] in args.tasks]
    samples = world_model.wm_samples(trs, tokenizer, max_tokens=args.max_prompt_tokens)
    if not samples:
        raise ValueError(f"{path} holds no usable transition for tasks {args.tasks}")
    return samples


def judge_samples(path: str, tokenizer, args) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, `yes`/`no` ids + end-of-turn) for every prefix of every real episode of args.tasks
    in the transitions file and in args.judge_trajectories (comma-separated trajectory files: real or
    expert episodes, or dreams replayed with `dream_replay.py --labelled`), judge.py. path "" (`--transitions ''`):
    learn from the trajectory files alone. Errors: FileNotFoundError as wm_samples; ValueError when
    none is usable."""
    import judge

    if path and not os.path.exists(path):
        raise FileNotFoundError(f"--transitions {path} not found: write it with `python world_model.py --collect` "
                                "(or pass --transitions '' to learn from --judge-trajectories alone)")
    trs = [t for t in read_jsonl(path) if t["task"] in args.tasks] if path else []
    files = [f for f in (args.judge_trajectories or "").split(",") if f]
    trajs = [t for f in files for t in read_jsonl(f) if t["task"] in args.tasks]
    samples = judge.judge_samples(trs, trajs, tokenizer, max_tokens=args.max_prompt_tokens,
                                  pages_shown=args.judge_pages)
    if not samples:
        raise ValueError(f"no usable episode for tasks {args.tasks} in --transitions {path!r} or "
                         f"--judge-trajectories {files}")
    return samples


def batch_indices(lengths: list[int], step: int, batch_size: int, seed: int, rank: int = 0, world: int = 1,
                  by_length: bool = True) -> list[int]:
    """This rank's samples for optimizer step `step` (0-based): each epoch a permutation seeded with
    seed + epoch (the same on every rank), cut into consecutive batches of batch_size (the remainder
    is left out); rank takes [rank::world] of its batch, sorted by length, longest first. Sorting
    changes no gradient (the same sum over the same samples) but makes micro-batches of similar
    lengths, which pad less (the default BC run: 1.18x the real tokens instead of 1.51x; bench.py
    --only padding, which passes by_length=False)."""
    per_epoch = max(1, len(lengths) // batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = np.random.default_rng(seed + epoch).permutation(len(lengths))
    batch = order[offset * batch_size:(offset + 1) * batch_size][rank::world].tolist()
    return sorted(batch, key=lambda i: -lengths[i]) if by_length else batch


def training_samples(args, tok) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) of --mode bc (args.demos), wm or judge (args.transitions, and for the
    judge args.judge_trajectories): bc_samples, wm_samples or judge_samples, with their errors."""
    if args.mode == "bc":
        return bc_samples(args.demos, tok, args)
    return (wm_samples if args.mode == "wm" else judge_samples)(args.transitions, tok, args)


def accumulate_gradients(model, tok, batch: list[tuple[list[int], list[int]]], n_tok: int, micro_batch: int,
                         device, bf16: bool) -> tuple[float, int]:
    """Forward and backward passes of -sum log p(target | prompt) / n_tok over `batch` ((prompt ids,
    target ids) pairs), micro_batch samples at a time (logits of the target positions only, (B, L)
    per micro-batch; peak memory grows with micro_batch x the longest prompt). Gradients accumulate
    in the parameters' .grad; no optimizer step. n_tok: the target tokens the loss is a mean over
    (all ranks' batch). Returns (the loss summed over micro-batches, the batch's prompt + target tokens,
    unpadded: what perf/tokens_per_s counts)."""
    loss_sum, tokens = 0.0, 0
    for mb in range(0, len(batch), micro_batch):
        part = batch[mb:mb + micro_batch]
        with policy.autocast(device, bf16):  # (the common prefix of the prompts runs once)
            logp, resp_mask, _ = policy.reply_logprobs(model, [p for p, _ in part], [t for _, t in part],
                                                       tok.pad_token_id)  # (B, L)
        loss = -(logp * resp_mask).sum() / n_tok  # this rank's share of the global token mean
        loss.backward()
        loss_sum += loss.item()
        tokens += sum(len(p) + len(t) for p, t in part)
    return loss_sum, tokens


def train_supervised(args, model, tok, opt, logger, step: int, rank: int, world: int, device) -> None:
    """Run --mode bc, wm or judge from optimizer step `step` (0, or the resumed checkpoint's) to the end
    (args.epochs passes), checkpointing every args.save_every steps and at the end (out/final).
    Reads args: mode, demos or transitions (and judge_trajectories), tasks, batch_size, micro_batch, epochs, lr, seed, bf16,
    max_skipped_steps, save_every, keep_ckpts, out, and the prompt settings. A step whose gradient norm or loss is not
    finite is skipped (update.StepGuard: the batch is passed over, the schedule moves on; args.max_skipped_steps in a
    row raise update.NonFiniteError). Logs per step: loss/<mode>, loss/grad_norm, loss/skipped_steps (1 when skipped),
    perf/step_s, perf/tokens_per_s, perf/peak_rss_gib (this process's peak resident memory so far, GiB), charts/lr, charts/epoch."""
    samples = training_samples(args, tok)
    tag = args.mode
    if args.batch_size % world:
        raise ValueError(f"--batch-size {args.batch_size} must divide evenly over {world} ranks")
    steps_per_epoch = max(1, len(samples) // args.batch_size)
    total_steps = max(1, int(steps_per_epoch * args.epochs))
    # linear warm-up over 10 steps (the RL update's update.warmup_lr), then linear decay to a tenth
    schedule = lambda s: update.warmup_lr(1.0, 10, s) * max(0.1, 1 - s / total_steps)  # noqa: E731
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    sched.last_epoch = step
    for group, base in zip(opt.param_groups, sched.base_lrs):  # resumed: the rate of step `step`, not of step 0
        group["lr"] = base * schedule(step)
    distributed.print0(rank, f"{tag}: {len(samples)} samples, {total_steps} steps of {args.batch_size}, "
                             f"lr {args.lr}, world {world}")
    bar = tqdm(total=total_steps, initial=step, desc=tag, disable=rank != 0)
    t_start, tokens = time.time(), 0
    lengths = [len(prompt) + len(target) for prompt, target in samples]
    settings = args.prompt_settings
    guard = update.StepGuard(args.max_skipped_steps, what=f"--mode {tag}")
    while step < total_steps:
        batch = batch_indices(lengths, step, args.batch_size, args.seed, rank, world)
        model.train()
        n_tok = distributed.all_sum(sum(len(samples[i][1]) for i in batch), world)  # target tokens, all ranks
        t0 = time.time()
        loss_sum, n = accumulate_gradients(model, tok, [samples[i] for i in batch], n_tok, args.micro_batch, device,
                                           bool(args.bf16))
        tokens += n
        distributed.sync_gradients(model, world)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        took = guard.step(opt, float(gnorm), loss_sum, world)
        with warnings.catch_warnings():  # a skipped first step makes torch warn of a misordered schedule: it is not
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
            sched.step()  # the schedule follows the batches, taken or skipped
        step += 1
        m = {f"loss/{tag}": distributed.all_sum(loss_sum, world), "loss/grad_norm": float(gnorm),
             "loss/skipped_steps": 0 if took else 1,
             "perf/step_s": time.time() - t0,
             "perf/tokens_per_s": distributed.all_sum(tokens, world) / (time.time() - t_start),
             "perf/peak_rss_gib": runlog.peak_rss_mb() / 1024,  # this rank's
             "charts/lr": sched.get_last_lr()[0], "charts/epoch": step / steps_per_epoch}
        logger.log(m, step)
        bar.update(1)
        bar.set_postfix(loss=f"{m[f'loss/{tag}']:.3f}")
        if step % args.save_every == 0 or step == total_steps:
            checkpoint.save_checkpoint(args.out, f"step-{step:06d}", model, tok, opt, step, {}, args.keep_ckpts,
                                       rank, world, settings)
    bar.close()
    checkpoint.save_checkpoint(args.out, "final", model, tok, opt, step, {}, args.keep_ckpts, rank, world, settings)
