"""train.py end to end in subprocesses with a tiny model: BC, M-GRPO on real pages, torchrun."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}


def run(args, timeout=300):
    r = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def metrics(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    path = tmp_path_factory.mktemp("demos") / "demos.jsonl"
    obs = "Goal: Click on the \"{0}\" button.\nURL: file:///m/miniwob/click-button.html\n[12] button '{0}'\n[13] button 'No'"
    with open(path, "w") as f:
        for i in range(8):
            f.write(json.dumps({"task": "click-button", "seed": i, "goal": "", "source": "expert", "success": True,
                                "reward": 1.0, "env_error": False,
                                "turns": [{"observation": obs.format(f"b{i}"), "action": "click('12')", "error": ""}]}) + "\n")
    return str(path)


def test_bc_runs_and_resumes(tmp_path, demos):
    out = str(tmp_path / "bc")
    base = [sys.executable, "train.py", "--mode", "bc", "--tiny", "--demos", demos, "--out", out, "--tasks", "click-button",
            "--batch-size", "4", "--micro-batch", "2", "--save-every", "1", "--lr", "1e-3"]
    run(base + ["--epochs", "1"])
    assert [m["step"] for m in metrics(out)] == [1, 2]
    assert os.path.exists(os.path.join(out, "final", "model.safetensors"))
    run(base + ["--epochs", "2", "--resume"])  # continues at step 3, not from scratch
    steps = [m["step"] for m in metrics(out)]
    assert steps == [1, 2, 3, 4], steps
    assert metrics(out)[-1]["loss/bc"] < metrics(out)[0]["loss/bc"]


def test_torchrun_two_processes_real_mode(tmp_path):
    out = str(tmp_path / "real")
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train.py",
         "--mode", "real", "--tiny", "--out", out, "--tasks", "click-button,enter-text", "--iterations", "2",
         "--groups-per-iter", "2", "--group-size", "2", "--max-steps", "2", "--max-new-tokens", "6", "--num-envs", "2"],
        timeout=600)
    ms = metrics(out)
    assert [m["step"] for m in ms] == [1, 2]
    assert ms[-1]["env/real_steps"] >= 8  # 2 iterations x 2 groups x G=2 x at least one step each
    assert os.path.exists(os.path.join(out, "final", "trainer_state.pt"))
