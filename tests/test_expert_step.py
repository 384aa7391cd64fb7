"""expert_step.py: one iteration's expert likelihood term alone, from a dream run's flags."""
import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import dream  # noqa: E402
import expert_step  # noqa: E402
import policy  # noqa: E402
import supervised  # noqa: E402


def _run(tmp_path, argv_extra=(), flags=None):
    """A dream run directory: its demos (click-button clicks [12], enter-text fills [5]), its
    args-history.jsonl and args.json, as train.py writes them."""
    tmp_path.mkdir(exist_ok=True)
    demos = tmp_path / "demos.jsonl"
    with open(demos, "w") as f:
        for task, action, bid in (("click-button", "click('12')", 12), ("enter-text", "fill('5', 'hi')", 5)):
            for i in range(4):
                obs = f"Goal: {task} {i}\nURL: file:///m/{task}.html\n[{bid}] button 'b{i}'"
                f.write(json.dumps({"task": task, "seed": i, "success": True, "reward": 1.0, "env_error": False,
                                    "turns": [{"observation": obs, "action": action, "error": ""}]}) + "\n")
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    argv = ["--mode", "dream", "--demos", str(demos), "--tasks", "click-button,enter-text", "--world-model", ROOT,
            "--real-ratio", "0.5", "--lr", "1e-3", "--no-think", *argv_extra]
    (run / "args-history.jsonl").write_text(json.dumps({"argv": argv}) + "\n")
    (run / "args.json").write_text(json.dumps(flags or {}))
    return str(run)


def test_run_args_replay_the_run_s_draw(tmp_path):
    run = _run(tmp_path)
    assert expert_step.run_args(run).expert_draw == "random"  # a run from before --expert-draw
    assert expert_step.run_args(_run(tmp_path / "b", flags={"expert_draw": "stratified"})).expert_draw == "stratified"
    assert expert_step.run_args(run, "stratified").expert_draw == "stratified"
    with pytest.raises(FileNotFoundError, match="args-history.jsonl"):
        expert_step.run_args(str(tmp_path))


def test_the_step_raises_the_experts_replies_and_only_the_kept_tasks(tmp_path, tok):
    args = expert_step.run_args(_run(tmp_path / "b"), "stratified")
    demos = supervised.expert_trajectories(args.demos, args.tasks)
    samples = {t["task"]: supervised.expert_turns(t, tok, args)[0] for t in demos}

    def logp(model, task):
        p, r = samples[task]
        with torch.no_grad():
            lp, m, _ = policy.reply_logprobs(model.eval(), [p], [r], tok.pad_token_id)
        return float((lp * m).sum())

    def step(**kw):
        model = policy.tiny_model(tok, seed=1)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        before = {t: logp(model, t) for t in samples}
        stats, drawn = expert_step.expert_step(model, opt, tok, args, 1, **kw)
        return before, {t: logp(model, t) for t in samples}, stats, drawn

    before, after, stats, drawn = step()
    assert sorted(drawn) == ["click-button"] * 8 + ["enter-text"] * 8  # 16 of 32 at ratio 0.5, dealt by task
    assert stats["loss/updates"] >= 1 and stats["loss/nll"] > 0
    assert all(after[t] > before[t] for t in samples)  # the expert replies got likelier
    before, after, stats, _ = step(only_task="click-button")
    assert after["click-button"] > before["click-button"]
    before, after, stats, _ = step(drop_task="click-button", only_task="click-button")  # nothing kept: no step
    assert stats["loss/updates"] == 0 and after == before
    args.expert_draw = "random"  # iteration N replays dream_batch's draw of iteration index N - 1
    model = policy.tiny_model(tok, seed=1)
    _, drawn = expert_step.expert_step(model, torch.optim.AdamW(model.parameters(), lr=args.lr), tok, args, 2)
    assert drawn == [t["task"] for t in dream.dream_batch(args, 1, 0, 1, demos)[1]]
    assert drawn != [t["task"] for t in dream.dream_batch(args, 0, 0, 1, demos)[1]]
    args.real_ratio = 0.0
    with pytest.raises(ValueError, match="no expert likelihood term"):
        expert_step.expert_step(policy.tiny_model(tok), None, tok, args, 1)
