"""A MiniWoB++ task as a reinforcement-learning environment, over BrowserGym and headless Chromium.

    from env import make_env, SUITE, eval_seeds
    env = make_env("click-button")
    obs = env.reset(seed=eval_seeds(1)[0])
    print(obs.text)                       # goal, URL, accessibility tree, last error
    obs, reward, done, info = env.step("<think>...</think> click('13')")
    env.close()

    python env.py --task click-link --seed 3        # print a page's observation, time resets/steps

What this file adds to BrowserGym (browsergym-core 0.14.3):
- one Chromium per WebEnv, kept across episodes; each reset only opens a new context and page
  (BrowserGym relaunches the browser on every reset: most of an episode's time, and defunct
  processes pile up);
- no second browser for the chat window (an in-memory stand-in), no screenshot or DOM snapshot,
  no slow_mo and no pre-observation sleep (0.21 s a step instead of 0.85 s); screenshots on request:
  `WebEnv(task, screenshots=True)` puts a small JPEG of the task area on Obs.screenshot after every
  reset and step (for report.py; about 40 ms each);
- a strict action grammar (actions.parse_action): model text is parsed with `ast`, never executed;
- every request is routed: only the MiniWoB html folder loads (file://), everything else aborts;
  no host name resolves and WebRTC sends no UDP (for what the router cannot see); popups are closed;
- reward 1 only on full credit (MiniWoB pays partial credit for some wrong answers);
- a browser fault ends the episode with info["env_error"] = True and never raises from step();
  every step, reset and close is bounded in wall-clock time (a watchdog kills a page that stops
  answering; see WebEnv), and a page that navigates or reloads under the observation is observed again.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import os
import signal
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

import playwright.sync_api

import miniwob as _miniwob_pkg

# BrowserGym's MiniWoB tasks read MINIWOB_URL when they are built: set it before anything else.
MINIWOB_HTML_DIR = os.path.join(os.path.dirname(os.path.abspath(_miniwob_pkg.__file__)), "html")
os.environ.setdefault("MINIWOB_URL", "file://" + os.path.join(MINIWOB_HTML_DIR, "miniwob") + "/")

from browsergym.core.action import functions as _bg_functions  # noqa: E402
from browsergym.core.action.highlevel import HighLevelActionSet  # noqa: E402
from browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE  # noqa: E402
from browsergym.core.env import BrowserEnv  # noqa: E402
from browsergym.core.observation import (  # noqa: E402
    MarkingError,
    _post_extract,
    _pre_extract,
    extract_merged_axtree,
)
from browsergym.miniwob import ALL_MINIWOB_TASKS  # noqa: E402

from actions import ACTIONS, ActionParseError, parse_action, split_action  # noqa: E402
from axtree import flatten_axtree  # noqa: E402

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# Tasks and seeds

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


# ----------------------------------------------------------------------------------------------
# Observation


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

    @property
    def text(self) -> str:
        return self.render()

    def render(self) -> str:
        """Goal, URL, tree, then the last action's error if any."""
        s = f"Goal: {self.goal}\nURL: {self.url}\n{self.axtree}"
        if self.error:
            s += f"\nLast action error: {self.error}"
        return s


def short_url(url: str) -> str:
    """Drop the machine-specific path of MiniWoB pages: 'file:///.../miniwob/click-button.html' ->
    'miniwob/click-button.html' (fewer tokens, same on every machine)."""
    prefix = "file://" + MINIWOB_HTML_DIR + "/"
    return url[len(prefix):] if url.startswith(prefix) else url


# ----------------------------------------------------------------------------------------------
# Browser


def chromium_path() -> str:
    return os.environ.get("WEBDREAM_CHROMIUM", "/usr/bin/chromium")


