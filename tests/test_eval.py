"""eval.py's statistics (stats.py) and comparisons, checked by hand; its flags."""
import numpy as np
import pytest

import compress
import eval as webeval
import stats


def test_wilson_by_hand():
    lo, hi = stats.wilson(0, 10)
    assert lo == 0.0 and abs(hi - 0.2775) < 1e-4  # z^2/(n+z^2) = 3.8416/13.8416
    lo, hi = stats.wilson(5, 10)
    assert abs(lo - 0.2366) < 1e-4 and abs(hi - 0.7634) < 1e-4
    assert stats.wilson(0, 0) == (0.0, 1.0)


def test_wilson_holds_the_observed_rate_at_every_count_up_to_3000():
    # every 0 <= s <= n <= 3000 at once (4.5 million intervals; the array form gives the scalar floats)
    sizes = np.arange(2, 3002)  # n + 1 values of s for each n
    n = np.repeat(np.arange(1, 3001), sizes)
    s = np.arange(len(n)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    lo, hi = stats.wilson(s, n)
    assert ((lo <= s / n) & (s / n <= hi) & (0 <= lo) & (hi <= 1)).all()
    assert (lo[s == 0] == 0.0).all() and (hi[s == n] == 1.0).all()  # exactly, not 2.8e-17 or 1 - 1e-16
    for k in np.random.default_rng(0).integers(0, len(n), 500):
        assert stats.wilson(int(s[k]), int(n[k])) == (lo[k], hi[k])
    for m in range(1, 3001):  # the scalar form at the boundaries
        assert stats.wilson(0, m)[0] == 0.0 and stats.wilson(m, m)[1] == 1.0
    with pytest.raises(ValueError):
        stats.wilson(np.array([1, 4]), np.array([2, 3]))


@pytest.mark.parametrize("think", [False, True])
def test_a_prompt_budget_below_the_system_prompt_and_header_is_a_usage_error(tok, think, capsys):
    system = compress.THINK_SYSTEM_PROMPT if think else compress.SYSTEM_PROMPT
    least = compress.min_tokens(tok, system)
    assert 30 < least < 200
    with pytest.raises(SystemExit) as e:
        webeval.main(["--max-prompt-tokens", "16", "--think" if think else "--no-think"])
    assert e.value.code == 2 and f"use at least {least}" in capsys.readouterr().err
    import train

    with pytest.raises(SystemExit) as e:
        train.parse_args(["--mode", "real", "--max-prompt-tokens", str(least - 1), "--think" if think else "--no-think"])
    assert e.value.code == 2 and f"use at least {least}" in capsys.readouterr().err
    assert train.parse_args(["--mode", "real", "--max-prompt-tokens", str(least), "--think" if think else "--no-think"])
    # the smallest budget works: a prompt within it, whatever the observation
    ids = compress.build_prompt(tok, [], "Goal: click the long button\nURL: x.html\n" + "[3] button 'a'\n" * 50,
                                max_tokens=least, system=system)
    assert len(ids) <= least and "Goal: " in tok.decode(ids)
    with pytest.raises(ValueError, match=f"smallest workable budget is {least}"):
        compress.build_prompt(tok, [], "Goal: x\nURL: y", max_tokens=least - 1, system=system)


def traj(task, success, env_error=False, steps=2):
    return {"task": task, "success": success, "env_error": env_error, "steps": steps}


def test_env_error_is_neither_success_nor_failure():
    trajs = [traj("a", True), traj("a", False), traj("a", False, env_error=True),
             traj("b", False, env_error=True)]
    s = stats.summarise(trajs, ["a", "b"])
    assert s["tasks"]["a"]["success"] == 0.5 and s["tasks"]["a"]["n"] == 2 and s["tasks"]["a"]["env_error"] == 1
    assert s["tasks"]["b"]["success"] is None and s["tasks"]["b"]["n"] == 0  # nothing measured, not a 0
    assert s["mean"]["success"] == 0.5 and s["mean"]["task_mean"] == 0.5 and s["mean"]["env_error"] == 2
    assert "| b | n/a |" in webeval.markdown(s, "t")


def test_compare_counts_only_the_episodes_every_run_has(tmp_path, capsys):
    import json

    import pytest

    def write(name, rows):
        d = tmp_path / name
        d.mkdir()
        (d / "trajectories.jsonl").write_text("".join(
            json.dumps({"task": t, "seed": s, "success": ok, "env_error": False, "steps": n}) + "\n" for t, s, ok, n in rows))
        return str(d)
    # run a has 3 seeds of task x (2 successes), run b only seeds 0 and 1: seed 2 is left out of both
    a = write("a", [("x", 0, True, 1), ("x", 1, False, 3), ("x", 2, True, 1), ("y", 0, True, 2)])
    b = write("b", [("x", 0, False, 6), ("x", 1, False, 6), ("y", 0, True, 1)])
    webeval.main(["--compare", f"A={a}", b])
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"| task | A | {b} |"  # a folder without a label is named by its path
    assert "| x | 50% | 0% |" in out and "| y | 100% | 100% |" in out
    assert "| **mean (95% CI)** | **66.7%** (21%-94%) | **33.3%** (6%-79%) |" in out  # wilson(2, 3), wilson(1, 3)
    assert "| episodes | 3 | 3 |" in out and "| real steps | 6 | 13 |" in out
    with pytest.raises(FileNotFoundError, match="trajectories.jsonl"):
        webeval.compare([("none", str(tmp_path / "none"))])
    with pytest.raises(SystemExit):  # two columns with one label: one run would hide the other
        webeval.main(["--compare", a, a])
    assert webeval._label("runs/bc/final/eval/") == "runs/bc/final" and webeval._label("runs/x") == "runs/x"
    c = write("c", [("z", 9, True, 1)])
    with pytest.raises(ValueError, match="share no"):
        webeval.compare([("a", a), ("c", c)])


def test_paired_difference_and_mcnemar_by_hand(tmp_path):
    import math

    # 300 shared episodes: 17 gained, 10 lost (the README's first M-GRPO run), the rest equal
    a = {("t", i): i < 184 for i in range(300)}
    b = {("t", i): (i < 174) or (184 <= i < 201) for i in range(300)}
    p = stats.paired(a, b)
    assert (p["n"], p["gained"], p["lost"]) == (300, 17, 10)
    assert abs(p["diff"] - 7 / 300) < 1e-12
    half = 1.96 * math.sqrt(27 - 49 / 300) / 300  # Wald interval of a paired difference
    assert abs(p["ci95"][0] - (7 / 300 - half)) < 1e-12 and abs(p["ci95"][1] - (7 / 300 + half)) < 1e-12
    assert abs(p["p"] - 2 * sum(math.comb(27, k) for k in range(11)) / 2 ** 27) < 1e-12  # exact McNemar, 0.248
    assert round(p["p"], 2) == 0.25 and round(100 * p["ci95"][0], 2) == -1.05 and round(100 * p["ci95"][1], 1) == 5.7
    assert stats.mcnemar_exact(0, 0) == 1.0 and stats.mcnemar_exact(5, 0) == 2 / 32


def test_compare_prints_the_paired_difference(tmp_path, capsys):
    import json

    def write(name, wins):
        d = tmp_path / name
        d.mkdir()
        (d / "trajectories.jsonl").write_text("".join(
            json.dumps({"task": "x", "seed": s, "success": s in wins, "env_error": False, "steps": 1}) + "\n"
            for s in range(10)))
        return str(d)
    webeval.main(["--compare", f"BC={write('a', {0, 1, 2})}", f"RL={write('b', {0, 1, 2, 3, 4, 5, 6})}"])
    out = capsys.readouterr().out
    # 4 gained, none lost, of 10: +40 points; Wald half-width 1.96 * sqrt(4 - 16/10) / 10; McNemar 2/16
    assert "| RL | 10 | 4 | 0 | +40.0 points (+9.6 to +70.4) | 0.125 |" in out


def test_mcnemar_exact_at_any_number_of_discordant_pairs(tmp_path, capsys):
    import json
    import math
    from fractions import Fraction

    # past 1,023 discordant pairs comb(n, k) / 2.0 ** n overflowed; the p-value is checked against the
    # same sum in exact rational arithmetic
    for gained, lost in ((1100, 1000), (700, 1300), (5000, 4800)):
        n, k = gained + lost, min(gained, lost)
        exact = float(min(Fraction(1), Fraction(2 * sum(math.comb(n, i) for i in range(k + 1)), 2 ** n)))
        assert abs(stats.mcnemar_exact(gained, lost) - exact) <= 1e-12 * exact, (gained, lost)
    assert stats.mcnemar_exact(600, 600) == 1.0 and 0.0 <= stats.mcnemar_exact(10 ** 7, 10 ** 7 - 10 ** 5) < 1e-6
    # eval.py --compare on 3,000 pooled episodes, 1,200 gained and 900 lost: no OverflowError
    for name, wins in (("bc", range(900)), ("rl", range(900, 2100))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trajectories.jsonl").write_text("".join(
            json.dumps({"task": "x", "seed": s, "success": s in wins, "env_error": False, "steps": 1}) + "\n"
            for s in range(3000)))
    webeval.main(["--compare", f"BC={tmp_path / 'bc'}", f"RL={tmp_path / 'rl'}"])
    assert "| RL | 3000 | 1200 | 900 | +10.0 points" in capsys.readouterr().out


