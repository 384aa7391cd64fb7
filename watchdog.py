"""Wall-clock bounds for calls into a browser, kept by killing the browser's processes from another thread.

    import watchdog
    with watchdog.guard(marker, 15.0, grace=3.0) as g:  # marker: the env's `--webdream-env=<marker>` tag
        page.evaluate(...)                             # a call Playwright cannot time out
    g.fired                                            # 0 in time, 1 its renderers were killed, 2 its browser was
    watchdog.sigkill(watchdog.chromium_pids(marker))   # kill one env's Chromium now, from any thread
    watchdog.chromium_rss_mb(marker)                   # its memory in MiB (PSS, else RSS)

Every WebEnv launches its own Chromium with the inert flag `--webdream-env=<marker>` (browser.py).
An env's processes are that browser and all its descendants (renderers, zygotes, utilities), found
with psutil by that flag and the parent links. The watchdog is one daemon thread shared by every
env; `guard` arms it around one call (see _Watchdog for the escalation). WebEnv's docstring (env.py)
says how the bounds of reset, step and close combine.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time

import psutil

logger = logging.getLogger(__name__)

KILL_GRACE_S = 3.0  # after a renderer kill, how long a still-blocked call waits before the browser is killed

# ----------------------------------------------------------------------------------------------
# An env's processes


def _is_env_browser(args: list[str], marker: str) -> bool:
    """Whether a command line is the Chromium browser process launched for `marker` (not one of its
    children, which carry a --type=, and not another env's browser: the flag is compared whole)."""
    cmd = " ".join(args)
    return f"--webdream-env={marker}" in args and "--type=" not in cmd and "chrom" in cmd


def env_processes(marker: str) -> dict[int, str]:
    """pid -> command line (arguments joined by spaces) of the Chromium launched with
    --webdream-env=<marker> and all its descendants; {} when it is not running. Processes that exit
    while they are read, and zombies, are left out."""
    table = {}
    for pid in psutil.pids():
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                table[pid] = (p.ppid(), p.cmdline())
        except psutil.Error:  # gone, a zombie (no command line), or not readable
            continue
    roots = {p for p, (_, args) in table.items() if _is_env_browser(args, marker)}
    keep, frontier = set(roots), set(roots)
    while frontier:
        frontier = {p for p, (pp, _) in table.items() if pp in frontier and p not in keep}
        keep |= frontier
    return {p: " ".join(table[p][1]) for p in keep}


def chromium_pids(marker: str) -> list[int]:
    """The Chromium launched with --webdream-env=<marker> and all its descendants, sorted."""
    return sorted(env_processes(marker))


def renderer_pids(marker: str) -> list[int]:
    """The renderer processes of the Chromium launched with --webdream-env=<marker>, sorted."""
    return sorted(p for p, cmd in env_processes(marker).items() if "--type=renderer" in cmd)


def sigkill(pids) -> None:
    """SIGKILL each pid (an iterable of ints); ones already gone are skipped. Never raises for a
    process that is gone or not ours."""
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def chromium_rss_mb(marker: str) -> float:
    """Memory of one env's Chromium processes in MiB: the sum of their proportional set sizes
    (PSS: shared pages split among the processes that share them) where the system reports it,
    else of their resident set sizes (RSS). 0.0 when the browser is not running."""
    total = 0
    for pid in chromium_pids(marker):
        try:
            p = psutil.Process(pid)
            try:
                mem = p.memory_full_info()
                total += getattr(mem, "pss", mem.rss)
            except psutil.AccessDenied:
                total += p.memory_info().rss
        except psutil.Error:  # gone meanwhile
            continue
    return total / 2**20


# ----------------------------------------------------------------------------------------------
# The watchdog


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
            # (at interpreter exit a new thread never runs and start() would wait for it forever)
            if (self._thread is None or not self._thread.is_alive()) and not sys.is_finalizing():
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
                    procs = env_processes(g.marker)
                    pids = [p for p, cmd in procs.items() if g.fired >= 2 or "--type=renderer" in cmd]
                    logger.warning("watchdog: a browser call of env %s is past its deadline: SIGKILL %s %s",
                                   g.marker, "its browser" if g.fired >= 2 else "its renderers", pids)
                    sigkill(pids)


_WATCHDOG = _Watchdog()


def guard(marker: str, seconds: float, grace: float = KILL_GRACE_S):
    """A context manager that bounds the call inside it to `seconds` of wall-clock time: past that,
    the renderers of the env's Chromium (found by `marker`) are SIGKILLed; `grace` seconds later, if the
    call still runs, the whole browser. It yields the guard: `.fired` is 0 (in time), 1 or 2 (what was
    killed). Thread-safe; no kill lands after the block has exited."""
    return _WATCHDOG.guard(marker, seconds, grace)
