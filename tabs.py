"""The tabs a page opens (window.open, a target=_blank link): how a browser env follows, lists and
closes them. MiniWoB closes them; general sites (WebArena) follow and list them.

    from tabs import close_popups, follow_new_tabs, tab_lines
    close_popups(bg)                        # MiniWoB: every page but the task's is closed, and told
    follow_new_tabs(bg, pages_before, action)   # a general site: a tab the action opened becomes the observed one
    tab_lines(bg, bg.page)                  # ["Tab 0: 'Home' http://shop/", "Tab 1 (active): ..."]

`bg` is a browser.PersistentBrowserEnv (its context, page, events, _follow, _drain and _browser_cdp).
A tab the page opens exists in Chromium when the action returns, but Playwright's page object for it
comes a few round trips later: follow_new_tabs first waits (at most 3 s, await_opened_tabs) until
Playwright lists as many tabs as Chromium's own `Target.getTargets` counts.
"""
from __future__ import annotations

import time

import playwright.sync_api

from axtree import clean_text, quote
from page_errors import shorten


def follow_new_tabs(bg, before: list, action: str | None) -> None:
    """A general site: a tab the page opened during the action (window.open, target=_blank) becomes the
    observed tab once its document is there, and the next observation says so; new_tab()'s own tab
    is the agent's doing and goes untold."""
    await_opened_tabs(bg)
    new = [p for p in bg.context.pages if p not in before]
    if action == "new_tab()":
        return
    for p in new:
        try:
            p.wait_for_load_state("domcontentloaded", timeout=3000)
            # the tab's URL can still read '' (its navigation not yet committed, seen once in a test run):
            # wait at most 1 s more for it, pumping Playwright's events (a blank tab reads about:blank, not '')
            deadline = time.monotonic() + 1.0
            while not p.url and time.monotonic() < deadline:
                p.wait_for_timeout(50)
        except playwright.sync_api.Error:
            pass
        bg._follow(p)
        url = clean_text(p.url)
        bg.events.append(f"Tab: the page opened a new tab{f' ({quote(shorten(url))})' if url != 'about:blank' else ''}; "
                         f"it is now the active tab.")


def await_opened_tabs(bg, timeout: float = 3.0) -> None:
    """Wait (at most `timeout` s) until Playwright lists every tab Chromium has open. A tab the page
    opens during the action (window.open in a click handler, a target=_blank link) exists in Chromium
    when the action returns; Playwright's page object for it comes a few round trips later, later still
    under load (the test of the tab a link opens missed it 2 times in 6 with 50 ms of waiting). A tab
    the page opens later (a timer, after a fetch) is not waited for: the next action's observation
    lists it. Prerendered pages are not tabs. Never raises (a failed DevTools session is rebuilt at
    the next call)."""
    deadline = time.monotonic() + timeout
    while True:
        bg._drain(bg.context)
        try:
            if bg._browser_cdp is None:
                bg._browser_cdp = bg.browser.new_browser_cdp_session()
            targets = bg._browser_cdp.send("Target.getTargets")["targetInfos"]
        except Exception:  # a closed browser or driver (not always a playwright Error)
            bg._browser_cdp = None
            return
        tabs = sum(t["type"] == "page" and t.get("subtype") != "prerender" for t in targets)
        if len(bg.context.pages) >= tabs or time.monotonic() > deadline:
            return


def close_popups(bg) -> None:
    """Close every page but the task's: a popup (window.open, target=_blank) whose load was blocked,
    a blank one, or one on a MiniWoB page. A MiniWoB task lives in one page; closing popups right
    after the action keeps the episode there whatever the popup's load timing (its URL goes to
    `popups_closed`, and to `blocked` if the router refused it; the next observation says that a
    tab was opened and closed)."""
    task_page = bg.task.page if bg.task else None
    stray = [p for p in bg.context.pages if p != task_page]
    if not stray:
        return
    bg._drain(bg.context)
    for p in stray:
        bg.popups_closed.append(clean_text(p.url))
        bg.events.append("Tab: the page opened a new tab; it was closed, and this page stays.")
        try:
            p.close(run_before_unload=False)
        except playwright.sync_api.Error:
            pass
        bg.page_history.pop(p, None)
    if bg.page in stray or bg.page is None or bg.page.is_closed():
        bg.page = task_page


def tab_lines(bg, active) -> list[str]:
    """One line per open tab, in tab_focus()'s order: "Tab 1 (active): 'Results' http://shop/?q=bag"."""
    lines = []
    for i, p in enumerate(bg.context.pages):
        try:
            title = p.title()
        except playwright.sync_api.Error:  # closing, or navigating
            title = ""
        lines.append(f"Tab {i}{' (active)' if p == active else ''}: {quote(shorten(clean_text(title), 80))} "
                     f"{shorten(clean_text(p.url))}")
    return lines
