"""Dream mode (DynaWeb): batch composition, the expert-trajectory loss terms, replay of dreams on
real pages, k-step drift, and train.py --mode dream end to end with tiny models."""
import json
import os
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import policy  # noqa: E402
import dream  # noqa: E402
import dream_replay  # noqa: E402
import judge  # noqa: E402
import train  # noqa: E402
import supervised  # noqa: E402
import update  # noqa: E402
import transitions as trans  # noqa: E402
import world_model as wm  # noqa: E402
import wm_eval  # noqa: E402
from runlog import read_jsonl  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "transitions.jsonl")


@pytest.fixture(scope="module")
def tok():
    return policy.load_tokenizer()


@pytest.mark.parametrize("ratio,n_real,n_jobs", [(0.4, 13, 20), (0.0, 0, 32), (1.0, 32, 0), (0.2, 6, 24), (0.6, 19, 12)])
def test_batch_holds_the_real_ratio(ratio, n_real, n_jobs):
    # 8 groups x G=4 = 32 trajectories; real = round(32 R); dream groups = round((32 - real) / 4)
    args = train.parse_args(["--mode", "dream", "--real-ratio", str(ratio), "--world-model", ROOT])
    experts = [{"task": "click-button", "k": k} for k in range(5)]
    jobs, real = dream.dream_batch(args, 0, 0, 1, experts)
    assert (len(real), len(jobs)) == (n_real, n_jobs)
    assert all(jobs[i] == jobs[i - i % 4] for i in range(len(jobs)))  # G consecutive copies of one (task, seed)
    # two ranks split the same draw: nothing lost, nothing doubled, groups whole on one rank
    j0, r0 = dream.dream_batch(args, 0, 0, 2, experts)
    j1, r1 = dream.dream_batch(args, 0, 1, 2, experts)
    assert len(j0) + len(j1) == n_jobs and len(r0) + len(r1) == n_real
    assert sorted(j0 + j1) == sorted(jobs) and not set(j0) & set(j1)


def test_expert_deal_spreads_tasks_and_repeats_no_demo_within_a_pass():
    # 15 tasks x 20 demos, 19 a batch (real ratio 0.6): the first 15 batches are one pass (285 of 300)
    demos = [{"task": f"t{t:02d}", "k": k} for t in range(15) for k in range(20)]
    batches = [supervised.expert_deal(demos, 19, it, seed=0) for it in range(15)]
    seen = [id(d) for b in batches for d in b]
    assert len(seen) == len(set(seen)) == 285  # no demo twice in a pass
    for b in batches:  # a batch of 19 spans at most three rounds of the 15 tasks: no task more than 3 times
        assert len(b) == 19 and max(Counter(d["task"] for d in b).values()) <= 3
    assert supervised.expert_deal(demos, 19, 3, seed=0) == batches[3]  # the same deal on every rank and on resume
    assert supervised.expert_deal(demos, 19, 3, seed=1) != batches[3]
    # the next pass deals every demo again, in a new order
    nxt = [id(d) for it in range(15, 32) for d in supervised.expert_deal(demos, 19, it, seed=0)]
    assert set(nxt[15:15 + 300]) == {id(d) for d in demos}
    assert [id(d) for d in supervised.expert_deal(demos, 300, 1, seed=0)] != [id(d) for d in supervised.expert_deal(demos, 300, 0, seed=0)]
    # tasks with few demos are dealt too; nothing to deal is an empty batch
    uneven = [{"task": "a", "k": 0}] + [{"task": "b", "k": k} for k in range(9)]
    assert sorted(d["k"] for d in supervised.expert_deal(uneven, 10, 0, seed=0) if d["task"] == "b") == list(range(9))
    assert supervised.expert_deal([], 5, 0, seed=0) == [] and supervised.expert_deal(demos, 0, 0, seed=0) == []


def test_dream_batch_deals_experts_unless_random_is_asked():
    demos = [{"task": f"t{t}", "k": k} for t in range(4) for k in range(3)]
    args = train.parse_args(["--mode", "dream", "--real-ratio", "0.25", "--world-model", ROOT])  # 8 experts
    _, real = dream.dream_batch(args, 1, 0, 1, demos)
    assert real == supervised.expert_deal(demos, 8, 1, args.seed)
    _, r0 = dream.dream_batch(args, 1, 0, 2, demos)
    _, r1 = dream.dream_batch(args, 1, 1, 2, demos)
    assert r0 + r1 != real and sorted(map(id, r0 + r1)) == sorted(map(id, real))  # ranks split the one deal
    args = train.parse_args(["--mode", "dream", "--real-ratio", "0.25", "--world-model", ROOT, "--expert-draw", "random"])
    _, rand = dream.dream_batch(args, 1, 0, 1, demos)
    assert len(rand) == 8 and rand != real


