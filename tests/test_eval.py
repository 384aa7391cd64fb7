"""eval.py's statistics, checked by hand."""
import eval as webeval


def test_wilson_by_hand():
    lo, hi = webeval.wilson(0, 10)
    assert lo == 0.0 and abs(hi - 0.2775) < 1e-4  # z^2/(n+z^2) = 3.8416/13.8416
    lo, hi = webeval.wilson(5, 10)
    assert abs(lo - 0.2366) < 1e-4 and abs(hi - 0.7634) < 1e-4
    assert webeval.wilson(0, 0) == (0.0, 1.0)


def traj(task, success, env_error=False, steps=2):
    return {"task": task, "success": success, "env_error": env_error, "steps": steps}


def test_env_error_is_neither_success_nor_failure():
    trajs = [traj("a", True), traj("a", False), traj("a", False, env_error=True),
             traj("b", False, env_error=True)]
    s = webeval.summarise(trajs, ["a", "b"])
    assert s["tasks"]["a"]["success"] == 0.5 and s["tasks"]["a"]["n"] == 2 and s["tasks"]["a"]["env_error"] == 1
    assert s["tasks"]["b"]["success"] is None and s["tasks"]["b"]["n"] == 0  # nothing measured, not a 0
    assert s["mean"]["success"] == 0.5 and s["mean"]["task_mean"] == 0.5 and s["mean"]["env_error"] == 2
    assert "| b | n/a |" in webeval.markdown(s, "t")
