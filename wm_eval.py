"""How right the Δ world model is: its greedy Δs against real next pages, one step and k steps.

    python world_model.py --eval runs/wm/final --data runs/wm_eval.jsonl             # exact match, line F1, done acc.
    python world_model.py --compare A/wm_eval_predictions.jsonl B/wm_eval_predictions.jsonl   # paired: B - A

    from wm_eval import evaluate_world_model, drift
    evaluate_world_model(model, tok, transitions, by_task=True)   # {"wm/exact_match": ..., "wm/done_accuracy": ...}

A prediction is right when apply(o_t, Δ̂) is the recorded next page exactly (URL and tree): the labels
are exact (delta.diff), so nothing is scored by a model or by hand. Beside it: Δ line precision and
recall, the `done:` line against the real outcome (accuracy and false positives: an imagined success
that is not one is the costly error in a dream), and DynaWeb's compounding error, k imagined steps
against the real pages after the same k actions (drift). compare_predictions pairs two models on the
same transitions (stats.paired: 95% interval, McNemar's p).
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter

import runlog
from delta import apply, delta_lines, predicted_done, tree_lines
from transitions import delta_label, episodes_of, load_transitions, transition_key
from world_model import check_delta_format, predict_delta


def evaluate_world_model(model, tokenizer, transitions: list[dict], *, max_new_tokens: int = 256,
                         batch_size: int = 8, max_prompt_tokens: int = 1024, by_task: bool = False,
                         progress: bool = False, predictions: list | None = None) -> dict:
    """Score greedy Δ predictions against real transitions.

    Returns {wm/exact_match: share whose apply(o_t, Δ̂) equals o_{t+1} (url and tree),
    wm/line_precision, wm/line_recall, wm/line_f1: over Δ lines other than `done:`, pooled over all
    transitions (multiset match), wm/done_accuracy: predicted_done == success,
    wm/done_false_positive_rate: predicted done among transitions that did not succeed,
    wm/bad_lines: mean skipped lines per Δ̂, wm/n}; with by_task, also {"by_task": {task: the same}}
    from the same predictions. `predictions`, a list, receives the predicted Δ of each transition, in order.
    """
    if not transitions:
        return {"wm/n": 0}
    preds = predict_delta(model, tokenizer, [dict(t["obs"], goal=t["goal"]) for t in transitions],
                          [t["action"] for t in transitions], max_new_tokens, batch_size=batch_size,
                          max_prompt_tokens=max_prompt_tokens, progress=progress)
    if predictions is not None:
        predictions.extend(preds)
    res = score_predictions(transitions, preds)
    if by_task:
        res["by_task"] = {task: score_predictions([t for t in transitions if t["task"] == task],
                                                  [d for t, d in zip(transitions, preds) if t["task"] == task])
                          for task in dict.fromkeys(t["task"] for t in transitions)}
    return res


def next_page_match(t: dict, delta: str) -> tuple[bool, int]:
    """(whether apply(o_t, Δ) is the recorded next page, URL and tree; the number of Δ lines skipped)."""
    o, bad = apply(t["obs"], delta, action=t["action"])
    return o["axtree"] == t["next_obs"]["axtree"] and o["url"] == t["next_obs"]["url"], bad


def score_predictions(transitions: list[dict], preds: list[str]) -> dict:
    """evaluate_world_model's figures for given Δ predictions (one per transition)."""
    n = len(transitions)
    exact = tp = n_pred = n_true = bad = done_ok = fp = negatives = 0
    for t, d in zip(transitions, preds):
        same, nb = next_page_match(t, d)
        exact += int(same)
        bad += nb
        p, q = Counter(delta_lines(d, t["action"])), Counter(delta_lines(delta_label(t), t["action"]))
        tp += sum((p & q).values())
        n_pred += sum(p.values())
        n_true += sum(q.values())
        pd = predicted_done(d)
        done_ok += int(pd == bool(t["success"]))
        if not t["success"]:
            negatives += 1
            fp += int(pd)
    # an empty prediction of an empty change is perfect, hence the 1.0 for empty denominators
    prec = tp / n_pred if n_pred else 1.0
    rec = tp / n_true if n_true else 1.0
    return {"wm/exact_match": exact / n if n else 0.0, "wm/line_precision": prec, "wm/line_recall": rec,
            "wm/line_f1": 2 * prec * rec / (prec + rec) if prec + rec else 0.0,
            "wm/done_accuracy": done_ok / n if n else 0.0,
            "wm/done_false_positive_rate": fp / negatives if negatives else 0.0,
            "wm/bad_lines": bad / n if n else 0.0, "wm/n": n}


def tree_f1(a: str, b: str) -> float:
    """F1 of the multisets of lines of two flattened trees (1.0 when both are empty)."""
    p, q = Counter(tree_lines(a)), Counter(tree_lines(b))
    tp = sum((p & q).values())
    if not p and not q:
        return 1.0
    return 2 * tp / (sum(p.values()) + sum(q.values()))


