"""GSPO: group sequence policy optimisation (Zheng et al. 2025; DynaWeb, arXiv 2601.22149, Sec. 3).

Same groups and advantages as M-GRPO (mgrpo.group_advantages), but the importance ratio is
one number per trajectory, the geometric mean of its token ratios over every action token of
every turn:

    s_i = exp( (1/|y_i|) sum_{t,k} log pi(a_{i,t,k} | ...) / pi_old(a_{i,t,k} | ...) )
    L   = - (1/N) sum_i min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i )

with |y_i| the number of action tokens of trajectory i and N the number of trajectories in the
batch. GSPO's clip range is tiny (3e-4 / 4e-4 by default) because s_i is a per-token average.
No KL term, as in the paper.

Call shape as mgrpo.mgrpo_loss, except that a trajectory's turns must all be in the same call
(s_i needs all of its tokens): train.py builds micro-batches from whole trajectories.
"""
from __future__ import annotations

import torch


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                       traj_index: torch.Tensor, num_local: int) -> torch.Tensor:
    """Mean over each trajectory's action tokens of log pi - log pi_old.

    logp, old_logp, mask: (M, L) for M turn-samples; traj_index: (M,) long in [0, num_local).
    Returns (num_local,). Padding and observation tokens (mask 0) do not enter it. A trajectory
    with no action token gets 0 (ratio 1).
    """
    mask = mask.float()
    lr = ((logp - old_logp) * mask).sum(-1)  # (M,)
    tokens = mask.sum(-1)  # (M,)
    num = torch.zeros(num_local, dtype=lr.dtype, device=lr.device).index_add(0, traj_index, lr)
    den = torch.zeros(num_local, dtype=lr.dtype, device=lr.device).index_add(0, traj_index, tokens)
    return num / den.clamp(min=1.0)


def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              traj_index: torch.Tensor, *, num_traj: int, clip_low: float = 3e-4,
              clip_high: float = 4e-4) -> tuple[torch.Tensor, dict]:
    """Clipped sequence-level loss for the whole trajectories of one (micro-)batch.

    logp, old_logp, mask: (M, L); traj_index: (M,) local trajectory ids 0..K-1 of each sample;
    advantages: (K,) one per local trajectory; num_traj: N, trajectories in the whole batch
    (so that micro-batch losses add up to the batch loss). Returns (loss, stats) with the mean
    sequence ratio and the clip fraction over the local trajectories (those whose min() takes the clipped
    term: s > 1 + clip_high with A > 0, s < 1 - clip_low with A < 0), as floats.
    """
    K = advantages.shape[0]
    log_s = sequence_log_ratio(logp, old_logp, mask, traj_index, K).clamp(-20.0, 20.0)  # (K,)
    s = torch.exp(log_s)  # s_i = (pi / pi_old) ** (1 / |y_i|)
    A = advantages.to(s.dtype)
    surr = torch.minimum(s * A, s.clamp(1 - clip_low, 1 + clip_high) * A)  # (K,)
    loss = -surr.sum() / max(1, num_traj)
    with torch.no_grad():
        # trajectories whose min() takes the clipped term (no gradient): s above 1 + eps_high with A > 0,
        # below 1 - eps_low with A < 0 (as mgrpo_loss counts tokens)
        clipped = (((s > 1 + clip_high) & (A > 0)) | ((s < 1 - clip_low) & (A < 0))).float()  # (K,)
        stats = {"ratio": float(s.mean()) if K else 1.0, "clip_frac": float(clipped.mean()) if K else 0.0, "n": K}
    return loss, stats
