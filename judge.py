"""The trajectory judge: DynaWeb's self-evaluation r(τ̂, q), the reward of a finished imagined trajectory.

    python train.py --mode judge --transitions runs/transitions.jsonl --judge-trajectories runs/demos.jsonl --out runs/judge
    python judge.py --eval runs/judge/final --data runs/wm_eval.jsonl      # accuracy and false positives on real episodes
    python judge.py --eval runs/judge/final --data runs/wm_eval.jsonl --imagined runs/wm/final/wm_eval_predictions.jsonl
        # the same on a world model's imagined next pages, paired against its done: line (docs/dreams.md)
    python judge.py --compare A/judge_eval_wm_eval_predictions.jsonl B/judge_eval_wm_eval_predictions.jsonl
        # two judges (or one at two budgets) paired on the same transitions: B - A
    python train.py --mode dream ... --dream-reward judge --judge runs/judge/final

DynaWeb scores each imagined trajectory τ̂ with a model's judgement of whether it completed the task
q. Here a language model reads the goal and the trajectory: each page the agent acted on with the
action it took, then the page after the last action (`final_observation`), and answers `yes` or
`no`. A dream that starts at stage k of a real episode is judged with that episode's first k
turns in front (its `context`): completion depends on them (enter-text: typed in the real prefix,
submitted in the dream). The verdict is P(yes), from one forward pass: the softmax over the two
answer tokens at the reply's first position; the reward is 1 when P(yes) > threshold, or
with --dream-reward judge-p P(yes) itself (graded: a group's dreams ranked by it, docs/dreams.md).

Each action is shown with the line of the page it acted on (`Action 2: click('34') on [34] link 'Id'`,
action_target): whether a click hit the link the goal names is then a match of two strings on one
line, not a lookup of a bid across a page (a 135M judge without it said no to every click-tab-2
completion, docs/dreams.md "d14"). Judges trained before this existed read their format from
their webdream.json (`shows_targets`).

The prompt fits a token budget: the oldest pages give way to a placeholder first (every action
stays), then the final page's tree is cut from its end. Labels are real outcomes (`judge_samples`):
every prefix of every recorded real episode (transitions.jsonl; trajectory records of real or
expert episodes), labelled with whether the task was complete right after its last action, and
dreams whose actions were replayed on real pages (`python dream_replay.py ... --labelled`),
labelled with the replay's outcome: imagined pages, real labels. It is
trained by supervised.py (-log p(answer | prompt)) like the world model.
"""
from __future__ import annotations

import json
import logging

import torch

import compress
import policy
import runlog
from env import Obs
from transitions import episodes_of, transition_key

logger = logging.getLogger(__name__)

# Short on purpose: it is in every judge sequence.
JUDGE_SYSTEM_PROMPT = "A web agent acted on these pages. Did its actions complete the goal? Answer yes or no."
OMITTED = "[page omitted]"


def page_text(observation: str, goal: str) -> str:
    """An observation's text without its `Goal:` line (the judge shows the goal once)."""
    head = f"Goal: {goal}\n"
    return observation[len(head):] if observation.startswith(head) else observation


def trajectory_view(traj: dict) -> tuple[str, list[str], list[str], str | None]:
    """(goal, pages, actions, final page or None) of a trajectory record: its context turns (a dream's
    real episode so far) then its turns; an unparsed reply is shown as its text."""
    goal = traj.get("goal", "")
    turns = [(u["observation"], u.get("response", "")) for u in traj.get("context", [])]
    turns += [(u["observation"], u.get("action") or u.get("response") or "") for u in traj["turns"]]
    final = traj.get("final_observation")
    return (goal, [page_text(o, goal) for o, _ in turns], [a for _, a in turns],
            page_text(final, goal) if final is not None else None)


def action_target(page: str, action: str) -> str | None:
    """The line of `page` (a flattened tree, axtree.flatten_axtree's text) that `action` acts on, stripped:
    action_target("[34] link 'Id'", "click('34')") -> "[34] link 'Id'". The action is untrusted model
    text (a reply, thought included, or a parsed action): actions.parse_action reads it, nothing runs
    it. None when it does not parse, its first parameter is not a bid (send_msg_to_user('34') acts on
    no element), or no line has that bid."""
    import actions
    from axtree import line_bid

    try:
        name, args = actions.split_action(actions.parse_action(action, actions.WEB_ACTIONS))
    except (actions.ActionParseError, SyntaxError, ValueError):
        return None
    if not args or actions.WEB_ACTIONS[name][:1] != ("bid",):
        return None
    return next((line.strip() for line in page.split("\n") if line_bid(line) == str(args[0])), None)


