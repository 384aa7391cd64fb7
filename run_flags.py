"""A run's flags across its starts: what --resume keeps, what it may change, and the record of each start.

    args.overrides = run_flags.resume_flags(parser, args, argv) if args.resume else {}   # in train.parse_args
    run_flags.record_start(args, argv)                                                   # rank 0, in train.main

out/args.json holds the flags of a run's first start, out/args-history.jsonl one line per start (time,
command line, flags, overrides). --resume runs with the flags of args.json (its --init stays the KL
reference and the start of the curves): a flag given again with the same value is fine; one of RESUMABLE
(--iterations, --epochs, the checkpoint, report and eval cadence, the rollout machinery, memory knobs)
may change, and the change is printed and logged; any other change is a parser error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import runlog


# Flags that a resumed run may change (how long, how often, on what machinery); the others define the run.
# (--epochs: a BC or WM run continued for more passes; its linear decay is then over the new length.)
RESUMABLE = ("iterations", "epochs", "save_every", "keep_ckpts", "report_every", "eval_every", "eval_seeds", "num_envs",
             "env_workers", "step_timeout", "micro_batch", "grad_ckpt", "generator", "vllm_memory", "log_kl",
             "judge_url", "max_skipped_steps")


def given_flags(p: argparse.ArgumentParser, argv) -> set[str]:
    """The flags (dest names) written on the command line, whatever their value."""
    saved = {a.dest: a.default for a in p._actions}
    try:
        for a in p._actions:
            a.default = argparse.SUPPRESS
        return set(vars(p.parse_args(argv)))
    finally:
        for a in p._actions:
            a.default = saved[a.dest]


def resume_flags(p: argparse.ArgumentParser, args, argv) -> dict:
    """--resume: args takes the flags of out/args.json (the run's first start) except those given on this
    command line. A given flag that differs from the run's is an error unless it is in RESUMABLE (so is
    one the run's args.json lacks, given at a value other than its default); returns those changes,
    {flag: [run's value, new value]}."""
    path = os.path.join(args.out, "args.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        stored = json.load(f)
    given, changed = given_flags(p, argv), {}
    for k, v in stored.items():
        if k in ("resume", "out") or k not in vars(args):
            continue
        if k == "tasks" and isinstance(v, list):  # (args.json of older runs held the derived list)
            v = ",".join(v)
        if k not in given:
            setattr(args, k, v)
        elif getattr(args, k) != v:
            if k not in RESUMABLE:
                p.error(f"--resume: --{k.replace('_', '-')} is {v!r} in this run ({path}); a resumed run keeps it "
                        f"(may change: {', '.join('--' + r.replace('_', '-') for r in RESUMABLE)})")
            changed[k] = [v, getattr(args, k)]
    # a flag newer than the run (absent from its args.json) ran at its default: giving another value changes the run
    for k in sorted(given - set(stored) - {"resume", "out"} - set(RESUMABLE)):
        if k in vars(args) and getattr(args, k) != p.get_default(k):
            p.error(f"--resume: --{k.replace('_', '-')} did not exist when this run started ({path}), so it ran at "
                    f"its default {p.get_default(k)!r}; a resumed run keeps it")
    for k, (old, new) in changed.items():
        print(f"resume: --{k.replace('_', '-')} {old!r} -> {new!r}", file=sys.stderr)
    return changed


def record_start(args, argv) -> None:
    """Write out/args.json (the first start's flags, `args.flags`; a resumed run keeps the file it has)
    and append this start to out/args-history.jsonl: {time (Unix s), argv, resume, overrides, flags}."""
    first = os.path.join(args.out, "args.json")
    if not (args.resume and os.path.exists(first)):  # a resumed run keeps its first start's flags
        with runlog.open_text(first, "w") as f:
            json.dump(args.flags, f, indent=1)
    with runlog.open_text(os.path.join(args.out, "args-history.jsonl"), "a") as f:
        f.write(json.dumps({"time": time.time(), "argv": list(argv), "resume": args.resume,
                            "overrides": args.overrides, "flags": args.flags}) + "\n")
