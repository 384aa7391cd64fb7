"""WebArena-Lite on hosted WebArena sites, through BrowserGym's own task classes and evaluators
(browsergym-webarenalite and browsergym-webarena 0.14.3, libwebarena 0.0.4).

    export WA_SHOPPING=http://node:7770 WA_SHOPPING_ADMIN=http://node:7780/admin WA_REDDIT=http://node:9999 \
           WA_GITLAB=http://node:8023 WA_WIKIPEDIA="http://node:8888/wikipedia_en_all_maxi_2022-05/A/User:The_other_Kiwix_guy/Landing" \
           WA_MAP=http://node:3000 WA_HOMEPAGE=http://node:4399
    import webarena_lite as wa
    wa.test_tasks()                   # WebArena-Lite's 165 tasks: ['webarenalite.4', 'webarenalite.7', ...]
    wa.train_tasks()                  # the 647 other WebArena tasks: ['webarena.0', 'webarena.1', ...]
    wa.site_urls()                    # {'WA_SHOPPING': 'http://node:7770', ...}, or MissingSites naming what to set
    wa.needs_judge('webarenalite.7')  # whether its evaluator asks an LLM judge (llm_judge.py)
    task = wa.entrypoint('webarenalite.4')(seed=0)   # BrowserGym's WebArenaLiteTask, for browser.py

(The file is not called webarena.py: that would hide libwebarena's own `webarena` package.)

Sites. The seven variables BrowserGym reads (browsergym.webarena.instance.ENV_VARS, with its WA_ prefix)
name the sites; site_urls raises MissingSites, naming each one missing, before any browser starts. The
request router lets a page reach exactly the hosts they name, on any port (WebArena's map loads tiles
and routes from other ports of its host), and nothing else: other hosts and file:// are refused
(browser.web_url_allowed).

Splits. The 165 WebArena-Lite tasks (BrowserGym's webarenalite.<WebArena id>, with WebArena-Lite's
corrected configs and evaluators) are the test set, never trained on by default. Training uses the 647
WebArena tasks outside them (webarena.<id>, WebArena's own configs and evaluators), disjoint from the test
set, as WebAgent-R1 does: the sites are the same, the tasks are not. (VisualAgentBench's synthetic
WebArena-Lite training trajectories are demonstrations, not task configs with evaluators: they would be
BC data, which train.py --mode bc takes in demos.jsonl form.) Seeds: a task config is its own seed. A
WebArena task has exactly one config, so the seed only seeds BrowserGym's choice among one: every seed of
a task is the same episode, evaluation runs each task once (seed 0), and training draws seeds as usual,
to no effect.

Loading. BrowserGym's packages download nltk's punkt_tab from the internet when imported, and register
every task with gymnasium; libwebarena's webarena.llms imports the OpenAI SDK and a TGI client. webdream
fetches nothing at run time and needs neither client: load() imports BrowserGym's task and evaluator
modules without running those package initialisers (their packages are put in sys.modules unexecuted),
gives libwebarena's graders llm_judge.chat_completion as their transport (the grading prompts stay the
benchmark's own), and, where nltk's punkt_tab is not installed, gives the evaluators' word_tokenize a
data-free stand-in: sentences split at . ! ? followed by a space, then NLTK's own word tokenizer (it
matters for the 4 tasks whose single reference answer is one character, such as '0').

Tasks that need a judge (needs_judge: a fuzzy_match in their answer or page checks) raise JudgeRequired
when built without one: benchmarks.select leaves them out, and counts them, first.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
import threading
import urllib.parse
import warnings

import llm_judge

# The sites, as BrowserGym names them (browsergym.webarena.instance.ENV_VARS, with the WA_ prefix it adds)
SITE_VARS = ("WA_SHOPPING", "WA_SHOPPING_ADMIN", "WA_REDDIT", "WA_GITLAB", "WA_WIKIPEDIA", "WA_MAP", "WA_HOMEPAGE")
TEST_PREFIX, TRAIN_PREFIX = "webarenalite.", "webarena."  # BrowserGym's gym ids, less "browsergym/"

_lock = threading.Lock()
_loaded: dict = {}     # what load() imported: the task classes
_custom: dict = {}     # registered task configs: name -> config (register())


class MissingSites(ValueError):
    """Site variables are unset; the message names each one and what it is for."""


class JudgeRequired(RuntimeError):
    """The task's evaluator asks an LLM judge and none is configured (llm_judge.configure)."""


def site_urls(environ=None) -> dict[str, str]:
    """{variable: URL} for the seven WA_* variables. Errors: MissingSites naming every one that is unset
    or empty, with an example of each."""
    environ = os.environ if environ is None else environ
    missing = [v for v in SITE_VARS if not environ.get(v, "").strip()]
    if missing:
        which = (f"set {', '.join(missing)}" if len(missing) == len(SITE_VARS) else
                 f"set {', '.join(missing)} (all of {', '.join(SITE_VARS)} are needed)")
        raise MissingSites(
            f"WebArena-Lite needs the address of each WebArena site: {which}, "
            f"e.g. export WA_SHOPPING=http://gpu-node:7770 "
            f"WA_SHOPPING_ADMIN=http://gpu-node:7780/admin WA_REDDIT=http://gpu-node:9999 "
            f"WA_GITLAB=http://gpu-node:8023 WA_WIKIPEDIA=http://gpu-node:8888/... WA_MAP=http://gpu-node:3000 "
            f"WA_HOMEPAGE=http://gpu-node:4399 (docs/webarena.md)")
    return {v: environ[v].strip().rstrip("/") for v in SITE_VARS}


