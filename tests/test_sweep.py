"""sweep.py's table, plot and baseline from finished points (a point whose results exist is not rerun)."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import sweep  # noqa: E402


def results(tasks: dict) -> dict:
    """eval.py's results.json for {task: (successes, n)}."""
    rows = {t: {"successes": s, "n": n, "success": s / n, "ci95": [0, 1], "env_error": 0, "mean_steps": 1.0}
            for t, (s, n) in tasks.items()}
    s, n = sum(v[0] for v in tasks.values()), sum(v[1] for v in tasks.values())
    return {"tasks": rows, "mean": {"success": s / n, "ci95": [0.1, 0.9], "n": n, "successes": s}}


def test_sweep_table_plot_and_baseline_on_the_swept_tasks(tmp_path):
    out = tmp_path / "sweep"
    for value, (s, steps) in {"0": (1, 0), "0.4": (3, 12)}.items():
        d = out / f"real-ratio-{value}"
        (d / "final" / "eval").mkdir(parents=True)
        (d / "final" / "eval" / "results.json").write_text(json.dumps(results({"click-button": (s, 5)})))
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "env/real_steps": steps, "dream/steps": 40}) + "\n")
    base = tmp_path / "bc.json"  # the start checkpoint was evaluated on more tasks than are swept
    base.write_text(json.dumps(results({"click-button": (4, 20), "enter-text": (20, 20)})))
    sweep.main(["--param", "real-ratio", "--values", "0,0.4", "--init", str(tmp_path), "--tasks", "click-button",
                "--baseline", str(base), "--out", str(out)])
    md = (out / "sweep.md").read_text().splitlines()
    assert md[4] == "| 0 | 20.0% | 10%-90% | 5 | 0 | 40 |  |"
    assert md[5] == "| 0.4 | 60.0% | 10%-90% | 5 | 12 | 40 |  |"
    assert md[6].startswith(f"| start ({tmp_path}) | 20.0% |")  # 4/20 on click-button, not 24/40 over both tasks
    data = json.loads((out / "sweep.json").read_text())
    assert [r["value"] for r in data["rows"]] == [0.0, 0.4] and data["baseline"]["n"] == 20
    assert (out / "sweep.png").stat().st_size > 1000


def test_a_point_whose_metrics_end_with_a_cut_line_reads_its_last_whole_record(tmp_path):
    # a point's run was killed while appending to metrics.jsonl: sweep reads its last whole record
    out = tmp_path / "sweep"
    d = out / "dream-len-3"
    (d / "final" / "eval").mkdir(parents=True)
    (d / "final" / "eval" / "results.json").write_text(json.dumps(results({"click-button": (2, 5)})))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "env/real_steps": 7, "dream/steps": 30}) + "\n"
                                     + '{"step": 2, "env/real_steps": 9, "dre')
    sweep.main(["--param", "dream-len", "--values", "3", "--init", str(tmp_path), "--tasks", "click-button",
                "--out", str(out)])
    row = json.loads((out / "sweep.json").read_text())["rows"][0]
    assert row["real_steps"] == 7 and row["dream_steps"] == 30