def test_start_states_know_how_to_reach_them_again():
    trs = trans.load_transitions(DATA)
    states = trans.start_states(trs, "click-tab-2")
    late = [s for s in states if s["prefix"]]
    assert late and all(s["seed"] is not None for s in states)
    ep = [t for t in trs if t["task"] == "click-tab-2" and t["seed"] == 1]
    s2 = next(s for s in states if s["axtree"] == ep[2]["obs"]["axtree"])
    assert s2["prefix"] == [ep[0]["action"], ep[1]["action"]]
    assert trans.pick_start_state(states, 7, "click-tab-2") is trans.pick_start_state(states, 7, "click-tab-2")
    with pytest.raises(ValueError):
        trans.pick_start_state(states, 7, "click-button")


def test_replay_reaches_a_late_start_state_on_real_pages():
    trs = trans.load_transitions(DATA)
    ep = [t for t in trs if t["task"] == "click-button" and t["seed"] == 2]  # three recorded steps
    start = next(s for s in trans.start_states(trs, "click-button") if s["seed"] == 2 and len(s["prefix"]) == 2)
    r = trans.replay(start, [ep[2]["action"]])
    assert r["start_match"], "the prefix actions on the same seed must rebuild the same page"
    assert r["steps"] == 3 and not r["env_error"]
    assert r["success"] == ep[2]["success"] and r["states"][0]["axtree"] == ep[2]["next_obs"]["axtree"]
    # the recording's step limit (3), not the task, ended the recorded episode; the replay's limit is 30
    assert ep[2]["truncated"] and not r["done"]
    from env import WebEnv

    capped = WebEnv("click-button", max_steps=3)  # the recording's limit: the episode ends, by the limit
    try:
        r3 = trans.replay(start, [ep[2]["action"]], env=capped)
    finally:
        capped.close()
    assert r3["steps"] == 3 and not r3["done"] and not r3["success"]
    import wm_refit  # the replay as the world model's training transition: the recorded step's own label

    (t,) = wm_refit.replay_transitions({"turns": [{"action": ep[2]["action"]}]}, start, r, iteration=1)
    assert t["delta"] == trans.delta_label(ep[2]) and t["delta"].endswith("done: no") and not t["success"]
    tab = [t for t in trs if t["task"] == "click-tab-2" and t["seed"] == 1]  # its 4th step completes the task
    start = next(s for s in trans.start_states(trs, "click-tab-2") if s["seed"] == 1 and len(s["prefix"]) == 3)
    r = trans.replay(start, [tab[3]["action"]])
    assert r["done"] and r["success"]
    (t,) = wm_refit.replay_transitions({"turns": [{"action": tab[3]["action"]}]}, start, r, iteration=1)
    assert t["delta"] == trans.delta_label(tab[3]) and t["delta"].endswith("done: yes") and t["step"] == 3


def test_drift_with_a_perfect_and_with_a_lazy_world_model(monkeypatch, tok):
    trs = trans.load_transitions(DATA)
    eps = trans.episodes_of(trs)
    assert [len(e) for e in eps] == [3, 4, 3, 3, 2, 1, 1, 3]
    true = {(t["task"], t["seed"], t["step"]): t["delta"] for t in trs}
    by_obs = {}
    for t in trs:
        by_obs.setdefault((t["obs"]["axtree"], t["action"]), t["delta"])

    def perfect(model, tokenizer, states, actions, *a, **k):
        return [by_obs[(s["axtree"], act)] for s, act in zip(states, actions)]

    monkeypatch.setattr(wm_eval, "predict_delta", perfect)
    d = wm_eval.drift(None, tok, trs, k_max=5)
    assert {k: v["n"] for k, v in d.items()} == {1: 8, 2: 6, 3: 5, 4: 1}  # episodes at least k steps long
    assert all(v["exact_match"] == 1.0 and v["tree_f1"] == 1.0 for v in d.values())
    monkeypatch.setattr(wm_eval, "predict_delta", lambda m, t, states, actions, *a, **k: ["done: no"] * len(states))
    lazy = wm_eval.drift(None, tok, trs, k_max=1)  # "nothing changes": right exactly where the page did not change
    unchanged = sum(e[0]["next_obs"]["axtree"] == e[0]["obs"]["axtree"] and e[0]["next_obs"]["url"] == e[0]["obs"]["url"]
                    for e in eps)
    assert lazy[1]["exact_match"] == unchanged / 8
    assert true  # (the recorded Δ are what `perfect` returns)


def test_tree_f1_by_hand():
    assert wm_eval.tree_f1("a\nb\nc", "a\nb\nd") == pytest.approx(2 * 2 / 6)
    assert wm_eval.tree_f1("", "") == 1.0 and wm_eval.tree_f1("a", "") == 0.0


def expert_turn(tok, action):
    import compress

    prompt = compress.build_prompt(tok, [], "Goal: Click on the \"OK\" button.\nURL: click-button.html\n[12] button 'OK'")
    return prompt, tok.encode(action, add_special_tokens=False) + [tok.eos_token_id]


