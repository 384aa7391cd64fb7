"""The Chromium session under each WebEnv: one headless Chromium kept across episodes, sandboxed,
driven through BrowserGym (browsergym-core 0.14.3) and Playwright's sync API.

    from browser import PersistentBrowserEnv
    bg = PersistentBrowserEnv(TASKS["click-button"], headless=True, timeout_ms=5000,
                              pre_observation_delay=0.0, marker="1234-0")
    bg_obs, info = bg.reset(seed=0)              # launches Chromium on first use; a new page per episode
    bg_obs, reward, terminated, truncated, info = bg.act("click('13')")   # a canonical action (actions.py)
    bg.close()
    web = PersistentBrowserEnv(webarena_lite.entrypoint("webarenalite.4"), True, 10_000, 0.0, "1234-1",
                               hosts=webarena_lite.allowed_hosts())   # a general site's policy

env.WebEnv is the user's interface: it bounds every call here in time (watchdog.py) and turns faults
into env_error. What this file changes in BrowserGym:
- one Chromium per env, launched once (our executable and flags, tagged `--webdream-env=<marker>`
  so watchdog.py can find its processes) and kept across resets, which reuse the context and page
  while they are healthy (BrowserGym relaunches the browser on every reset);
- no second browser for the chat window (an in-memory stand-in), no screenshot or DOM snapshot in
  the observation, no slow_mo and no pre-observation sleep;
- canonical actions run through page_actions.py: BrowserGym's own action functions (its library,
  exec'd once per env; model text is never executed), check() and uncheck() included, and our
  select_option (by the label the tree shows, a value only when no label matches);
- native dialogs (alert, confirm, prompt, beforeunload) are accepted at once, OK with a prompt's
  default text (Playwright would dismiss them silently), and a tab the page opens (window.open, a
  target=_blank link) is closed after the action and never observed: the task page stays the
  observed page (tabs.py). Each is told in the next observation (`events`, env.Obs.events);
- general sites (`hosts` given: WebArena) keep BrowserGym's tabs instead: a tab the page opens becomes
  the observed tab (the next observation says so and lists the open tabs, `tabs`), the tab actions
  (new_tab, tab_focus, tab_close) move the observed tab, each episode gets a fresh context (the task
  logs in), and the task's evaluators run only when asked (act(validate=True): env.py asks when the
  episode ends);
- text read from the page (goal, URL, tree, errors, dialog messages) is made valid Unicode where it
  enters (axtree.clean: a lone surrogate becomes U+FFFD);
- the network sandbox (sandbox.py): every request is routed and only the MiniWoB html folder loads
  (`url_allowed`), or on a general site only its hosts (`web_url_allowed`; a refused navigation is told
  in the next observation); no other host resolves and WebRTC sends no UDP (for what the router cannot
  see); MiniWoB's popups are closed after each action;
- a page that navigates or reloads under the observation is observed again; a task page that left its
  document (a reload, a navigation) ends the episode, one whose URL changed in place (a fragment link,
  pushState) goes on and is scored by the task (BrowserGym compares URLs exactly); a page with more than
  MAX_PAGE_ELEMENTS elements raises PageTooLarge;
- a Playwright error reaches the agent as one line (page_errors.short_error); what ends an episode as a
  browser fault is decided by the error's type and the page's state, never by its message's words;
- Playwright's per-call stack capture is the cheap one of later Playwright versions (playwright_stack.py).
"""
from __future__ import annotations

import logging
import os
import tempfile
import threading
import time

import playwright.sync_api

import playwright_stack
from sandbox import (CHROMIUM_ARGS, MINIWOB_HTML_DIR, chromium_args, url_allowed,  # noqa: F401
                     web_route_pattern, web_url_allowed)

playwright_stack.install()  # every sync call recorded its caller's stack at great cost (see there)

# BrowserGym's MiniWoB tasks read MINIWOB_URL when they are built: set it before anything else.
os.environ.setdefault("MINIWOB_URL", "file://" + os.path.join(MINIWOB_HTML_DIR, "miniwob") + "/")

from browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE  # noqa: E402
from browsergym.core.env import BrowserEnv  # noqa: E402
from browsergym.core.observation import (  # noqa: E402
    MarkingError,
    _post_extract,
    _pre_extract,
    extract_merged_axtree,
)

from actions import split_action  # noqa: E402
from axtree import HIDDEN_JS, HIDDEN_MAX_CHARS, HIDDEN_MAX_LINES, clean, clean_text, quote  # noqa: E402
from page_actions import ACTION_TIMEOUT_MS, action_namespace  # noqa: E402
from page_errors import is_fatal, is_navigation_race, short_error, shorten  # noqa: E402
from tabs import close_popups, follow_new_tabs, tab_lines  # noqa: E402

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# Chromium


def chromium_path() -> str:
    """The Chromium executable: $WEBDREAM_CHROMIUM, else /usr/bin/chromium."""
    return os.environ.get("WEBDREAM_CHROMIUM", "/usr/bin/chromium")


MAX_PAGE_ELEMENTS = 5_000  # a page with more elements is not observed (env_error); the largest MiniWoB page has 137
WEB_MAX_PAGE_ELEMENTS = 30_000  # the same bound on general sites (WebArena's admin grids hold thousands)
WEB_NAVIGATION_TIMEOUT_MS = 30_000  # general sites: a navigation (a login, a search) under load

_TLS = threading.local()  # one Playwright per thread (the sync API is bound to its thread)


def thread_playwright() -> playwright.sync_api.Playwright:
    """This thread's Playwright, started on first use (its sync API serves only the thread that started it)."""
    pw = getattr(_TLS, "pw", None)
    if pw is None:
        pw = playwright.sync_api.sync_playwright().start()
        pw.selectors.set_test_id_attribute(BROWSERGYM_ID_ATTRIBUTE)  # get_by_test_id() finds bids
        _TLS.pw = pw
    return pw


# ----------------------------------------------------------------------------------------------
# BrowserGym with one Chromium kept across episodes


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


class PageTooLarge(RuntimeError):
    """The page holds more than MAX_PAGE_ELEMENTS elements: it is not observed (its accessibility tree
    would cost the renderer and Python seconds and hundreds of MB). WebEnv turns it into env_error."""