def allowed_hosts(environ=None) -> frozenset[str]:
    """The host names the WA_* variables name (lower case): the only hosts a page may reach.
    Errors: MissingSites; ValueError for a variable that is not an http(s) URL."""
    hosts = set()
    for var, url in site_urls(environ).items():
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{var}={url!r} is not an http(s) URL such as http://gpu-node:7770")
        hosts.add(parts.hostname.lower())
    return frozenset(hosts)


# ----------------------------------------------------------------------------------------------
# Task configs (read from the installed packages' JSON, without importing them)


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{name} is not installed: `make setup` installs browsergym-webarena, "
                          f"browsergym-webarenalite and libwebarena (requirements-nodeps.txt)")
    return list(spec.submodule_search_locations)[0]


@functools.lru_cache(maxsize=None)
def _configs(prefix: str) -> dict[str, dict]:
    """name -> raw config (site placeholders such as __SHOPPING__ unreplaced) of every task of a prefix."""
    if prefix == TEST_PREFIX:
        path = os.path.join(_package_dir("browsergym.webarenalite"), "test_webarena_lite.raw.json")
        key = "old_task_id"  # WebArena-Lite renumbers its tasks; BrowserGym names them by WebArena's id
    else:
        path = os.path.join(_package_dir("webarena"), "test.raw.json")
        key = "task_id"
    with open(path) as f:
        return {f"{prefix}{c[key]}": c for c in json.load(f)}


def test_tasks() -> list[str]:
    """WebArena-Lite's 165 tasks, the evaluation set: 'webarenalite.<WebArena id>', by id."""
    return sorted(_configs(TEST_PREFIX), key=lambda n: int(n.rsplit(".", 1)[1]))


def train_tasks() -> list[str]:
    """The 647 WebArena tasks outside WebArena-Lite, the training set: 'webarena.<id>', by id."""
    held_out = {n[len(TEST_PREFIX):] for n in _configs(TEST_PREFIX)}
    return [n for n in sorted(_configs(TRAIN_PREFIX), key=lambda n: int(n.rsplit(".", 1)[1]))
            if n[len(TRAIN_PREFIX):] not in held_out]


def is_task_name(name: str) -> bool:
    """Whether `name` is a WebArena task name ('webarenalite.N', 'webarena.N' or a registered one),
    with or without BrowserGym's 'browsergym/' prefix."""
    name = name.removeprefix("browsergym/")
    return name in _custom or name.startswith((TEST_PREFIX, TRAIN_PREFIX))


def config(name: str) -> dict:
    """The task's raw config (placeholders such as __SHOPPING__ unreplaced; a registered config as given).
    Errors: ValueError naming the splits for an unknown task."""
    name = name.removeprefix("browsergym/")
    if name in _custom:
        return _custom[name]
    for prefix in (TEST_PREFIX, TRAIN_PREFIX):
        if name.startswith(prefix) and name in _configs(prefix):
            return _configs(prefix)[name]
    raise ValueError(f"unknown WebArena task {name!r}: the tasks are webarenalite.<id> (WebArena-Lite's 165, "
                     f"webarena_lite.test_tasks()) and webarena.<id> (the 647 others, webarena_lite.train_tasks())")


def needs_judge(name: str) -> bool:
    """Whether the task's evaluator asks an LLM judge: a fuzzy_match among its reference answers (an
    'N/A' one too: a wrong N/A reason is judged) or among its page checks."""
    ev = config(name)["eval"]
    answers = ev.get("reference_answers") or {}
    pages = ev.get("program_html") or []
    return ("string_match" in ev["eval_types"] and "fuzzy_match" in answers) or (
        "program_html" in ev["eval_types"] and any("fuzzy_match" in p["required_contents"] for p in pages))


def register(name: str, task_config: dict) -> None:
    """Add a task from a WebArena-format config (intent, start_url, sites, geolocation, eval, ...; URLs may
    use the __SHOPPING__-style placeholders), run by WebArena-Lite's task class and evaluators when the
    name starts with 'webarenalite.', by WebArena's otherwise ('webarena.'). For this process only (tests,
    or your own tasks on the same sites). Errors: ValueError for a name with neither prefix."""
    if not name.startswith((TEST_PREFIX, TRAIN_PREFIX)):
        raise ValueError(f"a registered WebArena task's name starts with {TEST_PREFIX!r} or {TRAIN_PREFIX!r}, got {name!r}")
    _custom[name] = json.loads(json.dumps(task_config))


# ----------------------------------------------------------------------------------------------
# BrowserGym's task classes and libwebarena's evaluators, loaded without their packages' side effects