def test_nll_term_alone_raises_the_expert_action(tok):
    model = policy.tiny_model(tok)
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--lr", "1e-3", "--micro-batch", "2"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    p, r = expert_turn(tok, "click('12')")
    with torch.no_grad():
        before, rm, _ = update.score(model, tok, [(0, p, r)], args.temperature, False, "cpu")
    stats = update.policy_update(model, opt, tok, [], train.update_config(args), "cpu", 1, nll=[(p, r)] * 3, nll_coef=1.0, rl_scale=0.0)
    with torch.no_grad():
        after, _, _ = update.score(model, tok, [(0, p, r)], args.temperature, False, "cpu")
    assert ((after - before) * rm).sum() > 0
    assert stats["loss/updates"] == 1 and stats["loss/nll"] == pytest.approx(-float((before * rm).sum() / rm.sum()), rel=1e-4)


def test_kl_anchor_is_the_full_vocabulary_kl_to_the_reference_along_the_expert_reply(tok):
    # --expert-loss kl: the expert term is KL(ref || policy) at each position of the expert's reply
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--lr", "1e-3", "--micro-batch", "2"])
    p, r = expert_turn(tok, "click('12')")
    p2, r2 = expert_turn(tok, "fill('12', 'hi')")
    ref, model = policy.tiny_model(tok, seed=1).eval(), policy.tiny_model(tok, seed=2)
    with torch.no_grad():  # the whole next-token distributions; their gathered entries are the reply log-probs
        lr_, rm, L = update.score(ref, tok, [(0, p, r), (0, p2, r2)], 1.0, False, "cpu", full=True)
        lp, _, _ = update.score(model, tok, [(0, p, r), (0, p2, r2)], 1.0, False, "cpu", full=True)
        lp_tok, _, _ = update.score(model, tok, [(0, p, r), (0, p2, r2)], 1.0, False, "cpu")
    ids = torch.tensor([[0] * (L - len(x)) + x for x in (r, r2)])
    assert torch.allclose(lp.gather(-1, ids[..., None])[..., 0] * rm, lp_tok * rm, atol=1e-5)
    kl = float(((lr_.exp() * (lr_ - lp)).sum(-1) * rm).sum() / rm.sum())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    cfg = train.update_config(args)
    stats = update.policy_update(model, opt, tok, [], cfg, "cpu", 1, nll=[(p, r), (p2, r2)], nll_coef=1.0,
                                 rl_scale=0.0, nll_ref=ref)
    assert kl > 0.01 and stats["loss/nll"] == pytest.approx(kl, rel=1e-4)
    for _ in range(5):
        last = update.policy_update(model, opt, tok, [], cfg, "cpu", 1, nll=[(p, r), (p2, r2)], nll_coef=1.0,
                                    rl_scale=0.0, nll_ref=ref)["loss/nll"]
    assert last < kl / 2  # the policy moved toward the reference
    same = policy.tiny_model(tok, seed=1)  # the policy is the reference: a zero loss and a zero gradient
    w = [t.detach().clone() for t in same.parameters()]  # (plain SGD: AdamW would blow float noise up to lr)
    st = update.policy_update(same, torch.optim.SGD(same.parameters(), lr=1.0), tok, [], cfg, "cpu", 1,
                              nll=[(p, r)], nll_coef=1.0, rl_scale=0.0, nll_ref=ref)
    assert st["loss/nll"] == pytest.approx(0.0, abs=1e-6)
    assert all(torch.allclose(a, b.detach(), atol=1e-5) for a, b in zip(w, same.parameters()))
    args.expert_loss = "kl"
    with pytest.raises(ValueError, match="needs the reference model"):
        dream.dream_update(model, opt, tok, [], [], args, cfg, "cpu", 1, seed=0)


def test_an_advantage_key_overrides_the_group_advantage(tok):
    model = policy.tiny_model(tok)
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--lr", "1e-3"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    p, r = expert_turn(tok, "click('12')")
    t = {"task": "click-button", "seed": "expert-0", "env_error": False, "reward": 1.0, "success": True,
         "turns": [{"prompt_ids": p, "response_ids": r}]}
    # alone in its group its advantage would be 0 and nothing would train
    assert update.policy_update(model, opt, tok, [dict(t)], train.update_config(args), "cpu", 1)["loss/trajectories_trained"] == 0
    stats = update.policy_update(model, opt, tok, [dict(t, advantage=0.5)], train.update_config(args), "cpu", 1)
    assert stats["loss/trajectories_trained"] == 1 and stats["loss/updates"] == 1