class PersistentBrowserEnv(BrowserEnv):
    """BrowserGym's BrowserEnv with one Chromium kept across resets.

    reset() mirrors BrowserEnv.reset (browsergym-core 0.14.3) except: the browser is launched
    once (slow_mo 0, our flags, our executable), the chat is in memory, every request is routed
    through `url_allowed`, and the observation skips the screenshot and the DOM snapshot.
    After an action: popups are closed, validation and observation are redone if the page navigated
    under them, a task page that was reloaded or left its document ends the episode (a URL changed in the
    same document does not), a crashed renderer raises, and a page
    with more than MAX_PAGE_ELEMENTS elements raises PageTooLarge instead of being observed.
    hosts: None for MiniWoB's policy; a set of host names for a general site's (sandbox.web_url_allowed,
    tabs followed and listed, a fresh context per episode, WEB_MAX_PAGE_ELEMENTS, validation on request).
    """

    def __init__(self, task_entrypoint, headless: bool, timeout_ms: int, pre_observation_delay: float,
                 marker: str, context_episodes: int = 100, hosts: frozenset[str] | None = None,
                 observe_hidden: bool = False, action_timeout_ms: int = ACTION_TIMEOUT_MS):
        super().__init__(task_entrypoint=task_entrypoint, headless=headless, slow_mo=0,
                         pre_observation_delay=pre_observation_delay, action_mapping=None)
        self.timeout_ms = timeout_ms
        self.marker = marker  # an inert flag that tags this env's Chromium in `ps`
        self.blocked: list[str] = []  # URLs aborted by the router in this episode
        self.popups_closed: list[str] = []  # URLs of the popups closed in this episode
        # every action's function (page_actions.py), `page` rebound before each (no exec of model text, ever)
        self.ns = action_namespace(lambda text: self.chat.add_message("assistant", str(text)), self._infeasible,
                                   timeout_ms=action_timeout_ms)
        self.hosts = None if hosts is None else frozenset(h.lower() for h in hosts)
        self.web = self.hosts is not None  # a general site's policy (else MiniWoB's)
        self.max_elements = WEB_MAX_PAGE_ELEMENTS if self.web else MAX_PAGE_ELEMENTS
        self.context_episodes = context_episodes
        self.episodes_in_context = 0
        self.observe_hidden = observe_hidden  # also read the hidden content (axtree.HIDDEN_JS) for the world model
        self.crashed = False  # the page's renderer died (Playwright's "crash" event)
        self.events: list[str] = []  # what the page did beside the action (dialogs, tabs), for the next Obs
        self.doc_token = ""  # set in the task's document at reset: gone means the page was reloaded
        self._episodes = 0
        self._browser_cdp = None  # a DevTools session on the browser (the tab count: tabs.await_opened_tabs)

    # -- browser lifetime
    def launch(self) -> None:
        self.browser = thread_playwright().chromium.launch(
            headless=self.headless, slow_mo=0, executable_path=chromium_path(),
            args=chromium_args(self.hosts) + [f"--webdream-env={self.marker}"])
        self._browser_cdp = None

    def browser_alive(self) -> bool:
        return self.browser is not None and self.browser.is_connected()

    def _route(self, route: playwright.sync_api.Route) -> None:
        url = route.request.url
        if web_url_allowed(url, self.hosts) if self.web else url_allowed(url):
            route.continue_()
        else:
            self.blocked.append(url)
            if self.web and _main_frame_navigation(route.request):  # a page or tab the agent would have seen
                self.events.append(f"Blocked: {quote(shorten(clean_text(url)))} is not one of the task's sites; "
                                   f"it was not loaded.")
            route.abort("blockedbyclient")

    def _infeasible(self, reason: str) -> None:
        """report_infeasible(reason): BrowserGym's rule (the chat records it; the episode ends, and a
        WebArena task reads it as the answer "N/A")."""
        self.chat.add_message("infeasible", str(reason))
        self.infeasible_message_received = True

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
        # Playwright's own waits: actions page_actions.ACTION_TIMEOUT_MS; everything else without a timeout
        # argument waits at most timeout_ms; navigations max(timeout_ms, 10 s). evaluate() and DevTools
        # calls have no timeout: WebEnv's watchdog bounds them.
        self.context.set_default_timeout(self.timeout_ms)
        self.context.set_default_navigation_timeout(  # slow under load
            max(self.timeout_ms, WEB_NAVIGATION_TIMEOUT_MS if self.web else 10_000))
        self.context.route(web_route_pattern(self.hosts) if self.web else "**/*", self._route)
        self.context.on("dialog", self._on_dialog)  # without a listener Playwright dismisses them unseen
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
            _remove_config_file(self.task)
            self.task = None
        self.task = self.task_entrypoint(seed=seed)
        self.blocked = []
        self.popups_closed = []
        self.events = []
        # Reuse the context and page while it is healthy: the task's setup() navigates to its page
        # afresh (a new document, new JS state), which is ~0.15 s cheaper than a new context.
        # A new context every `context_episodes` episodes bounds whatever a page might leave behind.
        # A general site's episode always gets a fresh context: its task logs in, and cookies must not carry over.
        reuse = (not self.web and self.context is not None and self.page is not None and not self.page.is_closed()
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
        if not self.web:
            self.task.page.evaluate("t => { window.__webdream_doc = t; }", self.doc_token)
        self.start_time = time.time()
        self.last_action = ""
        self.last_action_error = ""
        self.infeasible_message_received = False
        obs = self._get_obs()
        if not self.web:
            close_popups(self)
        return clean(dict(obs, events=self._take_events())), clean({"task_info": task_info})

    def act(self, action: str | None, error: str = "", validate: bool = True):
        """Run one canonical action (or none, with a parse error to show), then validate (unless
        validate=False: reward 0, not done) and observe."""
        self._check_alive()
        self.last_action = action or ""
        info = {"action_exec_start": time.time(), "action_exec_timeout": 0}
        self.last_action_error = error
        pages_before = list(self.context.pages)
        if action is not None:
            name, args = split_action(action)
            if name == "noop":
                pass  # BrowserGym's noop sleeps 1 s; MiniWoB pages have nothing to wait for
            elif name == "goto" and self.web and not web_url_allowed(args[0], self.hosts):
                self.last_action_error = (f"{quote(shorten(args[0]))} is not one of the task's sites "
                                          f"({', '.join(sorted(self.hosts))}); nothing was loaded")
            elif name == "tab_focus" and not args[0] < len(self.context.pages):
                self.last_action_error = f"there is no tab {args[0]}: the tabs are 0 to {len(self.context.pages) - 1}"
            else:
                self.ns["page"] = self.page
                try:
                    self.ns[name](*args)
                except playwright.sync_api.Error as e:
                    # what happened decides (the error's type, the page's and the renderer's state); never its
                    # words, which quote the page (a covering element's text may say "crashed")
                    if self.crashed or is_fatal(e, self.ns["page"]):
                        raise
                    self.last_action_error = short_error(e)
                except (ValueError, TypeError) as e:  # e.g. "Could not find element with bid"
                    self.last_action_error = short_error(e)
                if self.web:  # the tab actions make another tab the active one (they rebind "page")
                    self._follow(self.ns["page"])
        if self.web:
            follow_new_tabs(self, pages_before, action)
        # BrowserGym's post_step (wait for load, validate, observe) sees the page at some instant; an
        # action can start a navigation or reload that replaces the document in the middle of it. Then
        # the whole post-step is redone on the new document (a few times, backing off).
        for attempt in range(4):
            self._check_alive()
            if not self.web:
                close_popups(self)
            try:
                obs, reward, terminated, truncated, info = self.post_step(info, validate=validate)
                self._check_alive()  # (a crash closes the page, and BrowserGym would observe a blank new one)
                if (not self.web and not terminated and attempt < 3 and self.page == self.task.page
                        and obs["url"] != self.task.url and not self._on_task_document()):
                    continue  # validated the old document, observed a new one (not a fragment or pushState)
                if not self.web:
                    close_popups(self)  # a tab this action opened goes now, and the observation says so
                return clean(dict(obs, events=self._take_events())), reward, terminated, truncated, clean(info)
            except Exception as e:
                if attempt == 3 or self.crashed or not is_navigation_race(e, self.page):
                    raise
                logger.info("the page changed while it was observed (%s); observing again", short_error(e, 80))
                time.sleep(0.05 * 2 ** attempt)

    def _check_alive(self) -> None:
        if self.crashed:
            raise RuntimeError("the page's renderer crashed")

    def _take_events(self) -> list[str]:
        """The events since the last observation, for this one (a dialog handled later, e.g. while a
        screenshot is taken, goes to the next)."""
        events, self.events = self.events, []
        return events

    def _activate_page_from_js(self, page) -> None:
        """BrowserGym makes whichever page gets focus, loads or is clicked the observed page; a MiniWoB
        task lives in its one page, so a tab it opens is never observed (it validated as "invalid page"
        and ended the episode) but closed (tabs.close_popups). A general site keeps BrowserGym's rule."""
        task_page = getattr(self.task, "page", None) if self.task and not self.web else None
        if task_page is None or page == task_page:
            super()._activate_page_from_js(page)

    def _follow(self, page) -> None:
        """Make `page` the observed tab (BrowserGym's page history too), if it is another open one."""
        if page is not None and page is not self.page and not page.is_closed() and page in self.context.pages:
            super()._activate_page_from_js(page)

    def _on_dialog(self, dialog) -> None:
        """The dialog policy: every native dialog (alert, confirm, prompt, beforeunload) is accepted at
        once, as a user who clicks OK would, a prompt with its default text; the next observation says
        which dialog appeared, its message, and that it was accepted (env.Obs.events)."""
        kind, message, default = dialog.type, clean_text(dialog.message), clean_text(dialog.default_value)
        try:
            if kind == "prompt":
                dialog.accept(default)
            else:
                dialog.accept()
        except playwright.sync_api.Error:  # the page or the dialog is already gone
            pass
        said = f" {quote(shorten(message))}" if message else ""
        how = f"accepted with its default text {quote(shorten(default))}" if kind == "prompt" else "accepted (OK)"
        self.events.append(f"Dialog: the page showed {'an' if kind[0] in 'aeiou' else 'a'} {kind}{said}; it was {how}.")

    def _on_task_document(self) -> bool:
        """Whether the task page still shows the document the task set up (reset left a token in its window),
        whatever its URL says: a fragment link (<a href='#'>), history.pushState or replaceState change the URL
        in place, in the same document; a navigation or a reload, even to the same URL, replaces it."""
        return self.task.page.evaluate("() => window.__webdream_doc || ''") == self.doc_token

    def _task_validate(self):
        """MiniWoB: the task's own verdict while its page shows the task's document, whatever the URL; else the
        episode ends with reward 0 ("reloaded or left" for the task's URL, BrowserGym's "invalid url" for
        another). BrowserGym's validate() compares the URL exactly: a search-engine result link (href='#')
        ended a solved episode as "invalid url" with reward 0 (BrowserGym issue #366)."""
        page, task = self.page, self.task
        if not self.web and page == task.page:
            if self._on_task_document():
                if page.url == task.url:
                    return super()._task_validate()
                # the URL changed in place: BrowserGym's MiniWoB validate() without its URL comparison
                info = task._get_info()
                return float(info["RAW_REWARD_GLOBAL"] > 0), info["DONE_GLOBAL"], "", info
            if page.url.split("#")[0] == task.url:  # a reload starts MiniWoB afresh, with no episode running
                return 0.0, True, "", {"error": "the task page was reloaded or left, terminating task"}
        return super()._task_validate()

    def _get_obs(self):
        """Only what the text agent needs: goal, URL, AXTree (with bids), focused bid; on a general site
        with several tabs open, one line per tab (`tabs`: index, title, URL, which is active)."""
        page = self.page  # (a tab activated meanwhile is observed next time, not halfway through this one)
        n = page.evaluate("() => document.getElementsByTagName('*').length")
        if n > self.max_elements:
            raise PageTooLarge(f"the page has {n} elements, more than {self.max_elements}: not observed")
        for retries_left in reversed(range(3)):
            try:
                _pre_extract(page, tags_to_mark=self.tags_to_mark, lenient=(retries_left == 0))
                axtree = extract_merged_axtree(page)
            except (playwright.sync_api.Error, MarkingError) as e:
                if retries_left > 0 and is_navigation_race(e, page):
                    _post_extract(page)
                    time.sleep(0.05)
                    continue
                raise
            break
        # the content without a layout box, its bids this tree's (made valid with the rest by the caller's clean);
        # the world model's extra view only: a page that breaks it (a navigation, its own scripts) costs it, not the step
        hidden = []
        if self.observe_hidden:
            try:
                hidden = page.evaluate(HIDDEN_JS, [HIDDEN_MAX_LINES, HIDDEN_MAX_CHARS])
            except playwright.sync_api.Error as e:
                logger.warning("hidden content not read: %s", short_error(e))
        _post_extract(page)
        goal = "\n".join(m["text"] for m in self.goal_object if m.get("type") == "text")
        tabs = tab_lines(self, page) if self.web and len(self.context.pages) > 1 else []
        return {"goal": goal, "url": page.url, "axtree_object": axtree, "tabs": tabs, "hidden": hidden,
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


def _main_frame_navigation(request) -> bool:
    """Whether a request loads a tab's document (not a frame's, not a resource)."""
    try:
        return request.is_navigation_request() and request.frame.parent_frame is None
    except playwright.sync_api.Error:  # no frame yet (a popup's first request)
        return request.is_navigation_request()


def _remove_config_file(task) -> None:
    """Delete the temporary config file a WebArena task writes at every setup (BrowserGym leaves them)."""
    path = getattr(task, "config_file", None)
    if isinstance(path, str) and os.path.dirname(path) == tempfile.gettempdir():
        try:
            os.unlink(path)
        except OSError:
            pass
