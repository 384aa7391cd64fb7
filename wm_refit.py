"""The world model refit on the real outcomes of the policy's own dreams, as the dream run goes.

    torchrun train.py --mode dream --real-ratio 0.4 --wm-refit-steps 2     # every --replay-every iterations

A world model right on held-out expert and random transitions can still be wrong on the states the
policy dreams itself into: the policy's failures are the ones its training data lacks, and its `done:`
line called a quarter of the BC policy's failing steps successes (docs/dreams.md, d15). The dream loop
already replays a sample of dreams on real pages to check the reward (dream.replay_dreams). With
`--wm-refit-steps K` those replays also become real transitions (`replay_transitions`: the real page
before each step, the dream's action, the real page after, the real outcome), and the world model takes
K optimizer steps on them (`WorldModelRefit`): Dyna's model learning from real experience, on exactly the
states the current policy reaches. Each step's batch is up to half that check's transitions, half drawn
from the world model's own training transitions (--transitions), so it does not forget the rest of
the suite. The refit transitions go to out/wm_refit-rank{R}.jsonl (a log) and the refit model into every
checkpoint of the policy (CKPT/world_model/, in the same atomic save), which a run resumed from that
checkpoint dreams in: the pair is always the one saved together (the optimizer's moments start afresh).
The replays wait COLLECT_ACTION_TIMEOUT_MS for an action's element, as the training transitions did, so
that a timeout reads the same in both.

The replays' real browser steps are counted in env/real_steps as before; the refit adds none.
"""
from __future__ import annotations

import json
import os
import random
import shutil

import torch

import distributed
import runlog
import supervised
import update
import world_model
from delta import diff, done_status

REFIT_DIR = "world_model"          # inside each checkpoint of the dream run: CKPT/world_model
REFIT_TRANSITIONS = "wm_refit.jsonl"


def replay_transitions(dream: dict, start: dict, replay: dict, iteration: int) -> list[dict]:
    """The real transitions a replayed dream gives: one per dream step the real episode took whose
    action parsed (a parse error never reaches the world model in a dream either).

    dream: a dream's trajectory (turns with `action`, None where the reply did not parse); start: the
    real state it began from (transitions.pick_start_state: url, axtree, error, hidden, goal, task, seed,
    prefix); replay: transitions.replay's result for its actions, on a WebEnv(hidden=True) so that the
    pages carry their hidden content as the world model's training pages do. Returns [] unless the replay
    reproduced the start page (start_match) without an env_error. Records are transitions.py's
    ({task, seed, step, goal, obs, action, next_obs, delta, reward, done, success, truncated, source}),
    with source `dream_replay` and `iteration`; step counts from the start state's stage.
    """
    if not replay["start_match"] or replay["env_error"]:
        return []
    prev = {"url": start["url"], "axtree": start["axtree"], "error": start.get("error", "") or ""}
    if start.get("hidden"):
        prev["hidden"] = start["hidden"]
    out, stage = [], len(start.get("prefix", []))
    n = len(replay["states"])
    for k, (turn, nxt) in enumerate(zip(dream["turns"], replay["states"])):
        last = k == n - 1
        done = bool(last and replay.get("done"))
        success = bool(done and replay["success"])
        if turn.get("action"):
            rec = {"task": start["task"], "seed": start["seed"], "step": stage + k, "goal": start["goal"],
                   "obs": prev, "action": turn["action"], "next_obs": nxt, "reward": float(replay["reward"]) if done else 0.0,
                   "done": done, "success": success, "truncated": False, "source": "dream_replay",
                   "iteration": iteration}
            rec["delta"] = diff(prev, nxt, done_status(success, done), action=turn["action"])
            out.append(rec)
        prev = nxt
    return out


