"""A resumed run (issue 15): its logs after a kill (a cut JSONL line, TensorBoard events logged past the
checkpoint) and its flags (the first start's, --init above all). In this process, with tiny models."""
import json
import os
import time

import pytest

import runlog
from runlog import Logger, read_jsonl


def tb_scalars(out: str, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event of `tag` that TensorBoard shows for the run's out/tb."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(out, "tb"))
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]


def test_tensorboard_shows_each_step_once_after_a_resume(tmp_path):
    # an interrupted run logged steps 1..4 but checkpointed at 2; the resumed run redoes 3 and 4
    out = str(tmp_path)
    log = Logger(out, enabled=True)
    for step in range(1, 5):
        log.log({"loss/x": float(step)}, step)
    log.close()
    # TensorBoard reads event files in name order: time (s), host, pid, then a per-process counter compared as
    # text ('10' < '9'). A real resume is a later process; here, in one process, start the next second
    time.sleep(1.01 - time.time() % 1.0)
    log = Logger(out, enabled=True, resume_step=2)
    for step in (3, 4, 5):
        log.log({"loss/x": 10.0 * step}, step)
    log.close()
    assert tb_scalars(out, "loss/x") == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]
    assert [(m["step"], m["loss/x"]) for m in read_jsonl(os.path.join(out, "metrics.jsonl"))] == [
        (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]


def test_a_resumed_run_drops_a_cut_last_metrics_line(tmp_path, demos):
    import train

    out = str(tmp_path / "bc")
    base = ["--mode", "bc", "--tiny", "--demos", demos, "--out", out, "--tasks", "click-button", "--batch-size", "4",
            "--micro-batch", "2", "--save-every", "1", "--lr", "1e-3"]
    train.main(base + ["--epochs", "1"])
    path = os.path.join(out, "metrics.jsonl")
    with open(path, "a") as f:
        f.write('{"step": 3, "lo')  # killed while appending step 3's line
    train.main(base + ["--epochs", "2", "--resume"])
    with open(path) as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4]  # every line whole, each step once
    assert [s for s, _ in tb_scalars(out, "loss/bc")] == [1, 2, 3, 4]


def test_truncation_keeps_the_records_up_to_the_resumed_step(tmp_path):
    path = str(tmp_path / "dream_replays.jsonl")
    with open(path, "w") as f:
        f.write("".join(json.dumps({"iteration": i, "x": i}) + "\n" for i in (2, 4, 6)) + '{"iteration": 8, "tu')
    runlog.truncate_jsonl(path, "iteration", 4)
    assert [r["iteration"] for r in read_jsonl(path)] == [2, 4]
    assert open(path).read().endswith("}\n")
    runlog.truncate_jsonl(str(tmp_path / "none.jsonl"), "step", 3)  # no file: nothing to do
    assert not os.path.exists(tmp_path / "none.jsonl")