@pytest.mark.parametrize("expert_loss", ["nll", "gspo", "kl"])
def test_dream_mode_end_to_end(tmp_path, tok, expert_loss, dream_inputs, capfd):
    wm_dir, demos, _ = dream_inputs
    out = str(tmp_path / "dream")
    train.main(["--mode", "dream", "--tiny", "--world-model", wm_dir,
                "--transitions", DATA, "--demos", str(demos), "--tasks", "click-button,enter-text",
                "--iterations", "2", "--groups-per-iter", "2", "--group-size", "2", "--dream-len", "2",
                "--max-new-tokens", "6", "--num-envs", "2", "--replay-every", "2", "--replay-samples", "1",
                "--real-ratio", "0.5", "--expert-loss", expert_loss, "--out", out, "--report-every", "2"]
               # the gspo run also rewards its dreams with a (tiny, random) trajectory judge; the nll run
               # trains with M-GRPO and a KL penalty to its start (the reference model)
               + (["--dream-reward", "judge", "--judge", wm_dir] if expert_loss == "gspo" else
                  # and first probes the start policy on real pages (dream.probe_tasks)
                  ["--loss", "mgrpo", "--kl-coef", "0.1", "--probe-seeds", "1"] if expert_loss == "nll" else
                  # kl: the reference model is built for the expert term alone, and the world model
                  # is refit on the replay check's real transitions (wm_refit.py)
                  ["--wm-refit-steps", "1", "--wm-refit-batch", "2"]))  # in this process: one start fewer
    printed = "".join(capfd.readouterr())
    ms = read_jsonl(os.path.join(out, "metrics.jsonl"))
    probe_rows, ms = [x for x in ms if x["step"] == 0], [x for x in ms if x["step"] > 0]
    assert [x["step"] for x in ms] == [1, 2]
    # 4 trajectories a batch: 2 real, one dream group of 2, each dream 1-2 imagined steps
    assert all(x["dream/real_trajectories"] == 2 and x["dream/trajectories"] == 2 for x in ms)
    assert 4 <= ms[-1]["dream/steps"] <= 8
    if expert_loss == "nll":  # the probe's 2 greedy episodes (one a task, neither solved) are real steps
        assert "probe/success/click-button" in probe_rows[0] and "probe/success/enter-text" in probe_rows[0]
        assert 2 <= ms[0]["env/real_steps"] <= 12 and "dreams on click-button, enter-text" in printed
    else:
        assert not probe_rows and ms[0]["env/real_steps"] == 0
    assert ms[1]["env/real_steps"] > ms[0]["env/real_steps"]  # the replay check uses a browser
    assert "dream/replay_contradiction" in ms[1] and "dream/replay_contradiction" not in ms[0]
    if expert_loss == "kl":  # the run built its reference (dream_update raises without one); iteration 1 starts on it
        assert ms[0]["loss/nll"] == pytest.approx(0.0, abs=1e-6) and ms[1]["loss/nll"] > -1e-6
    elif expert_loss == "nll":
        assert all(x["loss/nll"] > 0 and x["dream/real_share"] == 0.5 for x in ms)
        # iteration 1's likelihood step moved the policy off its start: iteration 2's KL to the reference acts
        assert ms[1]["loss/kl"] > 0
    else:
        assert "loss/nll" not in ms[0] and all(x["loss/trajectories_trained"] >= 2 for x in ms)
        assert all(x["judge/n"] == 2 for x in ms) and "dream/replay_judge_false_positive_rate" in ms[1]
    assert "dream/replay_done_false_positive_rate" in ms[1]
    if expert_loss == "kl":  # the refit ran at the replay check only; the refit world model was saved for a resume
        import wm_refit

        # (the tiny policy's replies rarely parse, so a check may bring no transition, and then no step)
        assert "wm_refit/new" not in ms[0] and ms[1].get("wm_refit/steps", 0) == (1 if ms[1]["wm_refit/new"] else 0)
        for ck in ("final", "step-000002"):  # each checkpoint holds the world model it dreamt in
            assert wm_refit.refit_iteration(os.path.join(out, ck, wm_refit.REFIT_DIR)) == 2
        assert len(read_jsonl(os.path.join(out, "wm_refit-rank0.jsonl"))) == ms[1]["wm_refit/new"]
    else:
        assert "wm_refit/new" not in ms[1] and not any(os.path.exists(os.path.join(out, ck, "world_model"))
                                                         for ck in ("final", "step-000002"))
    dreams = read_jsonl(os.path.join(out, "dreams-rank0.jsonl"))  # every imagined trajectory, without token ids
    assert [(d["iteration"], d["group"]) for d in dreams] == [(1, 0), (1, 0), (2, 0), (2, 0)]
    assert all(d["source"] == "dream" and d["turns"] and "response_ids" not in d["turns"][0] for d in dreams)
    assert [sum(d["reward"] for d in dreams if d["iteration"] == i) / 2 for i in (1, 2)] == [x["rollout/reward"] for x in ms]
    rec = read_jsonl(os.path.join(out, "dream_replays.jsonl"))
    assert len(rec) == 1 and rec[0]["source"] == "dream" and "real_observation" in rec[0]["turns"][0]
    assert "real_transitions" not in rec[0]  # those go to wm_refit-rank{R}.jsonl, when refitting
    assert "done_success" in rec[0] and ("judge_p" in rec[0]) == (expert_loss == "gspo")
    html = open(os.path.join(out, "report", "report.html")).read()  # iteration 2's report, the replayed dream in it
    assert "data-source='dream'" in html and "predicted success" in html
    state = torch.load(os.path.join(out, "final", "trainer_state.pt"), weights_only=False)
    assert state["extra"]["dream_steps"] == ms[-1]["dream/steps"]


