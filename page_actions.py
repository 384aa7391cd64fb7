"""How a canonical action runs on the page: BrowserGym's own action functions, and ours where theirs
do not act on what the agent sees.

    from page_actions import action_namespace
    ns = action_namespace(send_message=lambda text: print(text))   # one namespace per environment
    ns["page"] = page                                               # rebound before every action
    ns["click"]("13"); ns["select_option"]("9", "Blue")             # (actions.split_action's name, args)

- BrowserGym's library (browsergym-core 0.14.3: its "chat", "infeas", "bid", "coord", "nav" and "tab"
  subsets, no demo mode, no retry with force), its Playwright waits of 500 ms raised to
  ACTION_TIMEOUT_MS (below), compiled once at import and exec'd into each namespace:
  safe, it is BrowserGym's own code; model text is never executed (actions.py parses it into a name
  and literal arguments). The tab functions (new_tab, tab_focus, tab_close) rebind the namespace's
  "page" to the tab they make active: the caller reads it back after the call;
- check() and uncheck(), from the same library but in none of its subsets;
- select_option: ours (select_options). BrowserGym's passes the text to Playwright, which matches an
  option's value before its label: with options value="Alpha" labelled "Other" and one labelled
  "Alpha", select_option(bid, 'Alpha') chose "Other", which the agent never saw as 'Alpha'.
- scroll: ours (scroll_page). BrowserGym's divides the deltas by the page's screenshot scale (1.5 on
  MiniWoB: scroll(0, 900) moved 600 px) and sends a wheel, which moves screen pixels (fewer CSS pixels
  in a CSS-zoomed scroller) and lands after the call returns (smooth scrolling: the observation could
  see the page before it moved). Coordinates of the "coord" functions are CSS pixels too (no scale).
"""
from __future__ import annotations

import inspect
import re

from browsergym.core.action import functions as _bg_functions
from browsergym.core.action.highlevel import HighLevelActionSet

from actions import WEB_ACTIONS
from axtree import clean, quote

# How long an action waits for its element to be actionable (attached, visible, stable, enabled,
# receiving events), in ms. BrowserGym passes 500 to every Playwright call of its actions. That is a
# wall-clock bound on work the page does at the speed of its renderer: with 16 browsers on two cores a
# click on a plain, visible button of click-button-sequence met it on its first action (rl-e9's probe,
# docs/rl.md), and 2-12 of the 300 episodes of an evaluation met it, more under load. A timeout is an error
# the agent sees, so the load wrote failures into rewards and evaluations. 3 s holds under that load;
# an element that never becomes actionable (hidden, covered) now costs 3 s of waiting, not CPU.
ACTION_TIMEOUT_MS = 3000
_BROWSERGYM_TIMEOUT = re.compile(r"\btimeout=500\b")


def _with_timeout(source: str, where: str) -> str:
    """BrowserGym's action source with its 500 ms Playwright timeouts read from the namespace's
    ACTION_TIMEOUT_MS. Errors: RuntimeError when the source has none (a BrowserGym whose waits changed)."""
    out, n = _BROWSERGYM_TIMEOUT.subn("timeout=ACTION_TIMEOUT_MS", source)
    if not n:
        raise RuntimeError(f"{where}: no 'timeout=500' in BrowserGym's action source; check ACTION_TIMEOUT_MS's rewrite")
    return out


_ACTION_SET = HighLevelActionSet(subsets=["chat", "infeas", "bid", "coord", "nav", "tab"], demo_mode="off", strict=True,
                                 multiaction=False, retry_with_force=False)
_ACTION_CODE = compile(_with_timeout(_ACTION_SET.python_includes, "actions"), "<browsergym actions>", "exec")
# check() and uncheck() are in BrowserGym's function library but in none of its action subsets
# (browsergym-core 0.14.3 comments them out); the grammar allows them, so they join the namespace.
_EXTRA_ACTION_CODE = compile(_with_timeout("\n\n".join(inspect.getsource(f) for f in (_bg_functions.check, _bg_functions.uncheck)),
                                           "check, uncheck"), "<browsergym actions: check, uncheck>", "exec")


def action_namespace(send_message, report_infeasible=None, timeout_ms: int = ACTION_TIMEOUT_MS) -> dict:
    """A fresh namespace holding a function for every action of the grammars (actions.WEB_ACTIONS, which
    holds MiniWoB's, but noop); its "page" must be set before each call. send_message(text): what
    send_msg_to_user does; report_infeasible(reason): what report_infeasible does (nothing by default);
    timeout_ms: how long an action waits for its element (ACTION_TIMEOUT_MS; the namespace's
    "ACTION_TIMEOUT_MS", read at each call).
    Errors: RuntimeError if an action of the grammar has no function (it would fail every episode)."""
    ns: dict = {"page": None, "DEMO_MODE": False, "send_message_to_user": send_message,
                "report_infeasible_instructions": report_infeasible or (lambda reason: None),
                "ACTION_TIMEOUT_MS": timeout_ms}
    exec(_ACTION_CODE, ns)  # safe: BrowserGym's own action library, compiled at import
    exec(_EXTRA_ACTION_CODE, ns)  # safe: check/uncheck from the same library
    ns["select_option"] = lambda bid, options: select_options(ns["get_elem_by_bid"](ns["page"], bid), bid, options,
                                                              ns["ACTION_TIMEOUT_MS"])
    ns["scroll"] = lambda delta_x, delta_y: scroll_page(ns["page"], delta_x, delta_y)
    # BrowserGym maps coordinates from its scaled screenshot (page._bgym_scale_factor, 1.5 on MiniWoB); this
    # agent reads no screenshot, so a coordinate (mouse_click, scroll_at, ...) is a CSS pixel of the viewport.
    ns["map_coordinates"] = lambda page, x, y: (x, y)
    missing = [a for a in WEB_ACTIONS if a != "noop" and not callable(ns.get(a))]
    if missing:
        raise RuntimeError(f"no function for the grammar's actions {missing}")
    return ns