def test_compare_pools_replicates_pairing_each_with_its_own(tmp_path, capsys):
    import json

    def write(name, wins, seeds=range(10)):
        d = tmp_path / name
        d.mkdir()
        (d / "trajectories.jsonl").write_text("".join(
            json.dumps({"task": "x", "seed": s, "success": s in wins, "env_error": False, "steps": 1}) + "\n"
            for s in seeds))
        return str(d)
    # replicate 0: BC wins {0,1,2}, RL {0..6}: 4 gained. Replicate 1 (same seeds): BC {0..5}, RL {0,1,2}: 3 lost.
    # Pooled on the 20 episodes (replicate, seed): 4 gained, 3 lost; paired across replicates it would be 0 gained.
    bc0, rl0, bc1, rl1 = write("bc0", {0, 1, 2}), write("rl0", set(range(7))), write("bc1", set(range(6))), write("rl1", {0, 1, 2})
    webeval.main(["--compare", f"BC={bc0},{bc1}", f"RL={rl0},{rl1}"])
    out = capsys.readouterr().out
    half = 1.96 * (7 - 1 / 20) ** 0.5 / 20
    assert f"| RL | 20 | 4 | 3 | +5.0 points ({100 * (0.05 - half):+.1f} to {100 * (0.05 + half):+.1f}) |" in out
    assert "| x | 45% | 50% |" in out and "| episodes | 20 | 20 |" in out and "2 replicates pooled" in out
    assert webeval._label(f"{bc0},{bc1}") == webeval._label(bc0) + ",..."
    with pytest.raises(SystemExit):  # a replicate without its partner
        webeval.main(["--compare", f"BC={bc0},{bc1}", f"RL={rl0}"])
    assert "same number of replicate folders" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a trailing comma is no folder
        webeval.main(["--compare", f"BC={bc0},", f"RL={rl0},"])
    assert "an empty folder name" in capsys.readouterr().err


