"""train.py end to end in subprocesses with a tiny model: BC, M-GRPO on real pages, torchrun."""
import os
import subprocess
import sys

import pytest
import torch

from runlog import read_jsonl

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}


def run(args, timeout=300):
    r = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def metrics(out):
    return read_jsonl(os.path.join(out, "metrics.jsonl"))


def test_torchrun_two_processes_real_mode(tmp_path, tok):
    # tests/scripted_train.py: the expert solves the first episode of each group, the second fails
    # (noop()), so every group has a variance and every iteration takes an optimizer step.
    import policy
    from safetensors.torch import load_file

    out = str(tmp_path / "real")
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "tests/scripted_train.py",
         "alternate", "--mode", "real", "--tiny", "--out", out, "--tasks", "click-button,enter-text", "--iterations", "2",
         "--groups-per-iter", "2", "--group-size", "2", "--max-steps", "2", "--max-new-tokens", "6", "--num-envs", "2",
         "--curriculum", "uniform", "--dynamic-sampling", "0"],
        timeout=600)
    ms = metrics(out)
    # each iteration: rank 0 plays click-button (solved in 1 step, failed in 2), rank 1 enter-text
    # (solved in 2: fill, submit; failed in 2): 7 real steps; each rank trains its 2 trajectories in 1 step
    # (counts are summed over the ranks: 4 trajectories trained)
    keys = ["step", "env/real_steps", "loss/updates", "loss/trajectories_trained", "rollout/success",
            "rollout/zero_var_groups", "rollout/turns", "env/env_error"]
    assert [[m[k] for k in keys] for m in ms] == [[1, 7, 1, 4, 0.5, 0, 1.75, 0], [2, 14, 1, 4, 0.5, 0, 1.75, 0]]
    assert os.path.exists(os.path.join(out, "final", "trainer_state.pt"))
    start, final = policy.tiny_model(tok).state_dict(), load_file(os.path.join(out, "final", "model.safetensors"))
    assert not all(torch_equal(start[k], final[k]) for k in final)  # the updates moved the weights
    html = open(os.path.join(out, "report", "report.html")).read()  # the last iteration's report, real screenshots
    assert html.count("<section class='episode") == 2 and "data:image/jpeg;base64," in html


def trajectory(tok, seed, reward, actions, observation, env_error=False):
    """A trajectory record as rollout.py writes it: one turn per action, each prompt built from the
    turns before it (compress.build_prompt), each reply the action's ids and the end-of-turn id."""
    import compress

    history, turns = [], []
    for a in actions:
        reply = tok.encode(a, add_special_tokens=False) + [tok.eos_token_id]
        # no response_logprobs: these replies were not sampled, so the update scores pi_old itself
        turns.append({"prompt_ids": compress.build_prompt(tok, history, observation), "response_ids": reply})
        history.append({"observation": observation, "response": a})
    return {"task": "click-button", "seed": seed, "env_error": env_error, "reward": reward, "success": reward == 1.0,
            "turns": turns}


PAGE = "Goal: Click on the \"OK\" button.\nURL: miniwob/click-button.html\n[12] button 'OK'\n[13] button 'No'"
LONG_PAGE = PAGE.replace("[13]", "[14] heading 'Pick one of the buttons below, then wait'\n[15] link 'help'\n[13]")


def synthetic_trajectories(tok):
    """Two groups of G=2 on one page: one group with rewards 1/0 (the 0 in two turns), one with 1/1."""
    return [trajectory(tok, 0, 1.0, ["click('12')"], PAGE), trajectory(tok, 0, 0.0, ["click('13')"] * 2, PAGE),
            trajectory(tok, 1, 1.0, ["click('12')"], PAGE), trajectory(tok, 1, 1.0, ["click('12')"], PAGE)]