# the options of a <select>, (label, value) each, in order; for another element its tag
_OPTIONS_JS = "el => el.tagName === 'SELECT' ? [...el.options].map(o => [o.label, o.value]) : el.tagName.toLowerCase()"
MAX_OPTIONS_SHOWN = 20  # an error names at most this many options, then how many more there are


def select_options(elem, bid: str, wanted, timeout_ms: int = ACTION_TIMEOUT_MS) -> None:
    """Select in the <select> `elem` (a Playwright Locator) each option `wanted` names (one text or a
    list): the option whose label, the text the tree shows (whitespace collapsed), is that text; the
    option whose value is that text only when no label is. Errors, each naming the element's options for
    the agent, and selecting nothing: ValueError for an option that no label or value matches, for one
    that several options match, for an element that is not a <select>; Playwright's own error for
    several options in a <select> without `multiple`."""
    options = clean(elem.evaluate(_OPTIONS_JS, timeout=timeout_ms))
    if isinstance(options, str):
        raise ValueError(f"select_option works on a <select> (a combobox or listbox in the tree); [{bid}] is a <{options}>")
    labels = [" ".join(label.split()) for label, _ in options]
    more = len(labels) - MAX_OPTIONS_SHOWN
    shown = ", ".join(quote(x) for x in labels[:MAX_OPTIONS_SHOWN]) + (f" and {more} more" if more > 0 else "")
    picked = []
    for w in [wanted] if isinstance(wanted, str) else list(wanted):
        w = str(w)
        hits = [i for i, label in enumerate(labels) if label == " ".join(w.split())]
        hits = hits or [i for i, (_, value) in enumerate(options) if value == w]
        if len(hits) != 1:
            why = f"{len(hits)} options of [{bid}] match {quote(w)}" if hits else f"[{bid}] has no option {quote(w)}"
            raise ValueError(f"{why}; its options: {shown}")
        picked.append(hits[0])
    elem.select_option(index=list(dict.fromkeys(picked)), timeout=timeout_ms)


# scroll(dx, dy) as a wheel at the pointer would do it, in CSS pixels, at once. The element under the pointer
# is the deepest :hover one (Playwright's mouse stays where the last click or hover put it), inside same-origin
# frames too; none (the mouse never moved): the page. A cancelable wheel event goes to it first: a page that
# handles the wheel itself (a map's zoom) and cancels it is not scrolled. Then, as the browser chains a wheel,
# the innermost scroll container around it that can move takes the whole delta; if none can, the page does.
# behavior 'instant' overrides a page's `scroll-behavior: smooth`, so the move is done when this returns.
# Returns how far the scrolled box moved, [x, y], in its CSS pixels.
SCROLL_JS = """([dx, dy]) => {
  let doc = document, el = null;
  for (;;) {
    const hovered = doc.querySelectorAll(':hover');
    el = hovered.length ? hovered[hovered.length - 1] : null;
    let inner = null;
    try { inner = el && el.contentDocument; } catch (e) {}
    if (!inner) break;
    doc = inner;
  }
  const win = doc.defaultView, r = el ? el.getBoundingClientRect() : null;
  const wheel = new win.WheelEvent('wheel', {deltaX: dx, deltaY: dy, deltaMode: 0, bubbles: true, cancelable: true,
    composed: true, view: win, clientX: r ? r.left + r.width / 2 : 0, clientY: r ? r.top + r.height / 2 : 0});
  if (!(el || doc.documentElement).dispatchEvent(wheel)) return [0, 0];
  // which axes a user can scroll: a box's overflow auto, scroll or overlay; the page's unless its root's (or,
  // when that is visible, the body's) overflow is hidden or clip (a modal's scroll lock)
  const axes = (box, page) => {
    let st = win.getComputedStyle(box);
    if (page && st.overflowX === 'visible' && st.overflowY === 'visible' && doc.body) st = win.getComputedStyle(doc.body);
    const ok = v => page ? !/hidden|clip/.test(v) : /auto|scroll|overlay/.test(v);
    return [ok(st.overflowX), ok(st.overflowY)];
  };
  const move = (box, [ax, ay]) => {
    const x = box.scrollLeft, y = box.scrollTop;
    box.scrollBy({left: ax ? dx : 0, top: ay ? dy : 0, behavior: 'instant'});
    return [box.scrollLeft - x, box.scrollTop - y];
  };
  const page = doc.scrollingElement || doc.documentElement;
  // (the body is a box like any other: a page whose root hides overflow and whose body scrolls is scrolled there)
  for (let box = el || doc.body; box && box !== page && box !== doc.documentElement;
       box = box.parentElement || (box.getRootNode().host ?? null)) {
    const can = axes(box, false);
    if (!can[0] && !can[1]) continue;
    const moved = move(box, can);
    if (moved[0] || moved[1]) return moved;
  }
  return move(page, axes(doc.documentElement, true));
}"""


def scroll_page(page, delta_x: float, delta_y: float) -> list[float]:
    """scroll(delta_x, delta_y): move the scroll box under the mouse pointer (the innermost one around the
    element under it that can move, else the page) by delta_x, delta_y CSS pixels, positive right and down,
    clamped at its ends, whatever the page's zoom, CSS zoom or device scale factor; done (no animation) when
    this returns. A page that cancels the wheel event sent first is not scrolled. Returns [dx, dy] moved (CSS
    pixels of the box). Errors: Playwright's, when the page is gone."""
    return page.evaluate(SCROLL_JS, [delta_x, delta_y])
