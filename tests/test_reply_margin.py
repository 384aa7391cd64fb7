"""reply_margin.py: the log-prob margin between a recorded reply and a click on a named element."""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import compress  # noqa: E402
import policy  # noqa: E402
import reply_margin  # noqa: E402

PAGE = ("Goal: Select Mexico from the list and click Submit.\nURL: miniwob/choose-list.html\n"
        "[13] combobox value='Australia'\n [14] option 'Australia', selected\n [15] option 'Mexico'\n"
        "[18] button 'Submit'")
REPLY = "<think>Select 'Mexico' in the combobox [13].</think>select_option('13', 'Mexico')"


def test_the_alternative_clicks_the_named_element_as_the_experts_word_it():
    assert reply_margin.click_reply(PAGE, "Submit", True) == "<think>Click the button 'Submit' [18].</think>click('18')"
    assert reply_margin.click_reply(PAGE, "Submit", False) == "click('18')"
    assert reply_margin.click_reply(PAGE, "Cancel", True) is None


def test_the_margin_is_the_difference_of_summed_reply_log_probs(tok):
    model = policy.tiny_model(tok, seed=3).eval()
    with torch.no_grad():  # a random tiny model is near uniform: sharpen it so every token's log-prob counts
        model.lm_head.weight.mul_(200.0)
    prompt = compress.render(tok, [{"role": "user", "content": PAGE}])
    alt = reply_margin.click_reply(PAGE, "Submit", True)
    (m,) = reply_margin.margins(model, tok, [(prompt, REPLY, alt)])

    def full(reply):  # one plain forward pass over prompt + reply, no shared prefix, no padding
        r = compress.encode_reply(tok, reply)
        with torch.no_grad():
            logp = model(torch.tensor([prompt + r])).logits[0, len(prompt) - 1:-1].log_softmax(-1)
        return logp.gather(1, torch.tensor(r)[:, None]).sum().item()

    assert reply_margin.summed_logprobs(model, tok, prompt, [REPLY, alt]) == pytest.approx([full(REPLY), full(alt)], abs=1e-3)
    assert m == pytest.approx(full(REPLY) - full(alt), abs=1e-3)
    assert abs(m) > 1e-3  # the two replies differ, so a random model scores them differently
    (back,) = reply_margin.margins(model, tok, [(prompt, alt, REPLY)])
    assert back == pytest.approx(-m, abs=1e-4)


def test_cases_come_from_the_task_s_successful_episodes(tmp_path, tok):
    prompt = compress.render(tok, [{"role": "user", "content": PAGE}])
    rows = [{"task": "choose-list", "success": True, "turns": [{"observation": PAGE, "response": REPLY, "prompt_ids": prompt}]},
            {"task": "choose-list", "success": False, "turns": [{"observation": PAGE, "response": REPLY, "prompt_ids": prompt}]},
            {"task": "click-button", "success": True, "turns": [{"observation": PAGE, "response": REPLY, "prompt_ids": prompt}]},
            {"task": "choose-list", "success": True,  # already clicks Submit: nothing to compare
             "turns": [{"observation": PAGE, "response": reply_margin.click_reply(PAGE, "Submit", True), "prompt_ids": prompt}]}]
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cases = reply_margin.cases_from(str(path), "choose-list", "Submit")
    assert cases == [(prompt, REPLY, "<think>Click the button 'Submit' [18].</think>click('18')")]
    with pytest.raises(ValueError, match="no turn 0 of 'choose-list'"):
        reply_margin.cases_from(str(path), "choose-list", "Cancel")