def test_every_task_gets_its_turn_of_dreams():
    # 5 dream groups an iteration (ratio 0.4) over 8 tasks: in 8 iterations each task gets 5 groups
    tasks = ["click-button", "click-link", "click-dialog", "click-dialog-2", "click-tab", "click-tab-2",
             "enter-text", "focus-text"]
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--tasks", ",".join(tasks)])

    seen = Counter(task for it in range(8) for task, _ in dream.dream_batch(args, it, 0, 1, [{"task": "click-button"}])[0][::4])
    assert seen == {t: 5 for t in tasks}


def test_the_probe_keeps_dreams_off_the_tasks_the_start_policy_solves(monkeypatch):
    # --probe-seeds in dream mode (dream.probe_tasks): real.probe's counts decide; a task solved on
    # every probe episode gets no dream group (its G rewards would be equal: advantage 0), a task
    # with an episode lost to env_error keeps its dreams; every task solved: dreams on all of them
    tasks = ["click-button", "enter-text", "click-link", "focus-text"]
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--tasks", ",".join(tasks),
                             "--probe-seeds", "3"])
    import real

    counts = {"click-button": (3, 3), "enter-text": (1, 3), "click-link": (3, 3), "focus-text": (2, 2)}
    monkeypatch.setattr(real, "probe", lambda args, gen, tok, pool, rank, world: (counts, 11))
    monkeypatch.setattr(dream.rollouts, "EnvPool", lambda *a, **k: SimpleNamespace(close=lambda: None))
    kept, probed, steps = dream.probe_tasks(args, None, None, 0, 1)
    assert kept == ["enter-text", "focus-text"] and probed == counts and steps == 11
    seen = {task for it in range(6) for task, _ in dream.dream_batch(args, it, 0, 1, [{"task": "click-button"}], kept)[0]}
    assert seen == {"enter-text", "focus-text"}
    counts = {t: (3, 3) for t in tasks}
    assert dream.probe_tasks(args, None, None, 0, 1)[0] == tasks


@pytest.mark.parametrize("cap", [0, 3])
def test_dynamic_sampling_in_dreams_trains_on_groups_with_signal(monkeypatch, cap):
    # dream.collect_dreams: click-button's dreams all succeed (a group without signal), enter-text's
    # first dream of a group fails and its second succeeds. Off: the drawn groups, as they are. CAP 3:
    # more groups of the given tasks until 2 have signal, at most 3 x 2 groups drawn in all.
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--group-size", "2",
                             "--dynamic-sampling", str(cap)])
    calls = []

    def fake_rollout(gen, tok, pool, jobs, **kw):
        calls.append(list(jobs))
        return [{"task": task, "seed": seed, "reward": float(task == "click-button" or k % 2 == 1), "turns": [],
                 "success": task == "click-button" or k % 2 == 1, "env_error": False}
                for k, (task, seed) in enumerate(jobs)], {"env_steps": len(jobs)}

    monkeypatch.setattr(dream.rollouts, "rollout", fake_rollout)
    jobs = [("click-button", 1)] * 2 + [("click-button", 2)] * 2
    kept, rolled, rstats, jstats = dream.collect_dreams(args, 0, 0, jobs, None, None, None, ["enter-text"],
                                                        None, None, None)
    assert jstats == {} and calls[0] == jobs
    if not cap:
        assert len(calls) == 1 and kept == rolled and len(rolled) == 4 and "sampling/groups_drawn" not in rstats
        return
    # no signal yet: the next draw assumes the floor rate 0.2, 2 / 0.2 = 10 groups, capped at 6 - 2 = 4
    assert len(calls) == 2 and len(calls[1]) == 4 * 2 and {t for t, _ in calls[1]} == {"enter-text"}
    assert len(rolled) == 12 and rstats["env_steps"] == 12
    assert len(kept) == 4 and all(t["task"] == "enter-text" for t in kept) and [t["reward"] for t in kept] == [0, 1, 0, 1]
    assert rstats["sampling/groups_drawn"] == 6 and rstats["sampling/groups_kept"] == 2


