"""The trajectory judge (judge.py): what it sees, what reward a dream gets from it, its labels, its training."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import checkpoint  # noqa: E402
import compress  # noqa: E402
import dream  # noqa: E402
import judge  # noqa: E402
import policy  # noqa: E402
import train  # noqa: E402
import transitions as trans  # noqa: E402
from env import Obs  # noqa: E402
from test_world_model import forced_model  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "transitions.jsonl")
GOAL = 'Enter "Myron" into the text field and press Submit.'


@pytest.fixture(scope="module")
def tok():
    return policy.load_tokenizer()


def page(axtree, error=""):
    return Obs(GOAL, "miniwob/enter-text.html", axtree, error).text


def dream_record(done_success=False):
    """A dream from stage 1 of a real enter-text episode: one real turn of context (the name typed),
    then one imagined turn (Submit clicked) and the imagined page after it."""
    return {"task": "enter-text", "seed": 3, "goal": GOAL, "source": "dream", "env_error": False, "steps": 1,
            "reward": float(done_success), "success": done_success,
            "context": [{"observation": page("[14] textbox\n[15] button 'Submit'"), "response": "fill('14', 'Myron')"}],
            "turns": [{"observation": page("[14] textbox value='Myron'\n[15] button 'Submit'"), "action": "click('15')",
                       "response": "<think>submit</think>click('15')", "error": ""}],
            "final_observation": page("[14] textbox value='Myron'\n[15] button 'Submit', focused\nStaticText 'Sent (imagined)'")}


def test_the_judge_sees_the_goal_the_real_context_and_the_imagined_pages(tok):
    text = tok.decode(judge.judge_prompt(tok, *judge.trajectory_view(dream_record())))
    assert text.count(GOAL) == 1  # the goal once, not once per page
    assert ("Page 1:\nURL: miniwob/enter-text.html\n[14] textbox\n[15] button 'Submit'\n"
            "Action 1: fill('14', 'Myron') on [14] textbox\n"
            "Page 2:\nURL: miniwob/enter-text.html\n[14] textbox value='Myron'\n[15] button 'Submit'\n"
            "Action 2: click('15') on [15] button 'Submit'\nFinal page:\nURL: miniwob/enter-text.html\n[14] textbox value='Myron'\n"
            "[15] button 'Submit', focused\nStaticText 'Sent (imagined)'\nDid the actions complete the goal?") in text
    assert text.startswith("<|im_start|>system\n" + judge.JUDGE_SYSTEM_PROMPT)


def test_each_action_shows_the_line_it_acted_on_and_old_judges_keep_their_format(tok, tmp_path):
    page_ = "URL: x\n[17] tablist\n [33] link 'Tab #3', selected\n[34] generic 'Proin'\n  [35] textbox value='34'"
    assert judge.action_target(page_, "click('34')") == "[34] generic 'Proin'"
    assert judge.action_target(page_, "<think>the word</think>\nclick('33')") == "[33] link 'Tab #3', selected"
    assert judge.action_target(page_, "fill('35', 'a')") == "[35] textbox value='34'"
    # no target: a bid not on the page, an action without a bid (a message that looks like one), a reply
    # that does not parse
    assert [judge.action_target(page_, a) for a in ("click('99')", "scroll(0, 100)", "send_msg_to_user('34')",
                                                    "click(34", "34")] == [None] * 5
    view = judge.trajectory_view(dream_record())
    old = tok.decode(judge.judge_prompt(tok, *view, targets=False))
    assert "Action 1: fill('14', 'Myron')\nPage 2:" in old and " on [" not in old
    # a judge checkpoint says which format it learnt; one written before the setting: without targets
    assert judge.shows_targets(None) is True and judge.shows_targets(str(tmp_path)) is True  # no webdream.json
    (tmp_path / "webdream.json").write_text(json.dumps({"step": 49, "think": True}))
    assert judge.shows_targets(str(tmp_path)) is False
    (tmp_path / "webdream.json").write_text(json.dumps({"step": 49, "judge_targets": True}))
    assert judge.shows_targets(str(tmp_path)) is True


def test_the_budget_omits_the_oldest_pages_first_then_cuts_the_final_page(tok):
    view = judge.trajectory_view(dream_record())
    full = judge.judge_prompt(tok, *view, max_tokens=4096)
    text = tok.decode(judge.judge_prompt(tok, *view, max_tokens=len(full) - 5))
    # every action stays, with its target line
    assert f"Page 1:\n{judge.OMITTED}\nAction 1: fill('14', 'Myron') on [14] textbox\nPage 2:\nURL:" in text
    goal, pages, actions, final = view
    long_final = final + "".join(f"\n[{100 + i}] button 'line {i}'" for i in range(60))
    ids = judge.judge_prompt(tok, goal, pages, actions, long_final, max_tokens=len(full) + 100)
    text = tok.decode(ids)
    assert len(ids) <= len(full) + 100 and text.count(judge.OMITTED) == 2 and "[100] button 'line 0'" in text
    assert "[159] button 'line 59'" not in text and "Action 2: click('15')" in text
    with pytest.raises(ValueError):
        judge.judge_prompt(tok, *view, max_tokens=20)
    # many actions on a long line: the target lines go last, so a prompt that fitted without them still fits
    long_page = "URL: x\n[7] button '" + "very long name " * 30 + "'"
    n = 12
    plain = judge.judge_prompt(tok, goal, [long_page] * n, ["click('7')"] * n, None, max_tokens=4096, targets=False)
    assert len(judge.judge_prompt(tok, goal, [long_page] * n, ["click('7')"] * n, None, max_tokens=4096)) > len(plain) + 1000
    ids = judge.judge_prompt(tok, goal, [long_page] * n, ["click('7')"] * n, None, max_tokens=len(plain) + 10)
    assert len(ids) <= len(plain) + 10 and f"Action {n}: click('7')\nDid" in tok.decode(ids)


def test_a_judge_shown_no_earlier_page_still_sees_every_action_on_its_line_and_the_final_page(tok, tmp_path, monkeypatch):
    view = judge.trajectory_view(dream_record())
    text = tok.decode(judge.judge_prompt(tok, *view, pages_shown=0))
    assert (f"Page 1:\n{judge.OMITTED}\nAction 1: fill('14', 'Myron') on [14] textbox\n"
            f"Page 2:\n{judge.OMITTED}\nAction 2: click('15') on [15] button 'Submit'\nFinal page:\n"
            "URL: miniwob/enter-text.html\n[14] textbox value='Myron'\n[15] button 'Submit', focused\n"
            "StaticText 'Sent (imagined)'\nDid the actions complete the goal?") in text
    one = tok.decode(judge.judge_prompt(tok, *view, pages_shown=1))  # the latest page before the final one
    assert f"Page 1:\n{judge.OMITTED}\nAction 1:" in one and "Page 2:\nURL: miniwob/enter-text.html\n[14] textbox value=" in one
    assert judge.judge_prompt(tok, *view, pages_shown=2) == judge.judge_prompt(tok, *view)  # all fit: as many as fit
    # the view a judge learnt is in its webdream.json; judges without it see as many pages as fit
    assert judge.shown_pages(None) is None and judge.shown_pages(str(tmp_path)) is None
    (tmp_path / "webdream.json").write_text(json.dumps({"step": 9, "judge_targets": True, "judge_pages": None}))
    assert judge.shown_pages(str(tmp_path)) is None
    (tmp_path / "webdream.json").write_text(json.dumps({"step": 9, "judge_targets": True, "judge_pages": 0}))
    assert judge.shown_pages(str(tmp_path)) == 0
    seen = []
    monkeypatch.setattr(judge, "judge_scores", lambda m, t, prompts, **k: seen.extend(map(t.decode, prompts)) or [0.5])
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--dream-reward", "judge", "--judge", str(tmp_path)])
    dream.reward_dreams([dream_record()], object(), tok, args, policy.torch.device("cpu"))
    assert seen == [text]  # the dream reward prompts it in that view
    for bad in (["--mode", "judge", "--judge-pages", "-1"], ["--mode", "bc", "--judge-pages", "0"]):
        with pytest.raises(SystemExit):
            train.parse_args(bad)


@pytest.mark.parametrize("answer, done_success, reward", [("yes", False, 1.0), ("no", True, 0.0), ("yes", True, 1.0)])
def test_the_dream_reward_is_the_judges_verdict(tok, answer, done_success, reward):
    m = forced_model(tok, answer)
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--dream-reward", "judge", "--judge", ROOT])
    trajs = [dream_record(done_success), dict(dream_record(), env_error=True, turns=[])]
    stats = dream.reward_dreams(trajs, m, tok, args, policy.torch.device("cpu"))
    t = trajs[0]
    assert (t["reward"], t["success"], t["done_success"]) == (reward, reward == 1.0, done_success)
    assert t["judge_p"] == pytest.approx(reward, abs=1e-6)
    assert "judge_p" not in trajs[1] and trajs[1]["reward"] == float(False)  # an env_error dream is not judged
    assert stats == pytest.approx({"judge/yes_share": reward, "judge/agree_with_done": float(reward == done_success),
                                   "judge/n": 1, "judge/mean_p": reward}, abs=1e-6)
    # --dream-reward done: the world model's verdict stays the reward, the judge is not asked
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT])
    trajs = [dream_record(done_success)]
    assert dream.reward_dreams(trajs, m, tok, args, policy.torch.device("cpu")) == {}
    assert (trajs[0]["reward"], trajs[0]["done_success"]) == (float(done_success), done_success)


def test_the_dream_reward_prompts_each_judge_in_the_format_it_learnt(tok, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(judge, "judge_scores", lambda m, t, prompts, **k: seen.extend(map(t.decode, prompts)) or [0.5])
    for saved, shown in (({"step": 49}, False), ({"step": 9, "judge_targets": True}, True)):
        (tmp_path / "webdream.json").write_text(json.dumps(saved))
        args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--dream-reward", "judge", "--judge", str(tmp_path)])
        dream.reward_dreams([dream_record()], object(), tok, args, policy.torch.device("cpu"))
        assert ("Action 2: click('15') on [15] button 'Submit'" in seen[-1]) is shown


def test_each_judge_is_scored_with_the_prompt_budget_it_learnt(tok, tmp_path, monkeypatch):
    assert judge.trained_budget(None) == 1024 and judge.trained_budget(str(tmp_path), 700) == 700  # no webdream.json
    seen = []
    real = judge.judge_prompt
    monkeypatch.setattr(judge, "judge_prompt", lambda *a, **k: seen.append(k["max_tokens"]) or real(*a, **k))
    monkeypatch.setattr(judge, "judge_scores", lambda m, t, prompts, **k: [0.5] * len(prompts))
    for saved, budget in (({"step": 9, "judge_targets": True}, 900), ({"step": 9, "max_prompt_tokens": 300}, 300)):
        (tmp_path / "webdream.json").write_text(json.dumps(saved))
        args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--dream-reward", "judge", "--judge",
                                 str(tmp_path), "--max-prompt-tokens", "900"])  # the policy's budget
        dream.reward_dreams([dream_record()], object(), tok, args, policy.torch.device("cpu"))
        assert seen[-1] == budget  # the judge's own budget, else the run's
    assert judge.trained_budget(str(tmp_path)) == 300


def test_the_graded_dream_reward_is_the_judges_p_yes(tok):
    """--dream-reward judge-p: the reward is P(yes) itself, success still P(yes) > --judge-threshold
    (a model that answers neither token: P(yes) = 1/2)."""
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--dream-reward", "judge-p", "--judge", ROOT])
    trajs = [dream_record(True)]
    dream.reward_dreams(trajs, forced_model(tok, "maybe"), tok, args, policy.torch.device("cpu"))
    assert trajs[0]["reward"] == pytest.approx(0.5) and trajs[0]["success"] is False
    args = train.parse_args(["--mode", "dream", "--world-model", ROOT, "--dream-reward", "judge-p", "--judge", ROOT,
                             "--judge-threshold", "0.4"])
    trajs = [dream_record(False)]
    dream.reward_dreams(trajs, forced_model(tok, "maybe"), tok, args, policy.torch.device("cpu"))
    assert trajs[0]["reward"] == pytest.approx(0.5) and trajs[0]["success"] is True


def test_the_judge_scores_compare_the_two_answer_tokens(tok):
    yes, no = judge.answer_ids(tok)
    assert tok.decode([yes]) == "yes" and tok.decode([no]) == "no"
    prompts = [judge.judge_prompt(tok, *judge.trajectory_view(dream_record()))] * 3
    # (forced_model forces its first token at each prefill: each check is one batch, one prefill)
    assert judge.judge_scores(forced_model(tok, "yes"), tok, prompts) == pytest.approx([1.0] * 3)
    assert judge.judge_scores(forced_model(tok, "no"), tok, prompts) == pytest.approx([0.0] * 3, abs=1e-6)
    assert judge.judge_scores(forced_model(tok, "maybe"), tok, prompts) == pytest.approx([0.5] * 3)  # neither answer


def test_labels_are_real_outcomes_of_every_prefix():
    trs = trans.load_transitions(DATA)
    views = judge.labelled_views(trs)
    assert len(views) == len(trs) and sum(y for _, y in views) == sum(t["success"] for t in trs)
    (goal, pages, actions, final), label = views[2]  # click-tab-2 seed 0, after its third action
    assert len(pages) == len(actions) == 3 and actions == [t["action"] for t in trs[:3]]
    assert final == judge.page_text(Obs(goal, trs[2]["next_obs"]["url"], trs[2]["next_obs"]["axtree"]).text, goal)
    assert label == trs[2]["success"]
    # trajectory records: each prefix the episode went on after is a `no`; the whole one only with its final page
    rec = dict(dream_record(True), source="expert", context=[])
    rec["turns"] = [{"observation": page("[14] textbox\n[15] button 'Submit'"), "action": "fill('14', 'Myron')"}] + rec["turns"]
    views = judge.labelled_views([], [rec, dict(rec, final_observation=None), dict(rec, source="dream")])
    assert [y for _, y in views] == [False, True, False]
    assert views[0][0][3] == judge.page_text(rec["turns"][1]["observation"], GOAL)
    # a dream is learnt from only with the real outcome of its replay (dream_replay.py --labelled), whole
    dreams = [dict(dream_record(True), real_success=False), dict(dream_record(False), real_success=True),
              dream_record(True), dict(dream_record(True), real_success=None),
              dict(dream_record(True), real_success=True, env_error=True)]
    views = judge.labelled_views([], dreams)
    assert [y for _, y in views] == [False, True] and views[0][0] == judge.trajectory_view(dreams[0])


def test_train_mode_judge_learns_from_the_transitions(tmp_path, tok):
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps(dict(dream_record(True), source="expert", context=[])) + "\n")
    out = str(tmp_path / "judge")
    train.main(["--mode", "judge", "--tiny", "--transitions", DATA, "--judge-trajectories", str(demos), "--out", out,
                "--tasks", "click-tab-2,enter-text,click-checkboxes,click-button", "--batch-size", "4",
                "--epochs", "0.4", "--micro-batch", "4", "--max-prompt-tokens", "600", "--judge-pages", "1"])
    ms = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [m["step"] for m in ms] == [1, 2] and all(m["loss/judge"] > 0 for m in ms)  # 21 samples: 5 steps an epoch
    m, tok2 = policy.load_model(os.path.join(out, "final"))
    r = judge.evaluate_judge(m, tok2, trans.load_transitions(DATA))
    assert r["judge/n"] == 20 and r["judge/positives"] == 5 and 0.0 <= r["judge/false_positive_rate"] <= 1.0
    assert checkpoint.saved_settings(os.path.join(out, "final"))["judge_targets"] is True
    assert judge.shows_targets(os.path.join(out, "final"))
    assert judge.trained_budget(os.path.join(out, "final")) == 600  # what judge.py --eval and dreams score it with
    assert judge.shown_pages(os.path.join(out, "final")) == 1
    with pytest.raises(SystemExit):  # continuing it in another view is a parser error
        train.parse_args(["--mode", "judge", "--init", os.path.join(out, "final"), "--judge-pages", "0"])
    train.parse_args(["--mode", "judge", "--init", os.path.join(out, "final"), "--judge-pages", "1"])
    trs = trans.load_transitions(DATA)
    assert [tok.decode(a) for _, a in judge.judge_samples(trs, [], tok)] == [
        ("yes" if t["success"] else "no") + "<|im_end|>" for t in trs]


def test_judge_data_from_labelled_dreams_alone(tmp_path, tok):
    """--transitions '' learns from --judge-trajectories alone (replayed dreams); a missing file or no
    usable episode is a clear error naming both sources."""
    import argparse

    import supervised
    dreams = tmp_path / "labelled.jsonl"
    dreams.write_text("".join(json.dumps(dict(dream_record(True), real_success=ok)) + "\n" for ok in (True, False)))
    args = argparse.Namespace(tasks=["enter-text"], judge_trajectories=str(dreams), max_prompt_tokens=1024,
                              judge_pages=None)
    assert [tok.decode(a) for _, a in supervised.judge_samples("", tok, args)] == ["yes<|im_end|>", "no<|im_end|>"]
    with pytest.raises(FileNotFoundError, match="--transitions ''"):
        supervised.judge_samples(str(tmp_path / "missing.jsonl"), tok, args)
    args.tasks = ["click-button"]
    with pytest.raises(ValueError, match="labelled.jsonl"):
        supervised.judge_samples("", tok, args)


def test_dream_reward_judge_needs_a_judge_checkpoint(capsys):
    with pytest.raises(SystemExit):
        train.parse_args(["--mode", "dream", "--world-model", ROOT, "--dream-reward", "judge", "--judge", "/nonexistent"])
    assert "python train.py --mode judge" in capsys.readouterr().err


def test_imagined_final_pages_are_the_world_models_and_a_perfect_one_changes_nothing():
    trs = trans.load_transitions(DATA)
    key = trans.transition_key
    real = judge.transition_views(trs)
    perfect = judge.transition_views(trs, {key(t): trans.delta_label(t) for t in trs})
    assert [k for k, _, _ in real] == [key(t) for t in trs] and perfect == real  # apply(o, diff(o, o2)) == o2
    lazy = judge.transition_views(trs, {key(t): "done: yes" for t in trs[:3]})  # an empty Δ: the page stays
    assert [k for k, _, _ in lazy] == [key(t) for t in trs[:3]]
    assert lazy[2][1][3] == lazy[2][1][1][2] != real[2][1][3] and lazy[2][2] is True  # the label stays the real outcome


def test_the_judge_and_done_are_compared_on_the_same_transitions():
    keys = [("t", s, 0, "click('1')") for s in range(6)]
    labels = [True, True, False, False, False, False]
    p_yes = [0.9, 0.2, 0.8, 0.1, 0.1, 0.1]         # judge: 1 false negative, 1 false positive
    done = ["done: yes", "done: yes", "done: yes", "done: yes", "done: yes", "done: no"]  # done: 3 false positives
    jp = [{"task": k[0], "seed": k[1], "step": k[2], "action": k[3], "label": y, "p_yes": p} for k, y, p in zip(keys, labels, p_yes)]
    wp = [{"task": k[0], "seed": k[1], "step": k[2], "action": k[3], "predicted": d} for k, d in zip(keys, done)]
    r = judge.compare_with_done(jp, wp + [dict(wp[0], seed=99)])
    assert r["n"] == 6 and r["done"]["judge/false_positive_rate"] == 0.75 and r["judge"]["judge/false_positive_rate"] == 0.25
    assert r["judge"]["judge/false_negative_rate"] == 0.5 and r["done"]["judge/false_negative_rate"] == 0.0
    assert (r["no_false_positive"]["n"], r["no_false_positive"]["gained"], r["no_false_positive"]["lost"]) == (4, 2, 0)
    assert (r["correct"]["gained"], r["correct"]["lost"]) == (2, 1)
    assert judge.compare_with_done(jp, wp, threshold=0.85)["judge"]["judge/false_positive_rate"] == 0.0
    with pytest.raises(ValueError, match="share no transition"):
        judge.compare_with_done(jp, [dict(w, seed=50) for w in wp])


def test_two_judges_are_compared_on_the_transitions_both_scored():
    def pred(task, seed, label, p):
        return {"task": task, "seed": seed, "step": 0, "action": "click('12')", "label": label, "p_yes": p}
    a = [pred("click-tab", 0, True, 0.9), pred("click-tab", 1, False, 0.8), pred("choose-list", 2, False, 0.2),
         pred("choose-list", 3, True, 0.3), pred("choose-list", 4, False, 0.1)]
    b = [pred("click-tab", 0, True, 0.9), pred("click-tab", 1, False, 0.1), pred("choose-list", 2, False, 0.7),
         pred("choose-list", 3, True, 0.6)]  # seed 4 unscored: left out of the pairing
    r = judge.compare_judges(a, b)
    assert r["n"] == 4 and (r["correct"]["gained"], r["correct"]["lost"]) == (2, 1)  # seeds 1 and 3 gained, 2 lost
    assert (r["no_false_positive"]["n"], r["no_false_positive"]["gained"], r["no_false_positive"]["lost"]) == (2, 1, 1)
    assert r["a"]["judge/false_positive_rate"] == 0.5 and r["b"]["judge/false_positive_rate"] == 0.5
    assert r["by_task"]["click-tab"]["gained"] == 1 and r["by_task"]["choose-list"]["lost"] == 1
    c = judge.compare_judges(a, b, threshold=0.65)["correct"]
    assert (c["gained"], c["lost"]) == (1, 1)  # B's 0.6 on seed 3 is a no at this threshold: no longer gained
    with pytest.raises(ValueError, match="share no transition"):
        judge.compare_judges(a, [pred("enter-text", 9, True, 0.5)])
    with pytest.raises(ValueError, match="two labels"):
        judge.compare_judges(a, [pred("click-tab", 0, False, 0.5)])