# Chromium flags for many small headless browsers on few cores. (BrowserGym's own
# --disable-features=OverlayScrollbars and --hide-scrollbars changes only matter for screenshots.)
CHROMIUM_ARGS = [
    "--disable-gpu",
    "--disable-crash-reporter",  # its crashpad handlers outlive the browser as zombies here
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
    "--no-first-run",
    "--mute-audio",
    "--disable-features=Translate,OptimizationHints,MediaRouter,OverlayScrollbars",
    "--renderer-process-limit=1",
    # The network, for what the request router (url_allowed) never sees. MiniWoB is file:// only.
    # No host name or address resolves: WebSockets, and the preconnect of a blocked navigation,
    # reached a local server before this flag, not with it.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # No WebRTC UDP (a STUN request to a literal address reached a local UDP port before this flag).
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
]

# Time bounds, in seconds (WebEnv's docstring says how they combine).
STEP_TIMEOUT_S = 15.0    # one step(); past it the env's renderer is killed and the episode is env_error
RESET_TIMEOUT_S = 30.0   # one reset(), every retry included
CLOSE_TIMEOUT_S = 10.0   # one close()
KILL_GRACE_S = 3.0       # after a renderer kill, how long a still-blocked call waits before the browser is killed
# WebEnv(screenshots=True): MiniWoB's task area (#wrap, 160x210 px at the top-left of the page) as a JPEG
SCREENSHOT_CLIP = {"x": 0, "y": 0, "width": 160, "height": 210}
SCREENSHOT_QUALITY = 60
SCREENSHOT_TIMEOUT_MS = 2000
MAX_PAGE_ELEMENTS = 5_000  # a page with more elements is not observed (env_error); the largest MiniWoB page has 137

_TLS = threading.local()  # one Playwright per thread (the sync API is bound to its thread)


def _playwright() -> playwright.sync_api.Playwright:
    pw = getattr(_TLS, "pw", None)
    if pw is None:
        pw = playwright.sync_api.sync_playwright().start()
        pw.selectors.set_test_id_attribute(BROWSERGYM_ID_ATTRIBUTE)  # get_by_test_id() finds bids
        _TLS.pw = pw
    return pw


class _Guard:
    """One call watched by `_WATCHDOG`. `fired`: 0 (in time), 1 (the env's renderers were killed),
    2 (its whole browser was killed)."""

    __slots__ = ("marker", "due", "grace", "fired")

    def __init__(self, marker: str, due: float, grace: float):
        self.marker, self.due, self.grace, self.fired = marker, due, grace, 0


