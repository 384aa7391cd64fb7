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
    cur = curriculum.Curriculum(["a", "b", "c"], group_size=2, decay=1.0, min_weight=0.0)
    # a: 3 groups with signal of 3 -> weight 4/5; b: 0 of 3 -> 1/5; c: never drawn -> 1/2
    cur.update([traj("a", s, r) for s in range(3) for r in (1.0, 0.0)] + [traj("b", s, 1.0) for s in range(6)])
    cur.merge(1)
    w = {"a": 0.8, "b": 0.2, "c": 0.5}
    # task t is drawn w.p. w_t / sum(w) and then has signal at rate w_t
    assert cur.signal_share() == pytest.approx((0.64 + 0.04 + 0.25) / 1.5)
    cur.leave_out(["c"])
    assert cur.signal_share() == pytest.approx((0.64 + 0.04) / 1.0)
    assert "curriculum/p/c" not in cur.metrics() and cur.metrics()["curriculum/weight/a"] == pytest.approx(w["a"])
    uniform = curriculum.Curriculum(["a", "b", "c"], group_size=2, decay=1.0, min_weight=0.0, uniform=True)
    uniform.load(cur.state())
    assert uniform.signal_share() == pytest.approx((0.8 + 0.2) / 2)  # drawn in turn: the mean weight


class SolvedPage:
    """One step: click('1') is rewarded on click-button and focus-text, never on enter-text. click-link's
    pages never load (env_error), and focus-text's first page does not either."""

    lock = threading.Lock()
    resets: Counter = Counter()

    def __init__(self, task):
        self.task = task

    def reset(self, seed, task=None):
        self.task = task or self.task
        with self.lock:
            SolvedPage.resets[self.task] += 1
            first = SolvedPage.resets[self.task] == 1
        broken = self.task == "click-link" or (self.task == "focus-text" and first)
        return SimpleNamespace(text="Goal: click one\nURL: fake.html\n[1] button 'one'", goal="x", env_error=broken,
                               error="page did not load" if broken else "")

    def step(self, text):
        ok = "click('1')" in text and self.task in ("click-button", "focus-text")
        return SimpleNamespace(text="", goal="x", env_error=False), float(ok), True, {
            "action": text, "error": "", "success": ok, "env_error": False}

    def close(self):
        pass


class GreedyOnly(MixedReplies):
    """Answers click('1'), and records the temperatures and prompts it was asked for."""

    def __init__(self, tok):
        super().__init__(tok)
        self.temperatures, self.calls = [], 0

    def generate(self, prompts, **kw):
        self.temperatures.append(kw.get("temperature"))
        return super().generate(prompts, **kw)


def test_probe_leaves_out_the_tasks_the_start_policy_solves(tok, capsys, monkeypatch):
    tasks = ["click-button", "enter-text", "click-link", "focus-text"]
    args = train.parse_args(["--mode", "real", "--tasks", ",".join(tasks), "--probe-seeds", "3",
                             "--max-new-tokens", "8"])
    SolvedPage.resets.clear()
    gen = GreedyOnly(tok)
    pool = EnvPool(SolvedPage, tok, num_envs=2)
    try:
        probed, steps = real.probe(args, gen, tok, pool, 0, 1)
        # two ranks: each rolls out its share, the counts are summed over both (all_sums stood in for)
        shares = []
        monkeypatch.setattr(real.distributed, "all_sums", lambda flat, world: shares.append(flat) or flat)
        SolvedPage.resets.clear()
        rank0, rank1 = (real.probe(args, gen, tok, pool, r, 2)[0] for r in (0, 1))
    finally:
        pool.close()
    assert set(gen.temperatures) == {0.0}  # greedy, as the evaluation
    # enter-text: 0 of 3; click-link: no valid episode; focus-text: 2 of 2 valid (its first page broke)
    assert probed == {"click-button": (3, 3), "enter-text": (0, 3), "click-link": (0, 0), "focus-text": (2, 2)}
    assert steps == 3 + 3 + 2  # one real step a valid episode; a page that never loaded took none
    summed = [a + b for a, b in zip(*shares)]
    assert sum(shares[0][1::2]) + sum(shares[1][1::2]) == 3 * 3 - 1  # 12 jobs split across ranks, 3 + 1 env_error
    assert sum(shares[0][1::2]) and sum(shares[1][1::2])  # each rank rolled out a share
    assert summed[0:2] == [3.0, 3.0] and summed[2:4] == [0.0, 3.0]
    cur = curriculum.Curriculum(args.tasks, args.group_size)
    # only click-button was solved on all 3: a task with an episode lost to env_error stays in
    assert real.leave_out_solved(cur, probed, 3) == ["click-button"]
    assert cur.drawable() == ["enter-text", "click-link", "focus-text"]
    everything = curriculum.Curriculum(["click-button", "enter-text"], args.group_size)  # all solved: none left out
    assert real.leave_out_solved(everything, {"click-button": (3, 3), "enter-text": (3, 3)}, 3) == []
    import webarena_lite

    for v in webarena_lite.SITE_VARS:  # a WebArena-Lite run's sites (never contacted by parse_args)
        monkeypatch.setenv(v, "http://gpu-node:1")
    for argv, message in ((["--mode", "bc", "--probe-seeds", "3"],
                           "--probe-seeds N (>= 0) applies to --mode real and dream"),
                          (["--mode", "real", "--benchmark", "webarena-lite", "--probe-seeds", "3"],
                           "every seed of a webarena-lite task is the same episode"),
                          (["--mode", "real", "--probe-seeds", "10001"], "only 10000 training seeds")):
        with pytest.raises(SystemExit):
            train.parse_args(argv)
        assert message in capsys.readouterr().err


