"""Which benchmark a run is on, and what that selects: its tasks (the training or the evaluation split),
its seeds, its prompt defaults, the rollout pool's time bound, and the tasks left out for want of an LLM
judge. train.py and eval.py take the same flags (add_flags) and choose the same way (select).

    --benchmark miniwob        (default) MiniWoB++ from local files: env.SUITE, training seeds 0-9999,
                               evaluation seeds 10000-10999 (disjoint pages of the same tasks)
    --benchmark webarena-lite  WebArena's sites, hosted elsewhere (the WA_* variables, webarena_lite.py):
                               training on the 647 WebArena tasks outside WebArena-Lite, evaluation on
                               WebArena-Lite's 165 (disjoint tasks; each task config is its own seed)
    --judge-url URL [--judge-model NAME]   the LLM judge some WebArena tasks are graded by (llm_judge.py)

    sel = benchmarks.select("webarena-lite", None, "eval")   # Selection(tasks=[...], skipped=[...])
    benchmarks.eval_seeds("webarena-lite", 1)                # [0]

Without a judge, the tasks an LLM grades (40 of the 165 test tasks, 86 of the 647 training tasks) are
not run: select leaves them out and lists them in `skipped`, eval.py reports them, and they never count
as successes or failures. There is no scripted expert for WebArena (experts.py is MiniWoB's): BC data
for it has to come from elsewhere, as demos.jsonl records.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import env as webenv
import llm_judge
import webarena_lite

BENCHMARKS = ("miniwob", "webarena-lite")
# WebArena's prompt defaults where a flag and the checkpoint say nothing (checkpoint.PROMPT_DEFAULTS are
# MiniWoB's): longer episodes, pages and answers
WEB_PROMPT_DEFAULTS = {"max_steps": 15, "max_prompt_tokens": 8192, "max_new_tokens": 256}
# rollout.EnvPool's backstop per reset or step: above env.WebEnv's own worst case for the benchmark
# (MiniWoB 15 + 2 x 3 s a step; WebArena's reset 90 + 3 x 3 s)
POOL_STEP_TIMEOUT_S = {"miniwob": 60.0, "webarena-lite": 150.0}


def add_flags(group) -> None:
    """--benchmark, --judge-url and --judge-model on an argparse parser or group."""
    group.add_argument("--benchmark", choices=BENCHMARKS, default="miniwob",
                       help="miniwob: MiniWoB++ from local files; webarena-lite: WebArena's hosted sites (set the "
                            "WA_* variables), training on the 647 WebArena tasks outside WebArena-Lite, evaluation "
                            "on WebArena-Lite's 165 (benchmarks.py)")
    group.add_argument("--judge-url", default=None,
                       help=f"webarena-lite: the OpenAI-compatible endpoint of the LLM judge some tasks are graded by, "
                            f"e.g. a local vLLM server http://127.0.0.1:8000/v1 (default ${llm_judge.URL_VAR}); "
                            f"without one those tasks are skipped and counted")
    group.add_argument("--judge-model", default=None,
                       help=f"the judge's model name (default ${llm_judge.MODEL_VAR}, else the first the server lists)")


def configure(args, error) -> None:
    """Check what the chosen benchmark needs before anything starts: the sites' variables (webarena-lite),
    and the judge flags (llm_judge.configure). error(message): the parser's usage error."""
    if args.benchmark == "webarena-lite":
        try:
            webarena_lite.allowed_hosts()
        except ValueError as e:  # MissingSites, or a variable that is not a URL
            error(str(e))
    try:
        llm_judge.configure(args.judge_url, args.judge_model)
    except ValueError as e:
        error(f"--judge-url: {e}")


@dataclass
class Selection:
    """The tasks a run goes over, and those it leaves out because an LLM judge grades them and none is set."""
    tasks: list[str]
    skipped: list[str] = field(default_factory=list)

    def note(self) -> str:
        """One line saying what was skipped and why ('' when nothing was)."""
        if not self.skipped:
            return ""
        return (f"Skipped: {len(self.skipped)} task(s) graded by an LLM judge, none configured (--judge-url or "
                f"${llm_judge.URL_VAR}); neither successes nor failures: {', '.join(self.skipped)}")


def default_tasks(benchmark: str, split: str) -> list[str]:
    """A benchmark's tasks for `split` ('train' or 'eval'): MiniWoB's suite for both (its splits are its
    seeds), WebArena-Lite's training or test tasks."""
    if benchmark == "miniwob":
        return list(webenv.SUITE)
    return webarena_lite.train_tasks() if split == "train" else webarena_lite.test_tasks()


def select(benchmark: str, tasks: str | list[str] | None, split: str) -> Selection:
    """The tasks of a run: `tasks` (comma-separated names, or a list) or the benchmark's default for `split`,
    less, on WebArena, those an LLM judge grades when none is configured (Selection.skipped).
    Errors: ValueError naming unknown tasks, or tasks of another benchmark."""
    names = default_tasks(benchmark, split) if tasks is None else (
        [t for t in tasks.split(",") if t] if isinstance(tasks, str) else list(tasks))
    wrong = [t for t in names if webenv.benchmark_of(t) != benchmark]
    if wrong:
        raise ValueError(f"task(s) {wrong} are not {benchmark} tasks (--benchmark {benchmark})")
    unknown = []
    for t in names:
        try:
            webenv.task_name(t)
        except ValueError:
            unknown.append(t)
    if unknown:
        known = "known MiniWoB tasks include " + ", ".join(webenv.SUITE) if benchmark == "miniwob" else \
            "WebArena tasks are webarenalite.<id> (the 165 test tasks) and webarena.<id> (the 647 training tasks)"
        raise ValueError(f"unknown task(s) {unknown}; {known}")
    if benchmark == "miniwob" or llm_judge.configured():
        return Selection(names)
    judged = [t for t in names if webarena_lite.needs_judge(t)]
    return Selection([t for t in names if t not in judged], judged)


def eval_seeds(benchmark: str, n: int) -> list[int]:
    """The evaluation seeds of a benchmark: MiniWoB's first n, WebArena's one ([0]: a task config is its
    own seed). Errors: ValueError for WebArena with n != 1, and as env.eval_seeds."""
    if benchmark == "miniwob":
        return webenv.eval_seeds(n)
    if n != 1:
        raise ValueError(f"a WebArena task has one page, its config: evaluate it once (--seeds 1), not {n} times")
    return [0]


def prompt_defaults(benchmark: str) -> dict | None:
    """The prompt defaults that replace checkpoint.PROMPT_DEFAULTS' for a benchmark (None: those)."""
    return WEB_PROMPT_DEFAULTS if benchmark == "webarena-lite" else None