@pytest.mark.parametrize("loss", ["gspo", "mgrpo"])
def test_the_advantage_key_is_the_advantage_used(tok, loss):
    # One trajectory alone in its group (group advantage 0) with advantage A: at ratio 1 both losses
    # are -A times the mean log-prob of its action tokens, so the gradient is -A times that mean's.
    from grads import rel_error, scaled, update_grads

    model = policy.tiny_model(tok)
    p, r = expert_turn(tok, "click('12')")
    logp, rm, _ = update.score(model, tok, [(0, p, r)], 1.0, False, "cpu")
    (-(logp * rm).sum() / rm.sum()).backward()
    ref = {n: q.grad.clone() for n, q in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    t = {"task": "click-button", "seed": "expert-0", "env_error": False, "reward": 1.0, "success": True,
         "turns": [{"prompt_ids": p, "response_ids": r}]}
    for a in (0.5, -2.0):
        (g,), stats = update_grads(model, tok, [dict(t, advantage=a)], "--mode", "dream", "--world-model", ROOT,
                                   "--loss", loss)
        err = rel_error(g, scaled(ref, a))
        assert err < 1e-5 and stats["loss/trajectories_trained"] == 1, (a, err)


def recorded_obs(t: dict, key: str = "obs") -> str:
    """The observation text the agent saw on a recorded transition's page (env.Obs.text)."""
    from env import Obs

    o = t[key]
    return Obs(t["goal"], o["url"], o["axtree"], o.get("error", "")).text


class Replies:
    """A generator (generators.py's contract) that answers `text` to every prompt and keeps the prompts."""

    def __init__(self, tok, text):
        self.tok, self.text, self.prompts = tok, text, []

    def generate(self, prompts, **kw):
        self.prompts += prompts
        ids = self.tok.encode(self.text, add_special_tokens=False) + [self.tok.eos_token_id]
        return [policy.Sample(ids=ids, logprobs=[0.0] * len(ids), text=self.text) for _ in prompts]


@pytest.mark.parametrize("keep_last", [1, 3])
def test_a_dream_from_stage_k_is_prompted_like_the_real_episode_at_stage_k(tok, keep_last):
    import compress
    import rollout

    trs = trans.load_transitions(DATA)
    ep = [t for t in trs if t["task"] == "click-tab-2" and t["seed"] == 1]  # four recorded steps
    states = trans.start_states(trs, "click-tab-2")
    k = 3
    start = next(s for s in states if s["axtree"] == ep[k]["obs"]["axtree"] and s["seed"] == 1)
    assert start["prefix"] == [t["action"] for t in ep[:k]] and len(start["prefix_obs"]) == k
    seed = next(x for x in range(1000) if trans.pick_start_state(states, x, "click-tab-2") is start)
    # the prompt the policy sees at stage k of the real episode: the first k pages and actions, then page k
    settings = compress.PromptSettings(keep_last=keep_last)
    real_history = [{"observation": recorded_obs(t), "response": t["action"]} for t in ep[:k]]
    real = settings.build(tok, real_history, recorded_obs(ep[k]))
    pool = rollout.EnvPool(lambda task: wm.DreamEnv(None, tok, states, dream_len=2, server=Fixed("~ [33] x\ndone: no")),
                           tok, num_envs=1)
    gen = Replies(tok, "click('33')")
    try:
        (traj,), _ = rollout.rollout(gen, tok, pool, [("click-tab-2", seed)], prompt=settings, source="dream")
    finally:
        pool.close()
    assert traj["turns"][0]["prompt_ids"] == real
    assert traj["context"] == real_history and traj["steps"] == len(traj["turns"]) == 2
    # the second prompt: the same k turns, then the dream's own first turn
    hist2 = real_history + [{"observation": traj["turns"][0]["observation"], "response": "click('33')"}]
    assert traj["turns"][1]["prompt_ids"] == settings.build(tok, hist2, traj["turns"][1]["observation"])
    assert "\n[33] x\n" in traj["turns"][1]["observation"] or "\n [33] x\n" in traj["turns"][1]["observation"]
    assert traj["final_observation"] == traj["turns"][1]["observation"]  # (the second Δ changes nothing)


class Fixed:
    """A stand-in for world_model.DeltaServer that predicts the same Δ for every step."""

    def __init__(self, delta):
        self.delta, self.calls = delta, []

    def predict(self, state, action):
        self.calls.append((dict(state), action))
        return self.delta


def test_the_update_never_scores_the_context(tok):
    # a trajectory's context is prompt history only: policy_update's samples are its turns
    model = policy.tiny_model(tok)
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--lr", "1e-3"])
    p, r = expert_turn(tok, "click('12')")
    t = {"task": "click-button", "seed": 0, "env_error": False, "reward": 1.0, "success": True, "advantage": 1.0,
         "turns": [{"prompt_ids": p, "response_ids": r}]}
    scored = []
    real_score = update.score

    def spy(model, tok, batch, *a):
        scored.extend(len(b[2]) for b in batch)
        return real_score(model, tok, batch, *a)

    import unittest.mock

    with unittest.mock.patch.object(update, "score", spy):
        update.policy_update(model, torch.optim.AdamW(model.parameters()), tok,
                             [dict(t, context=[{"observation": "Goal: x\nURL: y\n[1] button 'z'", "response": "click('1')"}] * 3)],
                             train.update_config(args), "cpu", 1)
    assert scored == [len(r)]


def dream_group(tok, rewards):
    """One group of dreams (the same task and seed), one turn each, with these rewards."""
    p, r = expert_turn(tok, "click('12')")
    return [{"task": "click-button", "seed": 5, "source": "dream", "env_error": False, "reward": float(x),
             "success": bool(x), "steps": 1, "turns": [{"prompt_ids": p, "response_ids": r}]} for x in rewards]


def expert_demos(n):
    obs = "Goal: Click on the \"OK\" button.\nURL: click-button.html\n[12] button 'OK'"
    return [{"task": "click-button", "seed": k, "success": True, "turns": [{"observation": obs, "action": "click('12')"}]}
            for k in range(n)]


def test_the_logged_dream_reward_leaves_the_expert_trajectories_out(tok):
    # --expert-loss gspo: the experts are GSPO samples (reward 1) in the update, but rollout/reward is the dreams'
    model = policy.tiny_model(tok)
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--expert-loss", "gspo"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    stats = dream.dream_update(model, opt, tok, dream_group(tok, [1, 0, 0, 0]), expert_demos(2), args,
                               train.update_config(args), "cpu", 1, seed=0)
    assert stats["loss/trajectories"] == 6  # four dreams and two experts were trained on
    assert stats["rollout/reward"] == 0.25  # (the update's own mean would be 3 / 6)
    assert (stats["dream/trajectories"], stats["dream/real_trajectories"]) == (4, 2)