def test_a_resumed_dream_run_drops_the_replays_it_redoes(tmp_path, tok, demos):
    # dream.py on resume at iteration 2 (of 2: nothing left to run): replays past it, and a line cut
    # by the kill, are dropped
    import torch

    import dream
    import policy
    import train

    out = str(tmp_path / "dream")
    os.makedirs(out)
    path = os.path.join(out, "dream_replays.jsonl")
    with open(path, "w") as f:
        f.write("".join(json.dumps({"iteration": i, "source": "dream"}) + "\n" for i in (2, 4)) + '{"iteration": 6, "so')
    args = train.parse_args(["--mode", "dream", "--tiny", "--real-ratio", "1", "--demos", demos, "--out", out,
                             "--iterations", "2", "--tasks", "click-button"])
    model = policy.tiny_model(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dream.train_dream(args, model, tok, opt, None, Logger(out, enabled=False), train.update_config(args), 2, {}, 0, 1,
                      torch.device("cpu"))
    assert [r["iteration"] for r in read_jsonl(path)] == [2]


# ---------------------------------------------------------------------------------------------
# a resumed run keeps its flags


@pytest.fixture()
def init_ckpt(tmp_path, tok):
    import policy

    path = str(tmp_path / "init")
    policy.tiny_model(tok, seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_resumed_run_keeps_its_init_as_the_kl_reference(tmp_path, monkeypatch, init_ckpt):
    import generators
    import scripted_train
    import train

    monkeypatch.setattr(generators, "make_generator", scripted_train.make_generator("alternate"))
    built = []  # (what build_model loaded: a resumed checkpoint or --init, sharded or not)
    real_build = train.build_model

    def spy(args, device, path=None, fsdp=None):
        built.append((path or args.init, fsdp))
        return real_build(args, device, path=path, fsdp=fsdp)
    monkeypatch.setattr(train, "build_model", spy)
    out = str(tmp_path / "real")
    first = ["--mode", "real", "--init", init_ckpt, "--kl-coef", "0.1", "--out", out, "--tasks", "click-button",
             "--groups-per-iter", "1", "--group-size", "2", "--max-steps", "1", "--num-envs", "1", "--report-every", "0",
             "--dynamic-sampling", "0", "--iterations", "1"]
    train.main(first)
    assert built == [(init_ckpt, None), (init_ckpt, False)]  # the policy, then the KL reference
    built.clear()
    train.main(["--mode", "real", "--out", out, "--resume", "--iterations", "2"])  # no --init, no --kl-coef
    assert built == [(os.path.join(out, "final"), None), (init_ckpt, False)]  # the reference is still --init
    with open(os.path.join(out, "args.json")) as f:
        flags = json.load(f)
    assert flags["init"] == init_ckpt and flags["kl_coef"] == 0.1 and flags["iterations"] == 1  # the first start's
    history = read_jsonl(os.path.join(out, "args-history.jsonl"))
    assert [(h["resume"], h["overrides"]) for h in history] == [(False, {}), (True, {"iterations": [1, 2]})]
    assert history[1]["flags"]["init"] == init_ckpt and history[1]["flags"]["iterations"] == 2
    assert [m["step"] for m in read_jsonl(os.path.join(out, "metrics.jsonl"))] == [1, 2]


def test_a_resumed_run_refuses_a_flag_that_would_change_the_run(tmp_path, init_ckpt, capsys):
    import train

    out = str(tmp_path / "real")
    os.makedirs(out)
    flags = vars(train.parse_args(["--mode", "real", "--init", init_ckpt, "--kl-coef", "0.1", "--out", out]))["flags"]
    with open(os.path.join(out, "args.json"), "w") as f:
        json.dump(flags, f)
    args = train.parse_args(["--mode", "real", "--out", out, "--resume", "--kl-coef", "0.1", "--num-envs", "4"])
    assert args.init == init_ckpt and args.kl_coef == 0.1 and args.overrides == {"num_envs": [16, 4]}
    for argv in (["--kl-coef", "0.2"], ["--init", str(tmp_path)], ["--tasks", "click-link"], ["--mode", "dream"]):
        with pytest.raises(SystemExit) as e:
            train.parse_args(["--mode", "real", "--out", out, "--resume"] + argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--resume: --" in err and "may change: --iterations" in err, err
    # a flag the run's args.json does not have (newer than the run) ran at its default
    del flags["reward"]
    with open(os.path.join(out, "args.json"), "w") as f:
        json.dump(flags, f)
    assert train.parse_args(["--mode", "real", "--out", out, "--resume", "--reward", "success"]).reward == "success"
    with pytest.raises(SystemExit):
        train.parse_args(["--mode", "real", "--out", out, "--resume", "--reward", "grounded"])
    assert "--reward did not exist when this run started" in capsys.readouterr().err


def test_a_checkpoint_that_does_not_fit_raises_before_writing(tmp_path, tok, model, monkeypatch):
    # a full disk mid-write lost a dream run's final checkpoint once: the check must come first, name the
    # shortfall, and leave the newest complete checkpoint (and out/latest) as they were
    import shutil

    import torch

    import checkpoint

    out = str(tmp_path / "run")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()  # Adam's two moments now exist: they count
    need = checkpoint.checkpoint_bytes(model, opt)
    params = sum(p.numel() for p in model.parameters())
    assert need == params * model.dtype.itemsize + 2 * params * 4 + 4 * len(opt.state)  # + Adam's step counters
    checkpoint.save_checkpoint(out, "step-000001", model, tok, opt, 1, {}, keep=2)
    usage = shutil.disk_usage(out)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage._replace(free=need))  # short by the 5% margin
    with pytest.raises(OSError, match="not enough disk to write checkpoint step-000002.*step-000001.*--resume"):
        checkpoint.save_checkpoint(out, "step-000002", model, tok, opt, 2, {}, keep=2)
    assert sorted(os.listdir(out)) == ["latest", "step-000001"]
    assert checkpoint.latest_checkpoint(out) == os.path.join(out, "step-000001")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage._replace(free=int(need * 1.06)))
    checkpoint.save_checkpoint(out, "step-000002", model, tok, opt, 2, {}, keep=2)
    assert checkpoint.latest_checkpoint(out) == os.path.join(out, "step-000002")


def test_a_save_that_fails_part_way_leaves_no_temp_folder(tmp_path, tok, model, monkeypatch):
    # the disk check passes but a write fails after the weights are out (a full disk, a Ctrl-C): the error
    # reaches the caller, no half-written NAME.tmp stays behind, the previous checkpoint is still latest
    import torch

    import checkpoint

    out = str(tmp_path / "run")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpoint.save_checkpoint(out, "step-000001", model, tok, opt, 1, {}, keep=2)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save_checkpoint(out, "step-000002", model, tok, opt, 2, {}, keep=2)
    assert sorted(os.listdir(out)) == ["latest", "step-000001"]
    assert checkpoint.latest_checkpoint(out) == os.path.join(out, "step-000001")
