"""How sure the world model is of its `done:` line: P(done: yes), and false positives by threshold.

    python done_calibration.py runs/wm/final --data runs/wm_eval.jsonl \
        --predictions runs/wm/final/wm_eval_predictions.jsonl      # from world_model.py --eval

The world model ends a dream, and rewards it, when its Δ says `done: yes` (world_model.DreamEnv). A
threshold on the probability of that `yes` trades false positives (an imagined success the real page
would not give) for false negatives. For each transition this reads the model's distribution at its
`done:` line, teacher-forced after its own predicted Δ lines (the prediction world_model.py --eval
wrote), normalised over `yes`, `no` and `fail`, and counts, for each threshold, the transitions called
done (P(yes) above it) against the real outcome. Read thresholds on data the model was not trained
on, and choose one on other data than the data it is reported on.
"""
from __future__ import annotations

import json
import sys

import torch

import compress
import runlog
import world_model as wm
from delta import predicted_done

STATUSES = ("yes", "no", "fail")


def done_p_yes(model, tokenizer, transitions: list[dict], deltas: list[str], *, max_prompt_tokens: int = 1024,
               progress: bool = False) -> list[float]:
    """P(`done: yes`) per transition: softmax over the three status tokens at the position after
    `done:`, the prompt (wm_prompt of goal, o_t, a_t) and the Δ's lines other than `done:` teacher-forced.
    One forward pass per transition; deltas[i] is transition i's predicted Δ. Errors: ValueError if the
    lengths differ, or if the tokenizer writes a status as more than one token after `done:`."""
    if len(transitions) != len(deltas):
        raise ValueError(f"{len(transitions)} transitions but {len(deltas)} Δs")
    head = compress.encode_text(tokenizer, "done:")
    ids = []
    for s in STATUSES:
        full = compress.encode_text(tokenizer, f"done: {s}")
        if full[:len(head)] != head or len(full) != len(head) + 1:
            raise ValueError(f"`done: {s}` is not `done:` and one token under this tokenizer: {full}")
        ids.append(full[-1])
    from tqdm import tqdm

    out = []
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        for t, d in tqdm(list(zip(transitions, deltas)), desc="P(done: yes)", disable=not progress, leave=False):
            body = [x for x in (d or "").split("\n") if not x.startswith("done:")]
            prompt = wm.wm_prompt(tokenizer, t["goal"], t["obs"], t["action"], max_prompt_tokens)
            x = prompt + compress.encode_text(tokenizer, "\n".join(body + ["done:"]))
            x = torch.tensor([x], device=device)
            logits = model(x, logits_to_keep=1, use_cache=False).logits[0, -1].float()  # (V,): the last position
            out.append(torch.softmax(logits[ids], -1)[0].item())
    return out


def by_threshold(transitions: list[dict], p_yes: list[float], thresholds=(0.5, 0.7, 0.8, 0.9, 0.95, 0.99),
                 greedy_yes: list[bool] | None = None) -> dict:
    """{threshold: {false_positives, negatives, true_positives, positives, false_positive_rate, accuracy}},
    a transition called done when its P(yes) > threshold (and, with `greedy_yes`, its greedy Δ says
    `done: yes`: DreamEnv's rule with --done-threshold), against t["success"]."""
    greedy_yes = greedy_yes if greedy_yes is not None else [True] * len(transitions)
    res = {}
    for th in thresholds:
        called = [g and p > th for p, g in zip(p_yes, greedy_yes)]
        fp = sum(c for t, c in zip(transitions, called) if not t["success"])
        tp = sum(c for t, c in zip(transitions, called) if t["success"])
        neg = sum(not t["success"] for t in transitions)
        pos = len(transitions) - neg
        res[th] = {"false_positives": fp, "negatives": neg, "true_positives": tp, "positives": pos,
                   "false_positive_rate": fp / neg if neg else 0.0,
                   "accuracy": (tp + neg - fp) / len(transitions) if transitions else 0.0}
    return res


def choose_threshold(transitions: list[dict], p_yes: list[float], greedy_yes: list[bool] | None = None, *,
                     max_false_positive_rate: float = 0.02) -> float | None:
    """The P(yes) threshold with the best completion accuracy whose false-positive rate is strictly under
    `max_false_positive_rate` on these transitions (by_threshold's rule, with `greedy_yes` DreamEnv's;
    read it on other data than the data it is reported on): a midpoint between two neighbouring P(yes)
    values, the lowest of equally accurate ones. None when no threshold in (0, 1) gets under the rate
    (so always with a rate of 0)."""
    ps = sorted(set(p_yes) | {0.0, 1.0})
    cands = sorted({(a + b) / 2 for a, b in zip(ps, ps[1:])} - {0.0, 1.0})
    best = None
    for th, r in by_threshold(transitions, p_yes, cands, greedy_yes).items():
        if r["false_positive_rate"] < max_false_positive_rate and (best is None or r["accuracy"] > best[1]):
            best = (th, r["accuracy"])
    return None if best is None else best[0]


