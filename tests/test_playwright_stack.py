"""playwright_stack.py: the cheap stack lists the frames inspect.stack() lists, it reaches Playwright's
modules, and Playwright still names the API in its errors (it reads the API name off that stack)."""
import inspect

import playwright._impl._connection
import playwright._impl._network
import playwright._impl._sync_base
import playwright.sync_api
import pytest

import browser  # noqa: F401  (installs it at import)
import env
import playwright_stack


def _nested(n, f):
    return _nested(n - 1, f) if n else f()


def test_the_stack_lists_the_frames_inspect_does():
    cheap, full = _nested(5, lambda: (playwright_stack.stack(), inspect.stack()))
    assert len(cheap) == len(full) > 8
    for c, f in zip(cheap, full):
        assert (c.frame, c.filename, c.lineno, c.function) == (f.frame, f.filename, f.lineno, f.function)
        assert c.code_context is None and c.index is None


def test_importing_browser_installs_it_in_playwrights_modules():
    for module in (playwright._impl._sync_base, playwright._impl._connection, playwright._impl._network):
        assert module.inspect.stack is playwright_stack.stack
        assert module.inspect.getmodule is inspect.getmodule  # the rest of inspect is inspect's
    assert playwright_stack.install()  # again: nothing changes
    assert playwright._impl._sync_base.inspect.stack is playwright_stack.stack


def test_playwright_still_names_the_api_in_its_errors():
    e = env.make_env("click-button", max_steps=2)
    try:
        assert not e.reset(0).env_error
        with pytest.raises(playwright.sync_api.Error, match=r"^Page\.evaluate: Error: thrown by the page"):
            e._bg.page.evaluate("() => { throw new Error('thrown by the page') }")
    finally:
        e.close()
