"""Playwright's errors as an agent reads them, and which of them mean the browser is gone.

    from page_errors import short_error, is_fatal, is_navigation_race, shorten
    short_error(e)          # "TimeoutError: Timeout 3000ms exceeded." (+ which element covers the target)
    is_fatal(e)             # the browser, context or page is gone (not a bad action)
    is_navigation_race(e)   # the document was replaced under the call: observe again

browser.py decides with them what ends an episode and what an agent is told; env.py writes faults with
short_error.
"""
from __future__ import annotations

import re

import playwright.sync_api
from browsergym.core.observation import MarkingError

from axtree import clean_text, quote

# Errors from validating/observing a page whose document was replaced under the call (a navigation or
# reload that the action started): the call is redone on the new document.
NAVIGATION_RACE = ("Execution context was destroyed", "Cannot find context with specified id",
                    "is not defined", "detached", "not found", "without a bid", "Cannot read properties of",
                    "navigat")


def is_navigation_race(e: Exception) -> bool:
    """Whether an error came from a document replaced under the call (the call is then redone)."""
    if isinstance(e, MarkingError):
        return True
    return (isinstance(e, playwright.sync_api.Error) and not is_fatal(e)
            and any(s in str(e) for s in NAVIGATION_RACE))


def is_fatal(e: Exception) -> bool:
    """Playwright errors that mean the browser, context or page is gone (vs. a bad action)."""
    s = str(e)
    return any(k in s for k in ("Target page, context or browser has been closed", "Browser has been closed",
                                "Connection closed", "Target closed", "crashed"))


def short_error(e: Exception, limit: int = 200) -> str:
    """An error as the agent sees it: "Type: message", its first line only (at most `limit` characters),
    without Playwright's call log (it costs tokens and helps nobody) except the one fact an agent can
    use: which element covers the target, appended as " (element [12] 'OK' is on top of it)"."""
    full = clean_text(f"{type(e).__name__}: {e}")
    s = full.split("\nCall log:")[0].strip()
    s = s.splitlines()[0] if s else s
    s = s if len(s) <= limit else s[: limit - 3] + "..."
    m = re.search(r'<\w+[^>]*?\bbid="(\w+)"[^>]*>([^<]{0,40})(?:</\w+>)? intercepts pointer events', full)
    if m:
        s += f" (element [{m.group(1)}] {quote(m.group(2).strip())} is on top of it)"
    return s


def shorten(text: str, limit: int = 200) -> str:
    """`text`, cut to `limit` characters with "..." when longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
