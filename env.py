"""A MiniWoB++ task (or a WebArena-Lite one) as a reinforcement-learning environment, over BrowserGym
and headless Chromium.

    from env import make_env, SUITE, eval_seeds
    env = make_env("click-button")
    obs = env.reset(seed=eval_seeds(1)[0])
    print(obs.text)                       # goal, URL, accessibility tree, last error
    obs, reward, done, info = env.step("<think>...</think> click('13')")
    env.close()

    python env.py --task click-link --seed 3        # print a page's observation, time resets/steps
    env = make_env("webarenalite.4", max_steps=15)  # WebArena-Lite: its sites from WA_* (webarena_lite.py)

A task name decides the benchmark (benchmark_of): MiniWoB's names ('click-button') or WebArena's
('webarenalite.<id>', 'webarena.<id>'). On WebArena the grammar is actions.WEB_ACTIONS (navigation,
tabs, the keyboard, report_infeasible), the router lets pages reach only the sites' hosts
(sandbox.web_url_allowed), tabs are followed and listed (Obs.tabs), and the task's evaluators run once,
when the episode ends: after send_msg_to_user (the answer) or report_infeasible, or at the step budget
(WebArena's rule: the final page counts, with no answer). Its time bounds are WEB_*_TIMEOUT_S.

This file is what a user imports: the task registry and seeds (TASKS, SUITE, train_seeds, eval_seeds,
is_success, from tasks.py), the observation (Obs) and the environment (WebEnv, make_env). Its parts
live beside it: tasks.py (which tasks, which seeds, what counts as success), actions.py (the action
grammar, parse_action), axtree.py (the tree text), browser.py (the Chromium session and its network
sandbox), watchdog.py (time bounds, by killing processes).

The environment's contract:
- one Chromium per WebEnv, kept across episodes: a reset opens a new page, not a new browser, and a
  step takes about 0.21 s (browser.py lists what differs from BrowserGym); screenshots on request:
  `WebEnv(task, screenshots=True)` puts a small JPEG of the task area on Obs.screenshot after every
  reset and step (for report.py; about 40 ms each);
- model text is parsed by a strict grammar (actions.parse_action) with `ast`, never executed; a
  parse error costs a step and is shown in the next observation;
- only the MiniWoB html folder loads (file://), every other request aborts; no host name resolves
  and WebRTC sends no UDP;
- tabs: a MiniWoB task lives in one page. A tab the page opens (window.open, a target=_blank link,
  to any URL) is closed right after the action, unobserved; the task page stays the observed page,
  the episode goes on, and the next observation says so ("Tab: the page opened a new tab; it was
  closed, and this page stays.");
- native dialogs (alert, confirm, prompt) are accepted at once, as by a user who clicks OK (a prompt
  with its default text); the next observation says which dialog, its message and what was done
  ("Dialog: the page showed a confirm 'Really delete?'; it was accepted (OK).");
- text from the page (goal, URL, names, values, errors, dialog messages) is valid Unicode: a lone
  surrogate is shown as U+FFFD, as the browser draws it (axtree.clean), and names and values are
  written as the page shows them (axtree.quote);
- reward 1 only on full credit (MiniWoB pays partial credit for some wrong answers);
- a browser fault ends the episode with info["env_error"] = True and never raises from step();
  every step, reset and close is bounded in wall-clock time (a watchdog kills a page that stops
  answering; see WebEnv), and a page that navigates or reloads under the observation is observed again.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import watchdog
import llm_judge
import webarena_lite
from actions import ACTION_SETS, ActionParseError, parse_action, split_action
from axtree import flatten_axtree, format_hidden
from browser import MINIWOB_HTML_DIR, PersistentBrowserEnv
from page_actions import ACTION_TIMEOUT_MS
from page_errors import short_error
# the task registry and seeds, re-exported: env is what a user imports (tasks.py holds them)
from tasks import (EVAL_SEEDS, SUITE, TASKS, TRAIN_SEEDS, benchmark_of, eval_seeds, is_success,  # noqa: F401
                   task_name, train_seeds)

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# Observation

MAX_EVENTS = 5  # event lines an observation shows (a page that alerts in a loop would fill the prompt)


@dataclass
class Obs:
    """What the agent sees at one step. `text` is the string that goes into the prompt."""

    goal: str
    url: str
    axtree: str  # flattened accessibility tree, one node a line: "[13] button 'Submit'"
    error: str = ""  # the last action's error (parse errors included), "" if none
    step: int = 0
    env_error: bool = False  # the browser failed (reset could not load the page): no step will follow
    # JPEG of the task area (WebEnv(screenshots=True) only; None otherwise or if the capture failed).
    # For people (report.py), never for the prompt: `text` does not use it.
    screenshot: bytes | None = field(default=None, repr=False, compare=False)
    # what the page did beside the action, one line each (browser.py writes them): "Dialog: the page
    # showed a confirm 'Really delete?'; it was accepted (OK).", "Tab: the page opened a new tab; ..."
    events: tuple[str, ...] = ()
    # general sites with several tabs open: one line per tab, shown after the URL
    # ("Tab 1 (active): 'Results' http://shop/?q=bag"); MiniWoB has none
    tabs: tuple[str, ...] = ()
    # the page's content without a layout box (display: none: a closed tab's panel, a collapsed section),
    # tree-like lines (axtree.format_hidden); WebEnv(hidden=True) only, for the world model (world_model.py),
    # never for the policy: `text` does not use it
    hidden: str = field(default="", repr=False)

    @property
    def text(self) -> str:
        return self.render()

    def render(self) -> str:
        """Goal, URL, the open tabs (several only), tree, the page's events (at most MAX_EVENTS lines, then
        a count), then the last action's error if any."""
        s = f"Goal: {self.goal}\nURL: {self.url}\n" + "".join(f"{t}\n" for t in self.tabs) + self.axtree
        for line in self.events[:MAX_EVENTS]:
            s += f"\n{line}"
        if len(self.events) > MAX_EVENTS:
            s += f"\n... ({len(self.events) - MAX_EVENTS} more events)"
        if self.error:
            s += f"\nLast action error: {self.error}"
        return s