def test_dream_mode_with_mgrpo_and_kl_builds_the_reference_and_its_kl_acts(tmp_path, tok, monkeypatch):
    # main builds `ref` (the run's start) for dream mode and hands it on to train_dream -> policy_update
    seen = {}

    def spy(*a, ref=None, **k):
        seen["ref"], seen["model"] = ref, a[1]
        seen["cfg"] = a[6]

    monkeypatch.setattr(dream, "train_dream", spy)
    (tmp_path / "wm").mkdir()  # main checks that the paths it will read hold a model and data (train_dream reads them)
    (tmp_path / "wm" / "config.json").write_text("{}")
    for f in ("demos.jsonl", "transitions.jsonl"):
        (tmp_path / f).write_text("")
    train.main(["--mode", "dream", "--tiny", "--world-model", str(tmp_path / "wm"), "--loss", "mgrpo", "--kl-coef", "0.1",
                "--demos", str(tmp_path / "demos.jsonl"), "--transitions", str(tmp_path / "transitions.jsonl"),
                "--out", str(tmp_path / "run"), "--tasks", "click-button"])
    assert seen["ref"] is not None and seen["ref"] is not seen["model"] and seen["cfg"].kl_coef == 0.1
    assert not any(p.requires_grad for p in seen["ref"].parameters())
    # ... and the update uses it: the k3 KL of a policy that has moved away from its reference is in the loss
    model = policy.tiny_model(tok)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--loss", "mgrpo", "--kl-coef", "0.1",
                             "--expert-loss", "gspo"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    group = dream_group(tok, [0, 0, 0, 0])  # no reward signal: only the KL term has a gradient
    stats = dream.dream_update(model, opt, tok, group, [], args, train.update_config(args), "cpu", 1, seed=0,
                               ref=seen["ref"])
    assert stats["loss/kl"] > 0 and stats["loss/trajectories_trained"] == 4 and stats["loss/grad_norm"] > 0
    with pytest.raises(ValueError, match="reference"):
        dream.dream_update(model, opt, tok, group, [], args, train.update_config(args), "cpu", 1, seed=0)