def shows_targets(path: str | None) -> bool:
    """Whether the judge checkpoint folder `path` was trained with each action's target line shown
    (its webdream.json's judge_targets): judges written before the setting existed were not; a model
    without a webdream.json (the base model, --tiny) gets the current format, True."""
    import checkpoint

    saved = checkpoint.saved_settings(path)
    return True if saved is None else bool(saved.get("judge_targets", False))


def shown_pages(path: str | None) -> int | None:
    """How many pages before the final one the judge checkpoint folder `path` was trained to see (its
    webdream.json's judge_pages: train.py --mode judge --judge-pages; judge_prompt's pages_shown), None
    (as many as fit the budget) for judges trained before the setting, the base model and --tiny."""
    import checkpoint

    saved = checkpoint.saved_settings(path)
    return None if saved is None or saved.get("judge_pages") is None else int(saved["judge_pages"])


def judge_view(path: str | None) -> dict:
    """The prompt format the judge checkpoint folder `path` learnt, as judge_prompt's keyword arguments
    (and judge_trajectories', judge_dreams', evaluate_judge's): {targets: shows_targets(path),
    pages_shown: shown_pages(path)}."""
    return {"targets": shows_targets(path), "pages_shown": shown_pages(path)}


def trained_budget(path: str | None, default: int = 1024) -> int:
    """The prompt budget, in tokens, the judge checkpoint folder `path` was trained with (its
    webdream.json's max_prompt_tokens: train.py --mode judge --max-prompt-tokens), `default` when it
    has none (the base model, --tiny). Scored with a larger budget, the judge sees prompts longer than
    any it learnt from (more of the episode's pages shown): docs/dreams.md "The judge's prompt budget".
    """
    import checkpoint

    saved = checkpoint.saved_settings(path)
    return int(saved["max_prompt_tokens"]) if saved and saved.get("max_prompt_tokens") else default


def judge_messages(goal: str, pages: list[str], actions: list[str], final: str | None, *, omit: int = 0,
                   final_lines: int | None = None, targets: bool = True) -> list[dict]:
    """Chat messages asking whether the actions completed the goal. The oldest `omit` pages are
    shown as a placeholder (each action keeps its target line: the target is read from the page
    before it is omitted); final_lines: show only the first lines of the final page; targets: each
    action followed by `on <line it acted on>` (action_target)."""
    parts = [f"Goal: {goal}"]
    for i, (page, action) in enumerate(zip(pages, actions)):
        line = action_target(page, action) if targets else None
        parts += [f"Page {i + 1}:", OMITTED if i < omit else page,
                  f"Action {i + 1}: {action}" + (f" on {line}" if line else "")]
    if final is not None:
        parts += ["Final page:", final if final_lines is None else "\n".join(final.split("\n")[:final_lines])]
    parts.append("Did the actions complete the goal?")
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(parts)}]