@pytest.mark.parametrize("loss,epochs,minibatches", [("mgrpo", 1, 1), ("gspo", 1, 1), ("mgrpo", 2, 2), ("gspo", 2, 1)])
def test_policy_update_raises_the_likelihood_of_the_rewarded_action(loss, epochs, minibatches):
    import torch

    import policy
    import train
    import update

    tok = policy.load_tokenizer()
    model = policy.tiny_model(tok)
    args = train.parse_args(["--mode", "real", "--loss", loss, "--ppo-epochs", str(epochs), "--minibatches", str(minibatches),
                             "--micro-batch", "2", "--lr", "1e-3"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    trajs = synthetic_trajectories(tok)
    batch = [(0, trajs[0]["turns"][0]["prompt_ids"], trajs[0]["turns"][0]["response_ids"]),
             (1, trajs[1]["turns"][0]["prompt_ids"], trajs[1]["turns"][0]["response_ids"])]
    with torch.no_grad():
        before, rm, _ = update.score(model, tok, batch, args.temperature, False, "cpu")
    stats = update.policy_update(model, opt, tok, trajs, train.update_config(args), "cpu", 1)
    with torch.no_grad():
        after, _, _ = update.score(model, tok, batch, args.temperature, False, "cpu")
    gain = ((after - before) * rm).sum(-1)
    assert gain[0] > gain[1]  # the rewarded reply gains on the unrewarded one (they share most tokens)
    assert stats["rollout/zero_var_groups"] == 0.5 and stats["loss/trajectories_trained"] == 2
    if epochs * minibatches == 1:
        assert abs(stats["loss/ratio"] - 1.0) < 1e-6 and stats["loss/clip_frac"] == 0.0  # on-policy: ratio exactly 1


def test_warmup_steps_raise_the_learning_rate_linearly_from_the_first_optimizer_step(tok):
    # AdamW's first step moves every weight with a gradient by about its learning rate: with
    # --warmup-steps 4 that is lr / 4, then 2 lr / 4 on the next step, counted from the optimizer's own
    # state (so a second update, or a resumed run, carries on); without warm-up the full lr
    import torch

    import policy
    import train
    import update

    def largest_moves(*flags, updates=2):
        torch.manual_seed(0)
        model = policy.tiny_model(tok)
        args = train.parse_args(["--mode", "real", "--lr", "1e-3", "--micro-batch", "2", *flags])
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
        moves, lrs = [], []
        for _ in range(updates):
            before = [p.detach().clone() for p in model.parameters()]
            stats = update.policy_update(model, opt, tok, synthetic_trajectories(tok), train.update_config(args), "cpu", 1)
            moves.append(max(float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before)))
            lrs.append((stats.get("loss/lr"), opt.param_groups[0]["lr"]))
        return moves, lrs

    moves, lrs = largest_moves("--warmup-steps", "4")
    assert 0.9 * 2.5e-4 < moves[0] <= 2.5e-4 * 1.001 and lrs[0] == (2.5e-4, 2.5e-4)
    assert 0.9 * 5e-4 < moves[1] <= 5e-4 * 1.002 and lrs[1] == (5e-4, 5e-4)  # (Adam's 2nd step: up to 1.0014 lr)
    moves, lrs = largest_moves(updates=1)
    assert 0.9e-3 < moves[0] <= 1.001e-3 and lrs[0] == (None, 1e-3)
    assert update.warmup_lr(1e-3, 4, 3) == 1e-3 and update.warmup_lr(1e-3, 4, 10) == 1e-3


def test_sigkill_mid_run_then_resume_ends_where_an_uninterrupted_run_would(tmp_path, demos):
    import signal
    import time

    from safetensors.torch import load_file

    import train

    def cmd(out):
        return [sys.executable, "train.py", "--mode", "bc", "--tiny", "--demos", demos, "--out", out, "--tasks",
                "click-button", "--batch-size", "4", "--micro-batch", "2", "--save-every", "1", "--lr", "1e-3",
                "--epochs", "5", "--keep-ckpts", "1"]
    # only the killed run needs a process of its own; the others run in this one (train.main, argv after train.py)
    whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
    train.main(cmd(whole)[2:])  # BC runs: every step logged once, the loss falls, the weights saved
    assert [m["step"] for m in metrics(whole)] == list(range(1, 11))
    assert metrics(whole)[-1]["loss/bc"] < metrics(whole)[0]["loss/bc"]
    assert 0.1 < metrics(whole)[-1]["perf/peak_rss_gib"] < 64  # the process's peak so far, in GiB (a model was loaded)
    proc = subprocess.Popen(cmd(cut), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = os.path.join(cut, "latest")
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(latest) and open(latest).read().strip() >= "step-000003":
            proc.send_signal(signal.SIGKILL)  # no chance to clean up: only what was on disk survives
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = int(open(latest).read().strip()[5:])
    assert 3 <= killed_at < 10
    train.main(cmd(cut)[2:] + ["--resume"])
    assert [m["step"] for m in metrics(cut)] == list(range(1, 11))  # each step logged once, none lost
    a = load_file(os.path.join(whole, "final", "model.safetensors"))
    b = load_file(os.path.join(cut, "final", "model.safetensors"))
    assert a.keys() == b.keys() and all(torch_equal(a[k], b[k]) for k in a)
    train.main(cmd(cut)[2:-4] + ["--epochs", "6", "--keep-ckpts", "1", "--resume"])  # a finished run extended: on from step 11
    assert [m["step"] for m in metrics(cut)] == list(range(1, 13))


def torch_equal(x, y):
    import torch

    return torch.allclose(x, y, atol=1e-6, rtol=0)


@pytest.mark.parametrize("argv,message", [
    (["--mode", "real", "--tasks", "click-buton"], "unknown task"),
    (["--mode", "real", "--group-size", "1"], "--group-size must be at least 2"),
    (["--mode", "real", "--init", "/nonexistent/ckpt"], "--init /nonexistent/ckpt: no such checkpoint folder"),
    (["--mode", "real", "--temperature", "0"], "--temperature must be > 0"),
    (["--mode", "bc", "--micro-batch", "0"], "--micro-batch must be at least 1"),
    (["--mode", "real", "--loss", "gspo", "--kl-coef", "0.1"], "GSPO has no KL"),
    (["--mode", "real", "--kl-clip", "10"], "it needs --kl-coef > 0"),
    (["--mode", "bc", "--warmup-steps", "4"], "applies to --mode real and dream"),
    (["--mode", "real", "--warmup-steps", "-1"], "--warmup-steps N (>= 0)"),
    (["--mode", "dream", "--real-ratio", "1.5"], "--real-ratio must be in [0, 1]"),
    (["--mode", "dream", "--real-ratio", "-0.1"], "--real-ratio must be in [0, 1]"),
    (["--mode", "dream", "--dream-len", "0"], "--dream-len must be at least 1"),
    (["--mode", "dream", "--dream-max-stage", "-1"], "--dream-max-stage must be at least 0"),
    (["--mode", "dream", "--done-threshold", "1.0"], "--done-threshold must be in (0, 1)"),
    (["--mode", "dream", "--done-threshold", "0"], "--done-threshold must be in (0, 1)"),
    (["--mode", "dream", "--world-model", "/nonexistent/wm"], "python train.py --mode wm"),
    (["--mode", "dream", "--wm-refit-steps", "-1"], "--wm-refit-steps must be at least 0"),
    (["--mode", "dream", "--wm-refit-steps", "2", "--replay-every", "0"], "it needs --replay-every N > 0"),
    (["--mode", "dream", "--wm-refit-steps", "2", "--wm-refit-batch", "1"], "--wm-refit-batch must be at least 2"),
    (["--mode", "dream", "--wm-refit-steps", "2", "--real-ratio", "1"], "it needs --real-ratio below 1"),
    (["--mode", "real", "--wm-refit-steps", "2"], "it needs --real-ratio below 1"),
    (["--mode", "dream", "--wm-refit-lr", "0"], "--wm-refit-lr must be > 0"),
    (["--mode", "dream", "--real-ratio", "1", "--bc-coef", "1"], "--bc-coef C (>= 0) applies to --mode real"),
    (["--mode", "real", "--bc-coef", "-1"], "--bc-coef C (>= 0) applies to --mode real"),
    (["--mode", "real", "--bc-coef", "1", "--bc-trajectories", "0"], "--bc-trajectories must be at least 1"),
])
def test_bad_arguments_get_a_clear_error(argv, message, capsys):
    import train

    with pytest.raises(SystemExit) as e:
        train.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_eval_rejects_a_missing_checkpoint(capsys):
    import eval as webeval

    with pytest.raises(SystemExit):
        webeval.main(["--ckpt", "/nonexistent/ckpt"])
    assert "--ckpt /nonexistent/ckpt: no such checkpoint folder" in capsys.readouterr().err


def _paths(tmp_path):
    """A model folder, a folder that is no model, a data file and a missing path, for the path checks."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "data.jsonl").write_text("")
    return {"model": str(tmp_path / "model"), "empty": str(tmp_path / "empty"), "file": str(tmp_path / "data.jsonl"),
            "none": str(tmp_path / "none")}


@pytest.mark.parametrize("argv,message", [
    (["--mode", "real", "--model", "{none}"], "--model {none}: no such model folder"),
    (["--mode", "real", "--model", "{empty}"], "--model {empty}: a folder, but not a model"),
    (["--mode", "real", "--model", "{file}"], "--model {file}: a file; a model is a folder"),
    (["--mode", "real", "--model", "someone/not-cached-model"], "not in the hub cache while HF_HUB_OFFLINE=1"),
    (["--mode", "real", "--init", "{none}"], "--init {none}: no such checkpoint folder"),
    (["--mode", "real", "--init", "bcfinal"], "--init bcfinal: no such checkpoint folder"),  # never a hub id
    (["--mode", "real", "--init", "{empty}"], "--init {empty}: a folder, but not a model"),
    (["--mode", "bc", "--demos", "{none}"], "--demos {none}: no such file; write it with `python experts.py"),
    (["--mode", "bc", "--demos", "{empty}"], "--demos {empty}: no such file"),
    (["--mode", "real", "--bc-coef", "1", "--demos", "{none}"], "--demos {none}: no such file"),
    (["--mode", "wm", "--transitions", "{none}"], "--transitions {none}: no such file; write it with `python world_model.py"),
    (["--mode", "judge", "--transitions", "{file}", "--judge-trajectories", "{file},{none}"],
     "--judge-trajectories {none}: no such file"),
    (["--mode", "dream", "--world-model", "{empty}", "--demos", "{file}", "--transitions", "{file}"],
     "--world-model {empty}: a folder, but not a model"),
    (["--mode", "dream", "--world-model", "{model}", "--dream-reward", "judge", "--judge", "{none}", "--demos", "{file}",
      "--transitions", "{file}"],
     "--judge {none}: no such checkpoint folder; train one with `python train.py --mode judge"),
    (["--mode", "dream", "--world-model", "{model}", "--judge", "{model}", "--demos", "{none}", "--transitions", "{file}"],
     "--demos {none}: no such file"),
    (["--mode", "dream", "--world-model", "{model}", "--judge", "{model}", "--demos", "{file}", "--transitions", "{none}"],
     "--transitions {none}: no such file"),
])
def test_a_bad_path_is_a_parser_error_before_anything_is_written(argv, message, tmp_path, capsys):
    # a missing or wrong model folder or data file: exit 2 with the flag named, before args.json or any
    # other file is written (main parses first), never a traceback from transformers mid-run
    import train

    paths = _paths(tmp_path)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.main([a.format(**paths) for a in argv] + ["--out", str(out)])
    assert e.value.code == 2 and message.format(**paths) in capsys.readouterr().err
    assert not out.exists()
    # the paths the mode does not read are not checked: a real run without --bc-coef needs no demos
    assert train.parse_args(["--mode", "real", "--demos", paths["none"], "--model", paths["model"]]).demos == paths["none"]


def test_hub_ids_pass_for_the_model_only_while_the_hub_is_reachable(monkeypatch):
    # with hub access on, a hub id is left to transformers (--model only); a checkpoint flag wants a folder
    import huggingface_hub.constants
    import policy

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert policy.model_path_error("Qwen/Qwen2.5-3B-Instruct") is None
    assert policy.model_path_error("runs/bc/final") == "--model runs/bc/final: no such model folder"
    assert policy.model_path_error("bcfinal", "--init", hub=False) == "--init bcfinal: no such checkpoint folder"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "not in the hub cache" in policy.model_path_error("Qwen/Qwen2.5-3B-Instruct")


def test_eval_rejects_a_model_that_is_not_one(tmp_path, capsys):
    import eval as webeval

    paths = _paths(tmp_path)
    for argv, message in ((["--model", paths["none"]], f"--model {paths['none']}: no such model folder"),
                          (["--ckpt", paths["empty"]], f"--ckpt {paths['empty']}: a folder, but not a model")):
        with pytest.raises(SystemExit):
            webeval.main(argv + ["--out", str(tmp_path / "eval")])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()


def test_think_format_puts_a_grounded_thought_before_each_expert_action(demos):
    import policy
    import supervised
    import train

    tok = policy.load_tokenizer()
    args = train.parse_args(["--mode", "bc", "--demos", demos, "--tasks", "click-button", "--think"])
    assert args.max_new_tokens == 64 and "<think>" in args.prompt.system
    prompt, reply = supervised.bc_samples(args.demos, tok, args)[0]
    assert tok.decode(reply) == "<think>Click the button 'b0' [12].</think>click('12')" + tok.eos_token
    assert train.parse_args(["--mode", "bc", "--demos", demos]).think  # the default format
    direct = train.parse_args(["--mode", "bc", "--demos", demos, "--tasks", "click-button", "--no-think"])
    assert direct.max_new_tokens == 32
    assert tok.decode(supervised.bc_samples(direct.demos, tok, direct)[0][1]) == "click('12')" + tok.eos_token


@pytest.mark.parametrize("loss", ["mgrpo", "gspo"])
def test_gradient_accumulation_micro_batches_and_minibatches(tok, loss):
    # two groups of four on pages of different lengths (micro-batches pad), one two-turn trajectory
    import policy
    from grads import rel_error, scaled, summed, update_grads

    trajs = [trajectory(tok, 0, 1.0, ["click('12')"], PAGE), trajectory(tok, 0, 0.0, ["click('13')", "noop()"], PAGE),
             trajectory(tok, 0, 0.0, ["noop()"], PAGE), trajectory(tok, 0, 1.0, ["click( '12' )"], PAGE),
             trajectory(tok, 1, 1.0, ["click('12')"], LONG_PAGE), trajectory(tok, 1, 0.0, ["click('15')"], LONG_PAGE),
             trajectory(tok, 1, 0.0, ["click('14')"], LONG_PAGE), trajectory(tok, 1, 1.0, ["press('12', 'Enter')"], LONG_PAGE)]
    model = policy.tiny_model(tok)
    (whole,), stats = update_grads(model, tok, trajs, "--loss", loss, "--micro-batch", "16")
    assert stats["loss/trajectories_trained"] == 8
    (one_by_one,), _ = update_grads(model, tok, trajs, "--loss", loss, "--micro-batch", "1")
    err = rel_error(one_by_one, whole)
    assert err < 1e-5, err  # 8 micro-batches accumulated = one of 8 trajectories (float32 rounding: ~1e-6)
    # two minibatches: two optimizer steps, each on half the trajectories at the batch's scale
    parts, stats = update_grads(model, tok, trajs, "--loss", loss, "--micro-batch", "1", "--minibatches", "2")
    assert len(parts) == stats["loss/updates"] == 2 and all(rel_error(p, whole) > 0.01 for p in parts)
    # loss/grad_norm is the last step's norm, loss/grad_norm_max the largest: a shuffle whose first step is larger
    for seed in range(8):
        steps, st = update_grads(model, tok, trajs, "--loss", loss, "--micro-batch", "16", "--minibatches", "2", seed=seed)
        norms = [sum(float((g.double() ** 2).sum()) for g in p.values()) ** 0.5 for p in steps]  # (no clipping here)
        if norms[0] > 1.01 * norms[1]:
            break
    assert norms[0] > 1.01 * norms[1], norms
    assert st["loss/grad_norm"] == pytest.approx(norms[1], rel=1e-4) and st["loss/grad_norm_max"] == pytest.approx(norms[0], rel=1e-4)
    err = rel_error(summed(parts), scaled(whole, 2))
    assert err < 1e-5, err


def test_env_error_trajectories_leave_their_groups(tok):
    # group 0: rewards 1, 0 and an env_error episode (reward 0); group 1: rewards 1, 1 and an env_error.
    # Kept, the env_error members would shift group 0's advantages (mean 1/3, not 1/2), give group 1
    # a variance (and an update), and train themselves. Left out, the update is the one without them.
    import policy
    from grads import update_grads

    ok = [trajectory(tok, 0, 1.0, ["click('12')"], PAGE), trajectory(tok, 0, 0.0, ["click('13')"], PAGE),
          trajectory(tok, 1, 1.0, ["click('12')"], LONG_PAGE), trajectory(tok, 1, 1.0, ["click( '12' )"], LONG_PAGE)]
    broken = [trajectory(tok, 0, 0.0, ["noop()"], PAGE, env_error=True),
              trajectory(tok, 1, 0.0, ["click('14')"], LONG_PAGE, env_error=True)]
    model = policy.tiny_model(tok)
    (with_errors,), stats = update_grads(model, tok, ok[:2] + broken[:1] + ok[2:] + broken[1:])
    (without,), _ = update_grads(model, tok, ok)
    assert stats["loss/trajectories_trained"] == 2 and stats["rollout/zero_var_groups"] == 0.5
    assert stats["rollout/reward"] == 0.75  # over the four episodes that ended without env_error
    assert all(torch_equal(with_errors[k], without[k]) for k in without)


def test_real_mode_resume_restores_the_rng(tmp_path, monkeypatch):
    # tests/scripted_train.py random: torch's RNG picks which episodes succeed and which wrong reply
    # the others give, so each iteration trains on what the RNG draws. A run stopped after one
    # iteration and resumed must restore the RNG state to end with the same weights, bit for bit.
    # (In this process: train.main seeds every RNG itself.)
    import generators
    import scripted_train
    import train
    from safetensors.torch import load_file

    monkeypatch.setattr(generators, "make_generator", scripted_train.make_generator("random"))

    def train_for(out, iterations, *more):
        train.main(["--mode", "real", "--tiny", "--out", out, "--tasks", "click-button", "--iterations", str(iterations),
                    "--groups-per-iter", "1", "--group-size", "4", "--max-steps", "1", "--num-envs", "1",
                    "--report-every", "0", "--lr", "1e-2", *more])
    whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
    train_for(whole, 2)
    train_for(cut, 1)
    train_for(cut, 2, "--resume")
    ms = metrics(whole)
    assert [m["loss/updates"] for m in ms] == [1, 1]  # both iterations trained (groups with a variance)
    assert [(m["step"], m["rollout/success"]) for m in metrics(cut)] == [(m["step"], m["rollout/success"]) for m in ms]
    a = load_file(os.path.join(whole, "final", "model.safetensors"))
    b = load_file(os.path.join(cut, "final", "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("loss", ["mgrpo", "gspo"])
def test_the_clip_flags_reach_the_loss_each_on_its_own_side(tok, monkeypatch, loss):
    # --clip-low 0.1 --clip-high 0.3 (asymmetric): the loss is called with them, not swapped on the way
    import gspo
    import mgrpo
    import policy
    from grads import update_grads

    module, seen = (mgrpo if loss == "mgrpo" else gspo), []
    real = getattr(module, f"{loss}_loss")

    def spy(*a, **kw):
        seen.append((kw["clip_low"], kw["clip_high"]))
        return real(*a, **kw)
    monkeypatch.setattr(module, f"{loss}_loss", spy)
    trajs = [trajectory(tok, 0, 1.0, ["click('12')"], PAGE), trajectory(tok, 0, 0.0, ["click('13')"], PAGE)]
    update_grads(policy.tiny_model(tok), tok, trajs, "--loss", loss, "--clip-low", "0.1", "--clip-high", "0.3")
    assert seen and set(seen) == {(0.1, 0.3)}, seen


def test_in_run_greedy_evaluations_run_on_the_same_eval_episodes_when_due(tmp_path, monkeypatch):
    # --eval-every 2 over 2 iterations: greedy evaluations before training (step 0) and after
    # iteration 2, not after iteration 1; each on the first --eval-seeds eval seeds of every task.
    # The scripted generator answers a prompt's first start with the expert and its second with a
    # wrong reply, so the same episode evaluated twice reads 1, then 0.
    import benchmarks
    import generators
    import scripted_train
    import train

    monkeypatch.setattr(generators, "make_generator", scripted_train.make_generator("alternate"))
    out = str(tmp_path / "real")
    train.main(["--mode", "real", "--tiny", "--out", out, "--tasks", "click-button", "--iterations", "2",
                "--groups-per-iter", "1", "--group-size", "2", "--max-steps", "1", "--num-envs", "1",
                "--report-every", "0", "--eval-every", "2", "--eval-seeds", "1", "--dynamic-sampling", "0",
                "--reward", "grounded"])
    ms = metrics(out)
    assert [(m["step"], m.get("eval/success")) for m in ms] == [(0, 1.0), (1, None), (2, 0.0)]
    # --reward grounded: the scripted replies carry no thought, so each group's one success earns nothing
    assert [(m["rollout/success"], m["rollout/ungrounded_success"], m["rollout/reward"]) for m in ms
            if "rollout/success" in m] == [(0.5, 0.5, 0.0)] * 2
    assert [m["eval/n"] for m in ms if "eval/n" in m] == [1.0, 1.0]
    assert [m["eval/repeated_action"] for m in ms if "eval/n" in m] == [0.0, 0.0]  # one turn each: no repeat
    assert [m["eval/ungrounded_thought"] for m in ms if "eval/n" in m] == [0.0, 0.0]  # logged (no thought to check)
    assert sorted(os.listdir(os.path.join(out, "evals"))) == ["iter-000000.jsonl", "iter-000002.jsonl"]
    seed = benchmarks.eval_seeds("miniwob", 1)[0]
    for name, success in (("iter-000000.jsonl", True), ("iter-000002.jsonl", False)):
        (t,) = read_jsonl(os.path.join(out, "evals", name))
        assert (t["task"], t["seed"], t["success"]) == ("click-button", seed, success)
        assert t["turns"] and all("prompt_ids" not in u for u in t["turns"])


def test_the_bc_term_enters_every_real_mode_update(tmp_path, monkeypatch, demos):
    # --bc-coef 1: every iteration's update carries the token-mean NLL of the drawn expert turns
    # (loss/nll logged); without the flag there is none. The demos hold click-button only and no
    # task is left out, so the BC term draws from click-button.
    import generators
    import scripted_train
    import train

    monkeypatch.setattr(generators, "make_generator", scripted_train.make_generator("random"))
    for bc in ("0", "1"):
        out = str(tmp_path / f"bc{bc}")
        train.main(["--mode", "real", "--tiny", "--out", out, "--tasks", "click-button", "--iterations", "2",
                    "--groups-per-iter", "1", "--group-size", "2", "--max-steps", "1", "--num-envs", "1",
                    "--report-every", "0", "--dynamic-sampling", "0", "--demos", demos, "--bc-coef", bc,
                    "--bc-trajectories", "3"])
        nlls = [m.get("loss/nll") for m in metrics(out) if "loss/updates" in m]
        assert len(nlls) == 2 and (all(x is None for x in nlls) if bc == "0" else all(x and x > 0 for x in nlls)), nlls


def test_the_negative_advantage_weight_reaches_the_update(tok):
    # --neg-adv-weight 0.25 on a group with rewards 1/0 (advantages +1/-1): the same gradient as the
    # group's advantages given by hand as +1 and -0.25
    import policy
    from grads import rel_error, update_grads

    model = policy.tiny_model(tok)
    group = [trajectory(tok, 0, 1.0, ["click('12')"], PAGE), trajectory(tok, 0, 0.0, ["click('13')"], PAGE)]
    (g,), _ = update_grads(model, tok, [dict(t) for t in group], "--neg-adv-weight", "0.25")
    (by_hand,), _ = update_grads(model, tok, [dict(group[0], advantage=1.0), dict(group[1], advantage=-0.25)])
    (plain,), _ = update_grads(model, tok, [dict(t) for t in group])
    assert rel_error(g, by_hand) < 1e-5
    assert rel_error(plain, by_hand) > 0.1


def test_supervised_micro_batches_accumulate_the_gradient_of_the_whole_batch(tok):
    """supervised.accumulate_gradients (the bc / wm / judge step): --micro-batch is a memory lever only;
    micro-batches of 1, 2 or 3 (prompts of different lengths: padding) give the gradient and loss of the
    whole batch in one pass, and the loss is the token mean over n_tok."""
    import compress
    import policy
    import supervised
    from grads import rel_error

    pages = ["[12] button 'OK'", "[12] button 'OK'\n[13] link 'a much longer page than the first one'\n" * 3,
             "[7] textbox 'Name'", "[9] checkbox 'x'\n" * 5, "[3] heading 'Title'"]
    batch = [(tok.encode(f"Goal: click.\n{p}"), compress.encode_reply(tok, f"click('{i}')")) for i, p in enumerate(pages)]
    n_tok = sum(len(t) for _, t in batch)
    model = policy.tiny_model(tok, seed=5)

    def grads(micro_batch):
        model.zero_grad(set_to_none=True)
        loss, tokens = supervised.accumulate_gradients(model, tok, batch, n_tok, micro_batch, "cpu", False)
        return loss, tokens, {k: p.grad.clone() for k, p in model.named_parameters()}

    loss, tokens, whole = grads(len(batch))
    assert tokens == sum(len(p) + len(t) for p, t in batch)
    with torch.no_grad():  # the token mean of -log p(target | prompt)
        logp, mask, _ = policy.reply_logprobs(model, [p for p, _ in batch], [t for _, t in batch], tok.pad_token_id)
    assert loss == pytest.approx(float(-(logp * mask).sum() / n_tok), rel=1e-5)
    for micro_batch in (1, 2, 3):
        part_loss, _, part = grads(micro_batch)
        assert part_loss == pytest.approx(loss, rel=1e-5)
        assert rel_error(part, whole) < 1e-5


def test_gradient_checkpointing_keeps_the_supervised_gradient(tok):
    """policy.enable_grad_ckpt (--grad-ckpt 1): the model recomputes activations (and says so, which
    turns off policy.reply_logprobs' shared prefix) and caches nothing, and the gradient is the same."""
    import compress
    import policy
    import supervised
    from grads import rel_error

    batch = [(tok.encode(f"Goal: click.\n[{i}] button 'OK'" + " x" * 9 * i), compress.encode_reply(tok, f"click('{i}')"))
             for i in range(3)]
    n_tok = sum(len(t) for _, t in batch)

    def grads(model):
        model.train()
        supervised.accumulate_gradients(model, tok, batch, n_tok, 2, "cpu", False)
        return {k: p.grad.clone() for k, p in model.named_parameters()}

    plain, ckpt = policy.tiny_model(tok, seed=6), policy.tiny_model(tok, seed=6)
    policy.enable_grad_ckpt(ckpt)
    assert policy.grad_ckpt_enabled(ckpt) and not policy.grad_ckpt_enabled(plain) and ckpt.config.use_cache is False
    assert rel_error(grads(ckpt), grads(plain)) < 1e-5