def test_replaying_a_dream_file_scores_its_rewards_against_real_pages(tmp_path):
    """dream_replay.replay_dream_file: a rewarded dream whose action really completes the task is a true
    positive, a rewarded one whose action does not is a false positive, an unrewarded success a
    false negative (real Chromium, the recorded start state of click-tab-2 seed 0 at stage 2); the
    world model's done: line and a judge's P(yes) at each threshold are scored on the same replays."""
    trs = trans.load_transitions(DATA)
    states = trans.start_states(trs)
    ep = [t for t in trs if t["task"] == "click-tab-2" and t["seed"] == 0]
    seed = next(s for s in range(1000)
                if trans.pick_start_state(states, s, "click-tab-2")["prefix"] == [ep[0]["action"], ep[1]["action"]])

    def rec(action, reward, done, p):
        return {"task": "click-tab-2", "seed": seed, "source": "dream", "reward": reward, "env_error": False,
                "done_success": done, "p": p, "iteration": 1, "group": 0,
                "turns": [{"observation": "", "response": action, "action": action}]}

    path = tmp_path / "dreams-rank0.jsonl"
    rows = [rec(ep[2]["action"], 1.0, True, 0.95), rec("click('21')", 1.0, False, 0.7),
            rec(ep[2]["action"], 0.0, True, 0.2), {**rec("click('21')", 1.0, True, 0.9), "iteration": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records, labelled = [], []
    res = dream_replay.replay_dream_file(str(path), DATA, iterations=[1], judge_p=lambda rs: [r["p"] for r in rs],
                                  thresholds=(0.5, 0.9), records=records, labelled=labelled)
    assert labelled == [{**r, "real_success": ok} for r, ok in zip(rows[:3], (True, False, True))]
    assert list(res) == ["trained", "done", "judge>0.5", "judge>0.9", "judge-p"]
    assert [(r["real_success"], r["trained"], r["judge-p"]) for r in records] == [(True, 1.0, 0.95), (False, 1.0, 0.7),
                                                                                  (True, 0.0, 0.2)]
    # in-group order: the one pair of (success, failure) dreams per success; a tie counts 1/2
    assert [(res[k]["all"]["ranked_pairs"], res[k]["all"]["ranking"]) for k in ("trained", "done", "judge-p")] == \
        [(2, 0.25), (2, 1.0), (2, 0.5)]
    c = res["trained"]["click-tab-2"]
    assert res["trained"]["all"] == c
    assert (c["dreams"], c["matched"], c["rewarded"], c["real_success"]) == (3, 3, 2, 2)
    assert (c["true_positive"], c["false_positive"], c["false_negative"]) == (1, 1, 1)
    assert c["precision"] == 0.5 and c["recall"] == 0.5 and c["real_steps"] == 9
    done, lax, strict = (res[k]["all"] for k in ("done", "judge>0.5", "judge>0.9"))
    assert (done["true_positive"], done["false_positive"], done["false_negative"]) == (2, 0, 0)
    assert (lax["true_positive"], lax["false_positive"], lax["false_negative"]) == (1, 1, 1)
    assert (strict["true_positive"], strict["false_positive"], strict["false_negative"]) == (1, 0, 1)
    assert strict["precision"] == 1.0 and strict["recall"] == 0.5


def test_dream_replay_command_scores_a_judge_and_writes_labelled_dreams(tmp_path, tok):
    """`python dream_replay.py DREAMS... --judge CKPT --out --labelled`: the command line scores the run's
    reward, the world model's done: line and the judge checkpoint's P(yes) (in the format its
    webdream.json says) on the same replayed dreams, and writes the per-dream scores and the dreams
    with their real outcomes (real Chromium; a tiny judge built from a config)."""
    trs = trans.load_transitions(DATA)
    states = trans.start_states(trs)
    ep = [t for t in trs if t["task"] == "click-tab-2" and t["seed"] == 0]
    seed = next(s for s in range(1000)
                if trans.pick_start_state(states, s, "click-tab-2")["prefix"] == [ep[0]["action"], ep[1]["action"]])
    rows = [{"task": "click-tab-2", "seed": seed, "source": "dream", "reward": r, "env_error": False,
             "done_success": True, "iteration": 1, "group": 0,
             "turns": [{"observation": ep[2]["obs"]["axtree"], "response": a, "action": a}]}
            for a, r in ((ep[2]["action"], 1.0), ("click('21')", 0.0))]  # the page a target line is read from
    dreams = [tmp_path / "run" / f"dreams-rank{rank}.jsonl" for rank in (0, 1)]  # two ranks, one dream each
    dreams[0].parent.mkdir()
    for path, r in zip(dreams, rows):
        path.write_text(json.dumps(r) + "\n")
    ckpt = tmp_path / "judge"
    policy.tiny_model(tok, seed=4).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    (ckpt / "webdream.json").write_text(json.dumps({"step": 1, "judge_targets": True}))
    out, labelled = tmp_path / "replay.json", tmp_path / "labelled.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "dream_replay.py"), *map(str, dreams), "--transitions", DATA,
                           "--judge", str(ckpt), "--thresholds", "0.5", "--out", str(out), "--labelled", str(labelled)],
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert list(res) == ["trained", "done", "judge>0.5", "judge-p"]
    assert (res["trained"]["all"]["true_positive"], res["trained"]["all"]["false_positive"]) == (1, 0)
    assert (res["done"]["all"]["true_positive"], res["done"]["all"]["false_positive"]) == (1, 1)
    assert res["trained"]["all"]["ranked_pairs"] == 0  # group 0 of rank 0 and group 0 of rank 1 are different groups
    scored = read_jsonl(str(tmp_path / "replay_dreams.jsonl"))
    assert [(r["real_success"], r["file"]) for r in scored] == [(True, 0), (False, 1)]
    assert all(r["judge>0.5"] == float(r["judge-p"] > 0.5) for r in scored)
    # the judge's P(yes) in the format its webdream.json names (with target lines), as train.py would reward
    jm, jtok = policy.load_model(str(ckpt))
    with_targets, without = (judge.judge_trajectories(jm, jtok, rows, max_tokens=1024, targets=t) for t in (True, False))
    assert max(abs(a - b) for a, b in zip(with_targets, without)) > 1e-5  # the formats do score differently
    assert [r["judge-p"] for r in scored] == pytest.approx(with_targets, abs=1e-6)
    assert read_jsonl(str(labelled)) == [{**r, "real_success": ok} for r, ok in zip(rows, (True, False))]
    assert "| click-tab-2 | 2 | 2 |" in proc.stdout


def test_the_old_replay_command_says_where_the_replay_went():
    """`python dream.py --replay ...` (the command before dream_replay.py) fails with a pointer, not silently."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "dream.py"), "--replay", "x.jsonl"], capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120)
    assert proc.returncode != 0 and "python dream_replay.py" in proc.stderr
