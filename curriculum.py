"""Which (task, seed) groups to roll out: a task curriculum from running signal rates, and dynamic
sampling's test of whether a group teaches anything.

    cur = Curriculum(tasks, group_size=4)
    groups = cur.draw(8, rng)                           # [(task, seed)], tasks weighted by expected signal
    cur.update(trajectories); cur.merge(world)          # running counts, summed over ranks
    cur.leave_out(["click-button"])                     # never drawn again (real.probe: solved at the start)
    kept, dropped = split_by_signal(trajectories, 4)    # groups whose rewards differ / are all equal

A group whose G rewards are all equal has advantage 0 for every member: it costs a rollout and
teaches nothing (WebAgent-R1's binary reward makes this the common case). Two levers, both from the
field:

- the curriculum weighs each task by the running share of its groups that had signal (a Beta(1, 1)
  prior over decayed counts: a task not drawn lately drifts back towards 1/2), floored at
  `min_weight` so that the weights alone drop no task for good (a solved task can regress). The share is
  measured, not derived from the task's success rate p as 1 - p^G - (1 - p)^G: a peaked policy
  succeeds on some pages of a task and fails on others, but on one page (one group) its G samples
  mostly agree, so the task's p overstates the signal (measured: p between 0.1 and 0.9 on most
  tasks, 17-44% of groups with signal);
- dynamic sampling (DAPO, Yu et al. 2025) keeps drawing groups until the batch holds the requested
  number of groups with signal, up to a cap (train.py), and trains on those only;
- tasks left out: real.probe runs the start policy greedily on a few training seeds of every task
  and leaves out the tasks it solves on every one of them (`--probe-seeds`; a task with a probe
  episode lost to env_error stays in). The running weights cannot do
  this on their own: a task not drawn lately drifts back to 1/2, so with 15 tasks most draws went
  to solved tasks (rl-e6: 67-83% of the groups without signal), and training on them moved the
  solved tasks rather than the failing ones (docs/rl.md).
"""
from __future__ import annotations

import random

import distributed
import env as webenv

_KEYS = ("groups", "signal", "episodes", "successes")


def split_by_signal(trajectories: list[dict], group_size: int) -> tuple[list[list[dict]], list[list[dict]]]:
    """Cut trajectories (in rollout order: G consecutive members per group) into groups, and split
    them into (groups with signal: rewards not all equal among the members without env_error,
    groups without). A group with fewer than two valid members has no signal."""
    groups = [trajectories[k:k + group_size] for k in range(0, len(trajectories), group_size)]
    keep, drop = [], []
    for g in groups:
        valid = [t for t in g if not t["env_error"]]
        (keep if len({t["reward"] for t in valid}) > 1 and len(valid) >= 2 else drop).append(g)
    return keep, drop