def _unexecuted_package(name: str) -> None:
    """Put package `name` in sys.modules without running its __init__ (its submodules import as usual)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        _package_dir(name)  # raises the install hint
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _stub_module(name: str, **attrs) -> None:
    if name not in sys.modules:
        module = type(sys)(name)
        module.__path__ = []  # a package with nothing else in it
        module.__dict__.update(attrs)
        sys.modules[name] = module


def _word_tokenize_fallback(text: str) -> list[str]:
    """nltk.word_tokenize without its punkt_tab data: sentences split after . ! ? and a space, then NLTK's
    data-free word tokenizer on each."""
    from nltk.tokenize import NLTKWordTokenizer

    tok = NLTKWordTokenizer()
    return [w for s in re.split(r"(?<=[.!?])\s+", text) if s for w in tok.tokenize(s)]


def load() -> dict:
    """Import BrowserGym's WebArena task classes and libwebarena's evaluators once (see the module
    docstring): {"test": WebArenaLiteTask, "train": GenericWebArenaTask}. Sets the unprefixed variables
    libwebarena reads (SHOPPING, ...) from the WA_* ones, as BrowserGym's WebArenaInstance does; libwebarena
    reads them once, on import, so the sites of a process are those of its first load.
    Errors: MissingSites; ImportError when the packages are not installed."""
    with _lock:
        if _loaded:
            return _loaded
        for var, url in site_urls().items():
            os.environ[var[3:]] = url
        llm_judge.direct_loopback()  # the evaluators' REST calls (requests) to sites on this machine skip http_proxy
        for pkg in ("browsergym.webarena", "browsergym.webarenalite"):  # their __init__ downloads punkt_tab
            _unexecuted_package(pkg)
        _package_dir("webarena")
        import webarena  # noqa: F401  (libwebarena: an empty __init__)

        _stub_module("webarena.llms")  # its __init__ imports the TGI client; the graders need openai_utils only
        _stub_module("webarena.llms.providers")
        _stub_module("webarena.llms.providers.openai_utils",
                     generate_from_openai_chat_completion=llm_judge.chat_completion)
        with warnings.catch_warnings():  # beartype 0.12's PEP 585 deprecation notices, on import
            warnings.simplefilter("ignore")
            from browsergym.webarena.task import GenericWebArenaTask
            from browsergym.webarenalite.task import WebArenaLiteTask
            import browsergym.webarenalite.evaluators as lite_evaluators
            import browsergym.webarenalite.helper_functions as lite_helpers
            import webarena.evaluation_harness.evaluators as wa_evaluators
            import webarena.evaluation_harness.helper_functions as wa_helpers
        for helpers in (lite_helpers, wa_helpers):  # (also when webarena.llms was imported before us)
            helpers.generate_from_openai_chat_completion = llm_judge.chat_completion
        try:
            import nltk

            nltk.data.find("tokenizers/punkt_tab")
        except LookupError:
            for evaluators in (lite_evaluators, wa_evaluators):
                evaluators.word_tokenize = _word_tokenize_fallback
        _loaded.update(test=WebArenaLiteTask, train=GenericWebArenaTask)
        return _loaded


def _substitute(task_config: dict, urls: dict[str, str]) -> dict:
    """The config with its site placeholders replaced by the sites' URLs, as BrowserGym's task classes do
    (`urls`: their WebArenaInstance.urls, {"shopping": ..., "shopping_admin": ..., ...})."""
    text = json.dumps(task_config)
    for key in ("shopping_admin", "shopping", "gitlab", "reddit", "wikipedia", "map"):
        text = text.replace(f"__{key.upper()}__", urls[key])
    return json.loads(text)


def make_task(name: str, seed: int):
    """BrowserGym's task object for `name` (WebArenaLiteTask for 'webarenalite.*', GenericWebArenaTask for
    'webarena.*'), built as BrowserGym builds it; a registered task runs its own config in that class.
    Errors: JudgeRequired (the task needs an LLM judge and none is configured), MissingSites, ValueError."""
    name = name.removeprefix("browsergym/")
    raw = config(name)
    if needs_judge(name) and not llm_judge.configured():
        raise JudgeRequired(f"{name} is graded by an LLM judge and none is configured: set --judge-url or "
                            f"${llm_judge.URL_VAR}")
    classes = load()
    test = name.startswith(TEST_PREFIX)
    cls = classes["test" if test else "train"]
    if name not in _custom:
        return cls(seed=seed, task_id=int(name.rsplit(".", 1)[1]))
    any_id = int((test_tasks() if test else train_tasks())[0].rsplit(".", 1)[1])
    task = cls(seed=seed, task_id=any_id)  # the class as built for a real task, then the config replaced
    task.task_configs = [_substitute(raw, task.webarena_instance.urls)]
    return task


def entrypoint(name: str):
    """A task factory for browser.PersistentBrowserEnv: entrypoint(name)(seed=0) -> make_task(name, 0).
    Errors (when called): as make_task."""
    config(name)  # an unknown name fails now
    return functools.partial(make_task, name.removeprefix("browsergym/"))
