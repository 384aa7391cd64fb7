"""Learning curves of train.py runs: training reward and eval success, against iterations and against real browser steps.

    python curves.py runs/real runs/dream --out docs/curves
    python curves.py runs/real runs/dream --labels M-GRPO,dreams --eval M-GRPO:5=runs/ablate/real-step-5/results.json

Writes OUT/train_reward.png, OUT/eval_success.png (each: against iterations left, against real browser
steps right), and the points plotted as OUT/curves.md (printed too) and OUT/curves.json.

Training reward, per run: "rollout/reward" (else "rollout/success") of RUN/metrics.jsonl against "step" and
against "env/real_steps" (cumulative real browser steps; a dream run counts only its replays there, its
imagined steps are "dream/steps"). Its reward is the world model's judgement. A resumed run can log a step
twice: the last record of a step wins. The smoothed line is a trailing 3-point moving average (the mean of
an iteration and the two before it; fewer at the start).

Eval success, per run: the mean success and its 95% Wilson interval of eval.py's results.json for
  - the start checkpoint, args.json "init" (INIT/eval/results.json): iteration 0, 0 real steps;
  - every RUN/step-XXXXXX/eval/results.json: iteration XXXXXX;
  - RUN/final/eval/results.json: the last step of metrics.jsonl;
  - every --eval [LABEL:]STEP=PATH (a results.json, its eval folder or its checkpoint; LABEL may be left out
    when there is one run). One point per iteration: --eval wins over final, final over step-XXXXXX.
Real steps of an eval point are "env/real_steps" at its step in metrics.jsonl.

In-run evaluations (train.py --eval-every: greedy success on a fixed subset of eval seeds, logged as
"eval/success" with its interval "eval/ci_low".."eval/ci_high" and "eval/n") are a second series,
dashed, in the same panels.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

import runlog
from report import read_metrics

REWARD_KEYS = ("rollout/reward", "rollout/success")


def train_points(run: str) -> tuple[list[dict], bool]:
    """([{iteration, real_steps, reward, ma3}] of a run's metrics.jsonl, one per step (the last record
    wins), whether it is a dream run (its reward is then the world model's judgement of dreams))."""
    path = os.path.join(run, "metrics.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: train.py writes it (python train.py --mode real --out {run}, "
                                f"or --mode dream)")
    by_step = {int(r["step"]): r for r in read_metrics(path)}  # later lines overwrite earlier ones: resumes
    key = next((k for k in REWARD_KEYS if any(k in r for r in by_step.values())), None)
    if key is None:
        raise ValueError(f"{path} has neither {' nor '.join(REWARD_KEYS)}: curves are for --mode real or dream runs")
    rows = [r for _, r in sorted(by_step.items()) if key in r]
    pts, ys = [], []
    for r in rows:
        ys.append(float(r[key]))
        w = ys[-3:]
        pts.append({"iteration": int(r["step"]), "real_steps": r.get("env/real_steps"), "reward": ys[-1],
                    "ma3": sum(w) / len(w)})
    return pts, any("dream/steps" in r for r in rows)


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _results(path: str) -> str:
    """A results.json given as itself, its eval folder or its checkpoint folder."""
    if os.path.isdir(path):
        inner = os.path.join(path, "results.json")
        return inner if os.path.exists(inner) else os.path.join(path, "eval", "results.json")
    return path


def eval_points(run: str, train: list[dict], extra: list[tuple[int, str]]) -> list[dict]:
    """[{checkpoint, iteration, real_steps, success, lo, hi, n, path}] of a run, sorted by iteration."""
    found: dict[int, tuple[str, str]] = {}  # iteration -> (checkpoint name, results.json); later wins
    args_path = os.path.join(run, "args.json")
    init = _load(args_path).get("init") if os.path.exists(args_path) else None
    if init and os.path.exists(os.path.join(init, "eval", "results.json")):
        found[0] = (init, os.path.join(init, "eval", "results.json"))
    for d in sorted(glob.glob(os.path.join(run, "step-*", "eval", "results.json"))):
        m = re.search(r"step-(\d+)", os.path.relpath(d, run))
        found[int(m.group(1))] = (os.path.relpath(os.path.dirname(os.path.dirname(d)), run), d)
    final = os.path.join(run, "final", "eval", "results.json")
    if os.path.exists(final) and train:
        found[train[-1]["iteration"]] = ("final", final)
    for step, path in extra:
        if not os.path.exists(_results(path)):
            raise FileNotFoundError(f"{_results(path)} not found (--eval): eval.py writes it "
                                    f"(python eval.py --ckpt CKPT --out DIR writes DIR/results.json)")
        found[step] = (f"--eval {step}", _results(path))
    steps = {p["iteration"]: p["real_steps"] for p in train}
    pts = []
    for it, (name, path) in sorted(found.items()):
        mean = _load(path)["mean"]
        if mean["success"] is None:  # every episode was an env_error: nothing was measured, no point
            continue
        pts.append({"checkpoint": name, "iteration": it, "real_steps": 0 if it == 0 else steps.get(it),
                    "success": mean["success"], "lo": mean["ci95"][0], "hi": mean["ci95"][1], "n": mean["n"],
                    "path": path})
    return pts


def subset_points(run: str, train: list[dict]) -> list[dict]:
    """[{iteration, real_steps, success, lo, hi, n}] of the in-run evaluations in RUN/metrics.jsonl."""
    steps = {p["iteration"]: p["real_steps"] for p in train}
    by_step = {int(r["step"]): r for r in read_metrics(os.path.join(run, "metrics.jsonl")) if "eval/success" in r}
    return [{"iteration": it, "real_steps": 0 if it == 0 else steps.get(it), "success": r["eval/success"],
             "lo": r.get("eval/ci_low", r["eval/success"]), "hi": r.get("eval/ci_high", r["eval/success"]),
             "n": int(r.get("eval/n", 0))} for it, r in sorted(by_step.items())]


def parse_eval(spec: str, labels: list[str]) -> tuple[str, int, str]:
    """'[LABEL:]STEP=PATH' -> (label, step, path)."""
    left, sep, path = spec.partition("=")
    label, _, step = left.rpartition(":")
    if not sep or not path or not step.isdigit():
        raise ValueError(f"--eval {spec!r}: expected [LABEL:]STEP=PATH, e.g. real:5=runs/x/results.json")
    if not label and len(labels) == 1:
        label = labels[0]
    if label not in labels:
        raise ValueError(f"--eval {spec!r}: label {label!r} is not one of the runs' labels {labels}")
    return label, int(step), path


def plot(runs: dict, out: str) -> list[str]:
    """The two PNGs (Agg canvas, no display, no global backend switch); returns their paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    paths = []
    for name, ylabel in (("train_reward", "training reward"), ("eval_success", "eval success (%)")):
        fig = Figure(figsize=(9, 3.4), dpi=110)
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, 2, sharey=True)
        for i, (label, r) in enumerate(runs.items()):
            c = f"C{i}"
            for ax, xkey in zip(axes, ("iteration", "real_steps")):
                if name == "train_reward":
                    pts = [p for p in r["train"] if p[xkey] is not None]
                    xs = [p[xkey] for p in pts]
                    ax.plot(xs, [p["reward"] for p in pts], color=c, alpha=0.35, lw=1, marker="o", ms=3)
                    what = "world-model reward in dreams" if r["dream"] else "reward on real pages"
                    ax.plot(xs, [p["ma3"] for p in pts], color=c, lw=2, label=f"{label} ({what})")
                else:
                    for key, style, what in (("eval", "-", "eval.py"), ("subset", "--", "in-run, greedy subset")):
                        pts = [p for p in r.get(key, []) if p[xkey] is not None]
                        if not pts:
                            continue
                        ys = [100 * p["success"] for p in pts]
                        err = [[y - 100 * p["lo"] for y, p in zip(ys, pts)], [100 * p["hi"] - y for y, p in zip(ys, pts)]]
                        ax.errorbar([p[xkey] for p in pts], ys, yerr=err, color=c, marker="o", ms=4, capsize=3, ls=style,
                                    label=f"{label}, {what} (n={pts[-1]['n']}, 95% CI)")
        axes[0].set_xlabel("iteration")
        axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[1].set_xlabel("real browser steps (env/real_steps)")
        axes[0].set_ylabel(ylabel)
        for ax in axes:
            ax.grid(alpha=0.3)
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=len(runs), fontsize=8, frameon=False)
        fig.suptitle(ylabel + (": raw (faint) and 3-point moving average" if name == "train_reward" else
                               ", 95% Wilson intervals; iteration 0 is the run's start checkpoint (--init)"), fontsize=10)
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        paths.append(os.path.join(out, name + ".png"))
        fig.savefig(paths[-1])
    return paths


def table(runs: dict) -> str:
    f = lambda x, fmt: "" if x is None else format(x, fmt)  # noqa: E731
    lines = ["| run | iteration | real steps | training reward | 3-point mean |", "|---|---|---|---|---|"]
    lines += [f"| {label} | {p['iteration']} | {f(p['real_steps'], 'd')} | {p['reward']:.3f} | {p['ma3']:.3f} |"
              for label, r in runs.items() for p in r["train"]]
    lines += [f"\n{label}: the reward of its dreams, as the world model judged it" for label, r in runs.items() if r["dream"]]
    lines += ["", "| run | checkpoint | iteration | real steps | eval success (95% CI) | episodes |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {label} | {p['checkpoint']} | {p['iteration']} | {f(p['real_steps'], 'd')} | {p['success']:.1%} "
              f"({p['lo']:.1%}-{p['hi']:.1%}) | {p['n']} |" for label, r in runs.items() for p in r["eval"]]
    lines += [f"| {label} | in-run subset | {p['iteration']} | {f(p['real_steps'], 'd')} | {p['success']:.1%} "
              f"({p['lo']:.1%}-{p['hi']:.1%}) | {p['n']} |" for label, r in runs.items() for p in r.get("subset", [])]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="train.py --out folders (each with metrics.jsonl)")
    ap.add_argument("--out", required=True, help="folder for the PNGs, curves.md and curves.json")
    ap.add_argument("--labels", help="comma-separated, one per run (default: the folders' names)")
    ap.add_argument("--eval", action="append", default=[], metavar="[LABEL:]STEP=PATH",
                    help="an eval results.json (or its folder) stored elsewhere, at iteration STEP; repeatable")
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else [os.path.basename(os.path.normpath(r)) for r in args.runs]
    if len(labels) != len(args.runs) or len(set(labels)) != len(labels):
        raise ValueError(f"labels {labels}: need one distinct label per run ({len(args.runs)}); use --labels")
    extra = [parse_eval(s, labels) for s in args.eval]
    runs = {}
    for label, run in zip(labels, args.runs):
        train, dream = train_points(run)
        runs[label] = {"run": run, "dream": dream, "train": train, "subset": subset_points(run, train),
                       "eval": eval_points(run, train, [(s, p) for lab, s, p in extra if lab == label])}
    os.makedirs(args.out, exist_ok=True)
    paths = plot(runs, args.out)
    md = table(runs)
    with runlog.open_text(os.path.join(args.out, "curves.md"), "w") as fh:
        fh.write(md)
    with runlog.open_text(os.path.join(args.out, "curves.json"), "w") as fh:
        json.dump(runs, fh, indent=1)
    print(md + "wrote " + ", ".join(paths + [os.path.join(args.out, n) for n in ("curves.md", "curves.json")]))
    return runs


if __name__ == "__main__":
    main()
