"""experts.py: the scripted experts solve held-out pages from the text observation alone."""
import pytest

import env
import experts
from actions import parse_action
from runlog import read_jsonl


@pytest.mark.parametrize("task", ["click-checkboxes", "login-user", "click-tab-2", "choose-list"])
def test_expert_solves_eval_seeds(task):
    e = env.make_env(task)
    try:
        for seed in env.eval_seeds(3):
            rec = experts.run_expert_episode(e, seed)
            assert rec["success"] and rec["reward"] == 1.0, rec
            for turn in rec["turns"]:
                assert parse_action(turn["action"]) == turn["action"]
                assert turn["observation"].startswith("Goal: ")
    finally:
        e.close()


def test_every_suite_task_has_an_expert():
    assert set(env.SUITE) <= set(experts.EXPERTS)


def test_collect_demos_writes_records(tmp_path):
    path = tmp_path / "demos.jsonl"
    counts = experts.collect_demos(["click-button"], 2, str(path), progress=False)
    assert counts["click-button"]["success"] == 2
    recs = read_jsonl(str(path))
    assert len(recs) == 2 and {r["seed"] for r in recs} == set(env.train_seeds(2))
    r = recs[0]
    assert r["source"] == "expert" and r["success"] and r["reward"] == 1.0 and not r["env_error"]
    assert set(r) >= {"task", "seed", "goal", "source", "turns", "reward", "success", "env_error"}
    assert set(r["turns"][0]) == {"observation", "action", "error"}


def test_thought_names_the_element_before_its_bid():
    obs = "Goal: Enter \"Kasie\".\n[12] generic 'x'\n[13] button 'no'\n [19] textbox\n[20] combobox 'Pick'"
    assert experts.thought(obs, "click('13')") == "Click the button 'no' [13]."
    assert experts.thought(obs, "fill('19', 'Kasie')") == "Type 'Kasie' into the textbox [19]."
    assert experts.thought(obs, "select_option('20', 'Phil')") == "Select 'Phil' in the combobox 'Pick' [20]."
    assert experts.thought(obs, "press('13', 'Enter')") == "Press Enter on the button 'no' [13]."
    assert experts.thought(obs, "click('99')") == "Click the element [99]."
    # the thought never parses as an action, so the reply's action is the one after </think>
    reply = f"<think>{experts.thought(obs, 'click(' + repr('13') + ')')}</think>click('13')"
    assert parse_action(reply) == "click('13')"
    with pytest.raises(experts.ExpertError):
        experts.thought(obs, "not an action")
