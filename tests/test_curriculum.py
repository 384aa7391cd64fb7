"""Signal in every batch: the curriculum's weights and dynamic sampling, with fake pages and rewards."""
import random
import threading
from collections import Counter
from types import SimpleNamespace

import pytest

import curriculum
import real
import train
from rollout import EnvPool


def traj(task, seed, reward, env_error=False):
    return {"task": task, "seed": seed, "reward": reward, "success": reward == 1.0, "env_error": env_error,
            "turns": [], "steps": 1}


def test_split_by_signal_by_hand():
    ts = [traj("a", 0, 1.0), traj("a", 0, 0.0),                       # signal
          traj("a", 1, 1.0), traj("a", 1, 1.0),                       # all equal
          traj("b", 2, 1.0), traj("b", 2, 0.0, env_error=True),       # one valid member: no signal
          traj("b", 3, 0.0), traj("b", 3, 0.0)]                       # all equal
    keep, drop = curriculum.split_by_signal(ts, 2)
    assert [g[0]["seed"] for g in keep] == [0] and [g[0]["seed"] for g in drop] == [1, 2, 3]


def test_weights_follow_each_tasks_share_of_groups_with_signal():
    cur = curriculum.Curriculum(["a", "b", "c"], group_size=2, decay=1.0, min_weight=0.05)
    assert cur.weight("a") == cur.weight("b") == 0.5  # the prior
    # task a: 3 groups, all with signal; b: 3 groups, none; c: not drawn
    cur.update([traj("a", s, r) for s in range(3) for r in (1.0, 0.0)] + [traj("b", s, 1.0) for s in range(6)])
    cur.merge(1)
    assert cur.weight("a") == pytest.approx(4 / 5) and cur.weight("b") == pytest.approx(1 / 5)
    assert cur.weight("c") == 0.5 and cur.rate("b") == pytest.approx(7 / 8)  # b always succeeds: p high, no signal
    draws = [t for t, _ in cur.draw(3000, random.Random(0))]
    assert draws.count("a") > draws.count("c") > draws.count("b")
    state = cur.state()
    again = curriculum.Curriculum(["a", "b", "c"], group_size=2)
    again.load(state)
    assert again.weight("a") == cur.weight("a") and again.rate("b") == cur.rate("b")


class MixedPage:
    """One step; reward for click('1'). Seeds divisible by 3 are 'mixed' pages: there the k-th reset of a
    seed (over all envs) is rewarded only for even k, so a group's G = 2 members (two consecutive resets of
    its seed, whichever envs and threads run them, in whatever order) get one 1 and one 0; elsewhere a
    reply earns nothing. (The draws are seeded, so no seed repeats within a collect in these tests.)"""

    resets: Counter = Counter()
    lock = threading.Lock()

    def __init__(self, task):
        self.task = task

    def reset(self, seed, task=None):
        with MixedPage.lock:
            self.k = MixedPage.resets[seed]
            MixedPage.resets[seed] += 1
        self.mixed = seed % 3 == 0
        return SimpleNamespace(text=f"Goal: click one\nURL: fake.html\n[1] button 'one'", goal="x", env_error=False)

    def step(self, text):
        ok = "click('1')" in text and self.mixed and self.k % 2 == 0
        info = {"action": text, "error": "", "success": ok, "env_error": False}
        return SimpleNamespace(text="", goal="x", env_error=False), float(ok), True, info

    def close(self):
        pass


class MixedReplies:
    """A generator that always answers `text`, click('1') by default (whether it earns a reward is the page's
    business)."""

    def __init__(self, tok, text="click('1')"):
        self.tok, self.text = tok, text

    def generate(self, prompts, **kw):
        import policy

        ids = self.tok.encode(self.text, add_special_tokens=False) + [self.tok.eos_token_id]
        return [policy.Sample(ids=ids, logprobs=[0.0] * len(ids), text=self.text) for _ in prompts]

    def push_weights(self, model):
        pass


@pytest.mark.parametrize("cap", [3.0, 0.0])
def test_dynamic_sampling_fills_the_batch_with_groups_that_have_signal(tok, cap):
    args = train.parse_args(["--mode", "real", "--tasks", "click-button", "--groups-per-iter", "4", "--group-size", "2",
                             "--dynamic-sampling", str(cap), "--max-new-tokens", "8"])
    cur = curriculum.Curriculum(args.tasks, args.group_size)
    MixedPage.resets.clear()
    pool = EnvPool(MixedPage, tok, num_envs=4)
    try:
        kept, rolled, counts = real.collect(args, cur, MixedReplies(tok), tok, pool, 0, 0, 1)
        assert len({t["seed"] for t in rolled}) == len(rolled) // 2  # (no seed drawn twice: see MixedPage)
    finally:
        pool.close()
    groups = [kept[k:k + 2] for k in range(0, len(kept), 2)]
    mixed = lambda g: g[0]["seed"] % 3 == 0  # noqa: E731
    if cap:  # only groups with signal are trained on, as many as asked, and the draws are counted
        assert len(groups) == 4 and all({t["reward"] for t in g} == {0.0, 1.0} for g in groups)
        assert counts["groups_kept"] >= 4 and counts["groups_drawn"] == len(rolled) // 2 <= 12
        assert counts["groups_drawn"] > 4  # (a third of the pages are mixed: more groups were drawn)
    else:  # off: the groups as drawn, signal or not
        assert len(groups) == 4 and counts["groups_drawn"] == 4 and len(rolled) == 8
    assert all(mixed(g) == ({t["reward"] for t in g} == {0.0, 1.0}) for g in groups)


