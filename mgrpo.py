"""M-GRPO: GRPO extended to multi-turn trajectories (WebAgent-R1, Sec. 3.2, Eq. 2-3).

G trajectories of the same task and seed form a group. Each trajectory i gets one binary
reward r_i (task success) and one advantage, shared by every action token of every turn:

    A_i = (r_i - mean(r_group)) / max(std(r_group), std_floor)      (std: population std)

The loss is the clipped PPO surrogate on every action token (observation and prompt tokens
are masked out), optionally with a k3 KL penalty to a reference model:

    L = - sum_{i,t,k} w_{i,t,k} [ min(rho A_i, clip(rho, 1-eps_low, 1+eps_high) A_i) - beta KL_{i,t,k} ]
    rho = pi(a_{i,t,k} | s_{i,t}, a_{i,t,<k}) / pi_old(a_{i,t,k} | ...)

Averaging (the loss owns it: `token_weights` under a named mode; N = trajectories in the batch):

    "trajectory": w = 1 / (N * |y_i|)              each trajectory weighs the same; within it every action
                                                   token of every turn the same (|y_i|: its action tokens)
    "turn":       w = 1 / (N * T_i * |y_{i,t}|)    WebAgent-R1 as written: the mean over a turn's tokens, then
                                                   over the trajectory's T_i turns, then over trajectories
                                                   (each turn weighs the same, however long its reply)
    "token":      w = 1 / (sum_i |y_i|)            every action token of the batch weighs the same (DAPO)

Weights sum to 1 over the whole batch, so summing the loss of micro-batches gives the batch loss
(gradient accumulation needs no rescaling). Under torchrun N and the token total are the global
counts (all-reduced by the caller), so each rank's weights sum to its share and the ranks'
gradients are summed: uneven shares still weigh every trajectory the same.

Each turn is one training sample (its prompt, compressed, plus its reply); samples carry the
index of the trajectory they came from.
"""
from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, groups: list, *, std_floor: float = 1e-2,
                     neg_weight: float = 1.0) -> tuple[torch.Tensor, float]:
    """Group-normalised advantages.

    rewards: (N,) float, one per trajectory; groups: N hashable group keys (task, seed).
    Returns (advantages (N,), share of trajectories in zero-variance groups). A group whose
    rewards are all equal gets exactly 0 (its numerator is 0); the floor on the std keeps a
    group whose rewards differ by a hair from blowing up.

    neg_weight: negative advantages are multiplied by it after normalisation (1: GRPO as written;
    0: only the group's better trajectories are reinforced, as in rejection-sampling fine-tuning;
    between: the positive/negative sample reinforcement split of Zhu et al. 2025, "The Surprising
    Effectiveness of Negative Reinforcement in LLM Reasoning", here weighting the negative side).
    Pushing a sampled token down moves its mass to every other token, unseen garbage included;
    docs/rl.md has what this measured. Errors: ValueError when neg_weight < 0.
    """
    if neg_weight < 0:
        raise ValueError(f"neg_weight must be >= 0, got {neg_weight}")
    adv = torch.zeros_like(rewards, dtype=torch.float32)
    zero_var = 0
    keys = {}
    for i, g in enumerate(groups):
        keys.setdefault(g, []).append(i)
    for idx in keys.values():
        r = rewards[idx].double()  # float64: rewards that differ by a hair keep their difference
        std = r.std(unbiased=False)
        if float(std) == 0.0:
            zero_var += len(idx)
            continue  # exactly 0, not (r - mean) / floor which could carry rounding noise
        adv[idx] = ((r - r.mean()) / torch.clamp(std, min=std_floor)).float()
    if neg_weight != 1.0:
        adv = torch.where(adv < 0, adv * neg_weight, adv)
    return adv, zero_var / max(1, len(groups))


AGGREGATIONS = ("trajectory", "turn", "token")