def test_bc_batch_draws_expert_turns_only_of_the_tasks_left_out(tok, tmp_path):
    # --bc-coef's anchor (real.bc_batch): expert turns of the tasks the probe left out (click-button
    # here, never enter-text, which RL trains on), --bc-trajectories / world of them per rank,
    # prompts exactly as BC builds them; with nothing left out, every task; none of a task: an error.
    import json

    import supervised

    path = tmp_path / "demos.jsonl"
    with open(path, "w") as f:
        for task, n in (("click-button", 6), ("enter-text", 6)):
            for i in range(n):
                obs = f"Goal: {task} {i}\nURL: file:///m/{task}.html\n[12] button 'b{i}'"
                f.write(json.dumps({"task": task, "seed": i, "success": True, "reward": 1.0, "env_error": False,
                                    "turns": [{"observation": obs, "action": "click('12')", "error": ""}]}) + "\n")
    args = train.parse_args(["--mode", "real", "--tasks", "click-button,enter-text", "--demos", str(path),
                             "--bc-coef", "1", "--bc-trajectories", "4"])
    demos = supervised.expert_trajectories(args.demos, args.tasks)
    cur = curriculum.Curriculum(args.tasks, args.group_size)
    expected = {tuple(p): r for t in demos for p, r in supervised.expert_turns(t, tok, args)}
    both = real.bc_batch(args, demos, cur, tok, 0, 0, 1)
    cur.leave_out(["click-button"])
    one = real.bc_batch(args, demos, cur, tok, 0, 0, 1)
    half = real.bc_batch(args, demos, cur, tok, 1, 1, 2)
    text = lambda samples: [tok.decode(p) for p, _ in samples]
    assert len(both) == len(one) == 4 and len(half) == 2
    assert all(expected[tuple(p)] == r for p, r in both + one + half)  # BC's own (prompt, reply) pairs
    assert all("click-button" in x and "enter-text" not in x for x in text(one) + text(half))
    assert sum("enter-text" in x for x in text(both)) == 2  # dealt task by task (supervised.expert_deal)
    pool = [t for t in demos if t["task"] == "click-button"]
    assert one == [s for t in supervised.expert_deal(pool, 4, 0, args.seed) for s in supervised.expert_turns(t, tok, args)]
    r0, r1 = (real.bc_batch(args, demos, cur, tok, 0, r, 2) for r in (0, 1))  # two ranks share one deal
    assert len(r0) == len(r1) == 2 and not set(text(r0)) & set(text(r1))
    assert real.bc_batch(args, demos, cur, tok, 0, 0, 1) == one  # the same draw for the same (iteration, rank)
    cur2 = curriculum.Curriculum(["click-button", "enter-text", "focus-text"], args.group_size)
    cur2.leave_out(["focus-text"])
    with pytest.raises(ValueError, match="no successful expert trajectory"):
        real.bc_batch(args, demos, cur2, tok, 0, 0, 1)
