"""done_calibration: P(done: yes) read after the predicted Δ, and the threshold table, with a tiny model."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compress  # noqa: E402
import done_calibration as dc  # noqa: E402
import policy  # noqa: E402


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
    delta = "~ [3] button 'OK', focused\ndone: no"
    (p,) = dc.done_p_yes(m, tok, [t], [delta])
    assert p == pytest.approx(float(torch.softmax(torch.tensor([2.0, 0.0, -1.0]), 0)[0]), abs=1e-5)
    body = compress.encode_text(tok, "~ [3] button 'OK', focused\ndone:")
    assert seen[-1][-len(body):] == body and seen[-1][-len(head):] == head  # its own line, then `done:`, not `no`
    with pytest.raises(ValueError):
        dc.done_p_yes(m, tok, [t], [])


def test_by_threshold_counts_against_the_real_outcome():
    ts = [{"success": s} for s in (True, True, False, False, False)]
    table = dc.by_threshold(ts, [0.95, 0.6, 0.99, 0.7, 0.1], thresholds=(0.5, 0.9))
    assert table[0.5] == {"false_positives": 2, "negatives": 3, "true_positives": 2, "positives": 2,
                          "false_positive_rate": 2 / 3, "accuracy": 3 / 5}
    assert (table[0.9]["false_positives"], table[0.9]["true_positives"], table[0.9]["accuracy"]) == (1, 1, 3 / 5)
