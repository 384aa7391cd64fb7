"""Measure a policy: success rate per task on held-out eval seeds, real pages only.

    python eval.py                                  # the base model on the default suite
    python eval.py --ckpt runs/bc/final --seeds 20  # a checkpoint
    python eval.py --ckpt runs/real/final --out runs/eval-real
    python eval.py --ckpt runs/bc/final --seeds 2 --report runs/bc/final/report  # + an HTML report
    python eval.py --compare BC=runs/bc/final/eval M-GRPO=runs/real/final/eval   # per-task table, same episodes
    python eval.py --compare BC=a/bc/final/eval,b/bc/final/eval M-GRPO=a/real/final/eval,b/real/final/eval  # 2 repeats pooled
    python eval.py --benchmark webarena-lite --ckpt CKPT --judge-url http://127.0.0.1:8000/v1   # hosted WebArena-Lite

--benchmark webarena-lite (benchmarks.py, webarena_lite.py) evaluates WebArena-Lite's 165 tasks once each
on the sites the WA_* variables name (a missing one is a usage error that names it). The tasks graded by
an LLM judge need --judge-url (or $WEBDREAM_JUDGE_URL); without one they are skipped, counted and listed
in results.md and results.json ("skipped"), never scored.

Greedy decoding by default. Success is full task credit; an episode that ends by an
infrastructure fault (`env_error`) is neither a success nor a failure: it is left out of the
rate and counted on its own. Intervals are 95% Wilson score intervals. Writes out/results.md,
out/results.json and every trajectory to out/trajectories.jsonl. --compare also gives each run's
paired difference against the first run on the episodes they share, with a 95% interval and the
exact McNemar p-value (stats.paired): the way to tell whether training changed anything.

--report DIR takes a screenshot of the page at every step (about 40 ms each) and writes
DIR/report.html (report.py): the results table, the training curves of the checkpoint's run
(<ckpt>/../metrics.jsonl, when it exists), and up to 50 episodes, failures first, step by step
with screenshot, reply, action or error, and observation. One self-contained file to open in a browser.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import time

import torch

import benchmarks
import checkpoint
import compress
import env as webenv
import generators
import llm_judge
import policy
import stats
from rollout import EnvPool, rollout
from runlog import open_text, read_jsonl


def _pct(x, fmt: str = ".0%") -> str:
    return "n/a" if x is None else format(x, fmt)  # None: nothing measured (every episode an env_error)


def markdown(summary: dict, title: str) -> str:
    lines = [f"### {title}", "", "| task | success | 95% CI | n | env_error | mean steps |", "|---|---|---|---|---|---|"]
    for task, r in summary["tasks"].items():
        lines.append(f"| {task} | {_pct(r['success'])} | {r['ci95'][0]:.0%}-{r['ci95'][1]:.0%} | {r['n']} | {r['env_error']} | {r['mean_steps']:.1f} |")
    m = summary["mean"]
    lines.append(f"| **all** | **{_pct(m['success'], '.1%')}** | {m['ci95'][0]:.0%}-{m['ci95'][1]:.0%} | {m['n']} | {m['env_error']} | |")
    return "\n".join(lines) + "\n"


def _label(path: str) -> str:
    """A run's default --compare label: its folder, less a trailing /eval (runs/bc/final/eval -> runs/bc/final)."""
    if "," in path:  # replicates: named by the first
        return _label(path.split(",")[0]) + ",..."
    path = os.path.normpath(path)
    return os.path.dirname(path) if os.path.basename(path) == "eval" else path