def short_url(url: str) -> str:
    """Drop the machine-specific path of MiniWoB pages: 'file:///.../miniwob/click-button.html' ->
    'miniwob/click-button.html' (fewer tokens, same on every machine)."""
    prefix = "file://" + MINIWOB_HTML_DIR + "/"
    return url[len(prefix):] if url.startswith(prefix) else url


# ----------------------------------------------------------------------------------------------
# The environment

# Time bounds, in seconds (WebEnv's docstring says how they combine).
STEP_TIMEOUT_S = 15.0    # one step(); past it the env's renderer is killed and the episode is env_error
RESET_TIMEOUT_S = 30.0   # one reset(), every retry included
CLOSE_TIMEOUT_S = 10.0   # one close()
# WebEnv(screenshots=True): MiniWoB's task area (#wrap, 160x210 px at the top-left of the page) as a JPEG
SCREENSHOT_CLIP = {"x": 0, "y": 0, "width": 160, "height": 210}
SCREENSHOT_QUALITY = 60
SCREENSHOT_TIMEOUT_MS = 2000
# WebArena: its pages are real sites (a reset logs in; the evaluators of the last step may load pages
# and wait 3 s each), so its bounds are wider; rollout.EnvPool's backstop must exceed them (benchmarks.py)
WEB_STEP_TIMEOUT_S = 60.0
WEB_RESET_TIMEOUT_S = 90.0
WEB_TIMEOUT_MS = 10_000     # Playwright's own waits (BrowserGym's WebArena tasks use 10 s)
WEB_TREE_LINES = 500        # tree lines kept (a prompt budget cuts the rest; WebArena pages run to thousands)
ENDING_ACTIONS = ("send_msg_to_user", "report_infeasible")  # on WebArena they end the episode: evaluate then


_ENV_COUNTER = iter(range(10**9))


