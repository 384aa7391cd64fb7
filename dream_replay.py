"""Replay a dream run's imagined trajectories on real pages: was the reward the policy trained on true?

    python dream_replay.py runs/dream/dreams-rank0.jsonl --transitions runs/transitions.jsonl [--judge runs/judge/final]

train.py --mode dream writes every imagined trajectory to dreams-rank{R}.jsonl (dream.dream_record).
This replays each one's replies on real pages from the start state the run drew (transitions.replay:
the same start page, then the dream's actions, parsed, never executed) and scores each dream reward
against the real outcome, per task: precision, recall, false positives, and how often a group's dreams
are ordered as their real outcomes are (what a group-normalised advantage sees). With --judge the same
dreams are also scored by another trajectory judge (paired); with --labelled each dream's line is
written again with its real outcome, data train.py --mode judge --judge-trajectories learns from.
The in-run check that replays a few dreams every --replay-every iterations is dream.replay_dreams.
"""
from __future__ import annotations

import json
import os
from typing import Callable

from tqdm import tqdm

import env as webenv
import policy
import transitions
from runlog import open_text, read_jsonl


def replay_dream_file(path: str | list[str], transitions_path: str, *, tasks: list[str] | None = None,
                      iterations: list[int] | None = None, progress: bool = False,
                      judge_p: Callable[[list[dict]], list[float]] | None = None,
                      thresholds: tuple[float, ...] = (0.5,), records: list | None = None,
                      max_stage: int | None = None, labelled: list | None = None) -> dict:
    """Replay every imagined trajectory of a dreams-rank{R}.jsonl file (dream_record's lines), or of
    several (a list of paths: one per rank of a torchrun run), on real pages and score dream rewards
    against the real outcome: how often the reward the policy was trained on was true (DynaWeb's
    r(τ̂, q) checked against the environment it imitates), and how often another reward would have
    been, on the same dreams (paired).

    Each dream starts from transitions.pick_start_state(start_states(transitions_path, max_stage=
    max_stage), seed, task), the start state the run drew (max_stage: the run's --dream-max-stage),
    and its replies are replayed with transitions.replay (untrusted text: parsed, never executed).
    Only dreams whose start page is reproduced exactly count.
    The rewards scored: "trained" (the recorded reward > 0.5, what the run trained on); "done" (the
    world model's `done: yes`, done_success, where every dream records it); and with judge_p (a
    function from dream records to P(yes) each, e.g. judge.judge_trajectories on a checkpoint)
    "judge>{th}" for each threshold, and "judge-p", P(yes) itself as --dream-reward judge-p gives it
    (rewarded: P(yes) > 0.5).
    What a group-normalised advantage uses is the order of rewards inside a group (the G dreams of one
    start state, recorded as iteration and group, in one file): ranked_pairs counts the pairs of a
    group's dreams with different real outcomes, ranked_right how many of them the reward orders as
    the real outcome does (a tie counts 1/2), ranking its share (0.5: no better than chance; None
    without pairs).
    Returns {reward: {task or "all": {dreams, matched, rewarded, real_success, true_positive,
    false_positive, false_negative, precision (true among rewarded, None when none), recall (rewarded
    among real successes, None when none), real_steps, ranked_pairs, ranked_right, ranking}}}.
    records: when a list, one dict per dream is appended (task, seed, iteration, group, file (the index
    of its file in `path`: a group is one file's), real_success
    (None when the start page was not reproduced) and each reward's score). labelled: when a list,
    each dream's own line is appended with real_success added (a trajectory file that train.py
    --mode judge --judge-trajectories learns real outcomes of imagined pages from). Raises FileNotFoundError
    for a missing file, ValueError for a task without recorded start states.
    """
    states = transitions.start_states(read_jsonl(transitions_path), max_stage=max_stage)
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    tagged = [(i, r) for i, p in enumerate(paths) for r in read_jsonl(p)]  # i: the file (rank), part of a group's key
    keep = [(i, r) for i, r in tagged if r.get("source", "dream") == "dream" and r.get("turns")
            and not r.get("env_error") and (tasks is None or r["task"] in tasks)
            and (iterations is None or r.get("iteration") in iterations)]
    rows, files = [r for _, r in keep], [i for i, _ in keep]
    scores = {"trained": [float(r.get("reward", 0.0)) for r in rows]}  # each reward's score; rewarded: > 0.5
    if rows and all("done_success" in r for r in rows):
        scores["done"] = [float(bool(r["done_success"])) for r in rows]
    if judge_p is not None:
        ps = [float(p) for p in judge_p(rows)]
        scores.update({f"judge>{th:g}": [float(p > th) for p in ps] for th in thresholds})
        scores["judge-p"] = ps
    real = []  # (real success or None when the start page was not reproduced, real steps) per row
    renv = None  # one real browser for every task (env.reset switches task), opened on first use
    try:
        for r in tqdm(rows, desc="replay dreams", disable=not progress):
            start = transitions.pick_start_state(states, r["seed"], r["task"])
            renv = renv or webenv.WebEnv(r["task"], max_steps=30)
            res = transitions.replay(start, [u["response"] for u in r["turns"]], env=renv)
            real.append((None if res["env_error"] or not res["start_match"] else bool(res["success"]), res["steps"]))
    finally:
        if renv is not None:
            renv.close()
    if records is not None:
        records += [{**{k: r.get(k) for k in ("task", "seed", "iteration", "group")}, "file": files[i],
                     "real_success": success, **{name: s[i] for name, s in scores.items()}}
                    for i, (r, (success, _)) in enumerate(zip(rows, real))]
    if labelled is not None:
        labelled += [{**r, "real_success": success} for r, (success, _) in zip(rows, real)]
    keys = ("dreams", "matched", "rewarded", "real_success", "true_positive", "false_positive", "false_negative",
            "real_steps", "ranked_pairs", "ranked_right")
    out: dict[str, dict[str, dict]] = {}
    for name, score in scores.items():
        table = out[name] = {}
        groups: dict[tuple, list[tuple[float, bool]]] = {}
        for i, r, s, (success, _) in zip(files, rows, score, real):
            if success is not None:
                groups.setdefault((r["task"], i, r.get("iteration"), r.get("group")), []).append((s, success))
        for (task_name, *_), members in groups.items():
            wins = [a for a, ok in members if ok]
            losses = [b for b, ok in members if not ok]
            right = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in wins for b in losses)
            for task in (task_name, "all"):
                c = table.setdefault(task, dict.fromkeys(keys, 0))
                c["ranked_pairs"] += len(wins) * len(losses)
                c["ranked_right"] += right
        for r, s, (success, steps) in zip(rows, score, real):
            rewarded = s > 0.5
            for task in (r["task"], "all"):
                c = table.setdefault(task, dict.fromkeys(keys, 0))
                c["dreams"] += 1
                c["real_steps"] += steps
                if success is None:
                    continue
                c["matched"] += 1
                c["rewarded"] += int(rewarded)
                c["real_success"] += int(success)
                c["true_positive"] += int(rewarded and success)
                c["false_positive"] += int(rewarded and not success)
                c["false_negative"] += int(success and not rewarded)
        for c in table.values():
            c["precision"] = c["true_positive"] / c["rewarded"] if c["rewarded"] else None
            c["recall"] = c["true_positive"] / c["real_success"] if c["real_success"] else None
            c["ranking"] = c["ranked_right"] / c["ranked_pairs"] if c["ranked_pairs"] else None
    return out


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Replay a dream run's imagined trajectories on real pages: was their reward true?")
    ap.add_argument("dreams", nargs="+", help="a run's dreams-rank{R}.jsonl (several: every rank's, scored together)")
    ap.add_argument("--transitions", default="runs/transitions.jsonl", help="the transitions the run's dreams started from")
    ap.add_argument("--tasks", default="", help="comma-separated tasks (default: every task in the file)")
    ap.add_argument("--iterations", default="", help="comma-separated iterations (default: all)")
    ap.add_argument("--judge", default="", help="a trajectory judge's checkpoint (train.py --mode judge): also score "
                    "its verdict on the same dreams")
    ap.add_argument("--thresholds", default="0.5,0.9", help="comma-separated P(yes) thresholds of --judge's verdict")
    ap.add_argument("--max-tokens", type=int, default=None, help="the judge prompt's token budget (default: the one "
                    "--judge was trained with, judge.trained_budget)")
    ap.add_argument("--out", default="", help="also write the counts here as JSON, and each dream's scores and "
                    "real outcome beside it (<out>_dreams.jsonl)")
    ap.add_argument("--labelled", default="", help="also write each replayed dream's line with its real outcome "
                    "(real_success; null where the start page was not reproduced, which the judge skips) here: "
                    "imagined trajectories with real labels, for train.py --mode judge --judge-trajectories")
    ap.add_argument("--max-stage", type=int, default=None, help="the run's --dream-max-stage (default: read from the "
                    "args.json beside the first dreams file, else every stage)")
    a = ap.parse_args()
    if a.max_stage is None and os.path.exists(run_args := os.path.join(os.path.dirname(a.dreams[0]), "args.json")):
        with open(run_args) as f:
            a.max_stage = json.load(f).get("dream_max_stage")
    judge_p = None
    if a.judge:
        import judge

        jm, jtok = policy.load_model(a.judge)
        budget = a.max_tokens or judge.trained_budget(a.judge)
        view = judge.judge_view(a.judge)
        judge_p = lambda rows: judge.judge_trajectories(jm, jtok, rows, max_tokens=budget, **view)  # noqa: E731
    res = replay_dream_file(a.dreams, a.transitions, tasks=[t for t in a.tasks.split(",") if t] or None,
                            iterations=[int(i) for i in a.iterations.split(",") if i] or None, progress=True,
                            judge_p=judge_p, thresholds=tuple(float(t) for t in a.thresholds.split(",") if t),
                            records=(records := []), max_stage=a.max_stage, labelled=(labelled := []))
    for reward, table in res.items():
        print(f"\nreward: {reward}\n")
        print("| task | dreams | start reproduced | rewarded | real successes | rewarded and real | rewarded, not real | "
              "real, not rewarded | precision | recall | in-group pairs ordered right |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, c in sorted(table.items(), key=lambda kv: (kv[0] == "all", kv[0])):
            prec, rec, rank = ("" if c[k] is None else f"{c[k]:.1%}" for k in ("precision", "recall", "ranking"))
            print(f"| {name} | {c['dreams']} | {c['matched']} | {c['rewarded']} | {c['real_success']} | "
                  f"{c['true_positive']} | {c['false_positive']} | {c['false_negative']} | {prec} | {rec} | "
                  f"{rank} of {c['ranked_pairs']} |")
    if a.out:
        with open_text(a.out, "w") as f:
            json.dump(res, f, indent=1)
        with open_text(os.path.splitext(a.out)[0] + "_dreams.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    if a.labelled:
        with open_text(a.labelled, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in labelled)
    print(json.dumps(res))
