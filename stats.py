"""Success rates and how sure we are of them: Wilson intervals, per-task summaries, paired comparisons.

    lo, hi = wilson(17, 20)                         # 95% interval of a success rate
    summary = summarise(trajectories, tasks)        # per task and overall, env_error left out
    p = paired(before, after)                       # the same (task, seed) episodes under two policies
    n = paired_episodes_needed(0.03, 0.05)          # episodes to detect +3 points when 5% are discordant
    python stats.py --discordant 0.05               # the same, as a table

Two policies evaluated on the same eval episodes (eval.py uses fixed eval seeds) are compared
pair by pair: an episode solved by one and not the other is a discordant pair; the difference of
success rates is (gained - lost) / n, with a 95% interval for paired proportions (Wald, on the
discordant counts) and the exact McNemar test (a two-sided binomial test on the discordant pairs).
Comparing two marginal intervals instead wastes most of the information: the same pages are easy or
hard for both policies.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.stats


def wilson(successes, n, z: float = 1.96):
    """95% Wilson score interval of a binomial proportion, as (low, high) in [0, 1].

    Always holds the observed rate: exactly 0.0 below when successes == 0 and exactly 1.0 above when
    successes == n (floating point alone gives 2.8e-17 and 0.9999999999999999 there). (0, 1) when n == 0.
    successes and n may be numpy arrays of the same shape (then low and high are arrays, element by
    element the same floats). Errors: ValueError unless 0 <= successes <= n."""
    s, m = np.asarray(successes), np.asarray(n)
    if np.any((s < 0) | (s > m)):
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    with np.errstate(divide="ignore", invalid="ignore"):
        p = s / m
        centre = (p + z * z / (2 * m)) / (1 + z * z / m)
        half = z * np.sqrt(p * (1 - p) / m + z * z / (4 * m * m)) / (1 + z * z / m)
        lo = np.where((s == 0) | (m == 0), 0.0, np.minimum(p, np.maximum(0.0, centre - half)))
        hi = np.where((s == m) | (m == 0), 1.0, np.maximum(p, np.minimum(1.0, centre + half)))
    if lo.ndim == 0:
        return float(lo), float(hi)
    return lo, hi


def summarise(trajs: list[dict], tasks: list[str]) -> dict:
    """Per-task and overall success with Wilson intervals from trajectory records (records.Trajectory;
    only task, success, env_error and steps are read). env_error episodes are neither successes nor
    failures: left out of the rates and counted apart. A task whose every episode was an env_error
    has success None (nothing was measured)."""
    rows = {}
    for task in tasks:
        ts = [t for t in trajs if t["task"] == task]
        ok = [t for t in ts if not t["env_error"]]
        s = sum(t["success"] for t in ok)
        lo, hi = wilson(s, len(ok))
        rows[task] = {"success": s / len(ok) if ok else None, "ci95": [lo, hi], "n": len(ok), "successes": s,
                      "env_error": len(ts) - len(ok), "mean_steps": sum(t["steps"] for t in ok) / max(1, len(ok))}
    ok = [t for t in trajs if not t["env_error"]]
    s = sum(t["success"] for t in ok)
    lo, hi = wilson(s, len(ok))
    measured = [r["success"] for r in rows.values() if r["success"] is not None]
    mean = {"success": s / len(ok) if ok else None, "ci95": [lo, hi], "n": len(ok), "successes": s,
            "env_error": len(trajs) - len(ok), "task_mean": sum(measured) / len(measured) if measured else None}
    return {"tasks": rows, "mean": mean}


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value: the chance, with discordant pairs split 50/50, of a split at
    least as uneven as gained vs lost: 2 P(X <= min(gained, lost)), X ~ Binomial(gained + lost, 1/2),
    capped at 1. 1.0 with no discordant pair.

    The binomial tail comes from scipy's regularised incomplete beta function (relative error about
    1e-14 at any n, in microseconds): summing comb(n, i) / 2**n in floats overflows past n = 1,023
    discordant pairs, which pooled eval repeats reach. Errors: ValueError for a negative count."""
    if gained < 0 or lost < 0:
        raise ValueError(f"discordant counts must be >= 0, got gained={gained}, lost={lost}")
    n = gained + lost
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * float(scipy.stats.binom.cdf(min(gained, lost), n, 0.5)))