def test_paired_episodes_needed_by_hand_and_its_inverse():
    # Connor 1987: (1.96 sqrt(.05) + 0.8416 sqrt(.05 - .03^2))^2 / .03^2 = 433.7
    assert stats.paired_episodes_needed(0.03, 0.05) == 434
    assert stats.paired_episodes_needed(-0.03, 0.05) == 434
    assert stats.paired_episodes_needed(0.05, 0.15) == 469
    d = stats.paired_detectable(434, 0.05)
    assert 0.029 < d <= 0.0301
    assert stats.paired_episodes_needed(d, 0.05) <= 434 < stats.paired_episodes_needed(d - 1e-4, 0.05)
    assert stats.paired_detectable(140, 0.05) is None  # fewer than even an all-gain split needs
    for bad in [(0.0, 0.05), (0.06, 0.05), (0.03, 1.5)]:
        with pytest.raises(ValueError):
            stats.paired_episodes_needed(*bad)
    with pytest.raises(ValueError):
        stats.paired_detectable(0, 0.05)


def test_paired_episodes_needed_gives_about_80_percent_power_to_the_exact_mcnemar_test():
    rng = np.random.default_rng(0)
    n, psi, diff = stats.paired_episodes_needed(0.05, 0.15), 0.15, 0.05
    # each episode: gained with (psi + diff) / 2, lost with (psi - diff) / 2, else concordant
    draws = rng.multinomial(n, [(psi + diff) / 2, (psi - diff) / 2, 1 - psi], size=2000)
    power = np.mean([stats.mcnemar_exact(int(g), int(l)) < 0.05 and g > l for g, l, _ in draws])
    assert 0.7 < power < 0.9, power