def judge_prompt(tokenizer, goal: str, pages: list[str], actions: list[str], final: str | None,
                 max_tokens: int = 1024, targets: bool = True, pages_shown: int | None = None) -> list[int]:
    """Prompt ids for the judge (judge_messages; targets: show each action's target line), at most
    `max_tokens` long: the oldest pages omitted first, then the final page cut from its end, then (with
    targets) the target lines dropped, the last resort for many actions on long lines. pages_shown: at
    most this many of the latest pages before the final page are shown at all (0: the goal, every
    action with its target line, and the final page; None: as many as fit). Raises ValueError if even
    that does not fit."""
    first = 0 if pages_shown is None else max(0, len(pages) - pages_shown)
    for omit in range(first, len(pages) + 1):
        ids = compress.render(tokenizer, judge_messages(goal, pages, actions, final, omit=omit, targets=targets))
        if len(ids) <= max_tokens:
            return ids
    n = len(final.split("\n")) if final is not None else 0
    while n > 0:
        n = max(0, min(n - 1, n * max_tokens // len(ids)))
        ids = compress.render(tokenizer, judge_messages(goal, pages, actions, final, omit=len(pages), final_lines=n,
                                                         targets=targets))
        if len(ids) <= max_tokens:
            return ids
    if targets:
        return judge_prompt(tokenizer, goal, pages, actions, final, max_tokens, targets=False, pages_shown=pages_shown)
    raise ValueError(f"max_tokens={max_tokens} cannot hold the judge prompt of {len(pages)} actions")


def answer_ids(tokenizer) -> tuple[int, int]:
    """The first token ids of the answers `yes` and `no` (what judge_scores compares)."""
    return compress.encode_text(tokenizer, "yes")[0], compress.encode_text(tokenizer, "no")[0]


@torch.no_grad()
def judge_scores(model, tokenizer, prompts: list[list[int]], *, batch_size: int = 8, bf16: bool = False) -> list[float]:
    """P(yes) for each judge prompt: softmax over the logits of the two answer tokens at the reply's
    first position (one forward pass per batch of left-padded prompts)."""
    if not prompts:
        return []
    model.eval()
    yes, no = answer_ids(tokenizer)
    device = next(model.parameters()).device
    out = []
    for k in range(0, len(prompts), batch_size):
        ids, mask = policy.left_pad(prompts[k:k + batch_size], tokenizer.pad_token_id)
        ids, mask = ids.to(device), mask.to(device)
        with policy.autocast(device, bf16):
            logits = model(input_ids=ids, attention_mask=mask, position_ids=policy.position_ids(mask),
                           logits_to_keep=1, use_cache=False).logits[:, -1].float()  # (B, V)
        out += torch.softmax(logits[:, [yes, no]], -1)[:, 0].tolist()
    return out


def judge_trajectories(model, tokenizer, trajs: list[dict], *, max_tokens: int = 1024, batch_size: int = 8,
                       bf16: bool = False, targets: bool = True, pages_shown: int | None = None) -> list[float]:
    """P(yes) for each trajectory record (trajectory_view, judge_prompt, judge_scores); targets and
    pages_shown: the judge's format (shows_targets and shown_pages of its checkpoint)."""
    prompts = [judge_prompt(tokenizer, *trajectory_view(t), max_tokens=max_tokens, targets=targets,
                            pages_shown=pages_shown) for t in trajs]
    return judge_scores(model, tokenizer, prompts, batch_size=batch_size, bf16=bf16)


def judge_dreams(model, tokenizer, trajs: list[dict], *, threshold: float = 0.5, max_tokens: int = 1024,
                 batch_size: int = 8, bf16: bool = False, graded: bool = False, targets: bool = True,
                 pages_shown: int | None = None) -> dict:
    """Reward the dreams with the judge, in place: each finished dream (no env_error, at least one
    turn) gets judge_p (P(yes)), done_success (the world model's `done: yes`, kept), and success
    from judge_p > threshold; its reward is that success (0 or 1), or with graded judge_p itself.
    Returns {judge/yes_share, judge/agree_with_done, judge/n, judge/mean_p}."""
    live = [t for t in trajs if not t["env_error"] and t["turns"]]
    ps = judge_trajectories(model, tokenizer, live, max_tokens=max_tokens, batch_size=batch_size, bf16=bf16,
                            targets=targets, pages_shown=pages_shown)
    for t, p in zip(live, ps):
        t["done_success"] = bool(t.get("done_success", t["success"]))
        t["judge_p"] = p
        t["success"] = p > threshold
        t["reward"] = float(p) if graded else float(t["success"])
    n = len(live)
    return {"judge/yes_share": sum(t["success"] for t in live) / n if n else 0.0,
            "judge/agree_with_done": sum(t["success"] == t["done_success"] for t in live) / n if n else 0.0,
            "judge/n": n, "judge/mean_p": sum(t["judge_p"] for t in live) / n if n else 0.0}


def transition_views(transitions: list[dict], imagined: dict | None = None) -> list[tuple[tuple, tuple, bool]]:
    """(key, view, label) for every prefix of every episode in a transitions file (in file order): for
    an episode's step k, its pages and actions 0..k and the recorded page after action k; label =
    success at step k; key = (task, seed, step, action), as world_model.py --eval's predictions name
    a transition.

    imagined: {key: predicted Δ} (a world model's `--eval` predictions): the final page is then the
    world model's page, delta.apply(page k, Δ), not the recorded one, i.e. the judge reads a one-step
    dream of the recorded action from the real prefix, as it does in dream mode; transitions without
    a prediction are left out."""
    from delta import apply

    out = []
    for ep in episodes_of(transitions):
        goal = ep[0]["goal"]
        pages = [Obs(goal, t["obs"]["url"], t["obs"]["axtree"], t["obs"].get("error", "")).text for t in ep]
        for k, t in enumerate(ep):
            key = transition_key(t)
            if imagined is None:
                nxt = t["next_obs"]
            elif key in imagined:
                nxt, _ = apply(t["obs"], imagined[key], action=t["action"])
            else:
                continue
            final = Obs(goal, nxt["url"], nxt["axtree"], nxt.get("error", "")).text
            view = (goal, [page_text(p, goal) for p in pages[:k + 1]], [x["action"] for x in ep[:k + 1]],
                    page_text(final, goal))
            out.append((key, view, bool(t["success"])))
    return out


def labelled_views(transitions: list[dict], trajectories: list[dict] = ()) -> list[tuple[tuple, bool]]:
    """(view, label) for every prefix of every real episode: view is trajectory_view's tuple, label
    whether the task was complete right after the prefix's last action.

    transitions: transition_views (the recorded page after each action). trajectories: records of real or expert episodes
    (env_error ones and dreams are left out: a dream's own success is not a real outcome), and
    dreams that carry `real_success` (a bool: dream_replay.py's --labelled file; null where the replay
    could not reproduce the dream's start), whole, labelled with it (the page after an imagined action is imagined, its
    label real; with or without a final page, as judge_dreams scores dreams). Of a real episode, each prefix that
    the episode went on after (the next turn's page is its final page, label no, since a MiniWoB
    episode ends at success), and the whole episode, labelled with its success, when its
    final_observation was recorded (a view without a final page would teach the judge that its
    absence means something)."""
    out = [(view, label) for _, view, label in transition_views(transitions)]
    for traj in trajectories:
        if traj.get("source") == "dream" and isinstance(traj.get("real_success"), bool) and traj.get("turns") \
                and not traj.get("env_error"):
            out.append((trajectory_view(traj), traj["real_success"]))
            continue
        if traj.get("source") not in ("real", "expert") or traj.get("env_error") or not traj.get("turns"):
            continue
        turns = traj["turns"]
        for k in range(len(turns) - 1):
            out.append((trajectory_view({**traj, "turns": turns[:k + 1], "final_observation": turns[k + 1]["observation"]}),
                        False))
        if traj.get("final_observation") is not None:
            out.append((trajectory_view(traj), bool(traj.get("success"))))
    return out


def judge_samples(transitions: list[dict], trajectories: list[dict], tokenizer,
                  max_tokens: int = 1024, pages_shown: int | None = None) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) for train.py --mode judge: the answer is `yes` or `no` then the
    end-of-turn id, the prompt judge_prompt's (compressed to max_tokens, never skipped; with each
    action's target line, the format train.py records as judge_targets; pages_shown as judge_prompt's,
    recorded as judge_pages)."""
    return [(judge_prompt(tokenizer, *view, max_tokens=max_tokens, targets=True, pages_shown=pages_shown),
             compress.encode_reply(tokenizer, "yes" if label else "no"))
            for view, label in labelled_views(transitions, trajectories)]


def rates(pred: list[bool], labels: list[bool]) -> dict:
    """{judge/accuracy, judge/false_positive_rate (yes among the prefixes that had not completed the
    task), judge/false_negative_rate, judge/n, judge/positives} of yes/no verdicts against real outcomes."""
    pos = sum(labels)
    neg = len(labels) - pos
    return {"judge/accuracy": sum(p == y for p, y in zip(pred, labels)) / max(1, len(labels)),
            "judge/false_positive_rate": sum(p and not y for p, y in zip(pred, labels)) / max(1, neg),
            "judge/false_negative_rate": sum(y and not p for p, y in zip(pred, labels)) / max(1, pos),
            "judge/n": len(labels), "judge/positives": pos}


def evaluate_judge(model, tokenizer, transitions: list[dict], trajectories: list[dict] = (), *,
                   imagined: dict | None = None, threshold: float = 0.5, max_tokens: int = 1024, batch_size: int = 8,
                   predictions: list | None = None, targets: bool = True, pages_shown: int | None = None) -> dict:
    """The judge on real outcomes (labelled_views): rates() at `threshold`. imagined: {key: predicted
    Δ} of a world model (transition_views): each transition's final page is the imagined one, and
    trajectories are not scored. `predictions`, a list, receives {task, seed, step, action, label,
    p_yes} for each scored transition, in order (trajectory prefixes have no key and are left out).
    targets and pages_shown: the judge's format (shows_targets and shown_pages of its checkpoint)."""
    keyed = transition_views(transitions, imagined)
    views = [(v, y) for _, v, y in keyed]
    if imagined is None:
        views += labelled_views([], trajectories)
    ps = judge_scores(model, tokenizer, [judge_prompt(tokenizer, *v, max_tokens=max_tokens, targets=targets,
                                                      pages_shown=pages_shown) for v, _ in views],
                      batch_size=batch_size)
    if predictions is not None:
        predictions.extend({"task": k[0], "seed": k[1], "step": k[2], "action": k[3], "label": y, "p_yes": p}
                           for (k, _, y), p in zip(keyed, ps))
    return rates([p > threshold for p in ps], [y for _, y in views])