def test_dynamic_sampling_stops_at_its_cap(tok):
    args = train.parse_args(["--mode", "real", "--tasks", "click-button", "--groups-per-iter", "2", "--group-size", "2",
                             "--dynamic-sampling", "2", "--max-new-tokens", "8"])

    wrong = MixedReplies(tok, "click('2')")  # never the rewarded action: no group has signal
    pool = EnvPool(MixedPage, tok, num_envs=2)
    try:
        kept, rolled, counts = real.collect(args, curriculum.Curriculum(args.tasks, 2), wrong, tok, pool, 0, 0, 1)
    finally:
        pool.close()
    assert kept == [] and counts["groups_drawn"] == 4 and counts["groups_kept"] == 0  # 2 x 2 groups, then it stops


def test_tasks_left_out_are_never_drawn_and_survive_a_resume():
    cur = curriculum.Curriculum(["a", "b", "c"], group_size=2, decay=1.0)
    cur.leave_out(["b"])
    assert cur.weight("b") == 0.0 and cur.drawable() == ["a", "c"]
    assert {t for t, _ in cur.draw(300, random.Random(0))} == {"a", "c"}
    with pytest.raises(ValueError, match="no task to draw"):
        cur.leave_out(["a", "c"])
    with pytest.raises(ValueError, match="not in the curriculum"):
        cur.leave_out(["d"])
    again = curriculum.Curriculum(["a", "b", "c"], group_size=2, uniform=True)
    again.load(cur.state())
    assert again.left_out == ["b"] and {t for t, _ in again.draw(6, random.Random(0))} == {"a", "c"}


def test_expected_signal_share_of_a_weighted_draw():
    cur = curriculum.Curriculum(["a", "b"], group_size=2, decay=1.0, min_weight=0.0)
    # a: 3 groups with signal of 3 -> weight 4/5; b: 0 of 3 -> 1/5
    cur.update([traj("a", s, r) for s in range(3) for r in (1.0, 0.0)] + [traj("b", s, 1.0) for s in range(6)])
    cur.merge(1)
    # drawn a w.p. 4/5 (signal 4/5), b w.p. 1/5 (signal 1/5): 16/25 + 1/25
    assert cur.signal_share() == pytest.approx(17 / 25)


class SolvedPage:
    """One step: click('1') is rewarded on click-button, never on enter-text."""

    def __init__(self, task):
        self.task = task

    def reset(self, seed, task=None):
        self.task = task or self.task
        return SimpleNamespace(text="Goal: click one\nURL: fake.html\n[1] button 'one'", goal="x", env_error=False)

    def step(self, text):
        ok = "click('1')" in text and self.task == "click-button"
        return SimpleNamespace(text="", goal="x", env_error=False), float(ok), True, {
            "action": text, "error": "", "success": ok, "env_error": False}

    def close(self):
        pass


def test_probe_leaves_out_the_tasks_the_start_policy_solves(tok, capsys):
    args = train.parse_args(["--mode", "real", "--tasks", "click-button,enter-text", "--probe-seeds", "3",
                             "--max-new-tokens", "8"])
    pool = EnvPool(SolvedPage, tok, num_envs=2)
    try:
        probed = real.probe(args, MixedReplies(tok), tok, pool, 0, 1)
    finally:
        pool.close()
    assert probed == {"click-button": (3, 3), "enter-text": (0, 3)}
    cur = curriculum.Curriculum(args.tasks, args.group_size)
    assert real.leave_out_solved(cur, probed) == ["click-button"] and cur.drawable() == ["enter-text"]
    everything = curriculum.Curriculum(args.tasks, args.group_size)  # all solved: nothing is left out
    assert real.leave_out_solved(everything, {"click-button": (3, 3), "enter-text": (2, 2)}) == []
    with pytest.raises(SystemExit):
        train.parse_args(["--mode", "dream", "--real-ratio", "1", "--probe-seeds", "3"])
    assert "--probe-seeds N (>= 0) applies to --mode real" in capsys.readouterr().err
