"""done_calibration: P(done: yes) read after the predicted Δ, and the threshold table, with a tiny model."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compress  # noqa: E402
import done_calibration as dc  # noqa: E402
import policy  # noqa: E402
import world_model as wm  # noqa: E402


def test_p_yes_is_read_after_the_delta_lines_and_done(tok):
    m = policy.tiny_model(tok, seed=1)
    yes, no, fail = (compress.encode_text(tok, f"done: {s}")[-1] for s in dc.STATUSES)
    head = compress.encode_text(tok, "done:")
    seen = []

    def hook(mod, inp, out):  # logits 2 / 0 / -1 for yes / no / fail at the last position
        out = out.clone()
        out[:, -1, :] = 0.0
        out[:, -1, yes], out[:, -1, fail] = 2.0, -1.0
        return out

    m.lm_head.register_forward_hook(hook)
    m.register_forward_pre_hook(lambda mod, args, kw: seen.append(kw.get("input_ids", args[0] if args else None)[0].tolist()),
                                with_kwargs=True)
    t = {"goal": "Click OK.", "obs": {"url": "u", "axtree": "[3] button 'OK'", "error": ""}, "action": "click('3')",
         "success": True}
    delta = "~ [3] button 'OK', focused\n+ [3] StaticText 'Thanks'\ndone: no"
    (p,) = dc.done_p_yes(m, tok, [t], [delta])
    assert p == pytest.approx(float(torch.softmax(torch.tensor([2.0, 0.0, -1.0]), 0)[0]), abs=1e-5)
    # the model read: the world model's prompt for (goal, page, action), its own Δ lines, then `done:` (not `no`)
    prompt = wm.wm_prompt(tok, t["goal"], t["obs"], t["action"])
    body = compress.encode_text(tok, "~ [3] button 'OK', focused\n+ [3] StaticText 'Thanks'\ndone:")
    assert seen[-1] == prompt + body and body[-len(head):] == head
    with pytest.raises(ValueError):
        dc.done_p_yes(m, tok, [t], [])


def test_by_threshold_counts_against_the_real_outcome():
    ts = [{"success": s} for s in (True, True, False, False, False, True, False)]
    table = dc.by_threshold(ts, [0.95, 0.6, 0.99, 0.7, 0.1, 0.9, 0.5], thresholds=(0.5, 0.9))
    assert table[0.5] == {"false_positives": 2, "negatives": 4, "true_positives": 3, "positives": 3,
                          "false_positive_rate": 2 / 4, "accuracy": 5 / 7}
    # called done above the threshold only: 0.5 is not above 0.5, nor 0.9 above 0.9
    assert (table[0.9]["false_positives"], table[0.9]["true_positives"], table[0.9]["accuracy"]) == (1, 1, 4 / 7)
    # completions 0.95, 0.6, 0.9 against failures 0.99, 0.7, 0.1, 0.5: pairs ordered right 3 + 2 + 3 of 12
    assert dc.auc(ts, [0.95, 0.6, 0.99, 0.7, 0.1, 0.9, 0.5]) == pytest.approx(8 / 12)
    assert dc.auc(ts[:2] + ts[2:3], [0.5, 0.4, 0.5]) == pytest.approx(0.25)  # a tie counts half
    with pytest.raises(ValueError):
        dc.auc(ts[:2], [0.1, 0.2])


def test_choose_threshold_by_hand():
    ts = [{"success": s} for s in (True, True, False, False, False, True, False)]
    p = [0.95, 0.6, 0.99, 0.7, 0.1, 0.9, 0.5]
    # under 1/4 false positives: above 0.99 nothing is called (accuracy 4/7); between 0.95 and 0.99 one false
    # positive (0.99: 25%, not under); so only thresholds >= 0.99 qualify: the midpoint of 0.99 and 1.0
    assert dc.choose_threshold(ts, p, max_false_positive_rate=0.25) == pytest.approx(0.995)
    # under 1/2: one false positive allowed: above 0.925 (0.95 and 0.99 called: 1 fp, 1 tp) accuracy 4/7;
    # above 0.8 (0.9, 0.95, 0.99): 1 fp, 2 tp, accuracy 5/7; above 0.65 adds 0.7 (2 fp = 50%: not under)
    assert dc.choose_threshold(ts, p, max_false_positive_rate=0.5) == pytest.approx(0.8)
    assert dc.choose_threshold([{"success": False}], [0.3], max_false_positive_rate=0.0) is None
    # DreamEnv's rule: a greedy `yes` is needed too
    greedy = [True, False, False, True, True, True, True]
    table = dc.by_threshold(ts, p, (0.5,), greedy_yes=greedy)
    assert (table[0.5]["true_positives"], table[0.5]["false_positives"]) == (2, 1)
    # under it 0.99's failure is never called: above 0.8 only 0.95 and 0.9 (completions), no false positive,
    # accuracy 6/7 (P(yes) alone needed 0.995 to stay under 1/4); above 0.65 0.7's failure too (5/7)
    assert dc.choose_threshold(ts, p, greedy, max_false_positive_rate=0.25) == pytest.approx(0.8)
    assert dc.choose_threshold(ts, p, greedy, max_false_positive_rate=0.5) == pytest.approx(0.8)
