"""wm_refit.py: a replayed dream's real transitions, and the world model's refit on them (tiny real
models built from a config, the real tokenizer, the recorded transitions of tests/data)."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import delta as dfmt  # noqa: E402
import policy  # noqa: E402
import transitions as trans  # noqa: E402
import wm_refit  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "transitions.jsonl")


@pytest.fixture(scope="module")
def tok():
    return policy.load_tokenizer()


def _episode(task, seed):
    return [t for t in trans.load_transitions(DATA) if (t["task"], t["seed"]) == (task, seed)]


def test_a_replayed_dream_gives_the_real_transitions_of_its_parsed_steps():
    ep = _episode("click-tab-2", 1)  # 4 steps, the last completes the task
    start = next(s for s in trans.start_states(trans.load_transitions(DATA))
                 if s["task"] == "click-tab-2" and s["seed"] == 1 and len(s["prefix"]) == 1)  # stage 1
    # the dream: ep's steps 1-3, with a reply that did not parse between the first two (a real page
    # shows the error and changes nothing)
    errored = {**ep[1]["next_obs"], "error": "ActionParseError: x"}
    turns = [{"action": ep[1]["action"]}, {"action": None}, {"action": ep[2]["action"]}, {"action": ep[3]["action"]}]
    replay = {"start_match": True, "env_error": False, "done": True, "success": True, "reward": 1.0,
              "states": [ep[1]["next_obs"], errored, ep[2]["next_obs"], ep[3]["next_obs"]]}
    recs = wm_refit.replay_transitions({"turns": turns}, start, replay, iteration=3)
    assert [r["action"] for r in recs] == [ep[1]["action"], ep[2]["action"], ep[3]["action"]]
    assert [r["step"] for r in recs] == [1, 3, 4] and all(r["iteration"] == 3 for r in recs)
    assert recs[0]["obs"]["axtree"] == ep[1]["obs"]["axtree"] and recs[1]["obs"] == errored  # pages chain
    assert [(r["done"], r["success"], r["reward"]) for r in recs] == [(False, False, 0.0)] * 2 + [(True, True, 1.0)]
    assert all(r["source"] == "dream_replay" and r["goal"] == ep[0]["goal"] for r in recs)
    for r in recs:  # the label is exact: apply(o, Δ) == o'
        assert dfmt.apply(r["obs"], r["delta"], action=r["action"])[0]["axtree"] == r["next_obs"]["axtree"]
    assert recs[-1]["delta"].endswith("done: yes") and recs[0]["delta"].endswith("done: no")
    assert recs[-1]["delta"] == trans.delta_label(recs[-1])  # what train.py --mode wm would train on

    # a replay that ran out of actions without ending the episode ends nothing; a failure is `done: fail`
    open_end = wm_refit.replay_transitions({"turns": turns}, start, {**replay, "done": False, "success": False}, 3)
    assert not any(r["done"] for r in open_end)
    failed = wm_refit.replay_transitions({"turns": turns}, start, {**replay, "success": False, "reward": 0.0}, 3)
    assert failed[-1]["delta"].endswith("done: fail") and not failed[-1]["success"]
    # the real start page was not reproduced, or the browser failed: the replay says nothing
    assert wm_refit.replay_transitions({"turns": turns}, start, {**replay, "start_match": False}, 3) == []
    assert wm_refit.replay_transitions({"turns": turns}, start, {**replay, "env_error": True}, 3) == []


def test_the_refit_trains_on_the_checks_transitions_and_the_base(tok, monkeypatch):
    import world_model

    base = trans.load_transitions(DATA)
    model = policy.tiny_model(tok, seed=2)
    with pytest.raises(ValueError):
        wm_refit.WorldModelRefit(model, tok, [])
    with pytest.raises(ValueError):
        wm_refit.WorldModelRefit(model, tok, base, batch_size=1)
    refit = wm_refit.WorldModelRefit(model, tok, base, lr=1e-2, batch_size=4, micro_batch=2)
    model.eval().requires_grad_(False)  # as the dream loop freezes it after building the refit
    new = [t for t in base if t["task"] == "enter-text"]  # 6 transitions
    before = [p.detach().clone() for p in model.parameters()]
    assert refit.refit(new, 0) == {"wm_refit/new": 6} and refit.refit([], 3) == {"wm_refit/new": 0}
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing new: no step
    with pytest.raises(ValueError):
        refit.refit(new, -1)

    seen, real_samples = [], world_model.wm_samples
    monkeypatch.setattr(world_model, "wm_samples", lambda ts, *a, **k: seen.append(list(ts)) or real_samples(ts, *a, **k))
    m = refit.refit(new, 3)
    assert m["wm_refit/steps"] == 3 and m["wm_refit/new"] == 6 and m["wm_refit/loss"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # it learnt
    assert not model.training and not any(p.requires_grad for p in model.parameters())  # back to dreaming
    # each step: two of the check's transitions (every one of the six once over the three steps), two of the base
    assert len(seen) == 3 and all(len(b) == 4 and all(t in base for t in b[2:]) for b in seen)
    assert sorted(map(id, [t for b in seen for t in b[:2]])) == sorted(map(id, new))
    seen.clear()
    refit.refit(new[:1], 2)  # one new transition: in both batches, three of the base beside it
    assert [b[0] for b in seen] == [new[0]] * 2 and all(len(b) == 4 for b in seen)


def test_the_refit_trains_only_a_peft_world_models_adapter(tok):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(policy.tiny_model(tok, seed=2), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    refit = wm_refit.WorldModelRefit(model, tok, trans.load_transitions(DATA), lr=1e-2, batch_size=4)
    model.requires_grad_(False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # lora_B starts at zero, so lora_A's first gradient is zero: two steps move both
    refit.refit(trans.load_transitions(DATA)[:4], 2)
    moved = {n for n, p in model.named_parameters() if not torch.equal(before[n], p)}
    assert moved and all("lora_" in n for n in moved)  # save_pretrained writes the adapter: nothing trained is lost
    import checkpoint

    # the disk check counts what save_pretrained writes: the adapter (frozen here, as a dreaming world model is)
    adapter = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" in n)
    assert checkpoint.checkpoint_bytes(model, None) == adapter < sum(p.numel() * p.element_size() for p in model.parameters())


def test_the_refit_world_model_is_saved_inside_its_checkpoint(tmp_path, tok):
    """The refit world model is a companion of the policy's checkpoint: written in the same atomic save,
    pruned with it, and a save whose world model fails leaves the previous checkpoint as the latest."""
    import checkpoint

    src = str(tmp_path / "wm")
    model = policy.tiny_model(tok, seed=4)
    model.save_pretrained(src)
    tok.save_pretrained(src)
    (tmp_path / "wm" / "webdream.json").write_text('{"delta_focus_header": false}')
    out = str(tmp_path / "run")
    policy_model = policy.tiny_model(tok, seed=2)
    opt = torch.optim.AdamW(policy_model.parameters(), lr=1e-3)

    def save(step, write):
        checkpoint.save_checkpoint(out, f"step-{step:06d}", policy_model, tok, opt, step, {}, keep=1,
                                   companions={wm_refit.REFIT_DIR: write}, companion_bytes=1)

    assert wm_refit.refit_iteration(os.path.join(out, "step-000004", wm_refit.REFIT_DIR)) is None
    save(4, lambda p: wm_refit.save_refit(p, model, tok, src, 4))
    save(6, lambda p: wm_refit.save_refit(p, model, tok, src, 6))
    saved = os.path.join(checkpoint.latest_checkpoint(out), wm_refit.REFIT_DIR)
    assert saved == os.path.join(out, "step-000006", wm_refit.REFIT_DIR) and wm_refit.refit_iteration(saved) == 6
    assert not os.path.exists(os.path.join(out, "step-000004"))  # pruned with its world model (keep=1)
    assert open(os.path.join(saved, "webdream.json")).read() == '{"delta_focus_header": false}'
    again, _ = policy.load_model(saved)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))

    def fail(path):
        raise OSError("disk gone")
    with pytest.raises(OSError, match="disk gone"):
        save(8, fail)
    assert checkpoint.latest_checkpoint(out) == os.path.join(out, "step-000006")  # the pair saved together, intact
    assert not os.path.exists(os.path.join(out, "step-000008")) and wm_refit.refit_iteration(saved) == 6


def test_a_resumed_dream_run_dreams_in_its_refit_world_model(tmp_path, tok, demos, monkeypatch):
    """train_dream resumed at iteration 2 (of 2: nothing left to run) loads the world model saved inside
    that checkpoint, not --world-model, and keeps only the refit transitions up to its iteration."""
    import json
    import shutil

    import checkpoint
    import dream
    import train
    from runlog import Logger, read_jsonl

    src = str(tmp_path / "wm")
    policy.tiny_model(tok, seed=1).save_pretrained(src)
    tok.save_pretrained(src)
    out = str(tmp_path / "dream")
    os.makedirs(out)
    refit_model = policy.tiny_model(tok, seed=5)
    checkpoint.save_checkpoint(out, "step-000002", policy.tiny_model(tok), tok, torch.optim.AdamW(
        refit_model.parameters()), 2, {}, keep=3, companions={wm_refit.REFIT_DIR: lambda p: wm_refit.save_refit(
            p, refit_model, tok, src, 2)})
    saved = os.path.join(out, "step-000002", wm_refit.REFIT_DIR)
    rows = [dict(t, iteration=i) for i, t in zip((2, 4), trans.load_transitions(DATA))]
    with open(os.path.join(out, "wm_refit-rank0.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    loaded, real_load = [], policy.load_model
    monkeypatch.setattr(policy, "load_model", lambda path, **k: loaded.append(path) or real_load(path, **k))
    args = train.parse_args(["--mode", "dream", "--tiny", "--real-ratio", "0.5", "--demos", demos, "--out", out,
                             "--world-model", src, "--transitions", DATA, "--iterations", "2",
                             "--tasks", "click-button", "--wm-refit-steps", "1"])
    model = policy.tiny_model(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dream.train_dream(args, model, tok, opt, None, Logger(out, enabled=False), train.update_config(args), 2, {}, 0, 1,
                      torch.device("cpu"))
    assert loaded == [saved]
    assert [r["iteration"] for r in read_jsonl(os.path.join(out, "wm_refit-rank0.jsonl"))] == [2]
    final = os.path.join(out, "final", wm_refit.REFIT_DIR)  # the final checkpoint carries the world model too
    assert checkpoint.latest_checkpoint(out) == os.path.join(out, "final") and wm_refit.refit_iteration(final) == 2
    # no refit model in the checkpoint resumed from: a clear error, not dreams in the world model the run began with
    shutil.rmtree(final)
    with pytest.raises(FileNotFoundError, match="no refit world model to resume in"):
        dream.train_dream(args, model, tok, opt, None, Logger(out, enabled=False), train.update_config(args), 2, {},
                          0, 1, torch.device("cpu"))
    # one refit apart from the checkpoint (a folder moved in by hand): refused, not dreamt in
    wm_refit.save_refit(final, refit_model, tok, src, 1)
    with pytest.raises(ValueError, match="refit up to iteration 1, the checkpoint resumed is at 2"):
        dream.train_dream(args, model, tok, opt, None, Logger(out, enabled=False), train.update_config(args), 2, {},
                          0, 1, torch.device("cpu"))


def test_a_dream_run_refits_its_world_model_on_the_real_replays_of_its_dreams(tmp_path, tok, monkeypatch, dream_inputs):
    """train.main --mode dream --wm-refit-steps 1, in process, with the expert's replies (tests/scripted_train.py,
    so every dream's actions parse): the replay check's dreams are replayed on real pages, their real
    transitions (Δ labels by delta.diff of the real pages) train the world model one step, and the
    refit world model, not the one the run began with, is saved inside the final checkpoint."""

    import checkpoint
    import generators
    import scripted_train
    import train
    from runlog import read_jsonl

    wm_dir, demos, start = dream_inputs
    out = str(tmp_path / "dream")
    monkeypatch.setattr(generators, "make_generator", scripted_train.make_generator("alternate"))
    train.main(["--mode", "dream", "--tiny", "--world-model", wm_dir, "--transitions", DATA, "--demos", str(demos),
                "--tasks", "click-button", "--iterations", "1", "--groups-per-iter", "2", "--group-size", "2",
                "--dream-len", "2", "--max-new-tokens", "6", "--num-envs", "2", "--replay-every", "1",
                "--replay-samples", "2", "--real-ratio", "0.5", "--out", out, "--wm-refit-steps", "1",
                "--wm-refit-batch", "4", "--probe-seeds", "0", "--expert-loss", "nll"])
    (m,) = [x for x in read_jsonl(os.path.join(out, "metrics.jsonl")) if x["step"] == 1]
    refit = read_jsonl(os.path.join(out, "wm_refit-rank0.jsonl"))
    assert m["wm_refit/new"] == len(refit) > 0 and m["wm_refit/steps"] == 1 and m["wm_refit/loss"] > 0
    assert all(t["source"] == "dream_replay" and t["iteration"] == 1 and t["task"] == "click-button" for t in refit)
    assert all(t["delta"] == trans.delta_label(t) for t in refit)  # exact labels, from the real pages
    assert all(t["obs"]["axtree"] and t["next_obs"]["axtree"] for t in refit)
    saved = os.path.join(checkpoint.latest_checkpoint(out), wm_refit.REFIT_DIR)
    assert wm_refit.refit_iteration(saved) == 1
    after, _ = policy.load_model(saved)
    assert any(not torch.equal(a, b) for a, b in zip(start.state_dict().values(), after.state_dict().values()))


def test_two_ranks_refit_together_when_one_rank_has_no_replay(tmp_path, tok, dream_inputs):
    """torchrun, 2 processes, the expert's replies: the batch's one dream group is rank 0's (rank 1 trains on
    its real expert trajectories), so only rank 0 replays dreams. The refit counts every rank's real
    transitions (wm_refit/new, a sum over ranks), rank 1 takes the same step on training transitions alone
    (no rank waits on a collective the other skipped: the run ends), and rank 0 saves the refit world
    model in the checkpoint."""
    import subprocess

    import checkpoint
    from runlog import read_jsonl

    wm_dir, demos, _ = dream_inputs
    out = str(tmp_path / "dream")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        "tests/scripted_train.py", "alternate", "--mode", "dream", "--tiny", "--world-model", wm_dir,
                        "--transitions", DATA, "--demos", str(demos), "--tasks", "click-button,enter-text",
                        "--iterations", "1", "--groups-per-iter", "2", "--group-size", "2", "--dream-len", "2",
                        "--max-new-tokens", "6", "--num-envs", "2", "--replay-every", "1", "--replay-samples", "1",
                        "--real-ratio", "0.5", "--out", out, "--wm-refit-steps", "1", "--wm-refit-batch", "4",
                        "--probe-seeds", "0", "--expert-loss", "nll"],
                       cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (m,) = [x for x in read_jsonl(os.path.join(out, "metrics.jsonl")) if x["step"] == 1]
    per_rank = [read_jsonl(os.path.join(out, f"wm_refit-rank{k}.jsonl")) for k in (0, 1)]
    assert per_rank[0] and not per_rank[1] and m["wm_refit/new"] == len(per_rank[0]) and m["wm_refit/steps"] == 1
    assert m["dream/trajectories"] == 2 and m["dream/real_trajectories"] == 2  # summed over the ranks
    assert wm_refit.refit_iteration(os.path.join(checkpoint.latest_checkpoint(out), wm_refit.REFIT_DIR)) == 1