def auc(transitions: list[dict], p_yes: list[float]) -> float:
    """The chance that a completed transition's P(yes) is above a failed one's (ties count half): how
    well P(yes) separates them whatever the threshold. Errors: ValueError without both kinds."""
    pos = [p for t, p in zip(transitions, p_yes) if t["success"]]
    neg = [p for t, p in zip(transitions, p_yes) if not t["success"]]
    if not pos or not neg:
        raise ValueError("auc needs completed and failed transitions")
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


if __name__ == "__main__":
    import argparse

    import policy
    from runlog import read_jsonl
    from transitions import load_transitions, transition_key

    ap = argparse.ArgumentParser(description="The world model's P(done: yes) by threshold against real outcomes.")
    ap.add_argument("checkpoint", help="the world model (train.py --mode wm)")
    ap.add_argument("--data", default="runs/wm_eval.jsonl", help="the transitions world_model.py --eval scored")
    ap.add_argument("--predictions", required=True, help="its <out>_predictions.jsonl (one predicted Δ per transition)")
    ap.add_argument("--thresholds", default="0.5,0.7,0.8,0.9,0.95,0.99", help="comma-separated P(yes) thresholds")
    ap.add_argument("--out", default="", help="also write each transition's P(yes) and the table here as JSON")
    ap.add_argument("--choose-on", default="", help="another --out file (other transitions, e.g. training seeds the "
                    "model never saw): choose the threshold there (choose_threshold) and report it on --data")
    ap.add_argument("--max-fp-rate", type=float, default=0.02, help="--choose-on: false-positive rate to stay under")
    a = ap.parse_args()
    data = load_transitions(a.data)
    preds = read_jsonl(a.predictions)
    if [transition_key(r) for r in preds] != [transition_key(t) for t in data]:
        ap.error(f"{a.predictions} does not hold one prediction per transition of {a.data}, in order")
    wm.check_delta_format(a.checkpoint)
    model, tok = policy.load_model(a.checkpoint)
    p = done_p_yes(model, tok, data, [r["predicted"] for r in preds], progress=True)
    greedy = [predicted_done(r["predicted"]) for r in preds]  # DreamEnv checks P(yes) only on a greedy `yes`
    thresholds = [float(x) for x in a.thresholds.split(",") if x]
    if a.choose_on:
        with open(a.choose_on, encoding="utf-8") as f:
            other = json.load(f)["p_yes"]
        if {(r["task"], r["seed"], r["step"]) for r in other} & {(t["task"], t["seed"], t["step"]) for t in data}:
            ap.error(f"{a.choose_on} and {a.data} share transitions: choose the threshold on other data")
        other_p, other_greedy = [r["p_yes"] for r in other], [r.get("greedy_yes", True) for r in other]
        chosen = choose_threshold(other, other_p, other_greedy, max_false_positive_rate=a.max_fp_rate)
        if chosen is None:
            sys.exit(f"no threshold has false positives under {a.max_fp_rate:.1%} on {a.choose_on}")
        there = by_threshold(other, other_p, [chosen], other_greedy)[chosen]
        here = by_threshold(data, p, [chosen], greedy)[chosen]
        print(f"DreamEnv's rule (a greedy `done: yes` and P(yes) > {chosen!r}), the threshold chosen on {a.choose_on} "
              f"(there: false positives {there['false_positives']} of {there['negatives']}, accuracy "
              f"{there['accuracy']:.1%}); on {a.data}: false positives {here['false_positives']} of {here['negatives']} "
              f"({here['false_positive_rate']:.1%}), completions {here['true_positives']} of {here['positives']}, "
              f"accuracy {here['accuracy']:.1%}")
    table = by_threshold(data, p, thresholds)
    print("P(yes) alone, by threshold:")
    for th, r in table.items():
        print(f"P(yes) > {th:<5}: false positives {r['false_positives']:3d} of {r['negatives']} "
              f"({r['false_positive_rate']:.1%}), completions {r['true_positives']:3d} of {r['positives']}, "
              f"accuracy {r['accuracy']:.1%}")
    if any(t["success"] for t in data) and not all(t["success"] for t in data):
        print(f"AUC {auc(data, p):.3f} (P(yes) of a completion above a failure's)")
    if a.out:
        with runlog.open_text(a.out, "w") as f:
            json.dump({"by_threshold": table, "p_yes": [{"task": t["task"], "seed": t["seed"], "step": t["step"],
                                                         "action": t["action"], "success": bool(t["success"]), "p_yes": x,
                                                         "greedy_yes": g}
                                                        for t, x, g in zip(data, p, greedy)]}, f, indent=1)