def token_weights(resp_mask: torch.Tensor, traj_index: torch.Tensor, mode: str = "trajectory", *,
                  num_traj: float | None = None, num_tokens: float | None = None) -> torch.Tensor:
    """Per-token loss weights w (M, L) for M turn-samples, under an aggregation mode (module doc).

    resp_mask: (M, L) 1 on action tokens; traj_index: (M,) long, the trajectory of each sample (all
    of a trajectory's turns must be in this call). num_traj / num_tokens: N and the batch's action
    tokens when the batch spans more than this call (torchrun ranks); default: counted here, from
    the trajectories and tokens with a nonzero mask. A sample with no action token gets no weight.
    Sums to 1 with the default counts (0 for an empty mask). Errors: ValueError for an unknown mode.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; one of {AGGREGATIONS}")
    resp_mask = resp_mask.float()
    per_sample = resp_mask.sum(-1)  # (M,) action tokens of each turn
    n = int(traj_index.max()) + 1 if len(traj_index) else 0
    per_traj = torch.zeros(n).index_add_(0, traj_index, per_sample)  # (n,) action tokens of each trajectory
    if num_traj is None:
        num_traj = float((per_traj > 0).sum())
    if num_tokens is None:
        num_tokens = float(per_sample.sum())
    if mode == "token":
        w = torch.full_like(per_sample, 1.0 / max(num_tokens, 1.0))
    elif mode == "trajectory":
        w = 1.0 / (per_traj[traj_index].clamp(min=1) * max(num_traj, 1.0))
    else:  # turn: each turn with a reply weighs 1 / (N * turns of its trajectory), spread over its tokens
        turns = torch.zeros(n).index_add_(0, traj_index, (per_sample > 0).float())  # (n,)
        w = 1.0 / (per_sample.clamp(min=1) * turns[traj_index].clamp(min=1) * max(num_traj, 1.0))
    return resp_mask * w[:, None]


def mgrpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor, *,
               clip_low: float = 0.2, clip_high: float = 0.2, ref_logp: torch.Tensor | None = None,
               kl_coef: float = 0.0, kl_clip: float = 0.0) -> tuple[torch.Tensor, dict]:
    """Clipped multi-turn GRPO loss for a (micro-)batch of turn-samples.

    logp, old_logp: (M, L) log-probs of the action tokens under pi and pi_old (old is detached);
    advantages: (M,) the advantage of each sample's trajectory; weights: (M, L) from
    `token_weights` (0 off action tokens; they carry the aggregation). ref_logp: (M, L) reference log-probs:
    the KL is reported whenever they are given, and enters the loss only with kl_coef > 0.
    kl_clip > 0 caps each token's k3 term in the loss at kl_clip (verl's "low_var_kl" caps it at 10):
    k3 = exp(d) - d - 1 with d = log pi_ref - log pi grows exponentially once a token falls below the
    reference, and its gradient, 1 - exp(d) per unit of log pi, with it; one such token can outweigh
    the rest of the batch after gradient clipping. A capped token carries no KL gradient.
    Returns (scalar loss, stats) where stats hold weighted means of the ratio, the clip fraction (the
    tokens whose min() takes the clipped term: ratio > 1 + clip_high with A > 0, < 1 - clip_low with A < 0)
    and the KL (uncapped: what the policy's distance is), and the share of tokens capped, as floats.
    """
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # a masked garbage position must not overflow
    ratio = torch.exp(log_ratio)  # (M, L)
    A = advantages[:, None]  # (M, 1)
    surr = torch.minimum(ratio * A, ratio.clamp(1 - clip_low, 1 + clip_high) * A)  # (M, L)
    per_token = -surr
    kl = torch.zeros_like(logp)
    if ref_logp is not None:  # logged whenever a reference is given; a penalty only with kl_coef > 0
        d = (ref_logp - logp).clamp(-20.0, 20.0)
        kl = torch.exp(d) - d - 1  # k3 estimator of KL(pi || pi_ref), >= 0
        if kl_coef > 0:
            per_token = per_token + kl_coef * (kl.clamp(max=kl_clip) if kl_clip > 0 else kl)
    loss = (per_token * weights).sum()
    with torch.no_grad():
        wsum = weights.sum().clamp(min=1e-12)
        # clipped: tokens whose min() takes the clipped term, so they carry no gradient (ratio above
        # 1 + eps_high with A > 0, below 1 - eps_low with A < 0); a ratio outside the range on the
        # other side of 1 keeps its gradient and is not counted (TRL #3032)
        clipped = (((ratio > 1 + clip_high) & (A > 0)) | ((ratio < 1 - clip_low) & (A < 0))).float()  # (M, L)
        stats = {"ratio": float((ratio * weights).sum() / wsum), "clip_frac": float((clipped * weights).sum() / wsum),
                 "kl": float((kl * weights).sum() / wsum), "weight": float(weights.sum()),
                 "kl_capped": float(((kl > kl_clip).float() * weights).sum() / wsum) if kl_clip > 0 else 0.0}
    return loss, stats
