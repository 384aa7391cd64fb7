"""Playwright's errors as an agent reads them, and which of them mean the browser is gone.

    from page_errors import short_error, is_fatal, is_navigation_race, shorten
    short_error(e)          # "TimeoutError: Timeout 3000ms exceeded." (+ which element covers the target)
    is_fatal(e, page)       # the browser, context or page is gone (not a bad action): by type and state
    is_navigation_race(e, page)   # the page changed under the call: observe again

browser.py decides with them what ends an episode and what an agent is told; env.py writes faults with
short_error.
"""
from __future__ import annotations

import re

import playwright.sync_api
from browsergym.core.observation import MarkingError
# Playwright's own type for a call on a closed page, context or browser, or over a closed driver connection
# (1.41 on; not exported by playwright.sync_api in 1.44)
from playwright._impl._errors import TargetClosedError

from axtree import clean_text, quote

# What a Playwright error's message holds: "Page.evaluate: " (the call), then one line that says what
# happened, then more lines: a script's stack, or Playwright's call log, which quotes the page's HTML (the
# element on top of a click's target). Page content can stand anywhere after that first line, and inside a
# script's own error ("Error: <the script's text>"). So a fault is never told from words found anywhere in
# the message: fatality from Playwright's error type and the state of the page and browser, a navigation
# race from the whole first line, matched to the reports of Playwright, Chromium and V8 listed below.
_CALL = re.compile(r"[A-Za-z]+\.[A-Za-z_]+: ")

# The first lines (after the call) that report a page changed under the call: its document was replaced
# (a navigation or reload the action started), a frame was attached, detached or navigated, a node went
# away. Playwright's own words; Chromium's protocol errors (a context, frame or node it no longer knows);
# V8's errors in our own scripts (the validation's and the marking's) run on a document that is not yet,
# or no longer, the one they were written for (a missing global, an element gone). Each is matched whole:
# a page that writes these words in its text or HTML writes them after this line, never as all of it.
NAVIGATION_RACE = re.compile(
    r"Execution context was destroyed, most likely because of a navigation\.?"
    r"|(?:Navigating frame was detached|Frame was detached|Frame has been detached)[.!]?"
    r"|Unable to retrieve content because the page is navigating and changing the content\.?"
    r"|Protocol error \([A-Za-z]+\.[A-Za-z]+\): [^\n]*"
    r"|ReferenceError: [A-Za-z_$][\w$]* is not defined"
    r"|TypeError: Cannot read properties of (?:undefined|null) \(reading '[\w$]*'\)")


def _first_line(e: Exception) -> str:
    """What happened, as Playwright says it: the message's first line without the call ("Page.evaluate: ")."""
    lines = str(e).splitlines()
    line = lines[0] if lines else ""
    m = _CALL.match(line)
    return line[m.end():] if m else line


def is_navigation_race(e: Exception, page=None) -> bool:
    """Whether an error came from a page changed under the call (the caller then redoes the call on the new
    document): BrowserGym's MarkingError (a frame appeared during marking), or a Playwright error, not fatal
    (is_fatal with `page`), whose first line is one of NAVIGATION_RACE's reports. Page content never decides
    it (see above): a page that shows "not found" or "detached" is not a race."""
    if isinstance(e, MarkingError):
        return True
    return (isinstance(e, playwright.sync_api.Error) and not is_fatal(e, page)
            and NAVIGATION_RACE.fullmatch(_first_line(e)) is not None)


def is_fatal(e: Exception, page=None) -> bool:
    """Whether the browser, context or page is gone (vs. a bad action), from what happened, never from the
    message (it quotes page content: a click's call log names the element on top of the target with its
    text, and a page's text may say "crashed"): Playwright's TargetClosedError (the page, its context, the
    browser or the driver connection closed), or `page` (when given) closed or its browser disconnected.
    A crashed renderer is seen by state: browser.py's crash handler closes the page."""
    if isinstance(e, TargetClosedError):
        return True
    if page is None:
        return False
    browser = page.context.browser
    return page.is_closed() or (browser is not None and not browser.is_connected())


def short_error(e: Exception, limit: int = 200) -> str:
    """An error as the agent sees it: "Type: message", its first line only (at most `limit` characters),
    without Playwright's call log (it costs tokens and helps nobody) except the one fact an agent can
    use: which element covers the target, appended as " (element [12] 'OK' is on top of it)"."""
    full = clean_text(f"{type(e).__name__}: {e}")
    s = full.split("\nCall log:")[0].strip()
    s = s.splitlines()[0] if s else s
    s = s if len(s) <= limit else s[: limit - 3] + "..."
    # (Playwright's call log previews an element's text in at most 50 characters, "…" included)
    m = re.search(r'<\w+[^>]*?\bbid="(\w+)"[^>]*>([^<]{0,50})(?:</\w+>)? intercepts pointer events', full)
    if m:
        s += f" (element [{m.group(1)}] {quote(m.group(2).strip())} is on top of it)"
    return s


def shorten(text: str, limit: int = 200) -> str:
    """`text`, cut to `limit` characters with "..." when longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