def compare_with_done(judge_preds: list[dict], wm_preds: list[dict], threshold: float = 0.5) -> dict:
    """The two dream rewards on the same transitions: the judge's verdict (judge_preds, evaluate_judge's
    predictions, P(yes) > threshold) against the world model's `done: yes` (wm_preds, world_model.py
    --eval's predictions: {task, seed, step, action, predicted}), both against the real outcome.
    Returns {"done": rates, "judge": rates, "correct": stats.paired (B = the judge, A = done: yes;
    right verdicts), "no_false_positive": stats.paired over the transitions that did not complete
    the task (a right `no`), "n": shared transitions}. Raises ValueError when they share none."""
    import stats
    from delta import predicted_done

    done = {transition_key(r): predicted_done(r["predicted"]) for r in wm_preds}
    said = {transition_key(r): r["p_yes"] > threshold for r in judge_preds if transition_key(r) in done}
    label = {transition_key(r): bool(r["label"]) for r in judge_preds if transition_key(r) in done}
    if not said:
        raise ValueError("the judge's and the world model's predictions share no transition")
    ks = list(said)
    neg = [k for k in ks if not label[k]]
    return {"n": len(ks), "done": rates([done[k] for k in ks], [label[k] for k in ks]),
            "judge": rates([said[k] for k in ks], [label[k] for k in ks]),
            "correct": stats.paired({k: done[k] == label[k] for k in ks}, {k: said[k] == label[k] for k in ks}),
            "no_false_positive": stats.paired({k: not done[k] for k in neg}, {k: not said[k] for k in neg})}


