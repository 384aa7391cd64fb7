"""The policy-gradient update: one iteration's trajectories in, optimizer steps out (M-GRPO or GSPO).

    cfg = UpdateConfig(loss="mgrpo", aggregation="turn", ppo_epochs=2, minibatches=2)
    stats = policy_update(model, opt, tok, trajectories, cfg, device, world, ref=ref_model)

Each turn of a trajectory is one sample: its prompt ids plus its reply ids, exactly as generated
(records.Turn). Advantages are group-normalised over (task, seed) groups (mgrpo.group_advantages);
a trajectory with an "advantage" key keeps that value instead (dream mode's expert trajectories).
env_error trajectories are left out before anything is counted: neither success nor failure.

The batch is used `ppo_epochs` times; each pass shuffles the trajectories and cuts them into
`minibatches` parts, one optimizer step each (so the clipped ratio acts from the second step on).
pi_old, the sampling-time policy, is scored once before the first step; with a single step pi_old
is the current policy itself (ratio exactly 1). With `old_from_rollout` pi_old is read instead from
the log-probs each turn stored when it was sampled (records.Turn.response_logprobs): the same numbers
to float rounding when the rollout sampled with the trainer's own weights in the same precision
(generators.HFGenerator without --bf16; train.py decides), one forward pass over the batch fewer.
Turns without them (expert trajectories, which carry an "advantage") are scored as before.
With `warmup_steps` the learning rate of the run's first optimizer steps rises linearly to `lr`
(warmup_lr, counted by the optimizer's own step count, so a resumed run carries on where it was).
The loss of one step is the mean over its part's trajectories (mgrpo.token_weights' aggregation,
or GSPO's per-trajectory mean), with the counts taken over every rank (distributed.all_sums), and the ranks' gradients are summed: a rank with a
smaller share weighs each of its trajectories the same as a rank with a larger one. Trajectories
with a zero advantage count in the mean but are not run (without a KL term their gradient is 0).
Micro-batches (`batches_for`): GSPO's are whole trajectories (its sequence ratio needs all of a
trajectory's tokens in one call); M-GRPO's put the turns with the same prompt together, so that a
group's first turns run their prompt once (policy.reply_logprobs shares a batch's common prefix).
Either way gradient accumulation adds up to the step's loss.

Dream mode adds `nll`, (prompt ids, reply ids) samples of real expert turns, whose token-mean
negative log-likelihood enters each step with weight `nll_coef` while the RL loss is scaled by
`rl_scale`: loss = rl_scale * L_rl + nll_coef * L_nll (dream.py says why). With `nll_ref` (a frozen
model: --expert-loss kl) L_nll is instead the token mean of KL(nll_ref || policy) over the whole
vocabulary at each position of the expert's reply (teacher-forced): the term holds the reference's
behaviour on real pages rather than pulling toward the expert's replies.

A step whose gradient norm or loss is not finite (one bf16 overflow is enough) is skipped, not taken:
AdamW would write the inf or NaN into the weights and its moments, and every later step, and every
checkpoint, would carry it. `StepGuard` makes that call for every optimizer step of the project (this
update, supervised.py's bc/wm/judge steps, wm_refit.py's world-model refits), on a flag summed over
the ranks, and stops the run once `max_skipped` steps in a row were skipped (train.py --max-skipped-steps).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

import distributed
import gspo
import mgrpo
import policy
import records


@dataclass
class UpdateConfig:
    """The knobs of one policy update (train.py fills them from its flags)."""
    loss: str = "mgrpo"              # "mgrpo" (token-level ratio) or "gspo" (sequence-level ratio)
    aggregation: str = "trajectory"  # M-GRPO's token weights: mgrpo.AGGREGATIONS
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0             # M-GRPO's k3 penalty to the reference model (needs ref)
    kl_clip: float = 0.0             # each token's k3 term in the loss capped at this (0: uncapped; mgrpo.mgrpo_loss)
    neg_adv_weight: float = 1.0      # negative group advantages are multiplied by it (mgrpo.group_advantages)
    ppo_epochs: int = 1              # passes over the batch
    minibatches: int = 1             # optimizer steps per pass
    micro_batch: int = 8             # samples (turns) per forward pass
    temperature: float = 1.0         # the sampling temperature: log-probs are of softmax(logits / T)
    max_grad_norm: float = 1.0
    bf16: bool = False
    old_from_rollout: bool = False   # pi_old = each turn's response_logprobs (sampled by these very weights)
    lr: float = 0.0                  # the learning rate after warm-up (train.py: --lr); used only with warmup_steps
    warmup_steps: int = 0            # linear learning-rate warm-up over the run's first N optimizer steps (0: none)


MAX_SKIPPED_STEPS = 5  # train.py --max-skipped-steps' default: this many skipped steps in a row stop the run


class NonFiniteError(RuntimeError):
    """Raised by StepGuard when too many optimizer steps in a row had a non-finite gradient or loss."""


class StepGuard:
    """Takes an optimizer step only when its gradient norm and loss are finite on every rank; counts the
    skipped ones and stops a run that keeps skipping.

        guard = StepGuard(max_skipped=5)      # one per optimizer, kept for the whole run
        ...backward(), sync_gradients, norm = clip_grad_norm_(...)
        took = guard.step(opt, norm, loss, world, model)

    The count of consecutive skips lives here, not in one call of its users, so it runs on across
    the RL loop's iterations (real.py and dream.py call policy_update once an iteration); a resumed
    run starts it at 0. Attributes: skipped (all skipped steps), consecutive (skipped since the last
    step taken), max_skipped. Errors: ValueError for max_skipped < 1."""

    def __init__(self, max_skipped: int = MAX_SKIPPED_STEPS, what: str = "training"):
        if max_skipped < 1:
            raise ValueError(f"max_skipped must be at least 1, got {max_skipped}")
        self.max_skipped, self.what = max_skipped, what
        self.skipped = self.consecutive = 0

    def step(self, opt, grad_norm: float, loss: float, world: int, model=None) -> bool:
        """opt.step() unless the gradient norm (clip_grad_norm_'s, before clipping) or this rank's loss
        is inf or NaN on any rank; the gradients are cleared either way (opt.zero_grad). Collective
        under torchrun: every rank calls it for every step, and the decision is taken on a flag summed
        over the ranks (distributed.all_sum), so no rank steps while another skips (each rank's loss is
        its own; the gradients, summed by sync_gradients, are already the same). `model`: under
        distributed.full_params the skipped step's full weights are gathered again, as the optimizer's
        post-step hook would have. Returns whether the step was taken. Errors: NonFiniteError on the
        max_skipped-th skipped step in a row (the weights are still those of the last step taken)."""
        finite = math.isfinite(float(grad_norm)) and math.isfinite(float(loss))
        if distributed.all_sum(0.0 if finite else 1.0, world) == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
            self.consecutive = 0
            return True
        opt.zero_grad(set_to_none=True)  # nothing of the bad step carries into the next one
        if model is not None:
            distributed.regather_full(model)
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.max_skipped:
            raise NonFiniteError(
                f"{self.what}: {self.consecutive} optimizer steps in a row had a non-finite gradient or loss (the "
                f"last: gradient norm {float(grad_norm)}, loss {float(loss)} on this rank) and were skipped; stopping rather "
                f"than training on. The weights are those of the last step taken (no checkpoint holds the inf/NaN). "
                f"Lower --lr, try --bf16 0, or allow more skips in a row with --max-skipped-steps (now "
                f"{self.max_skipped}, default {MAX_SKIPPED_STEPS})")
        return False


def optimizer_steps(opt) -> int:
    """How many steps `opt` (torch.optim.AdamW or Adam) has taken: its per-parameter "step" count,
    which a resumed run restores with the optimizer state (checkpoint.restore_state); 0 before the first."""
    for st in opt.state.values():
        if "step" in st:
            return int(st["step"])
    return 0


def warmup_lr(lr: float, warmup_steps: int, done: int) -> float:
    """The learning rate of optimizer step `done` + 1 under a linear warm-up: lr * (done + 1) / warmup_steps
    for the first `warmup_steps` steps, then lr. Why RL here needs one: AdamW's first step divides
    each gradient by its own magnitude, so it moves every weight by the full lr whatever the
    gradient's size (Liu et al. 2020, RAdam, Sec. 3). From the BC start, the first iteration's second
    step saw loss/kl 20.3 and a gradient norm of 574 before clipping, against 0.02-0.05 and 1-2 in
    every later iteration (rl-e11, docs/rl.md)."""
    if warmup_steps <= 0:
        return lr
    return lr * min(1.0, (done + 1) / warmup_steps)


def score(model, tok, batch: list[tuple], temperature: float, bf16: bool, device,
          full: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Log-probs of each sample's reply tokens. batch: [(trajectory index, prompt ids, reply ids)].
    Returns logp (B, L) float32 ((B, L, V), the whole next-token distribution, with `full`), the reply
    mask (B, L) (replies right-aligned) and L."""
    with policy.autocast(device, bf16):
        logp, rm, L = policy.reply_logprobs(model, [p for _, p, _ in batch], [r for _, _, r in batch],
                                            tok.pad_token_id, temperature=temperature, full=full)
    return logp.float(), rm, L


def batches_for(loss: str, trajectories: list[int], by_traj: dict, samples: list[tuple], size: int) -> list[list[int]]:
    """The micro-batches (sample indices) of these trajectories' turns. GSPO: whole trajectories (its
    sequence ratio needs all of a trajectory's tokens in one call), longest first. M-GRPO (a token-level
    loss, any grouping): the turns with the same prompt together, at most `size` a micro-batch (a
    group's first turns: their prompt then runs once, policy.reply_logprobs), the other turns longest
    first. The grouping changes no gradient, only the work (less padding, shared prefixes)."""
    longest = lambda i: -max(len(samples[k][1]) + len(samples[k][2]) for k in by_traj[i])  # noqa: E731
    if loss == "gspo":
        return micro_batches(sorted(trajectories, key=longest), by_traj, size)
    by_prompt: dict = {}
    for i in trajectories:
        for k in by_traj.get(i, []):
            by_prompt.setdefault(tuple(samples[k][1]), []).append(k)
    out, rest = [], []
    for ks in by_prompt.values():
        if len(ks) > 1:
            out += [ks[j:j + size] for j in range(0, len(ks), size)]
        else:
            rest += ks
    rest.sort(key=lambda k: -(len(samples[k][1]) + len(samples[k][2])))
    return out + [rest[j:j + size] for j in range(0, len(rest), size)]


def micro_batches(trajectories: list[int], by_traj: dict, size: int) -> list[list[int]]:
    """Sample indices in micro-batches of about `size` samples, never splitting a trajectory."""
    out, cur = [], []
    for i in trajectories:
        cur += by_traj.get(i, [])
        if len(cur) >= size:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def _right_aligned(rows: list[torch.Tensor], like: torch.Tensor, L: int) -> torch.Tensor:
    """Stack per-sample reply vectors right-aligned into a (B, L) tensor like `like` (zeros elsewhere)."""
    out = torch.zeros_like(like)
    for j, r in enumerate(rows):
        out[j, L - len(r):] = r
    return out


def policy_update(model, opt, tok, trajectories: list[dict], cfg: UpdateConfig, device, world: int = 1, *,
                  ref=None, nll: list[tuple[list[int], list[int]]] | None = None, nll_coef: float = 0.0,
                  rl_scale: float = 1.0, seed: int = 0, nll_ref=None, guard: StepGuard | None = None) -> dict:
    """Optimizer steps on this rank's trajectories (collective under torchrun: every rank calls it,
    each with its own trajectories, and every rank takes the same number of steps).

    ref: a frozen reference model; with cfg.kl_coef > 0 (M-GRPO) its k3 KL enters the loss, and
    whenever it is given the KL of the trained tokens is logged (loss/kl). nll_ref: a frozen model
    that turns the `nll` term into KL(nll_ref || policy) on the expert replies' positions. seed: the shuffle of
    the passes (the same on every rank is not needed). guard: the run's StepGuard (its count of skipped
    steps in a row runs on across calls; default a fresh one with MAX_SKIPPED_STEPS): a step whose
    gradient norm or loss is not finite is skipped. Returns metrics, counts summed over ranks:
    rollout/reward (mean reward of the trajectories that count), rollout/zero_var_groups (share of
    them in groups with equal rewards), loss/trajectories (counted), loss/trajectories_trained
    (nonzero advantage), loss/updates (optimizer steps), loss/policy, loss/ratio, loss/clip_frac,
    loss/kl, loss/kl_capped (weighted means), loss/skipped_steps (steps skipped for a non-finite gradient
    or loss; loss/updates counts the steps taken), loss/grad_norm (last step, before clipping), loss/grad_norm_max
    (the largest of the iteration's steps: a spike in an early step of several), loss/empty_samples, loss/nll with nll (the KL to nll_ref with one), and loss/lr
    (the last step's learning rate) with cfg.warmup_steps. Errors: NonFiniteError from `guard`.
    """
    nll = nll or []
    guard = guard or StepGuard(what="policy update")
    valid = [t for t in trajectories if records.trainable(t)]
    rewards = torch.tensor([t["reward"] for t in valid], dtype=torch.float32)
    adv, zero_var_share = mgrpo.group_advantages(rewards, [(t["task"], t["seed"]) for t in valid],
                                                 neg_weight=cfg.neg_adv_weight)
    for i, t in enumerate(valid):
        if "advantage" in t:
            adv[i] = float(t["advantage"])
    samples = [(i, u["prompt_ids"], u["response_ids"]) for i, t in enumerate(valid) for u in t["turns"]
               if u.get("response_ids")]
    use_kl = cfg.loss == "mgrpo" and cfg.kl_coef > 0
    if use_kl and ref is None:
        raise ValueError("kl_coef > 0 needs a reference model (ref)")
    trained = [i for i in range(len(valid)) if float(adv[i]) != 0.0 or use_kl]
    n_valid, r_sum, n_zero, n_trained, n_empty = distributed.all_sums(
        [len(valid), float(rewards.sum()), zero_var_share * len(valid), len(trained),
         sum(1 for t in valid for u in t["turns"] if not u.get("response_ids"))], world)
    stats = {"rollout/reward": r_sum / max(1.0, n_valid), "rollout/zero_var_groups": n_zero / max(1.0, n_valid),
             "loss/trajectories": n_valid, "loss/trajectories_trained": n_trained, "loss/empty_samples": n_empty}
    by_traj: dict[int, list[int]] = {}
    for k, (i, _, _) in enumerate(samples):
        by_traj.setdefault(i, []).append(k)
    n_updates = cfg.ppo_epochs * cfg.minibatches
    # pi_old (when several steps share the batch) and the reference log-probs, scored once up front
    old, ref_lp = {}, {}
    if n_updates > 1 and cfg.old_from_rollout:  # the sampling-time log-probs are pi_old's own
        turns = [u for t in valid for u in t["turns"] if u.get("response_ids")]  # samples' order
        for k, u in enumerate(turns):
            lp = u.get("response_logprobs")
            if "advantage" not in valid[samples[k][0]] and lp is not None and len(lp) == len(u["response_ids"]):
                old[k] = torch.tensor(lp, dtype=torch.float32, device=device)
    if trained and (n_updates > 1 or ref is not None):
        model.eval()
        with torch.no_grad():
            for net, store in ((model, old), (ref, ref_lp)):
                if net is None or (net is model and n_updates == 1):
                    continue
                for mb in batches_for(cfg.loss, trained, by_traj, samples, cfg.micro_batch):
                    todo = [k for k in mb if k not in store]
                    if not todo:
                        continue
                    lp, _, L = score(net, tok, [samples[k] for k in todo], cfg.temperature, cfg.bf16, device)
                    for j, k in enumerate(todo):
                        store[k] = lp[j, L - len(samples[k][2]):]
    model.train()
    agg = {"loss/policy": 0.0, "loss/ratio": 0.0, "loss/clip_frac": 0.0, "loss/kl": 0.0, "loss/kl_capped": 0.0, "loss/updates": 0,
           "loss/grad_norm": 0.0, "loss/grad_norm_max": 0.0, "loss/skipped_steps": 0}
    if nll_coef:
        agg["loss/nll"] = 0.0
    weight_seen = 0.0  # ratio, clip fraction and KL are means weighted by each micro-batch's loss weight
    rng = random.Random(seed)
    trained_set = set(trained)
    for _ in range(cfg.ppo_epochs):
        order = list(range(len(valid)))
        rng.shuffle(order)
        for part in range(cfg.minibatches):
            chunk = order[part::cfg.minibatches]
            nll_chunk = nll[part::cfg.minibatches]
            run = [i for i in chunk if i in trained_set]
            chunk_tokens = sum(len(samples[k][2]) for i in chunk for k in by_traj.get(i, []))
            n_chunk, tok_chunk, n_run, nll_tok = distributed.all_sums(
                [len(chunk), chunk_tokens, len(run), sum(len(r) for _, r in nll_chunk)], world)
            if n_run + nll_tok == 0:
                # no rank has anything to train on: stepping AdamW on zero gradients would still move
                # the weights along its stale moments. Every rank takes this branch together.
                continue
            step_loss = 0.0  # this rank's loss of the step (rl_scale and nll_coef aside): is it finite?
            if run:
                ks = [k for i in run for k in by_traj[i]]
                lengths = torch.tensor([len(samples[k][2]) for k in ks])
                full = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).float()
                local = torch.tensor([samples[k][0] for k in ks])
                # one action token's weight in each sample, over this step's trajectories on every rank
                w_tok = mgrpo.token_weights(full, torch.unique(local, return_inverse=True)[1], cfg.aggregation,
                                            num_traj=n_chunk, num_tokens=tok_chunk)[:, 0]
                w_of = dict(zip(ks, w_tok.tolist()))
            for mb in batches_for(cfg.loss, run, by_traj, samples, cfg.micro_batch):
                batch = [samples[k] for k in mb]
                logp, rm, L = score(model, tok, batch, cfg.temperature, cfg.bf16, device)  # (B, L)
                old_lp = _right_aligned([old[k] for k in mb], logp, L) if n_updates > 1 else logp.detach()
                r_lp = _right_aligned([ref_lp[k] for k in mb], logp, L) if ref is not None else None
                if cfg.loss == "gspo":
                    local = {i: j for j, i in enumerate(dict.fromkeys(i for i, _, _ in batch))}
                    loss, s = gspo.gspo_loss(logp, old_lp, adv[list(local)].to(device), rm,
                                             torch.tensor([local[i] for i, _, _ in batch], device=device),
                                             num_traj=n_chunk, clip_low=cfg.clip_low, clip_high=cfg.clip_high)
                    weight = len(local) / n_chunk
                    if r_lp is not None:  # monitoring only: GSPO has no KL term
                        d = (r_lp - logp.detach()).clamp(-20, 20)
                        s["kl"] = float(((d.exp() - d - 1) * rm).sum() / rm.sum().clamp(min=1))
                else:
                    w = rm * torch.tensor([w_of[k] for k in mb], device=device)[:, None]
                    a = torch.tensor([float(adv[i]) for i, _, _ in batch], device=device)
                    loss, s = mgrpo.mgrpo_loss(logp, old_lp, a, w, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                               ref_logp=r_lp, kl_coef=cfg.kl_coef if use_kl else 0.0,
                                               kl_clip=cfg.kl_clip)
                    weight = s["weight"]
                (loss * rl_scale).backward()
                step_loss += loss.item()
                agg["loss/policy"] += loss.item() / n_updates
                agg["loss/ratio"] += s["ratio"] * weight
                agg["loss/clip_frac"] += s["clip_frac"] * weight
                agg["loss/kl"] += s.get("kl", 0.0) * weight
                agg["loss/kl_capped"] += s.get("kl_capped", 0.0) * weight
                weight_seen += weight
            for j in range(0, len(nll_chunk), cfg.micro_batch):  # real expert turns: -log p(reply)
                batch = [(None, p, r) for p, r in nll_chunk[j:j + cfg.micro_batch]]
                if nll_ref is None:
                    logp, rm, _ = score(model, tok, batch, 1.0, cfg.bf16, device)
                    loss = -(logp * rm).sum() / nll_tok
                else:  # KL(ref || policy) of the next-token distributions along the expert's reply
                    with torch.no_grad():
                        ref_full, _, _ = score(nll_ref, tok, batch, 1.0, cfg.bf16, device, full=True)
                    logp, rm, _ = score(model, tok, batch, 1.0, cfg.bf16, device, full=True)  # (B, L, V)
                    loss = ((ref_full.exp() * (ref_full - logp)).sum(-1) * rm).sum() / nll_tok
                    del ref_full
                (loss * nll_coef).backward()
                step_loss += loss.item()
                agg["loss/nll"] += loss.item() / n_updates
            distributed.sync_gradients(model, world)
            agg["loss/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
            if not agg["loss/grad_norm"] <= agg["loss/grad_norm_max"]:  # (a NaN norm is kept, not hidden by max)
                agg["loss/grad_norm_max"] = agg["loss/grad_norm"]
            if cfg.warmup_steps > 0:
                agg["loss/lr"] = warmup_lr(cfg.lr, cfg.warmup_steps, optimizer_steps(opt))
                for group in opt.param_groups:
                    group["lr"] = agg["loss/lr"]
            if guard.step(opt, agg["loss/grad_norm"], step_loss, world, model):
                agg["loss/updates"] += 1
            else:
                agg["loss/skipped_steps"] += 1
    for k in ("loss/ratio", "loss/clip_frac", "loss/kl", "loss/kl_capped"):
        agg[k] = agg[k] / weight_seen if weight_seen else (1.0 if k == "loss/ratio" else 0.0)
    stats.update(agg)
    return stats
