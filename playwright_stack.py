"""Playwright's per-call stack capture, made cheap: a backport of upstream's fix to the pinned 1.44.

browsergym-core 0.14.3 pins playwright==1.44. On every sync API call (page.evaluate, a click, a CDP
message) that version records the caller's stack with `inspect.stack()` (playwright/_impl/
_sync_base.py, _connection.py, _network.py), which builds each frame's source context and, for every
frame whose file is not on disk (`<frozen runpy>`, `<string>`), looks the module up by scanning all of
sys.modules (`inspect.getmodule`). In a process that has imported torch and transformers that is
thousands of modules per frame, per call; Playwright then uses only each frame's file name, line,
function and locals (for the API name in its error messages and traces). Upstream made the capture
cheap in playwright-python #2835 (`inspect.stack(0)`, 1.53) and #3147 (a plain walk of `f_back`).

`install()` points those three modules' `inspect` at a copy of the module whose `stack()` walks the
frames the same way #3147 does: the same frames in the same order, each an `inspect.FrameInfo` with the
frame, its code's file name, line and function, and no source context (which Playwright never reads).
Nothing else changes. It installs only on the version it was written for (1.44.0); on any other it
does nothing. browser.py calls it at import.

    import playwright_stack
    playwright_stack.install()   # idempotent; returns True when installed
"""
from __future__ import annotations

import importlib.metadata
import inspect
import sys
import types

FOR_VERSION = "1.44.0"
MODULES = ("playwright._impl._sync_base", "playwright._impl._connection", "playwright._impl._network")


def stack(context: int = 1) -> list[inspect.FrameInfo]:
    """The caller's stack, innermost first, as `inspect.stack()` lists it (a FrameInfo per frame:
    frame, filename = co_filename, lineno, function), without source context (`code_context` and
    `index` None whatever `context` says) and without looking modules up."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        frames.append(inspect.FrameInfo(frame, code.co_filename, frame.f_lineno, code.co_name, None, None))
        frame = frame.f_back
    return frames


def install() -> bool:
    """Give Playwright's stack-capturing modules the cheap `stack()`. Returns True when installed
    (now or before), False when the installed Playwright is not FOR_VERSION (left untouched)."""
    if importlib.metadata.version("playwright") != FOR_VERSION:
        return False
    fast = types.ModuleType("inspect", "the inspect module with a cheap stack() (playwright_stack.py)")
    fast.__dict__.update({k: v for k, v in vars(inspect).items() if not k.startswith("__")})
    fast.stack = stack
    for name in MODULES:
        module = importlib.import_module(name)
        if getattr(module.inspect, "stack", None) is not stack:
            module.inspect = fast
    return True