def compare_judges(a_preds: list[dict], b_preds: list[dict], threshold: float = 0.5) -> dict:
    """Two judges' verdicts (P(yes) > threshold) on the transitions both scored (evaluate_judge's
    predictions, `judge.py --eval`'s <out>_predictions.jsonl, paired by task, seed, step and action).
    Returns {"correct": stats.paired of right verdicts (B's gain over A), "no_false_positive":
    stats.paired over the transitions that did not complete the task (a right `no`), "a", "b":
    rates of each, and per task {task: stats.paired of right verdicts}}. Raises ValueError when the
    two share no transition, or when one transition has two labels (different data files)."""
    import stats

    a = {transition_key(r): r for r in a_preds}
    b = {transition_key(r): r for r in b_preds}
    ks = [k for k in a if k in b]
    if not ks:
        raise ValueError("the two judges' predictions share no transition")
    if any(bool(a[k]["label"]) != bool(b[k]["label"]) for k in ks):
        raise ValueError("a transition has two labels: the predictions are of different data")
    right = [{k: (p[k]["p_yes"] > threshold) == bool(p[k]["label"]) for k in ks} for p in (a, b)]
    neg = [k for k in ks if not a[k]["label"]]
    out = {"n": len(ks), "correct": stats.paired(*right),
           "no_false_positive": stats.paired(*({k: p[k]["p_yes"] <= threshold for k in neg} for p in (a, b))),
           **{name: rates([p[k]["p_yes"] > threshold for k in ks], [bool(p[k]["label"]) for k in ks])
              for name, p in (("a", a), ("b", b))}}
    out["by_task"] = {t: stats.paired(*({k: v for k, v in r.items() if k[0] == t} for r in right))
                      for t in sorted({k[0] for k in ks})}
    return out