class WebEnv:
    """One MiniWoB++ task in real headless Chromium, stepped with the model's raw text.

    reset(seed) -> Obs; step(text) -> (Obs, reward, done, info) with
    info = {"action": canonical str or None, "error": str, "success": bool,
            "env_error": bool, "raw_reward": float, "truncated": bool}.
    reward is 1.0 only on full success. done: the task ended or `max_steps` actions were taken
    (truncated, reward 0). A parse error costs a step, runs nothing, and is shown in the next Obs.
    The browser is launched once per WebEnv and reused across episodes; many WebEnvs can live in
    one thread (Playwright's sync API allows one thread per instance, so threads each get their own).
    screenshots=True: every Obs from reset/step carries `screenshot`, a JPEG (~3-6 kB) of MiniWoB's
    160x210 task area (SCREENSHOT_CLIP), or None if the capture failed (logged; the step goes on).
    hidden=True: every Obs also carries `hidden`, the page's text without a layout box (axtree.HIDDEN_JS,
    7-40 ms a page measured on MiniWoB), which the world model reads; transitions.collect_transitions sets it.
    action_timeout_ms: how long an action waits for its element (default page_actions.ACTION_TIMEOUT_MS, 3 s).

    What a step does when the page misbehaves (tests/test_env_faults.py feeds each case):
    - an action on an element that is gone or hidden: an error the agent sees in Obs.error
      ("Could not find element with bid", "Timeout 3000ms exceeded"); the episode goes on, whatever
      words the error quotes from the page (a covering element that says "crashed" is not a fault);
    - the page navigates or reloads while it is being validated/observed: the observation is taken
      again on the new document. A task page that navigated elsewhere or reloaded ends the episode
      with reward 0 and info["error"] saying so (the page left the task, as in BrowserGym; not env_error);
      a URL changed in the same document (a fragment link such as search-engine's href='#' results,
      pushState) does not: the task scores the page (tests/test_faults3_pages.py);
    - a request outside the MiniWoB folder (image, script, frame, fetch, popup, navigation) is aborted
      and listed in `self._bg.blocked`; popups and tabs are closed after each action
      (`self._bg.popups_closed`) and the episode goes on in the task's page (Obs.events says so);
    - a native dialog is accepted (Obs.events says which, with its message); name resolution and WebRTC UDP are off in Chromium
      (WebSockets, which the router never sees, cannot connect);
    - an infrastructure fault (the browser or its renderer died, the page stopped answering, a page
      too large to observe: more than browser.MAX_PAGE_ELEMENTS elements; known by Playwright's error
      type and the page's state, never by an error's words) ends the episode with done,
      info["env_error"] = True, reward 0. step() never raises for any of these.
    After a fault the context is closed at once (a runaway page stops using CPU and memory); the
    next reset opens a fresh context in the same browser, or relaunches it if the browser died.

    Time bounds. Playwright waits on its own for at most: page_actions.ACTION_TIMEOUT_MS (3 s) for an
    action's element (BrowserGym's actions; their own 500 ms failed clicks under load), `timeout_ms`
    (5 s) for anything else that takes a timeout, max(timeout_ms, 10 s) for a navigation, 3 s per page
    and frame for loading. JavaScript evaluation and DevTools calls (validation, bid marking, the
    accessibility tree) have no timeout: a page whose script never yields blocks them forever.
    So a watchdog thread bounds each call in wall-clock time. A step() still running after
    `step_timeout` s (15) gets this env's renderer processes SIGKILLed; the page's crash handler closes
    the page, which fails the blocked call at once. If the call still runs `kill_grace` s (3) later (a
    DevTools call in flight does not notice the renderer's death), the whole browser is killed. The
    faulty context is then closed under a bound of its own (kill_grace, escalating the same way).
    Worst case, step() returns after step_timeout + 2 * kill_grace + a fraction of a second (21 s by
    default). reset(): `reset_timeout` s (30) for all attempts together, each attempt getting an equal
    share of what is left (a reused page that hangs costs its share, then a fresh context gets the
    rest); worst case reset_timeout + (retries + 1) * kill_grace (39 s). close(): CLOSE_TIMEOUT_S (10).
    All stay under rollout.py's 60 s backstop, so the env reports its own env_error first.
    Measured with the defaults (2 busy cores; tests/test_env_faults.py checks the same paths with
    smaller bounds): a page stuck in a DOM-growing loop, env_error after 15.1 s (renderer kill; the next
    reset, in a fresh context of the same browser, 0.65 s); the same with a call the renderer kill
    cannot end, 18.1 s (browser kill; next reset relaunches, 1.1 s); a renderer that dies mid-step,
    0.65 s; a DOM growing past browser.MAX_PAGE_ELEMENTS, 0.3 s; a reset whose reused page hangs on unload,
    10.7 s (and a normal episode).
    """

    def __init__(self, task: str, max_steps: int = 10, headless: bool = True, timeout_ms: int | None = None,
                 pre_observation_delay: float = 0.0, max_tree_lines: int | None = None,
                 step_timeout: float | None = None, reset_timeout: float | None = None,
                 kill_grace: float = watchdog.KILL_GRACE_S, screenshots: bool = False, hidden: bool = False,
                 action_timeout_ms: int | None = None):
        self.benchmark = benchmark_of(task)
        self.web = self.benchmark != "miniwob"
        task = task_name(task)
        # defaults: MiniWoB's (5 s, 200 lines, 15 s, 30 s), or WebArena's wider ones
        timeout_ms = timeout_ms or (WEB_TIMEOUT_MS if self.web else 5000)
        max_tree_lines = max_tree_lines or (WEB_TREE_LINES if self.web else 200)
        step_timeout = step_timeout or (WEB_STEP_TIMEOUT_S if self.web else STEP_TIMEOUT_S)
        reset_timeout = reset_timeout or (WEB_RESET_TIMEOUT_S if self.web else RESET_TIMEOUT_S)
        if not (step_timeout > 0 and reset_timeout > 0 and kill_grace > 0):
            raise ValueError(f"step_timeout, reset_timeout and kill_grace must be > 0, "
                             f"got {step_timeout}, {reset_timeout}, {kill_grace}")
        self.task = task
        self.max_steps = max_steps
        self.max_tree_lines = max_tree_lines
        self.screenshots = screenshots
        self.step_timeout, self.reset_timeout, self.kill_grace = step_timeout, reset_timeout, kill_grace
        self.marker = f"{os.getpid()}-{next(_ENV_COUNTER)}"
        self.actions = ACTION_SETS["web" if self.web else "miniwob"]  # the grammar parse_action takes
        self._bg = PersistentBrowserEnv(_entrypoint(task), headless=headless, timeout_ms=timeout_ms,
                                         pre_observation_delay=pre_observation_delay, marker=self.marker,
                                         hosts=webarena_lite.allowed_hosts() if self.web else None,
                                         observe_hidden=hidden,
                                         action_timeout_ms=action_timeout_ms or ACTION_TIMEOUT_MS)
        self.seed: int | None = None
        self.goal = ""
        self.t = 0
        self.done = True
        # what the next reset must repair first: None, "context" (open a fresh context) or "browser" (relaunch)
        self._broken: str | None = None

    @property
    def hidden(self) -> bool:
        """Whether observations carry Obs.hidden; settable between episodes (EnvPool.set_env_attr)."""
        return self._bg.observe_hidden

    @hidden.setter
    def hidden(self, on: bool) -> None:
        self._bg.observe_hidden = bool(on)

    # -- helpers
    def _obs(self, bg_obs: dict, error: str = "") -> Obs:
        return Obs(goal=self.goal, url=short_url(bg_obs["url"]),
                   axtree=flatten_axtree(bg_obs["axtree_object"], self.max_tree_lines),
                   error=error, step=self.t, events=tuple(bg_obs.get("events", ())), tabs=tuple(bg_obs.get("tabs", ())),
                   hidden=format_hidden(bg_obs.get("hidden", [])))

    def _screenshot(self) -> bytes | None:
        """The task area as a small JPEG (Obs.screenshot), or None: screenshots off, or the capture
        failed (logged; a failed capture never fails the step). Runs inside the step's watchdog guard:
        Playwright's own timeout ends a slow capture; only a page that hangs the renderer trips the guard."""
        if not self.screenshots:
            return None
        try:  # MiniWoB's task area; a general site's viewport
            return self._bg.page.screenshot(type="jpeg", quality=SCREENSHOT_QUALITY,
                                            clip=None if self.web else SCREENSHOT_CLIP,
                                            timeout=min(self._bg.timeout_ms, SCREENSHOT_TIMEOUT_MS))
        except Exception as e:
            logger.warning("screenshot(%s, seed=%s, step %d) failed: %s", self.task, self.seed, self.t,
                           short_error(e, 120))
            return None

    def _guard(self, seconds: float):
        return watchdog.guard(self.marker, seconds, self.kill_grace)

    def _repair(self) -> None:
        if self._broken == "browser":
            self._bg.close()
        elif self._broken == "context":
            self._bg.drop_context()
        self._broken = None

    @property
    def needs_launch(self) -> bool:
        """Whether the next reset starts a Chromium (first use, or after the browser died): rollout.py
        lets only a few environments launch at once."""
        return self._broken == "browser" or not self._bg.browser_alive()

    def _after_fault(self, killed_browser: bool) -> None:
        """Close the faulty context now, under a bound of its own; decide what the next reset repairs."""
        with self._guard(self.kill_grace) as g:
            self._bg.drop_context()
        dead = killed_browser or g.fired >= 2 or self._broken == "browser" or not self._bg.browser_alive()
        self._broken = "browser" if dead else None  # (a kill() from another thread stays marked)

    def reset(self, seed: int, retries: int = 2, task: str | None = None) -> Obs:
        """Start an episode on page `seed` (of `task`, when given: the browser is kept, so one WebEnv
        serves any task). A browser fault retries in a fresh context, then in a relaunched browser,
        within `reset_timeout` seconds for all attempts; if every try fails, the returned Obs has
        env_error=True and carries the error, and the next step() ends the episode with
        info["env_error"] = True."""
        if task is not None and task != self.task:
            if benchmark_of(task) != self.benchmark:
                raise ValueError(f"this WebEnv runs {self.benchmark} tasks, not {task!r}")
            task = task_name(task)
            self.task = task
            self._bg.task_entrypoint = _entrypoint(task)
        self.seed, self.t, self.done = seed, 0, False
        if self.web and webarena_lite.needs_judge(self.task) and not llm_judge.configured():
            self._broken, self.goal = self._broken or "context", ""  # refused before any browser work: never scored
            return Obs(goal="", url="", axtree="", step=0, env_error=True,
                       error=f"environment error: {self.task} is graded by an LLM judge and none is configured "
                             f"(--judge-url or ${llm_judge.URL_VAR})")
        deadline = time.monotonic() + self.reset_timeout
        err = ""
        for attempt in range(retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                err = err or f"reset took longer than {self.reset_timeout:g} s"
                break
            fault = None
            # each remaining attempt gets an equal share of what is left: a page that hangs the first
            # attempt (the reused page never finishes navigating) leaves time for a fresh context
            with self._guard(left / (retries + 1 - attempt)) as g:
                try:
                    self._repair()
                    bg_obs, _ = self._bg.reset(seed=seed)
                    self.goal = bg_obs["goal"]
                    obs = self._obs(bg_obs)
                    obs.screenshot = self._screenshot()
                except Exception as e:  # any browser/Playwright fault
                    fault = e
            if g.fired and fault is None:
                fault = TimeoutError(f"reset took longer than {self.reset_timeout:g} s; the page was killed")
            if fault is None:
                return obs
            logger.warning("reset(%s, seed=%s) failed (attempt %d): %s", self.task, seed, attempt, fault)
            err = short_error(fault)
            # first a fresh context in the same browser, then a fresh browser
            self._broken = "context" if attempt == 0 and g.fired < 2 and self._bg.browser_alive() else "browser"
        self._broken = "browser"
        self.goal = ""
        return Obs(goal="", url="", axtree="", error=f"environment error: {err}", step=0, env_error=True)

    def step(self, text: str) -> tuple[Obs, float, bool, dict]:
        """Parse the model's text, act, and observe. Never raises for browser or page faults, and
        returns within the time bound in the class docstring."""
        info = {"action": None, "error": "", "success": False, "env_error": False,
                "raw_reward": 0.0, "truncated": False}
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        self.t += 1
        if self._broken:
            self.done = True
            info.update(env_error=True, error="environment error during reset")
            return Obs(self.goal, "", "", info["error"], self.t, env_error=True), 0.0, True, info
        try:
            action = parse_action(text, self.actions)
            parse_error = ""
        except ActionParseError as e:
            action, parse_error = None, f"ActionParseError: {e}"
        info["action"] = action
        # MiniWoB validates every step; WebArena's evaluators run once, when the episode ends
        evaluate = not self.web or self.t >= self.max_steps or (
            action is not None and split_action(action)[0] in ENDING_ACTIONS)
        fault = None
        with self._guard(self.step_timeout) as g:
            try:
                bg_obs, reward, terminated, _, bg_info = self._bg.act(action, error=parse_error, validate=evaluate)
                obs = self._obs(bg_obs, error=bg_obs["last_action_error"])
                obs.screenshot = self._screenshot()
            except Exception as e:  # browser fault, page too large, or a tree too deep to flatten
                fault = e
        if g.fired:  # past the bound: even a call that then returned saw a killed renderer
            fault = TimeoutError(f"the page did not answer within {self.step_timeout:g} s; "
                                 f"its {'browser' if g.fired >= 2 else 'renderer'} was killed")
        elif fault is not None and self._bg.crashed:
            fault = RuntimeError("the page's renderer crashed")
        if fault is not None:  # end the episode; the context is replaced now, the browser if need be
            logger.warning("step(%s, seed=%s) failed: %s", self.task, self.seed, fault)
            self.done = True
            info.update(env_error=True, error=f"environment error: {short_error(fault)}")
            self._after_fault(killed_browser=g.fired >= 2)
            return Obs(self.goal, "", "", info["error"], self.t, env_error=True), 0.0, True, info
        task_info = bg_info.get("task_info", {})
        ended_by_page = "error" in task_info  # BrowserGym's validate(): wrong page or URL, or a reload
        if ended_by_page:
            terminated = True
        # MiniWoB's raw reward is in task_info; WebArena's evaluators return theirs (1.0 or 0.0)
        raw = float((reward if self.web else task_info.get("RAW_REWARD_GLOBAL")) or 0.0)
        success = bool(terminated) and is_success(raw)
        truncated = not terminated and self.t >= self.max_steps
        done = bool(terminated) or truncated
        self.done = done
        error = bg_obs["last_action_error"] or (f"episode ended: {task_info['error']}" if ended_by_page else "")
        info.update(error=error, success=success, raw_reward=raw, truncated=truncated)
        return obs, (1.0 if success else 0.0), done, info

    def kill(self) -> None:
        """SIGKILL this env's Chromium processes. Safe from any thread (close() is not: Playwright's
        sync objects belong to the thread that made them); a call blocked on the browser then fails."""
        watchdog.sigkill(watchdog.chromium_pids(self.marker))
        self._broken = "browser"

    def close(self) -> None:
        """Close the browser (within CLOSE_TIMEOUT_S; past it the browser is killed). Safe to call twice."""
        with self._guard(CLOSE_TIMEOUT_S):
            self._bg.close()
        self.done = True

    def chromium_rss_mb(self) -> float:
        """Memory of this env's Chromium processes (browser + renderers), in MiB: PSS where the system
        reports it, else RSS (watchdog.chromium_rss_mb)."""
        return watchdog.chromium_rss_mb(self.marker)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _entrypoint(task: str):
    """The BrowserGym task class (MiniWoB) or factory (WebArena) a task name runs."""
    return webarena_lite.entrypoint(task) if webarena_lite.is_task_name(task) else TASKS[task]


def make_env(task: str, **kw) -> WebEnv:
    """WebEnv(task, **kw). Errors: ValueError for an unknown task (the message lists valid names)."""
    return WebEnv(task, **kw)


if __name__ == "__main__":
    import argparse
    import statistics

    ap = argparse.ArgumentParser(description="Print a MiniWoB page's observation and time resets/steps.")
    ap.add_argument("--task", default="click-button", help="MiniWoB task name, e.g. click-link")
    ap.add_argument("--seed", type=int, default=0, help="page seed")
    ap.add_argument("--n", type=int, default=0, help="time this many resets and noop steps")
    a = ap.parse_args()
    env = make_env(a.task)
    obs = env.reset(a.seed)
    print(obs.text)
    print(f"({len(obs.text)} characters)")
    if a.n:
        tr, ts = [], []
        for i in range(a.n):
            t0 = time.time(); env.reset(a.seed + i); tr.append(time.time() - t0)
            t0 = time.time(); env.step("noop()"); ts.append(time.time() - t0)
        print(f"reset {statistics.mean(tr):.3f} s, step {statistics.mean(ts):.3f} s, "
              f"chromium RSS {env.chromium_rss_mb():.0f} MiB")
    env.close()
