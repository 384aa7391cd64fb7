"""Which (task, seed) groups to roll out: a task curriculum from running success rates, and dynamic
sampling's test of whether a group teaches anything.

    cur = Curriculum(tasks, group_size=4)
    groups = cur.draw(8, rng)                       # [(task, seed)], tasks weighted by expected signal
    cur.update(trajectories); cur.merge(world)      # running success rates, summed over ranks
    kept, dropped = split_by_signal(trajectories)   # groups whose rewards differ / are all equal

A group whose G rewards are all equal has advantage 0 for every member: it costs a rollout and
teaches nothing (WebAgent-R1's binary reward makes this the common case once a task is mostly
solved or mostly failed). Two levers, both from the field:

- the curriculum weighs each task by the chance that a group of it has signal,
  q = 1 - p^G - (1 - p)^G, with p the task's running success rate at the sampling temperature
  (a Beta(1, 1) prior over decayed counts, so a task not seen lately drifts back towards p = 1/2),
  floored at `min_weight` so that no task is dropped for good (a solved task can regress);
- dynamic sampling (DAPO, Yu et al. 2025) keeps drawing groups until the batch holds the requested
  number of groups with signal, up to a cap (train.py), and trains on those only.
"""
from __future__ import annotations

import random

import distributed
import env as webenv


class Curriculum:
    """Running per-task success counts and the task weights they give (module docstring).

    decay: each merge multiplies the old counts by it first. uniform=True: no weights, the tasks in a
    fixed cycle (the plain schedule): group k of a draw on rank r is the cycle's position
    (groups drawn before) * world + r + k * world, so the ranks share one cycle without collectives.
    """

    def __init__(self, tasks: list[str], group_size: int, *, decay: float = 0.7, min_weight: float = 0.05,
                 uniform: bool = False, rank: int = 0, world: int = 1):
        if not tasks:
            raise ValueError("a curriculum needs at least one task")
        self.tasks, self.group_size, self.decay, self.min_weight, self.uniform = list(tasks), group_size, decay, min_weight, uniform
        self.successes = {t: 0.0 for t in self.tasks}
        self.episodes = {t: 0.0 for t in self.tasks}
        self._pending = {t: [0.0, 0.0] for t in self.tasks}  # this rank's counts since the last merge
        self._cycle, self.rank, self.world = 0, rank, world

    def rate(self, task: str) -> float:
        """The task's running success rate: the mean of a Beta(1 + s, 1 + n - s) posterior."""
        return (self.successes[task] + 1.0) / (self.episodes[task] + 2.0)

    def weight(self, task: str) -> float:
        """The chance that a group of this task has signal, 1 - p^G - (1-p)^G, floored at min_weight."""
        p, g = self.rate(task), self.group_size
        return max(self.min_weight, 1.0 - p ** g - (1.0 - p) ** g)

    def draw(self, n: int, rng: random.Random) -> list[tuple[str, int]]:
        """n (task, train seed) groups: tasks drawn with probability proportional to their weight
        (or cycling through the tasks when uniform), seeds uniformly from env.TRAIN_SEEDS."""
        if self.uniform:
            tasks = [self.tasks[(self._cycle * self.world + self.rank + k * self.world) % len(self.tasks)]
                     for k in range(n)]
            self._cycle += n
        else:
            tasks = rng.choices(self.tasks, weights=[self.weight(t) for t in self.tasks], k=n)
        return [(t, rng.choice(webenv.TRAIN_SEEDS)) for t in tasks]

    def update(self, trajectories: list[dict]) -> None:
        """Count this rank's finished episodes (env_error ones say nothing about the policy)."""
        for t in trajectories:
            if not t["env_error"] and t["task"] in self._pending:
                self._pending[t["task"]][0] += float(t["success"])
                self._pending[t["task"]][1] += 1.0

    def merge(self, world: int) -> None:
        """Decay the old counts and add every rank's new ones (collective: every rank calls it), so
        that all ranks draw with the same weights."""
        flat = distributed.all_sums([x for t in self.tasks for x in self._pending[t]], world)
        for k, t in enumerate(self.tasks):
            self.successes[t] = self.decay * self.successes[t] + flat[2 * k]
            self.episodes[t] = self.decay * self.episodes[t] + flat[2 * k + 1]
            self._pending[t] = [0.0, 0.0]

    def state(self) -> dict:
        """What a checkpoint stores to resume the same schedule."""
        return {"successes": dict(self.successes), "episodes": dict(self.episodes), "cycle": self._cycle}

    def load(self, state: dict) -> None:
        for t in self.tasks:
            self.successes[t] = float(state.get("successes", {}).get(t, 0.0))
            self.episodes[t] = float(state.get("episodes", {}).get(t, 0.0))
        self._cycle = int(state.get("cycle", 0))

    def metrics(self) -> dict:
        """curriculum/p/<task> and curriculum/weight/<task> for the log."""
        out = {}
        for t in self.tasks:
            out[f"curriculum/p/{t}"] = self.rate(t)
            out[f"curriculum/weight/{t}"] = self.weight(t)
        return out


def split_by_signal(trajectories: list[dict], group_size: int) -> tuple[list[list[dict]], list[list[dict]]]:
    """Cut trajectories (in rollout order: G consecutive members per group) into groups, and split
    them into (groups with signal: rewards not all equal among the members without env_error,
    groups without). A group with fewer than two valid members has no signal."""
    groups = [trajectories[k:k + group_size] for k in range(0, len(trajectories), group_size)]
    keep, drop = [], []
    for g in groups:
        rewards = {t["reward"] for t in g if not t["env_error"]}
        valid = sum(1 for t in g if not t["env_error"])
        (keep if len(rewards) > 1 and valid >= 2 else drop).append(g)
    return keep, drop