def paired(a: dict, b: dict, z: float = 1.96) -> dict:
    """Compare policy B with policy A on the episodes both have.

    a, b: {(task, seed): success bool} (env_error episodes left out by the caller). Returns {n,
    gained (B solved, A did not), lost (A solved, B did not), a, b (success rates), diff (b - a),
    ci95 (Wald interval of the paired difference), p (exact McNemar)}. Errors: ValueError when the
    two share no episode."""
    keys = sorted(set(a) & set(b), key=str)
    n = len(keys)
    if n == 0:
        raise ValueError("the two evaluations share no (task, seed) episode")
    gained = sum(1 for k in keys if b[k] and not a[k])
    lost = sum(1 for k in keys if a[k] and not b[k])
    diff = (gained - lost) / n
    var = (gained + lost - (gained - lost) ** 2 / n) / n ** 2  # variance of the paired difference
    half = z * math.sqrt(max(var, 0.0))
    return {"n": n, "gained": gained, "lost": lost, "a": sum(bool(a[k]) for k in keys) / n,
            "b": sum(bool(b[k]) for k in keys) / n, "diff": diff, "ci95": [diff - half, diff + half],
            "p": mcnemar_exact(gained, lost)}


def paired_line(name: str, r: dict, width: int = 24) -> str:
    """One line of a paired comparison (paired's dict): `name n=... A ... B ... B-A ... (interval)
    gained, lost, p`, as world_model.py --compare and judge.py --compare print it."""
    return (f"{name:{width}s} n={r['n']:4d}  A {r['a']:6.1%}  B {r['b']:6.1%}  B-A {r['diff']:+6.1%} "
            f"({r['ci95'][0]:+.1%} to {r['ci95'][1]:+.1%})  gained {r['gained']}, lost {r['lost']}, p = {r['p']:.2g}")


def outcomes(trajs: list[dict]) -> dict:
    """{(task, seed): success} of the episodes that did not end in env_error (for `paired`)."""
    return {(t["task"], t["seed"]): bool(t["success"]) for t in trajs if not t["env_error"]}


def paired_episodes_needed(diff: float, discordant: float, z_alpha: float = 1.96, z_power: float = 0.8416) -> int:
    """Episodes a paired comparison needs so that McNemar's test at two-sided 5% (z_alpha) finds a true
    difference `diff` of success rates with 80% power (z_power), when a share `discordant` of the
    episodes are solved by exactly one of the two policies (Connor 1987's normal approximation):

        n = (z_alpha * sqrt(psi) + z_power * sqrt(psi - diff^2))^2 / diff^2,   psi = discordant

    diff and discordant are fractions (0.03 = 3 points). Read discordant off an earlier paired comparison
    ((gained + lost) / n). Errors: ValueError unless 0 < |diff| <= discordant <= 1."""
    d = abs(diff)
    if not 0 < d <= discordant <= 1:
        raise ValueError(f"need 0 < |diff| <= discordant <= 1, got diff {diff}, discordant {discordant}")
    return math.ceil((z_alpha * math.sqrt(discordant) + z_power * math.sqrt(discordant - d * d)) ** 2 / (d * d))


def paired_detectable(n: int, discordant: float, z_alpha: float = 1.96, z_power: float = 0.8416) -> float | None:
    """The smallest difference of success rates (a fraction) that n paired episodes detect with
    paired_episodes_needed's test and power at this discordant share: the inverse of
    paired_episodes_needed, by bisection (to 1e-6). None when not even a difference as large as the
    discordant share (every discordant pair a gain) is detectable. Errors: ValueError unless n >= 1
    and 0 < discordant <= 1."""
    if n < 1 or not 0 < discordant <= 1:
        raise ValueError(f"need n >= 1 and 0 < discordant <= 1, got n {n}, discordant {discordant}")
    lo, hi = 0.0, discordant
    if paired_episodes_needed(hi, discordant, z_alpha, z_power) > n:
        return None
    while hi - lo > 1e-6:  # episodes needed fall as the difference grows
        mid = (lo + hi) / 2
        if paired_episodes_needed(mid, discordant, z_alpha, z_power) <= n:
            hi = mid
        else:
            lo = mid
    return hi


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="how many paired eval episodes a comparison needs (McNemar, 5%, 80% power)")
    ap.add_argument("--discordant", type=float, required=True,
                    help="share of episodes solved by exactly one policy, from an earlier comparison: (gained + lost) / n")
    ap.add_argument("--diff", type=float, nargs="*", default=[0.02, 0.03, 0.05, 0.10],
                    help="true differences of success (fractions) to size for")
    ap.add_argument("--episodes", type=int, nargs="*", default=[28, 140, 300],
                    help="episode counts whose smallest detectable difference to print")
    a = ap.parse_args()
    if not 0 < a.discordant <= 1 or any(d <= 0 for d in a.diff) or any(n < 1 for n in a.episodes):
        ap.error("need 0 < --discordant <= 1, every --diff above 0 and every --episodes at least 1")
    for d in a.diff:
        if d <= a.discordant:
            print(f"difference {d:+.1%}: {paired_episodes_needed(d, a.discordant)} episodes")
        else:
            print(f"difference {d:+.1%}: larger than the discordant share {a.discordant:.1%}, impossible")
    for n in a.episodes:
        d = paired_detectable(n, a.discordant)
        print(f"{n} episodes: " + ("no difference detectable" if d is None else f"detect {d:+.1%} or more"))