def compare(runs: list[tuple[str, str]]) -> str:
    """A markdown table of success per task (columns: runs) over the episodes every run has, then
    each later run against the first, paired on those episodes.

    runs: [(label, folder or trajectories.jsonl written by this script)]. Only the (task, seed) pairs
    present in every run count, so runs evaluated on different numbers of seeds compare on the same
    pages; the last rows give each run's mean with its 95% Wilson interval, the episodes compared and
    the real browser steps they took. The paired table: gained / lost episodes, the difference in
    points with its 95% interval, and the exact McNemar p (stats.paired).

    Replicates: a comma-separated list of folders, the same number k for every label
    (`BC=a/bc,b/bc RL=a/rl,b/rl`), pools k repeats of the comparison: the i-th folders of all labels
    form replicate i, an episode is (i, task, seed), and the tables count every replicate's episodes
    (two RL runs from one BC checkpoint count that BC's episodes twice, each paired with its own run;
    the interval and McNemar's p then treat the repeats as independent, which holds for the RL runs'
    randomness given that BC, not for BC's own: a fresh BC per repeat is the stronger test).
    Errors: FileNotFoundError for a folder without trajectories.jsonl; ValueError when the runs share
    no episode or list different numbers of replicates.
    """
    trajs, counts = {}, {}
    for label, paths in runs:
        reps = []
        folders = [f.strip() for f in paths.split(",")]
        counts[label] = len(folders)
        if not all(folders):
            raise ValueError(f"{label}={paths!r}: an empty folder name in the list")
        for i, path in enumerate(folders):
            f = path if path.endswith(".jsonl") else os.path.join(path, "trajectories.jsonl")
            if not os.path.exists(f):
                raise FileNotFoundError(f"{f} not found: python eval.py --ckpt CKPT --out {path} writes it")
            reps += [(i, t) for t in read_jsonl(f)]
        trajs[label] = reps
    if len(set(counts.values())) > 1:
        raise ValueError(f"every run needs the same number of replicate folders, got {counts}")
    episode = lambda i, t: (i, t["task"], t["seed"])  # noqa: E731
    common = set.intersection(*({episode(i, t) for i, t in ts} for ts in trajs.values()))
    if not common:
        raise ValueError(f"the runs {[l for l, _ in runs]} share no (task, seed) episode")
    shared_reps = {l: [(i, t) for i, t in ts if episode(i, t) in common] for l, ts in trajs.items()}
    shared = {l: [t for _, t in ts] for l, ts in shared_reps.items()}
    tasks = list(dict.fromkeys(t["task"] for t in next(iter(shared.values()))))
    sums = {l: stats.summarise(ts, tasks) for l, ts in shared.items()}
    lines = ["| task | " + " | ".join(sums) + " |", "|---" * (len(sums) + 1) + "|"]
    for task in tasks:
        lines.append(f"| {task} | " + " | ".join(_pct(s["tasks"][task]["success"]) for s in sums.values()) + " |")
    mean = lambda m: "n/a" if m["success"] is None else f"**{m['success']:.1%}** ({m['ci95'][0]:.0%}-{m['ci95'][1]:.0%})"
    lines.append("| **mean (95% CI)** | " + " | ".join(mean(s["mean"]) for s in sums.values()) + " |")
    lines.append("| episodes | " + " | ".join(str(s["mean"]["n"]) for s in sums.values()) + " |")
    lines.append("| real steps | " + " | ".join(str(sum(t["steps"] for t in ts)) for ts in shared.values()) + " |")
    labels = list(shared)
    if len(labels) > 1:
        outcomes = lambda ts: {episode(i, t): bool(t["success"]) for i, t in ts if not t["env_error"]}  # noqa: E731
        base = outcomes(shared_reps[labels[0]])
        pooled = f", {max(counts.values())} replicates pooled" if max(counts.values()) > 1 else ""
        lines += ["", f"Paired against {labels[0]} on the same episodes (env_error episodes of either run left out{pooled}):", "",
                  "| run | episodes | gained | lost | difference (95% CI) | McNemar p |", "|---|---|---|---|---|---|"]
        for label in labels[1:]:
            p = stats.paired(base, outcomes(shared_reps[label]))
            lines.append(f"| {label} | {p['n']} | {p['gained']} | {p['lost']} | {100 * p['diff']:+.1f} points "
                         f"({100 * p['ci95'][0]:+.1f} to {100 * p['ci95'][1]:+.1f}) | {p['p']:.3g} |")
    return "\n".join(lines) + "\n"