class WorldModelRefit:
    """K AdamW steps on the world model per replay check, on that check's real transitions: each step's
    batch of `batch_size` is up to half this check's transitions (shuffled, and dealt across the K steps,
    so that every one is trained on when there are enough steps) and the rest drawn from `base` (the world
    model's own training transitions, so the rest of the suite is not forgotten); the loss is
    -log p(Δ | goal, o_t, a_t) of train.py --mode wm (world_model.wm_samples, supervised.accumulate_gradients;
    DynaWeb Sec. 3, Eq. 2). Only the parameters trainable when it is built are trained (a PEFT world
    model: its adapter, which is what save_pretrained writes).

    Collective under torchrun: every rank calls `refit` at the same iterations with the same `steps`,
    gradients are summed over ranks (distributed.sync_gradients), so the ranks' copies stay equal, and
    when no rank has a new transition no rank steps. A step whose gradient norm or loss is not finite is
    skipped (update.StepGuard, its count of skips in a row kept across refits; `max_skipped` in a row raise
    update.NonFiniteError), so the world model the dreams run in never takes an inf or NaN. The model must
    not be generating while `refit` runs (the dream loop holds world_model._PREDICT_LOCK). Raises ValueError
    for batch_size < 2 or an empty `base`.
    """

    def __init__(self, model, tokenizer, base: list[dict], *, lr: float = 2e-5, batch_size: int = 16,
                 micro_batch: int = 4, max_tokens: int = 1024, bf16: bool = False, max_grad_norm: float = 1.0,
                 seed: int = 0, world: int = 1, max_skipped: int = update.MAX_SKIPPED_STEPS):
        if batch_size < 2:
            raise ValueError(f"batch_size must be at least 2 (half new, half base), got {batch_size}")
        if not base:
            raise ValueError("WorldModelRefit needs the world model's training transitions (base), got none")
        self.model, self.tok, self.base = model, tokenizer, base
        self.batch_size, self.micro_batch, self.max_tokens = batch_size, micro_batch, max_tokens
        self.bf16, self.max_grad_norm, self.world = bf16, max_grad_norm, world
        self.rng = random.Random(seed)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("WorldModelRefit: the model has no trainable parameter (build it before freezing the model)")
        self.opt = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self.guard = update.StepGuard(max_skipped, what="world-model refit")

    def refit(self, new: list[dict], steps: int) -> dict:
        """Take `steps` optimizer steps on this rank's `new` transitions (replay_transitions' records) and the
        base. Returns {wm_refit/loss (mean over steps, per target token), wm_refit/new (all ranks' new
        transitions), wm_refit/steps (asked for), wm_refit/skipped_steps (of those, skipped for a non-finite
        gradient or loss)}; only wm_refit/new, with no step taken, when no rank has any.
        Errors: update.NonFiniteError (StepGuard)."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        total = int(distributed.all_sum(len(new), self.world))
        if not steps or not total:
            return {"wm_refit/new": total}
        device = next(self.model.parameters()).device
        order = self.rng.sample(new, len(new))
        half = min(len(order), self.batch_size // 2)
        for p in self.params:
            p.requires_grad_(True)
        self.model.train()
        losses, skipped = [], 0
        try:
            for k in range(steps):
                mine = [order[(k * half + j) % len(order)] for j in range(half)]
                picked = mine + self.rng.sample(self.base, min(len(self.base), self.batch_size - half))
                samples = world_model.wm_samples(picked, self.tok, self.max_tokens)
                n_tok = distributed.all_sum(sum(len(t) for _, t in samples), self.world)
                loss, _ = supervised.accumulate_gradients(self.model, self.tok, samples, max(1, n_tok),
                                                          self.micro_batch, device, self.bf16)
                distributed.sync_gradients(self.model, self.world)
                gnorm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
                skipped += not self.guard.step(self.opt, float(gnorm), loss, self.world)
                losses.append(distributed.all_sum(loss, self.world))
        finally:
            self.model.eval()
            for p in self.params:
                p.requires_grad_(False)
        return {"wm_refit/loss": sum(losses) / len(losses), "wm_refit/new": total, "wm_refit/steps": steps,
                "wm_refit/skipped_steps": skipped}


def save_refit(path: str, model, tokenizer, source: str, iteration: int) -> None:
    """Write the refit world model to folder `path` (checkpoint.save_checkpoint's companion: CKPT/world_model,
    inside the checkpoint's temp folder, so it is as atomic as the policy's weights), with the source
    checkpoint's webdream.json (its prompt and Δ format) and refit.json {iteration, source}. Rank 0 only."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if os.path.exists(os.path.join(source, "webdream.json")):
        shutil.copy(os.path.join(source, "webdream.json"), path)
    with runlog.open_text(os.path.join(path, "refit.json"), "w") as f:
        json.dump({"iteration": iteration, "source": source}, f)


def refit_iteration(path: str) -> int | None:
    """The iteration the refit world model in folder `path` (CKPT/world_model) was saved at, or None when
    there is none."""
    try:
        with open(os.path.join(path, "refit.json")) as f:
            return int(json.load(f)["iteration"])
    except (OSError, ValueError, KeyError):
        return None
