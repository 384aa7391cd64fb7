"""Ablation sweeps of dream mode: success against --real-ratio or --dream-len (DynaWeb Fig. 3a/3b).

    python sweep.py --param real-ratio --values 0,0.2,0.4,0.6,1 --out runs/sweep-real-ratio
    python sweep.py --param dream-len --values 1,3,5,8 --out runs/sweep-dream-len

For each value: `train.py --mode dream --init <--init> --<param> <value>` for --iterations
iterations, then `eval.py` on --seeds eval seeds per task, each in its own subprocess (a crash
costs one point, not the sweep). A point whose eval results already exist is not rerun, so an
interrupted sweep continues where it stopped. Writes out/sweep.md (a table with 95% intervals and
real browser steps), out/sweep.json and out/sweep.png (success against the value, with the
--init checkpoint's success as a dashed line when --baseline gives its results.json).
Arguments after `--` go to train.py unchanged (e.g. `-- --lr 5e-5 --groups-per-iter 4`).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from runlog import open_text, read_jsonl

ROOT = os.path.dirname(os.path.abspath(__file__))


def run_point(args, value: str, extra: list[str]) -> dict:
    """Train and evaluate one value of the swept parameter; return its eval summary plus steps and times."""
    out = os.path.join(args.out, f"{args.param}-{value}")
    results = os.path.join(out, "final", "eval", "results.json")
    if not os.path.exists(results):
        t0 = time.time()
        train = [sys.executable, os.path.join(ROOT, "train.py"), "--mode", "dream", "--init", args.init,
                 f"--{args.param}", value, "--iterations", str(args.iterations), "--out", out,
                 "--tasks", args.tasks, *extra]
        if os.path.exists(os.path.join(out, "args.json")):
            train.append("--resume")
        subprocess.run(train, check=True, cwd=ROOT)
        t_train = time.time() - t0
        subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--ckpt", os.path.join(out, "final"),
                        "--seeds", str(args.seeds), "--tasks", args.tasks], check=True, cwd=ROOT)
        with open(results) as f:
            r = json.load(f)
        r["train_seconds"] = t_train
        with open_text(results, "w") as f:
            json.dump(r, f, indent=1)
    with open(results) as f:
        r = json.load(f)
    last = read_jsonl(os.path.join(out, "metrics.jsonl"))[-1]
    r["real_steps"] = last.get("env/real_steps", 0)
    r["dream_steps"] = last.get("dream/steps", 0)
    return r


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--param", choices=["real-ratio", "dream-len"], required=True, help="the train.py flag swept")
    p.add_argument("--values", required=True, help="comma-separated values")
    p.add_argument("--init", default="runs/bc/final", help="policy checkpoint every point starts from")
    p.add_argument("--iterations", type=int, default=4, help="dream iterations per point")
    p.add_argument("--seeds", type=int, default=5, help="eval seeds per task per point")
    p.add_argument("--tasks", default=None, help="comma-separated tasks (default: the suite)")
    p.add_argument("--baseline", default=None, help="results.json of the --init checkpoint, drawn as a dashed line")
    p.add_argument("--out", default=None, help="sweep folder (default runs/sweep-<param>)")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    import env as webenv

    args.tasks = args.tasks or ",".join(webenv.SUITE)
    args.out = args.out or os.path.join("runs", f"sweep-{args.param}")
    if not os.path.isdir(args.init):
        p.error(f"--init {args.init}: no such checkpoint (make bc writes runs/bc/final)")
    os.makedirs(args.out, exist_ok=True)
    values = [v.strip() for v in args.values.split(",") if v.strip()]
    rows = []
    for v in values:
        try:
            r = run_point(args, v, extra)
        except subprocess.CalledProcessError as e:  # one failed point, not a failed sweep
            print(f"{args.param} {v}: failed ({e}); the other points go on", file=sys.stderr, flush=True)
            continue
        m = r["mean"]
        if m["success"] is None:  # every episode an env_error: nothing measured
            print(f"{args.param} {v}: no episode measured (all env_error)", file=sys.stderr, flush=True)
            continue
        rows.append({"value": float(v), "success": m["success"], "ci95": m["ci95"], "n": m["n"],
                     "real_steps": r["real_steps"], "dream_steps": r["dream_steps"],
                     "train_seconds": r.get("train_seconds")})
        print(f"{args.param} {v}: success {m['success']:.1%} ({m['ci95'][0]:.0%}-{m['ci95'][1]:.0%}, n={m['n']})", flush=True)
    base = None
    if args.baseline and os.path.exists(args.baseline):
        with open(args.baseline) as f:
            rows_b = json.load(f)["tasks"]
        # the starting checkpoint's success on the swept tasks only (its results may cover more)
        done = [rows_b[t] for t in args.tasks.split(",") if t in rows_b]
        s, n = sum(r["successes"] for r in done), sum(r["n"] for r in done)
        if n:
            from stats import wilson

            base = {"success": s / n, "ci95": list(wilson(s, n)), "n": n}
    cmd = "python sweep.py " + " ".join(argv)
    lines = [f"`{cmd}`", "", f"| --{args.param} | success | 95% CI | episodes | real steps | dream steps | train s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ts = "" if r["train_seconds"] is None else f"{r['train_seconds']:.0f}"
        lines.append(f"| {r['value']:g} | {r['success']:.1%} | {r['ci95'][0]:.0%}-{r['ci95'][1]:.0%} | {r['n']} | "
                     f"{r['real_steps']} | {r['dream_steps']} | {ts} |")
    if base:
        lines.append(f"| start ({args.init}) | {base['success']:.1%} | {base['ci95'][0]:.0%}-{base['ci95'][1]:.0%} | "
                     f"{base['n']} | | | |")
    with open_text(os.path.join(args.out, "sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open_text(os.path.join(args.out, "sweep.json"), "w") as f:
        json.dump({"param": args.param, "rows": rows, "baseline": base, "command": cmd}, f, indent=1)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 3.2), dpi=120)
    xs = [r["value"] for r in rows]
    ys = [100 * r["success"] for r in rows]
    err = [[100 * (r["success"] - r["ci95"][0]) for r in rows], [100 * (r["ci95"][1] - r["success"]) for r in rows]]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label="dream mode")
    if base:
        ax.axhline(100 * base["success"], ls="--", color="gray", label="start (BC)")
    ax.set_xlabel(f"--{args.param}")
    ax.set_ylabel("eval success (%)")
    ax.set_title(f"success vs {args.param} ({args.iterations} iterations)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "sweep.png"))
    print("\n".join(lines))
    print(f"wrote {args.out}/sweep.md, sweep.json, sweep.png")


if __name__ == "__main__":
    main()
