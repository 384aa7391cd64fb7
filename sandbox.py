"""The network sandbox of every browser: which URLs a page may load, and the Chromium flags for what
the request router never sees.

    from sandbox import url_allowed, web_url_allowed, chromium_args
    url_allowed("file:///.../miniwob/html/miniwob/click-button.html")        # MiniWoB: its folder only
    web_url_allowed("http://shop:7770/cart", frozenset({"shop"}))              # a general site: its hosts only
    chromium_args(None)                   # MiniWoB's flags: no host name or address resolves
    chromium_args(frozenset({"shop"}))    # a site's: only its hosts resolve

Two policies (browser.PersistentBrowserEnv routes every request through one of them):
- MiniWoB (hosts None): only the MiniWoB html folder loads (file://), and about:blank and data: pages;
  every other request is aborted, no host name or address resolves and WebRTC sends no UDP.
- the general web (a set of host names: the WA_* variables' hosts, webarena_lite.allowed_hosts):
  http(s) and ws(s) requests to those hosts, on any port, and about:blank, data: and blob: pages; every
  other request is aborted (other hosts, file://, chrome://), and only those hosts resolve.
"""
from __future__ import annotations

import os
import re
import urllib.parse

import miniwob as _miniwob_pkg

MINIWOB_HTML_DIR = os.path.join(os.path.dirname(os.path.abspath(_miniwob_pkg.__file__)), "html")

# Chromium keeps only the last of repeated --disable-features switches (measured on Chromium 156:
# `--disable-features=WebUSB --disable-features=Translate` leaves navigator.usb defined), and
# Playwright puts its own switch before ours: so ours repeats every feature Playwright 1.44 disables
# (its chromiumSwitches.js; tests/test_sandbox.py checks the pinned driver's list is covered), else
# those (HttpsUpgrades, PaintHolding, LazyFrameLoading, ...) would be enabled again.
PLAYWRIGHT_DISABLED_FEATURES = ("ImprovedCookieControls", "LazyFrameLoading", "GlobalMediaControls",
                                "DestroyProfileOnBrowserClose", "MediaRouter", "DialMediaRouteProvider",
                                "AcceptCHFrame", "AutoExpandDetailsElement",
                                "CertificateTransparencyComponentUpdater",
                                "AvoidUnnecessaryBeforeUnloadCheckSync", "Translate", "HttpsUpgrades",
                                "PaintHolding")
# ours: OverlayScrollbars (BrowserGym's own choice; with --hide-scrollbars it only matters for screenshots)
DISABLED_FEATURES = PLAYWRIGHT_DISABLED_FEATURES + ("OptimizationHints", "OverlayScrollbars")

# Chromium flags for many small headless browsers on few cores.
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
    "--disable-features=" + ",".join(DISABLED_FEATURES),  # the only one Chromium reads (above)
    "--renderer-process-limit=1",
    # The network, for what the request router (url_allowed) never sees. MiniWoB is file:// only.
    # No host name or address resolves: WebSockets, and the preconnect of a blocked navigation,
    # reached a local server before this flag, not with it.
    "--host-resolver-rules=MAP * ~NOTFOUND",
    # No WebRTC UDP (a STUN request to a literal address reached a local UDP port before this flag).
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
]
_RESOLVER = "--host-resolver-rules=MAP * ~NOTFOUND"


def chromium_args(hosts: frozenset[str] | None) -> list[str]:
    """The Chromium flags of a policy: CHROMIUM_ARGS for MiniWoB (hosts None); for the general web the
    same, except that the given hosts resolve (each an EXCLUDE of the resolver's rule)."""
    if hosts is None:
        return list(CHROMIUM_ARGS)
    rule = _RESOLVER + "".join(f", EXCLUDE {h}" for h in sorted(hosts))
    return [rule if a == _RESOLVER else a for a in CHROMIUM_ARGS]


def web_route_pattern(hosts: frozenset[str]) -> re.Pattern:
    """The URLs a general site's router has to see: every URL but those that plainly go to one of `hosts`
    (scheme, host, optional port, then the path). Playwright matches a regex in the browser, so an allowed
    request never waits on Python: no round trip per resource, and no page closed while its navigation
    waits on a route callback (one hung a reset that closed BrowserGym's login tab). The router still
    decides each URL it sees (web_url_allowed), so a URL the pattern lets through by mistake is refused."""
    names = "|".join(re.escape(h) for h in sorted(hosts))
    return re.compile(rf"^(?!(?:https?|wss?)://(?:{names})(?::\d+)?(?:[/?#]|$)|about:blank|data:|blob:)")


def url_allowed(url: str) -> bool:
    """MiniWoB's rule: only MiniWoB's own files (and blank/data pages) may load."""
    if url.startswith(("about:blank", "data:")):
        return True
    if not url.startswith("file://"):
        return False
    path = os.path.normpath(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    return path == MINIWOB_HTML_DIR or path.startswith(MINIWOB_HTML_DIR + os.sep)


def web_url_allowed(url: str, hosts: frozenset[str]) -> bool:
    """The general web's rule: http(s) and ws(s) to one of `hosts` (lower-case host names, any port), and
    about:blank, data: and blob: pages. Everything else is refused: other hosts, file://, chrome://."""
    if url.startswith(("about:blank", "data:", "blob:")):
        return True
    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port  # (.port raises for a port out of range)
    except ValueError:  # a malformed URL (a bad port, a broken IPv6 literal)
        return False
    return parts.scheme in ("http", "https", "ws", "wss") and host is not None and host.lower() in hosts