class _Watchdog:
    """Wall-clock bounds for calls into the browser, from one daemon thread shared by every WebEnv.

    Playwright's sync calls cannot be interrupted from another thread, and page.evaluate() and DevTools
    calls have no timeout at all: a page whose script never yields blocks them forever. What any thread
    can do is kill processes. A guarded call still running at its deadline gets its env's renderer
    processes SIGKILLed (the page's crash handler then closes the page, which fails the blocked call);
    if it is still running `grace` seconds later, the env's whole browser (which fails any call). Kills
    happen under the lock, so once a guard has exited none of its kills can still land (on a browser
    launched after it).
    """

    def __init__(self):
        self._cv = threading.Condition()
        self._armed: set[_Guard] = set()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def guard(self, marker: str, seconds: float, grace: float = KILL_GRACE_S):
        g = _Guard(marker, time.monotonic() + seconds, grace)
        with self._cv:
            self._armed.add(g)
            if self._thread is None or not self._thread.is_alive():
                try:
                    t = threading.Thread(target=self._run, name="webdream-watchdog", daemon=True)
                    t.start()
                    self._thread = t
                except RuntimeError:  # interpreter shutting down: the call runs unguarded
                    pass
            self._cv.notify()
        try:
            yield g
        finally:
            with self._cv:
                self._armed.discard(g)

    def _run(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                due = [g for g in self._armed if g.due <= now]
                if not due:
                    nxt = min((g.due for g in self._armed), default=now + 60.0)
                    self._cv.wait(max(0.01, nxt - now))
                    continue
                for g in due:
                    g.fired += 1
                    g.due = now + g.grace
                    if g.fired >= 2:
                        self._armed.discard(g)
                    procs = _env_processes(g.marker)
                    pids = [p for p, cmd in procs.items() if g.fired >= 2 or "--type=renderer" in cmd]
                    logger.warning("watchdog: a browser call of env %s is past its deadline: SIGKILL %s %s",
                                   g.marker, "its browser" if g.fired >= 2 else "its renderers", pids)
                    sigkill(pids)


_WATCHDOG = _Watchdog()


class _MemoryChat:
    """Stand-in for BrowserGym's Chat, which launches a second browser to draw a chat window."""

    def __init__(self):
        self.messages: list[dict] = []

    def add_message(self, role: str, msg: str) -> None:
        if role != "info":
            self.messages.append({"role": role, "timestamp": time.time(), "message": msg})

    def wait_for_user_message(self) -> None:
        pass

    def close(self) -> None:
        pass


# BrowserGym's action functions (click, fill, ...) compiled once; each env execs them into its own
# namespace, whose `page` is rebound before every action (no exec of model text, ever).
_ACTION_SET = HighLevelActionSet(subsets=["chat", "bid", "nav"], demo_mode="off", strict=True,
                                 multiaction=False, retry_with_force=False)
_ACTION_CODE = compile(_ACTION_SET.python_includes, "<browsergym actions>", "exec")
# check() and uncheck() are in BrowserGym's function library but in none of its action subsets
# (browsergym-core 0.14.3 comments them out); the grammar allows them, so they join the namespace.
_EXTRA_ACTION_CODE = compile("\n\n".join(inspect.getsource(f) for f in (_bg_functions.check, _bg_functions.uncheck)),
                             "<browsergym actions: check, uncheck>", "exec")

_ACTIVATE_PAGE_JS = r"""
window.browsergym_page_activated();
window.addEventListener("focus", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("focusin", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("load", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("pageshow", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("mousemove", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("mouseup", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("mousedown", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("wheel", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("keyup", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("keydown", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("input", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("touchstart", () => {window.browsergym_page_activated();}, {capture: true});
window.addEventListener("touchend", () => {window.browsergym_page_activated();}, {capture: true});
document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") {
        window.browsergym_page_activated();
    }
}, {capture: true});
"""


def url_allowed(url: str) -> bool:
    """Only MiniWoB's own files (and blank/data pages) may load."""
    if url.startswith(("about:blank", "data:")):
        return True
    if not url.startswith("file://"):
        return False
    path = os.path.normpath(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    return path == MINIWOB_HTML_DIR or path.startswith(MINIWOB_HTML_DIR + os.sep)


class PageTooLarge(RuntimeError):
    """The page holds more than MAX_PAGE_ELEMENTS elements: it is not observed (its accessibility tree
    would cost the renderer and Python seconds and hundreds of MB). WebEnv turns it into env_error."""


# Errors from validating/observing a page whose document was replaced under the call (a navigation or
# reload that the action started): the call is redone on the new document.
_NAVIGATION_RACE = ("Execution context was destroyed", "Cannot find context with specified id",
                    "is not defined", "detached", "not found", "without a bid", "Cannot read properties of",
                    "navigat")


def _is_navigation_race(e: Exception) -> bool:
    if isinstance(e, MarkingError):
        return True
    return (isinstance(e, playwright.sync_api.Error) and not _is_fatal(e)
            and any(s in str(e) for s in _NAVIGATION_RACE))


class _PersistentBrowserEnv(BrowserEnv):
    """BrowserGym's BrowserEnv with one Chromium kept across resets.

    reset() mirrors BrowserEnv.reset (browsergym-core 0.14.3) except: the browser is launched
    once (slow_mo 0, our flags, our executable), the chat is in memory, every request is routed
    through `url_allowed`, and the observation skips the screenshot and the DOM snapshot.
    After an action: popups are closed, validation and observation are redone if the page navigated
    under them, a task page that was reloaded ends the episode, a crashed renderer raises, and a page
    with more than MAX_PAGE_ELEMENTS elements raises PageTooLarge instead of being observed.
    """

    def __init__(self, task_entrypoint, headless: bool, timeout_ms: int, pre_observation_delay: float,
                 marker: str, context_episodes: int = 100):
        super().__init__(task_entrypoint=task_entrypoint, headless=headless, slow_mo=0,
                         pre_observation_delay=pre_observation_delay, action_mapping=None)
        self.timeout_ms = timeout_ms
        self.marker = marker  # an inert flag that tags this env's Chromium in `ps`
        self.blocked: list[str] = []  # URLs aborted by the router in this episode
        self.popups_closed: list[str] = []  # URLs of the popups closed in this episode
        self.ns: dict = {"page": None, "DEMO_MODE": False,
                         "send_message_to_user": lambda text: self.chat.add_message("assistant", str(text)),
                         "report_infeasible_instructions": lambda reason: None}
        exec(_ACTION_CODE, self.ns)  # safe: BrowserGym's own action library, compiled at import; model text is never executed
        exec(_EXTRA_ACTION_CODE, self.ns)  # safe: check/uncheck from the same library
        missing = [a for a in ACTIONS if a != "noop" and not callable(self.ns.get(a))]
        if missing:  # a grammar action with no implementation would end every episode that uses it
            raise RuntimeError(f"BrowserGym provides no function for actions {missing}")
        self.context_episodes = context_episodes
        self.episodes_in_context = 0
        self.crashed = False  # the page's renderer died (Playwright's "crash" event)
        self.doc_token = ""  # set in the task's document at reset: gone means the page was reloaded
        self._episodes = 0

    # -- browser lifetime
    def launch(self) -> None:
        self.browser = _playwright().chromium.launch(
            headless=self.headless, slow_mo=0, executable_path=chromium_path(),
            args=CHROMIUM_ARGS + [f"--webdream-env={self.marker}"])

    def browser_alive(self) -> bool:
        return self.browser is not None and self.browser.is_connected()

    def _route(self, route: playwright.sync_api.Route) -> None:
        url = route.request.url
        if url_allowed(url):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort("blockedbyclient")

    def _drain(self, ctx) -> None:
        """Let Playwright run the route and binding callbacks queued for `ctx`. Closing a context or page
        while a navigation's requests wait on them hung forever (7 of 30 tries, Playwright 1.44); two
        round trips 50 ms apart first: 0 of 30."""
        try:
            ctx.cookies()
            time.sleep(0.05)
            ctx.cookies()
        except Exception:
            pass

    def drop_context(self) -> None:
        """Close the context and its pages (a runaway page stops here); the next reset opens a new one.
        Never raises."""
        ctx, self.context, self.page = self.context, None, None
        self.page_history = {}
        if ctx is None:
            return
        self._drain(ctx)
        try:
            ctx.close()
        except Exception:
            pass

    def _on_crash(self, page) -> None:
        """The renderer died. Playwright 1.44 then leaves every pending and later evaluate() on the page
        waiting forever (measured); closing the page makes them fail at once ("Target page ... closed").
        Event handlers run beside the blocked call, so this also unblocks a step in progress."""
        self.crashed = True
        try:
            page.close(run_before_unload=False)
        except Exception:
            pass

    def _new_context(self) -> None:
        self.drop_context()
        if not self.browser_alive():
            self.launch()
        self.context = self.browser.new_context(
            viewport=self.task.viewport, locale=self.task.locale, timezone_id=self.task.timezone_id)
        # Playwright's own waits: BrowserGym's actions pass 500 ms; everything else without a timeout
        # argument waits at most timeout_ms; navigations max(timeout_ms, 10 s). evaluate() and DevTools
        # calls have no timeout: WebEnv's watchdog bounds them.
        self.context.set_default_timeout(self.timeout_ms)
        self.context.set_default_navigation_timeout(max(self.timeout_ms, 10_000))  # slow under load
        self.context.route("**/*", self._route)
        self.context.expose_binding(
            "browsergym_page_activated", lambda source: self._activate_page_from_js(source["page"]))
        self.context.add_init_script(_ACTIVATE_PAGE_JS)
        self.page_history = {}
        self.page = self.context.new_page()
        self.crashed = False
        self.page.on("crash", self._on_crash)  # one renderer serves every page (--renderer-process-limit=1)
        self.episodes_in_context = 0

    def reset(self, seed: int):
        if self.task:
            self.task.teardown()
            self.task = None
        self.task = self.task_entrypoint(seed=seed)
        self.blocked = []
        self.popups_closed = []
        # Reuse the context and page while it is healthy: the task's setup() navigates to its page
        # afresh (a new document, new JS state), which is ~0.15 s cheaper than a new context.
        # A new context every `context_episodes` episodes bounds whatever a page might leave behind.
        reuse = (self.context is not None and self.page is not None and not self.page.is_closed()
                 and not self.crashed and len(self.context.pages) == 1
                 and self.episodes_in_context < self.context_episodes)
        if not reuse:
            self._new_context()
        self.episodes_in_context += 1
        self.chat = _MemoryChat()
        self.chat.add_message("assistant", "Hi! I am your UI assistant.")
        goal, task_info = self.task.setup(page=self.page)
        self.goal_object = [{"type": "text", "text": goal}] if isinstance(goal, str) else list(goal or [])
        for m in self.goal_object:
            if m.get("type") == "text":
                self.chat.add_message("user", m["text"])
        self._wait_dom_loaded()
        self._active_page_check()
        self._check_alive()
        self._episodes += 1
        self.doc_token = f"{self.marker}:{self._episodes}"
        self.task.page.evaluate("t => { window.__webdream_doc = t; }", self.doc_token)
        self.start_time = time.time()
        self.last_action = ""
        self.last_action_error = ""
        self.infeasible_message_received = False
        return self._get_obs(), {"task_info": task_info}

    def act(self, action: str | None, error: str = ""):
        """Run one canonical action (or none, with a parse error to show), then validate and observe."""
        self._check_alive()
        self.last_action = action or ""
        info = {"action_exec_start": time.time(), "action_exec_timeout": 0}
        self.last_action_error = error
        if action is not None:
            name, args = split_action(action)
            if name == "noop":
                pass  # BrowserGym's noop sleeps 1 s; MiniWoB pages have nothing to wait for
            else:
                self.ns["page"] = self.page
                try:
                    self.ns[name](*args)
                except playwright.sync_api.Error as e:
                    if _is_fatal(e):
                        raise
                    self.last_action_error = _short_error(e)
                except (ValueError, TypeError) as e:  # e.g. "Could not find element with bid"
                    self.last_action_error = _short_error(e)
        # BrowserGym's post_step (wait for load, validate, observe) sees the page at some instant; an
        # action can start a navigation or reload that replaces the document in the middle of it. Then
        # the whole post-step is redone on the new document (a few times, backing off).
        for attempt in range(4):
            self._check_alive()
            self._close_popups()
            try:
                obs, reward, terminated, truncated, info = self.post_step(info)
                self._check_alive()  # (a crash closes the page, and BrowserGym would observe a blank new one)
                if (not terminated and attempt < 3 and self.page == self.task.page
                        and obs["url"] != self.task.url):  # validated the old document, observed a new one
                    continue
                return obs, reward, terminated, truncated, info
            except Exception as e:
                if attempt == 3 or self.crashed or not _is_navigation_race(e):
                    raise
                logger.info("the page changed while it was observed (%s); observing again", _short_error(e, 80))
                time.sleep(0.05 * 2 ** attempt)

    def _check_alive(self) -> None:
        if self.crashed:
            raise RuntimeError("the page's renderer crashed")

    def _close_popups(self) -> None:
        """Close every page but the task's: a popup (window.open, target=_blank) whose load was blocked,
        a blank one, or one on a MiniWoB page. A MiniWoB task lives in one page; closing popups right
        after the action keeps the episode there whatever the popup's load timing (its URL goes to
        `popups_closed`, and to `blocked` if the router refused it)."""
        task_page = self.task.page if self.task else None
        stray = [p for p in self.context.pages if p != task_page]
        if not stray:
            return
        self._drain(self.context)
        for p in stray:
            self.popups_closed.append(p.url)
            try:
                p.close(run_before_unload=False)
            except playwright.sync_api.Error:
                pass
            self.page_history.pop(p, None)
        if self.page in stray or self.page is None or self.page.is_closed():
            self.page = task_page

    def _task_validate(self):
        page, task = self.page, self.task
        if page == task.page and page.url == task.url:
            # same URL, but is it still the document the task set up? (a reload starts MiniWoB afresh,
            # with no episode running: the task could never be completed)
            if page.evaluate("() => window.__webdream_doc || ''") != self.doc_token:
                return 0.0, True, "", {"error": "the task page was reloaded or left, terminating task"}
        return super()._task_validate()

    def _get_obs(self):
        """Only what the text agent needs: goal, URL, AXTree (with bids), focused bid."""
        n = self.page.evaluate("() => document.getElementsByTagName('*').length")
        if n > MAX_PAGE_ELEMENTS:
            raise PageTooLarge(f"the page has {n} elements, more than {MAX_PAGE_ELEMENTS}: not observed")
        for retries_left in reversed(range(3)):
            try:
                _pre_extract(self.page, tags_to_mark=self.tags_to_mark, lenient=(retries_left == 0))
                axtree = extract_merged_axtree(self.page)
            except (playwright.sync_api.Error, MarkingError) as e:
                if retries_left > 0 and any(s in str(e) for s in (
                        "detached", "not found", "context was destroyed", "without a bid",
                        "Cannot read properties of undefined")):
                    _post_extract(self.page)
                    time.sleep(0.05)
                    continue
                raise
            break
        _post_extract(self.page)
        goal = "\n".join(m["text"] for m in self.goal_object if m.get("type") == "text")
        return {"goal": goal, "url": self.page.url, "axtree_object": axtree,
                "last_action": self.last_action,
                "last_action_error": self.last_action_error}

    def close(self):
        """Close the context and the browser. Never raises."""
        self.drop_context()
        try:
            if self.browser is not None:
                self.browser.close()
        except Exception:
            pass
        self.task = self.context = self.browser = self.chat = self.page = None


def _is_fatal(e: Exception) -> bool:
    """Playwright errors that mean the browser, context or page is gone (vs. a bad action)."""
    s = str(e)
    return any(k in s for k in ("Target page, context or browser has been closed", "Browser has been closed",
                                "Connection closed", "Target closed", "crashed"))


def _short_error(e: Exception, limit: int = 200) -> str:
    """First line of an error, without Playwright's call log (it costs tokens and helps nobody),
    except the one fact an agent can use: which element covers the target."""
    full = f"{type(e).__name__}: {e}"
    s = full.split("\nCall log:")[0].strip()
    s = s.splitlines()[0] if s else s
    s = s if len(s) <= limit else s[: limit - 3] + "..."
    m = re.search(r'<\w+[^>]*?\bbid="(\w+)"[^>]*>([^<]{0,40})(?:</\w+>)? intercepts pointer events', full)
    if m:
        s += f" (element [{m.group(1)}] {m.group(2).strip()!r} is on top of it)"
    return s


# ----------------------------------------------------------------------------------------------
# The environment

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

    What a step does when the page misbehaves (tests/test_env_faults.py feeds each case):
    - an action on an element that is gone or hidden: an error the agent sees in Obs.error
      ("Could not find element with bid", "Timeout 500ms exceeded"); the episode goes on;
    - the page navigates or reloads while it is being validated/observed: the observation is taken
      again on the new document. A task page that navigated elsewhere or reloaded ends the episode
      with reward 0 and info["error"] saying so (the page left the task, as in BrowserGym; not env_error);
    - a request outside the MiniWoB folder (image, script, frame, fetch, popup, navigation) is aborted
      and listed in `self._bg.blocked`; popups are closed after each action (`self._bg.popups_closed`)
      and the episode goes on in the task's page; name resolution and WebRTC UDP are off in Chromium
      (WebSockets, which the router never sees, cannot connect);
    - an infrastructure fault (the browser or its renderer died, the page stopped answering, a page
      too large to observe: more than MAX_PAGE_ELEMENTS elements) ends the episode with done,
      info["env_error"] = True, reward 0. step() never raises for any of these.
    After a fault the context is closed at once (a runaway page stops using CPU and memory); the
    next reset opens a fresh context in the same browser, or relaunches it if the browser died.

    Time bounds. Playwright waits on its own for at most: 500 ms for an action's element (BrowserGym's
    actions), `timeout_ms` (5 s) for anything else that takes a timeout, max(timeout_ms, 10 s) for a
    navigation, 3 s per page and frame for loading. JavaScript evaluation and DevTools calls (validation,
    bid marking, the accessibility tree) have no timeout: a page whose script never yields blocks them
    forever. So a watchdog thread bounds each call in wall-clock time. A step() still running after
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
    0.65 s; a DOM growing past MAX_PAGE_ELEMENTS, 0.3 s; a reset whose reused page hangs on unload,
    10.7 s (and a normal episode).
    """

    def __init__(self, task: str, max_steps: int = 10, headless: bool = True, timeout_ms: int = 5000,
                 pre_observation_delay: float = 0.0, max_tree_lines: int = 200,
                 step_timeout: float = STEP_TIMEOUT_S, reset_timeout: float = RESET_TIMEOUT_S,
                 kill_grace: float = KILL_GRACE_S, screenshots: bool = False):
        task = _task_name(task)
        if not (step_timeout > 0 and reset_timeout > 0 and kill_grace > 0):
            raise ValueError(f"step_timeout, reset_timeout and kill_grace must be > 0, "
                             f"got {step_timeout}, {reset_timeout}, {kill_grace}")
        self.task = task
        self.max_steps = max_steps
        self.max_tree_lines = max_tree_lines
        self.screenshots = screenshots
        self.step_timeout, self.reset_timeout, self.kill_grace = step_timeout, reset_timeout, kill_grace
        self.marker = f"{os.getpid()}-{next(_ENV_COUNTER)}"
        self._bg = _PersistentBrowserEnv(TASKS[task], headless=headless, timeout_ms=timeout_ms,
                                         pre_observation_delay=pre_observation_delay, marker=self.marker)
        self.seed: int | None = None
        self.goal = ""
        self.t = 0
        self.done = True
        # what the next reset must repair first: None, "context" (open a fresh context) or "browser" (relaunch)
        self._broken: str | None = None
        self.last_raw_reward = 0.0

    # -- helpers
    def _obs(self, bg_obs: dict, error: str = "") -> Obs:
        return Obs(goal=self.goal, url=short_url(bg_obs["url"]),
                   axtree=flatten_axtree(bg_obs["axtree_object"], self.max_tree_lines),
                   error=error, step=self.t)

    def _screenshot(self) -> bytes | None:
        """The task area as a small JPEG (Obs.screenshot), or None: screenshots off, or the capture
        failed (logged; a failed capture never fails the step). Runs inside the step's watchdog guard:
        Playwright's own timeout ends a slow capture; only a page that hangs the renderer trips the guard."""
        if not self.screenshots:
            return None
        try:
            return self._bg.page.screenshot(type="jpeg", quality=SCREENSHOT_QUALITY, clip=SCREENSHOT_CLIP,
                                            timeout=min(self._bg.timeout_ms, SCREENSHOT_TIMEOUT_MS))
        except Exception as e:
            logger.warning("screenshot(%s, seed=%s, step %d) failed: %s", self.task, self.seed, self.t,
                           _short_error(e, 120))
            return None

    def _guard(self, seconds: float):
        return _WATCHDOG.guard(self.marker, seconds, self.kill_grace)

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
            task = _task_name(task)
            self.task = task
            self._bg.task_entrypoint = TASKS[task]
        self.seed, self.t, self.done, self.last_raw_reward = seed, 0, False, 0.0
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
            err = _short_error(fault)
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
            action = parse_action(text)
            parse_error = ""
        except ActionParseError as e:
            action, parse_error = None, f"ActionParseError: {e}"
        info["action"] = action
        fault = None
        with self._guard(self.step_timeout) as g:
            try:
                bg_obs, _, terminated, _, bg_info = self._bg.act(action, error=parse_error)
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
            info.update(env_error=True, error=f"environment error: {_short_error(fault)}")
            self._after_fault(killed_browser=g.fired >= 2)
            return Obs(self.goal, "", "", info["error"], self.t, env_error=True), 0.0, True, info
        task_info = bg_info.get("task_info", {})
        ended_by_page = "error" in task_info  # BrowserGym's validate(): wrong page or URL, or a reload
        if ended_by_page:
            terminated = True
        raw = float(task_info.get("RAW_REWARD_GLOBAL") or 0.0)
        self.last_raw_reward = raw
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
        sigkill(chromium_pids(self.marker))
        self._broken = "browser"

    def close(self) -> None:
        """Close the browser (within CLOSE_TIMEOUT_S; past it the browser is killed). Safe to call twice."""
        with self._guard(CLOSE_TIMEOUT_S):
            self._bg.close()
        self.done = True

    def chromium_rss_mb(self) -> float:
        """Resident memory of this env's Chromium processes (browser + renderers), in MiB (Linux /proc)."""
        return chromium_rss_mb(self.marker)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _task_name(task: str) -> str:
    """'click-button', 'miniwob.click-button' or 'browsergym/miniwob.click-button' -> 'click-button'.
    Raises ValueError, listing the valid names, for an unknown task."""
    for prefix in ("browsergym/miniwob.", "miniwob."):
        if task.startswith(prefix):
            task = task[len(prefix):]
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(sorted(TASKS))}")
    return task


