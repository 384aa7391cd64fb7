"""The Chromium flags: Playwright's own disabled features stay disabled (Chromium reads only the last
--disable-features switch, and Playwright puts its own before ours)."""
import os
import re

import playwright
import psutil

import browser
import sandbox


def _playwright_disabled_features() -> set[str]:
    """The features the installed Playwright driver disables (its chromiumSwitches.js)."""
    path = os.path.join(os.path.dirname(playwright.__file__), "driver", "package", "lib", "server", "chromium",
                        "chromiumSwitches.js")
    found = re.findall(r"'--disable-features=([^']*)'", open(path).read())
    assert len(found) == 1, found
    return set(found[0].split(","))


def _disable_features(cmdline: list[str]) -> list[str]:
    return [a.split("=", 1)[1] for a in cmdline if a.startswith("--disable-features=")]


def test_our_one_switch_repeats_every_feature_playwright_disables():
    assert _playwright_disabled_features() <= set(sandbox.DISABLED_FEATURES)
    for hosts in (None, frozenset({"shop"})):
        assert len(_disable_features(sandbox.chromium_args(hosts))) == 1


def test_the_browser_keeps_playwrights_features_disabled():
    """The browser hands its child processes the features it resolved (one sorted switch): every one
    Playwright disables is among them (before the fix, HttpsUpgrades, PaintHolding, ... were not)."""
    marker = "--webdream-test-sandbox"  # finds this browser among any others the test process runs
    # this thread's one Playwright (a second sync_playwright() on a thread that has one fails)
    b = browser.thread_playwright().chromium.launch(executable_path=browser.chromium_path(),
                                                    args=sandbox.chromium_args(None) + [marker])
    try:
        b.new_page().goto("about:blank")
        main = [proc for proc in psutil.Process().children(recursive=True)  # the browser: the driver's child
                if marker in proc.cmdline() and proc.parent().name() != "chromium"]
        assert len(main) == 1, main
        resolved = [_disable_features(c.cmdline()) for c in main[0].children(recursive=True)]
    finally:
        b.close()
    resolved = [s for s in resolved if s]
    assert resolved and all(len(s) == 1 for s in resolved)
    for s in resolved:
        assert _playwright_disabled_features() <= set(s[0].split(","))
