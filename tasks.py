"""The tasks and their seeds: which MiniWoB++ (or WebArena-Lite) task a name means, the default suite,
disjoint training and evaluation seeds, and what counts as success.

    from tasks import SUITE, eval_seeds, train_seeds, task_name
    SUITE                        # the 15 default tasks, each solved 100% by experts.py
    eval_seeds(10)               # the first 10 held-out seeds, always the same: [10000, ..., 10009]
    task_name("miniwob.click-tab")   # -> 'click-tab' (ValueError, listing the valid names, for an unknown one)

env.py re-exports all of it (what a user imports); nothing here opens a browser.
"""
from __future__ import annotations

import browser  # noqa: F401  (sets MINIWOB_URL, which BrowserGym's MiniWoB tasks read when they are imported)
import webarena_lite

from browsergym.miniwob import ALL_MINIWOB_TASKS  # (after browser)


TASKS = {cls.subdomain: cls for cls in ALL_MINIWOB_TASKS}  # every MiniWoB task BrowserGym knows

# Default suite: 1-4 step tasks whose goal text fully determines the answer, of varied kinds.
# Every one is solved 100% of the time by experts.py from the text observation.
SUITE: list[str] = [
    "click-button",          # buttons
    "click-button-sequence", # two buttons in order
    "click-link",            # links (<span>s: generic nodes must be kept)
    "click-dialog",          # close a dialog
    "click-dialog-2",        # pick a dialog button
    "click-tab",             # tabs
    "click-tab-2",           # tabs, then a link inside the tab
    "enter-text",            # text entry
    "enter-password",        # two password fields
    "login-user",            # login form
    "focus-text",            # focus a field
    "click-checkboxes",      # checkboxes
    "choose-list",           # <select> dropdown
    "click-option",          # radio buttons
    "click-collapsible",     # expand a section, then click
]
# Left out: use-autocomplete (its menu opens on key events after a delay: fill() does not show
# it, so the answer is not in the text observation).

# Disjoint seed ranges: training never sees an evaluation page.
TRAIN_SEEDS = range(0, 10_000)
EVAL_SEEDS = range(10_000, 11_000)


def train_seeds(n: int, offset: int = 0) -> list[int]:
    """The n training seeds starting at `offset` (wraps around the range). Errors: ValueError if n < 0."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [TRAIN_SEEDS[(offset + i) % len(TRAIN_SEEDS)] for i in range(n)]


def eval_seeds(n: int) -> list[int]:
    """The first n evaluation seeds (always the same ones). Errors: ValueError if n > 1000 or n < 0."""
    if not 0 <= n <= len(EVAL_SEEDS):
        raise ValueError(f"n must be in [0, {len(EVAL_SEEDS)}], got {n}")
    return list(EVAL_SEEDS[:n])


def is_success(raw_reward: float) -> bool:
    """Full credit only. MiniWoB's WOB_RAW_REWARD_GLOBAL is 1 on success, -1 on failure, and some
    tasks pay partial credit in between for wrong answers: that is not success."""
    return raw_reward is not None and float(raw_reward) >= 1.0 - 1e-6


def benchmark_of(task: str) -> str:
    """The benchmark a task name belongs to: 'webarena-lite' for WebArena's names ('webarenalite.4',
    'webarena.12', registered ones), else 'miniwob'."""
    return "webarena-lite" if webarena_lite.is_task_name(task) else "miniwob"


def task_name(task: str) -> str:
    """'click-button', 'miniwob.click-button' or 'browsergym/miniwob.click-button' -> 'click-button';
    a WebArena name as is, less 'browsergym/'. Raises ValueError, listing the valid names, for an unknown task."""
    if webarena_lite.is_task_name(task):
        task = task.removeprefix("browsergym/")
        webarena_lite.config(task)  # (raises for an unknown one)
        return task
    for prefix in ("browsergym/miniwob.", "miniwob."):
        if task.startswith(prefix):
            task = task[len(prefix):]
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(sorted(TASKS))}")
    return task