if __name__ == "__main__":
    import argparse
    import os

    from runlog import read_jsonl

    ap = argparse.ArgumentParser(description="Evaluate a trajectory judge on real outcomes.")
    ap.add_argument("--eval", default="", help="checkpoint folder of the judge (train.py --mode judge)")
    ap.add_argument("--compare", nargs=2, metavar="PREDICTIONS", default=None,
                    help="two --eval predictions files (A B): B's paired gain in right verdicts and in right `no`s")
    ap.add_argument("--data", default="runs/wm_eval.jsonl", help="real transitions (world_model.py --collect)")
    ap.add_argument("--trajectories", default="", help="comma-separated trajectory files (real or expert episodes)")
    ap.add_argument("--imagined", default="", help="a world model's predictions on --data (world_model.py --eval's "
                    "<out>_predictions.jsonl): judge its imagined next pages, and compare with its `done:` line")
    ap.add_argument("--threshold", type=float, default=0.5, help="P(yes) above which the judge says yes")
    ap.add_argument("--max-tokens", type=int, default=None, help="the judge prompt's token budget (default: the one "
                    "the judge was trained with, its webdream.json's max_prompt_tokens; 1024 without one)")
    ap.add_argument("--out", default=None, help="the JSON written (default <checkpoint>/judge_eval_<data>.json, or "
                    "judge_eval_imagined_<data>.json with --imagined, <data> the --data file's name without .jsonl, "
                    "so evaluations on two data files do not overwrite each other); its per-transition P(yes) "
                    "beside it, <out>_predictions.jsonl")
    a = ap.parse_args()
    if bool(a.eval) == bool(a.compare):
        ap.error("give --eval CHECKPOINT or --compare A B")
    if a.compare:
        import stats

        res = compare_judges(*(read_jsonl(p) for p in a.compare), threshold=a.threshold)
        rows = {"right verdicts": res["correct"], "right no (false positives)": res["no_false_positive"], **res["by_task"]}
        for name, r in rows.items():
            print(stats.paired_line(name, r, width=28))
        raise SystemExit(0)
    a.max_tokens = a.max_tokens or trained_budget(a.eval)
    m, tok = policy.load_model(a.eval)
    trajs = [t for p in a.trajectories.split(",") if p for t in read_jsonl(p)]
    wm = read_jsonl(a.imagined) if a.imagined else None
    preds: list[dict] = []
    view = judge_view(a.eval)
    res = evaluate_judge(m, tok, read_jsonl(a.data), trajs, threshold=a.threshold, max_tokens=a.max_tokens,
                         imagined={transition_key(r): r["predicted"] for r in wm} if wm else None,
                         predictions=preds, **view)
    res["by_threshold"] = {th: rates([r["p_yes"] > th for r in preds], [r["label"] for r in preds])
                           for th in (0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.95, 0.99)}
    if wm:
        res["vs_done"] = compare_with_done(preds, wm, a.threshold)
    res.update(data=a.data, checkpoint=a.eval, imagined=a.imagined, threshold=a.threshold, max_tokens=a.max_tokens,
               pages_shown=view["pages_shown"])
    stem = os.path.splitext(os.path.basename(a.data))[0]
    out = a.out or os.path.join(a.eval, f"judge_eval_imagined_{stem}.json" if wm else f"judge_eval_{stem}.json")
    with runlog.open_text(os.path.splitext(out)[0] + "_predictions.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in preds)
    with runlog.open_text(out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    print(f"wrote {out}")