def make_env(task: str, **kw) -> WebEnv:
    """WebEnv(task, **kw). Errors: ValueError for an unknown task (the message lists valid names)."""
    return WebEnv(task, **kw)


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process (Linux /proc)."""
    procs = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            procs[int(pid)] = (ppid, cmd)
        except (OSError, IndexError, ValueError):
            continue
    return procs


def _env_processes(marker: str) -> dict[int, str]:
    """pid -> command line of the Chromium launched with --webdream-env=<marker> and all its descendants."""
    procs = _proc_table()
    roots = {p for p, (_, cmd) in procs.items()
             if f"--webdream-env={marker}" in cmd and "--type=" not in cmd and "chrom" in cmd}
    keep, frontier = set(roots), set(roots)
    while frontier:
        frontier = {p for p, (pp, _) in procs.items() if pp in frontier and p not in keep}
        keep |= frontier
    return {p: procs[p][1] for p in keep}


def sigkill(pids) -> None:
    """SIGKILL each pid; ones already gone are skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def chromium_pids(marker: str) -> list[int]:
    """The Chromium launched with --webdream-env=<marker> and all its descendants."""
    return sorted(_env_processes(marker))


def renderer_pids(marker: str) -> list[int]:
    """The renderer processes of the Chromium launched with --webdream-env=<marker>."""
    return sorted(p for p, cmd in _env_processes(marker).items() if "--type=renderer" in cmd)


def chromium_rss_mb(marker: str) -> float:
    """Memory of one env's Chromium processes in MiB: the sum of their proportional set sizes
    (PSS: shared pages split among the processes that share them), else of their RSS."""
    total = 0
    for pid in chromium_pids(marker):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                kb = next(int(l.split()[1]) for l in f if l.startswith("Pss:"))
        except (OSError, StopIteration):
            try:
                with open(f"/proc/{pid}/statm") as f:
                    kb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
            except OSError:
                continue
        total += kb
    return total / 1024


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
