"""A run's logs: metrics to TensorBoard and JSONL, and the one reader of every JSONL file.

    log = Logger("runs/real", enabled=rank == 0, resume_step=None)
    log.log({"rollout/success": 0.5, "loss/policy": 0.1}, step=1)     # out/tb and out/metrics.jsonl
    rows = read_jsonl("runs/real/metrics.jsonl")                       # a cut last line is skipped

Keys are namespaced (`loss/`, `rollout/`, `env/`, `perf/`, `eval/`, ...). On resume from step s,
metrics.jsonl loses the lines after s and TensorBoard purges its events after s (they are redone),
so curves never show a step twice.

Every JSONL file of the project (demos, transitions, trajectories, metrics, dream replays) is
appended one line at a time; a run killed while appending leaves a cut last line. `read_jsonl`
skips such a line with a warning; a broken line anywhere else is an error that names it.
"""
from __future__ import annotations

import codecs
import json
import logging
import os
import resource
import time

logger = logging.getLogger(__name__)

# Text the project writes may hold what a page or a model produced, lone surrogates included (a page's
# broken UTF-16, a decoded reply): encoded strictly they raise UnicodeEncodeError and lose the file. Each
# becomes U+FFFD instead, as axtree.clean_text does where page text enters.
# (The handler returns UTF-8 bytes: CPython's UTF-8 encoder refuses a non-ASCII str as a replacement.)
codecs.register_error("webdream.fffd", lambda e: ("\ufffd".encode() * (e.end - e.start), e.end))


def open_text(path: str, mode: str = "w"):
    """`open(path, mode)` for a text file the project writes ("w", "a" or "x"): UTF-8 whatever the locale, and
    text that UTF-8 cannot encode (a lone surrogate) written as U+FFFD instead of raising. Every report,
    result, log, record and trajectory file goes through it (tests/test_report.py checks the sources)."""
    if mode not in ("w", "a", "x"):
        raise ValueError(f"open_text writes text: mode 'w', 'a' or 'x', got {mode!r}")
    return open(path, mode, encoding="utf-8", errors="webdream.fffd")


def read_jsonl(path: str) -> list[dict]:
    """Every record of a JSONL file, blank lines skipped. A last line that does not parse (a write
    cut short) is dropped with a warning. Errors: FileNotFoundError; ValueError naming the file and
    line for a broken line that is not the last."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                logger.warning("%s: skipping its last line, cut short (%d characters): %s", path, len(line), e)
                continue
            raise ValueError(f"{path} line {i + 1} is not JSON ({e}); only a cut last line is skipped") from None
    return out


def truncate_jsonl(path: str, key: str, last) -> None:
    """On resume: keep only the records of `path` whose `key` is at most `last` (those after it are
    redone; a record without the key counts as 0), atomically; a cut last line goes too. No file: nothing."""
    if os.path.exists(path):
        write_jsonl(path, [r for r in read_jsonl(path) if r.get(key, 0) <= last])


def write_jsonl(path: str, records: list[dict]) -> None:
    """Replace `path` by the records, one JSON line each, atomically (a temp file, then rename)."""
    tmp = path + ".tmp"
    with open_text(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(tmp, path)


class Logger:
    """`log(metrics, step)`: TensorBoard (out/tb) + JSONL (out/metrics.jsonl) on rank 0, a no-op
    elsewhere. resume_step: the step a resumed run restarts after; later lines and events are dropped."""

    def __init__(self, out: str, enabled: bool, resume_step: int | None = None):
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        path = os.path.join(out, "metrics.jsonl")
        if resume_step is not None:
            truncate_jsonl(path, "step", resume_step)
        # purge_step: events at or after it, written by the interrupted run, are dropped
        self.tb = SummaryWriter(os.path.join(out, "tb"),
                                purge_step=resume_step + 1 if resume_step is not None else None)
        self.jsonl = open_text(path, "a")

    def log(self, metrics: dict, step: int) -> None:
        if not self.enabled:
            return
        for k, v in metrics.items():
            self.tb.add_scalar(k, v, step)
        self.jsonl.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")
        self.jsonl.flush()
        self.tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.tb.close()
            self.jsonl.close()


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (getrusage's ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