def drift(model, tokenizer, transitions: list[dict], k_max: int = 5, *, max_new_tokens: int = 256,
          batch_size: int = 8, progress: bool = False) -> dict:
    """How far k imagined steps drift from the real pages, k = 1..k_max (DynaWeb's compounding error).

    For every recorded real episode with at least k steps, start from its first page, apply the
    world model's Δ for the episode's own actions k times (each prediction reads the previous
    imagined page), and compare the k-th imagined page with the real page after the same k actions
    (recorded when the episode ran on real pages). Returns {k: {exact_match, tree_f1, n}}: the share
    of identical pages (URL and tree) and the mean line F1 of the trees, over the n episodes.
    """
    eps = [e for e in episodes_of(transitions) if e]
    states = [dict(e[0]["obs"], goal=e[0]["goal"]) for e in eps]
    out = {}
    for k in range(1, k_max + 1):
        live = [i for i, e in enumerate(eps) if len(e) >= k]
        if not live:
            break
        preds = predict_delta(model, tokenizer, [states[i] for i in live], [eps[i][k - 1]["action"] for i in live],
                              max_new_tokens, goals=[eps[i][0]["goal"] for i in live], batch_size=batch_size,
                              progress=progress)
        exact, f1 = 0, 0.0
        for i, d in zip(live, preds):
            o, _ = apply(states[i], d, action=eps[i][k - 1]["action"])
            states[i] = dict(o, goal=eps[i][0]["goal"])
            real = eps[i][k - 1]["next_obs"]
            exact += int(o["axtree"] == real["axtree"] and o["url"] == real["url"])
            f1 += tree_f1(o["axtree"], real["axtree"])
        out[k] = {"exact_match": exact / len(live), "tree_f1": f1 / len(live), "n": len(live)}
    return out


def compare_predictions(a_path: str, b_path: str) -> dict:
    """Two world models' exact next pages on the transitions both predicted (their `--eval`
    <out>_predictions.jsonl files, paired by task, seed, step and action): {"all": stats.paired(...),
    task: stats.paired(...)}: B's gain over A with its 95% interval and the exact McNemar p.
    Raises ValueError when the files share no transition."""
    import stats
    from runlog import read_jsonl

    def exact(path):
        return {transition_key(r): bool(r["exact"]) for r in read_jsonl(path)}
    a, b = exact(a_path), exact(b_path)
    out = {"all": stats.paired(a, b)}
    for task in sorted({k[0] for k in set(a) & set(b)}):
        out[task] = stats.paired({k: v for k, v in a.items() if k[0] == task}, {k: v for k, v in b.items() if k[0] == task})
    return out


def evaluate_checkpoint(path: str, data: str, tasks: list[str], drift_k: int = 5, out: str | None = None) -> dict:
    """`python world_model.py --eval PATH --data DATA`: the world model in checkpoint folder `path` on the
    transitions of `data` (JSONL) of `tasks`: one step per task (evaluate_world_model, by_task) and
    k-step drift for k = 1..drift_k. Writes the result to `out` (default PATH/wm_eval.json) and each
    transition's predicted Δ beside it (<out>_predictions.jsonl: task, seed, step, action, label,
    predicted, bad_lines, exact; what compare_predictions and done_calibration.py read). Returns
    {by_task, one_step, drift, data, checkpoint, seconds}. Errors: ValueError when the checkpoint was
    trained on another Δ format (world_model.check_delta_format)."""
    import policy

    check_delta_format(path)
    m, tok = policy.load_model(path)
    rows = [t for t in load_transitions(data) if t["task"] in tasks]
    t0 = time.time()
    preds: list[str] = []
    one = evaluate_world_model(m, tok, rows, by_task=True, progress=True, predictions=preds)
    print(json.dumps(one, indent=1), flush=True)
    out = out or os.path.join(path, "wm_eval.json")
    with runlog.open_text(os.path.splitext(out)[0] + "_predictions.jsonl", "w") as f:  # one line per transition, for reading errors
        for t, d in zip(rows, preds):
            same, bad = next_page_match(t, d)
            f.write(json.dumps({"task": t["task"], "seed": t["seed"], "step": t["step"], "action": t["action"],
                                "label": delta_label(t), "predicted": d, "bad_lines": bad, "exact": same}) + "\n")
    res = {"by_task": one.pop("by_task"), "one_step": one, "drift": drift(m, tok, rows, drift_k, progress=True),
           "data": data, "checkpoint": path, "seconds": time.time() - t0}
    with runlog.open_text(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({"one_step": res["one_step"], "drift": res["drift"]}, indent=1))
    print(f"wrote {out}")
    return res