class Curriculum:
    """Running per-task counts (groups drawn, groups with signal, episodes, successes) and the task
    weights they give (module docstring).

    decay: each merge multiplies the old counts by it first. uniform=True: no weights, the tasks in a
    fixed cycle (the plain schedule): group k of a draw on rank r is the cycle's position
    (groups drawn before) * world + r + k * world, so the ranks share one cycle without collectives.
    """

    def __init__(self, tasks: list[str], group_size: int, *, decay: float = 0.7, min_weight: float = 0.05,
                 uniform: bool = False, rank: int = 0, world: int = 1):
        if not tasks:
            raise ValueError("a curriculum needs at least one task")
        self.tasks, self.group_size, self.decay, self.min_weight = list(tasks), group_size, decay, min_weight
        self.uniform, self.rank, self.world = uniform, rank, world
        self.counts = {t: dict.fromkeys(_KEYS, 0.0) for t in self.tasks}
        self._pending = {t: dict.fromkeys(_KEYS, 0.0) for t in self.tasks}  # this rank's, since the last merge
        self._cycle = 0
        self.left_out: list[str] = []

    def leave_out(self, tasks) -> None:
        """Never draw these tasks again (weight 0; they stay in the counts and the log).
        Raises ValueError for a task not in the curriculum, or when no task would be left."""
        tasks = list(dict.fromkeys(tasks))
        unknown = [t for t in tasks if t not in self.counts]
        if unknown:
            raise ValueError(f"not in the curriculum: {', '.join(unknown)}")
        if set(self.tasks) <= set(tasks) | set(self.left_out):
            raise ValueError("leaving these out leaves no task to draw")
        self.left_out = [t for t in self.tasks if t in set(tasks) | set(self.left_out)]

    def drawable(self) -> list[str]:
        """The tasks draws come from: all but the ones left out."""
        return [t for t in self.tasks if t not in self.left_out]

    def rate(self, task: str) -> float:
        """The task's running success rate (posterior mean, Beta(1, 1) prior), for the log."""
        c = self.counts[task]
        return (c["successes"] + 1.0) / (c["episodes"] + 2.0)

    def weight(self, task: str) -> float:
        """The task's running share of groups with signal (posterior mean, Beta(1, 1) prior), floored;
        0 for a task left out."""
        if task in self.left_out:
            return 0.0
        c = self.counts[task]
        return max(self.min_weight, (c["signal"] + 1.0) / (c["groups"] + 2.0))

    def draw(self, n: int, rng: random.Random) -> list[tuple[str, int]]:
        """n (task, train seed) groups: tasks drawn with probability proportional to their weight
        (or in the fixed cycle when uniform), seeds uniformly from env.TRAIN_SEEDS; never a task left out."""
        pool = self.drawable()
        if self.uniform:
            tasks = [pool[(self._cycle * self.world + self.rank + k * self.world) % len(pool)] for k in range(n)]
            self._cycle += n
        else:
            tasks = rng.choices(pool, weights=[self.weight(t) for t in pool], k=n)
        return [(t, rng.choice(webenv.TRAIN_SEEDS)) for t in tasks]

    def update(self, trajectories: list[dict]) -> None:
        """Count this rank's finished groups (G consecutive trajectories, as rollout returns a draw)
        and episodes; env_error episodes say nothing about the policy."""
        keep, drop = split_by_signal(trajectories, self.group_size)
        for groups, signal in ((keep, 1.0), (drop, 0.0)):
            for g in groups:
                c = self._pending.get(g[0]["task"])
                if c is None:
                    continue
                c["groups"] += 1.0
                c["signal"] += signal
                for t in g:
                    if not t["env_error"]:
                        c["episodes"] += 1.0
                        c["successes"] += float(t["success"])

    def merge(self, world: int) -> None:
        """Decay the old counts and add every rank's new ones (collective: every rank calls it), so
        that all ranks draw with the same weights."""
        flat = distributed.all_sums([self._pending[t][k] for t in self.tasks for k in _KEYS], world)
        for i, t in enumerate(self.tasks):
            for j, k in enumerate(_KEYS):
                self.counts[t][k] = self.decay * self.counts[t][k] + flat[i * len(_KEYS) + j]
                self._pending[t][k] = 0.0

    def state(self) -> dict:
        """What a checkpoint stores to resume the same schedule."""
        return {"counts": {t: dict(c) for t, c in self.counts.items()}, "cycle": self._cycle,
                "left_out": list(self.left_out)}

    def load(self, state: dict) -> None:
        for t in self.tasks:
            saved = state.get("counts", {}).get(t, {})
            self.counts[t] = {k: float(saved.get(k, 0.0)) for k in _KEYS}
        self._cycle = int(state.get("cycle", 0))
        self.left_out = [t for t in self.tasks if t in state.get("left_out", [])]

    def signal_share(self) -> float:
        """The expected share of groups with signal in a weighted draw: sum(w^2) / sum(w) over the
        drawable tasks (task t is drawn with probability w_t / sum(w) and has signal at rate w_t;
        uniform draws: the mean weight). dynamic sampling's first over-draw (real.collect)."""
        w = [self.weight(t) for t in self.drawable()]
        return sum(w) / len(w) if self.uniform else sum(x * x for x in w) / sum(w)

    def metrics(self) -> dict:
        """curriculum/p/<task> (success rate) and curriculum/weight/<task> (share of groups with signal),
        for the tasks drawn from (a task left out has no counts: its prior would read as 50%)."""
        out = {}
        for t in self.drawable():
            out[f"curriculum/p/{t}"] = self.rate(t)
            out[f"curriculum/weight/{t}"] = self.weight(t)
        return out
