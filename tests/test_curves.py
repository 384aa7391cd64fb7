"""curves.py: training reward and eval success curves of hand-written runs (no browser, no model)."""
import json

import pytest
from PIL import Image

import curves


def results(successes: int, n: int, lo: float, hi: float) -> str:
    """eval.py's results.json, reduced to what curves.py reads (and a task row)."""
    mean = {"success": successes / n, "ci95": [lo, hi], "n": n, "successes": successes, "env_error": 0}
    return json.dumps({"tasks": {"click-button": mean}, "mean": mean, "seconds": 1.0, "model": "x"})


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def runs(tmp_path):
    bc = tmp_path / "bc" / "final"
    write(bc / "eval" / "results.json", results(30, 100, 0.2, 0.4))
    a = tmp_path / "a"  # a real run, resumed after step 2: step 2 was logged twice, the second record wins
    records = [(1, 0.2, 10), (2, 0.9, 25), (2, 0.4, 20), (3, 0.6, 30), (4, 0.8, 45)]
    write(a / "metrics.jsonl", "".join(json.dumps({"step": s, "time": 0.0, "rollout/reward": r, "rollout/success": r,
                                                    "env/real_steps": e}) + "\n" for s, r, e in records))
    write(a / "args.json", json.dumps({"mode": "real", "init": str(bc.parent / "final")}))
    write(a / "step-000002" / "eval" / "results.json", results(40, 100, 0.3, 0.5))
    write(a / "final" / "eval" / "results.json", results(50, 100, 0.4, 0.6))
    write(tmp_path / "elsewhere" / "results.json", results(45, 100, 0.35, 0.55))
    b = tmp_path / "b"  # a dream run without args.json: no start point; only rollout/success logged
    write(b / "metrics.jsonl", "".join(json.dumps({"step": s, "rollout/success": r, "env/real_steps": e, "dream/steps": 9 * s})
                                       + "\n" for s, r, e in [(1, 1.0, 0), (2, 0.5, 4)]))
    write(tmp_path / "b-eval" / "eval" / "results.json", results(7, 10, 0.4, 0.9))
    return tmp_path


def test_curves_points_table_and_pngs(runs, capsys):
    out = runs / "out"
    got = curves.main([str(runs / "a"), str(runs / "b"), "--out", str(out), "--labels", "real,dream",
                       "--eval", f"real:3={runs / 'elsewhere' / 'results.json'}", "--eval", f"dream:2={runs / 'b-eval'}"])
    a = got["real"]["train"]
    assert [p["iteration"] for p in a] == [1, 2, 3, 4]  # step 2 once, its last record
    assert [p["reward"] for p in a] == [0.2, 0.4, 0.6, 0.8] and [p["real_steps"] for p in a] == [10, 20, 30, 45]
    assert [p["ma3"] for p in a] == pytest.approx([0.2, 0.3, 0.4, 0.6])  # trailing 3-point mean
    ev = [(p["checkpoint"], p["iteration"], p["real_steps"], p["success"], p["lo"], p["hi"]) for p in got["real"]["eval"]]
    assert ev == [(str(runs / "bc" / "final"), 0, 0, 0.3, 0.2, 0.4), ("step-000002", 2, 20, 0.4, 0.3, 0.5),
                  ("--eval 3", 3, 30, 0.45, 0.35, 0.55), ("final", 4, 45, 0.5, 0.4, 0.6)]  # final: last step's real steps
    b = got["dream"]
    assert b["dream"] and [p["reward"] for p in b["train"]] == [1.0, 0.5] and b["train"][1]["ma3"] == 0.75
    assert [(p["iteration"], p["real_steps"], p["success"]) for p in b["eval"]] == [(2, 4, 0.7)]

    md = (out / "curves.md").read_text()
    assert md in capsys.readouterr().out
    for row in ["| real | 2 | 20 | 0.400 | 0.300 |", "| real | 4 | 45 | 0.800 | 0.600 |", "| dream | 2 | 4 | 0.500 | 0.750 |",
                "| real | final | 4 | 45 | 50.0% (40.0%-60.0%) | 100 |", "| real | step-000002 | 2 | 20 | 40.0% (30.0%-50.0%) | 100 |",
                "| dream | --eval 2 | 2 | 4 | 70.0% (40.0%-90.0%) | 10 |"]:
        assert row in md.splitlines(), row
    assert json.loads((out / "curves.json").read_text())["real"]["train"][1]["reward"] == 0.4
    for name in ("train_reward.png", "eval_success.png"):
        assert (out / name).stat().st_size > 5000
        with Image.open(out / name) as im:
            assert im.format == "PNG" and im.size[0] > 500 and im.size[1] > 200
            im.verify()


def test_curves_errors_name_the_problem(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothing[/\\]metrics.jsonl not found: train.py writes it"):
        curves.main([str(tmp_path / "nothing"), "--out", str(tmp_path / "o")])
    with pytest.raises(ValueError, match="label 'c' is not one of"):
        curves.main([str(runs / "a"), "--out", str(tmp_path / "o"), "--eval", "c:1=x.json"])
    with pytest.raises(ValueError, match=r"expected \[LABEL:\]STEP=PATH"):
        curves.main([str(runs / "a"), "--out", str(tmp_path / "o"), "--eval", "a:five=x.json"])
    with pytest.raises(FileNotFoundError, match="missing.json not found"):
        curves.main([str(runs / "a"), "--out", str(tmp_path / "o"), "--eval", "2=missing.json"])
    write(tmp_path / "bc-run" / "metrics.jsonl", json.dumps({"step": 1, "loss/bc": 1.0}) + "\n")
    with pytest.raises(ValueError, match="curves are for --mode real or dream runs"):
        curves.main([str(tmp_path / "bc-run"), "--out", str(tmp_path / "o")])