def evaluate(generator, tokenizer, tasks: list[str], seeds: list[int], *, max_steps: int = 6, num_envs: int = 8,
             temperature: float = 0.0, max_new_tokens: int = 32, prompt: compress.PromptSettings = compress.PromptSettings(),
             progress: bool = True, screenshots: bool = False, processes: bool = False) -> tuple[dict, list[dict]]:
    """Run every (task, seed) once on real pages with `generator` (generators.py); return
    (stats.summarise's summary, trajectories).
    screenshots: keep a JPEG of every page in the trajectories (turn["screenshot"], base64; for report.py).
    processes: each browser in a process of its own instead of a worker thread (rollout.EnvPool)."""
    benchmark = webenv.benchmark_of(tasks[0]) if tasks else "miniwob"
    pool = EnvPool(functools.partial(webenv.WebEnv, max_steps=max_steps, screenshots=screenshots), tokenizer,
                   num_envs=num_envs, processes=processes, step_timeout=benchmarks.POOL_STEP_TIMEOUT_S[benchmark])
    try:
        jobs = [(t, s) for t in tasks for s in seeds]
        trajs, _ = rollout(generator, tokenizer, pool, jobs, temperature=temperature, max_new_tokens=max_new_tokens,
                           prompt=prompt, progress=progress, desc="eval")
    finally:
        pool.close()
    return stats.summarise(trajs, tasks), trajs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default=None, help="checkpoint folder; default: the base model (--model)")
    p.add_argument("--model", default=policy.DEFAULT_MODEL, help="base model when no --ckpt")
    benchmarks.add_flags(p)
    p.add_argument("--tasks", default=None, help="comma-separated tasks (default: the benchmark's evaluation tasks: "
                   "MiniWoB's suite, or WebArena-Lite's 165)")
    p.add_argument("--seeds", type=int, default=None, help="eval seeds per task (default 20; WebArena-Lite: 1, a task "
                   "config is its own seed)")
    p.add_argument("--max-steps", type=int, default=None, help="turns per episode (test-time interaction budget; default: as trained, else 6)")
    p.add_argument("--num-envs", type=int, default=8, help="episodes running at once")
    p.add_argument("--env-workers", choices=["thread", "process"], default="thread",
                   help="each browser in a worker thread, or in a process of its own (bench.py --only workers)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--max-new-tokens", type=int, default=None, help="reply length limit (default: as trained, else 32)")
    p.add_argument("--bid-last", action=argparse.BooleanOptionalAction, default=None,
                   help="tree lines show the bid after the element's role and name, `button 'OK' [28]` (compress."
                        "bid_after_name; docs/rl.md); default: as the checkpoint was trained, else on; "
                        "--no-bid-last: `[28] button 'OK'`")
    p.add_argument("--keep-last", type=int, default=None, help="observations kept in full (default: as trained, else 1)")
    p.add_argument("--no-compress", action="store_true", default=None, help="keep every observation in full (default: as trained)")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="token budget of a prompt (default: as trained, else 1024)")
    p.add_argument("--think", action=argparse.BooleanOptionalAction, default=None,
                   help="a <think> block before the action (default: as trained; the base model: think)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where the model runs")
    p.add_argument("--bf16", type=int, default=0, help="bf16 autocast for generation (1/0); slower than fp32 on CPU")
    p.add_argument("--out", default=None, help="output folder (default: <ckpt>/eval or runs/eval-base)")
    p.add_argument("--compare", nargs="+", default=None, metavar="[LABEL=]DIR[,DIR...]",
                   help="instead of evaluating: a per-task table of earlier evaluations (their out folders), "
                        "over the episodes they all have; DIR,DIR,...: replicates pooled (the i-th of each run paired)")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="also write DIR/report.html: results, training curves, episodes with screenshots")
    args = p.parse_args(argv)
    if args.compare:
        runs = [tuple(c.split("=", 1)) if "=" in c else (_label(c), c) for c in args.compare]
        labels = [label for label, _ in runs]
        if len(set(labels)) < len(labels):
            p.error(f"--compare: two runs have the same label ({labels}); name them LABEL=DIR")
        try:
            print(compare(runs), end="")
        except (ValueError, FileNotFoundError) as e:
            p.error(f"--compare: {e}")
        return
    benchmarks.configure(args, p.error)  # the sites' variables, the judge
    try:
        sel = benchmarks.select(args.benchmark, args.tasks, "eval")
        args.seeds = args.seeds or (20 if args.benchmark == "miniwob" else 1)
        if not 1 <= args.seeds <= len(webenv.EVAL_SEEDS):
            raise ValueError(f"--seeds must be between 1 and {len(webenv.EVAL_SEEDS)}")
        seeds = benchmarks.eval_seeds(args.benchmark, args.seeds)
    except ValueError as e:
        p.error(str(e))
    if not sel.tasks:
        p.error(f"no task left to evaluate. {sel.note()}")
    if (err := policy.model_path_error(args.ckpt, "--ckpt", hub=False) if args.ckpt else policy.model_path_error(args.model)):
        p.error(err)
    # The prompt format a checkpoint was trained with (train.py writes webdream.json), unless overridden.
    checkpoint.resolve_prompt_settings(args, args.ckpt, benchmarks.prompt_defaults(args.benchmark))
    prompt = checkpoint.prompt_settings(args)
    least = compress.min_tokens(policy.load_tokenizer(args.ckpt or args.model), prompt.system)
    if args.max_prompt_tokens < least:
        p.error(f"--max-prompt-tokens {args.max_prompt_tokens} is too small: the system prompt"
                f"{' of --think' if args.think else ''} and an observation's header take {least} tokens; "
                f"use at least {least}")
    out = args.out or (os.path.join(args.ckpt, "eval") if args.ckpt else os.path.join("runs", "eval-base"))
    os.makedirs(out, exist_ok=True)
    model, tok = policy.load_model(args.ckpt or args.model, device=args.device)
    t0 = time.time()
    if sel.skipped:
        print(sel.note())
    summary, trajs = evaluate(generators.HFGenerator(model, tok, bf16=bool(args.bf16)), tok, sel.tasks,
                              seeds, max_steps=args.max_steps, num_envs=args.num_envs,
                              temperature=args.temperature, max_new_tokens=args.max_new_tokens, prompt=prompt,
                              screenshots=bool(args.report), processes=args.env_workers == "process")
    summary["seconds"] = time.time() - t0
    summary["real_steps"] = sum(t["steps"] for t in trajs)
    summary["model"] = args.ckpt or args.model
    summary["benchmark"] = args.benchmark
    summary["skipped"] = {"need_llm_judge": sel.skipped}  # not run, not scored (benchmarks.Selection)
    if args.benchmark != "miniwob":
        summary["judge"] = llm_judge.describe()
    title = (f"{summary['model']}: {args.seeds} eval seeds per task, max {args.max_steps} steps"
             if args.benchmark == "miniwob" else
             f"{summary['model']}: WebArena-Lite, {len(sel.tasks)} tasks once each, max {args.max_steps} steps")
    md = markdown(summary, title) + (f"\n{sel.note()}\n" if sel.skipped else "")
    with open_text(os.path.join(out, "results.md"), "w") as f:
        f.write(md)
    with open_text(os.path.join(out, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open_text(os.path.join(out, "trajectories.jsonl"), "w") as f:
        for t in trajs:
            f.write(json.dumps(t) + "\n")
    print(md)
    print(f"wrote {out}/results.md, results.json, trajectories.jsonl ({summary['seconds']:.0f} s)")
    if args.report:
        import report

        metrics = os.path.join(os.path.dirname(os.path.abspath(args.ckpt)), "metrics.jsonl") if args.ckpt else None
        path = report.write_report(args.report, trajs, summary=summary,
                                   metrics_path=metrics if metrics and os.path.exists(metrics) else None, title=title)
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
