"""What an action and an observation mean on real pages (issue 57): scroll(dx, dy) moves the page by dx, dy CSS
pixels whatever the page's scale (BrowserGym draws MiniWoB at 1.5 for its screenshots), zoom or device scale
factor, and is done when the step ends; every text the page shows is in the tree, also one that is part of a
neighbour's name. Real Chromium: a MiniWoB task page (click-button) with elements added after reset, and
plain pages in the same browser."""
import pytest

import env
from axtree import read_tree

SEED = env.eval_seeds(1)[0]
TALL = "<div id=tall style='width:4000px;height:4000px'>tall</div>"


@pytest.fixture(scope="module")
def e():
    made = env.make_env("click-button", max_steps=40)
    yield made
    made.close()


def _put(e, html: str) -> env.Obs:
    """A fresh episode whose task area also holds `html`; the observation after a noop() (new elements have bids)."""
    e.reset(SEED)
    e._bg.page.evaluate("h => document.getElementById('area').insertAdjacentHTML('beforeend', h)", html)
    obs, _, done, info = e.step("noop()")
    assert not done and not info["env_error"], info
    return obs


def _xy(page, box: str = "") -> list[float]:
    """The page's scroll position [scrollX, scrollY], or the element `box`'s [scrollLeft, scrollTop], in CSS px."""
    if box:
        return page.evaluate("s => { const b = document.querySelector(s); return [b.scrollLeft, b.scrollTop]; }", box)
    return page.evaluate("() => [scrollX, scrollY]")


# ---------------------------------------------------------------------------------------------
# scroll(dx, dy): CSS pixels, at once


def test_scroll_moves_a_miniwob_page_by_what_it_says(e):
    _put(e, TALL)
    page = e._bg.page
    assert getattr(page, "_bgym_scale_factor", 1.0) == 1.5  # BrowserGym's screenshot scale: scroll(0, 900) moved 600
    for action, want in [("scroll(0, 900)", [0, 900]), ("scroll(300, 0)", [300, 900]), ("scroll(-100, -400)", [200, 500])]:
        _, _, _, info = e.step(action)
        assert not info["env_error"] and _xy(page) == want, (action, _xy(page))
    e.step("scroll(0, 1e6)")  # clamped at the end
    assert _xy(page)[1] == page.evaluate("() => document.documentElement.scrollHeight - innerHeight")


def test_scroll_moves_the_box_under_the_pointer_and_coordinates_are_css_pixels(e):
    # a CSS-zoomed scroll box at the right of the viewport: a wheel there moved it half of what was asked
    _put(e, "<div style='position:fixed;left:200px;top:120px'><div id=box style='width:50px;height:40px;overflow:auto;"
            "zoom:2'><div style='width:2000px;height:2000px'>inside</div></div></div>" + TALL)
    page, ns = e._bg.page, e._bg.ns
    ns["page"] = page
    r = page.evaluate("() => { const r = box.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }")
    ns["mouse_move"](*r)  # a coordinate is a CSS pixel of the viewport (BrowserGym divided it by 1.5: off the box)
    assert page.evaluate("() => box.matches(':hover')")
    e.step("scroll(0, 300)")
    assert _xy(page, "#box") == [0, 300] and _xy(page) == [0, 0]
    e.step("scroll(50, 1e6)")  # the box's end: it stops there, the page does not take the rest
    assert _xy(page, "#box")[0] == 50 and _xy(page) == [0, 0]
    e.step("scroll(0, 200)")  # the box can go no further down: the page moves
    assert _xy(page) == [0, 200]


PLAIN = ("<html style='{html}'><body style='margin:0'>"
         "<div style='width:5000px;height:5000px;background:linear-gradient(red,blue)'>plain</div></body></html>")


@pytest.mark.parametrize("scale, html", [(1, ""), (2, ""), (1, "zoom:1.5"), (1, "scroll-behavior:smooth")])
def test_scroll_moves_a_plain_page_by_css_pixels(e, scale, html):
    """A plain page (no BrowserGym scale) at device scale factor 1 or 2, CSS-zoomed, or scrolling smoothly:
    the move is exact and done when the action returns (a wheel's smooth scroll landed after it)."""
    ctx = e._bg.browser.new_context(viewport={"width": 332, "height": 214}, device_scale_factor=scale)
    try:
        page = ctx.new_page()
        page.set_content(PLAIN.format(html=html))
        ns = e._bg.ns
        ns["page"] = page
        ns["scroll"](0, 900)
        assert _xy(page) == [0, 900]
        ns["scroll"](250, -300)
        assert _xy(page) == [250, 600]
        page.evaluate("() => addEventListener('wheel', ev => ev.preventDefault(), {passive: false})")
        ns["scroll"](0, 100)  # a page that takes the wheel for itself (a map's zoom) is not scrolled
        assert _xy(page) == [250, 600]
    finally:
        ctx.close()


def test_scroll_moves_a_page_whose_body_is_the_scroller(e):
    # an app layout: the root hides overflow, the body scrolls (a wheel moves the body; the root cannot move)
    ctx = e._bg.browser.new_context(viewport={"width": 332, "height": 214})
    try:
        page = ctx.new_page()
        page.set_content("<html style='overflow:hidden;height:100%'><body style='margin:0;overflow:auto;height:100%'>"
                         "<div style='height:5000px'>app</div></body></html>")
        e._bg.ns["page"] = page
        e._bg.ns["scroll"](0, 300)
        assert page.evaluate("() => [document.body.scrollTop, document.documentElement.scrollTop]") == [300, 0]
    finally:
        ctx.close()


# ---------------------------------------------------------------------------------------------
# every text the page shows is in the tree


def test_text_that_is_part_of_a_neighbours_name_is_shown(e):
    obs = _put(e, "<div><input aria-label='Enter 7 digits'> 7</div><div><button>Submit order</button> order</div>"
                  "<div><a href='#'>Read more</a> more</div><div><input value='hello'> hell</div>"
                  "<div><button>Save <b>changes</b> now</button></div><div><button aria-label='Close'>Cl</button></div>"
                  "<div><button>Buy<div role='group'>soon <b>cheap</b></div></button></div>"
                  "<div><a href='#'>Pick<div role='listbox'><span>delta</span> <b>omega</b></div></a></div>")
    nodes = read_tree(obs.axtree)
    texts = [n.name for n in nodes if n.role == "StaticText"]
    for name, text in [("Enter 7 digits", "7"), ("Submit order", "order"), ("Read more", "more")]:
        assert any(n.name == name for n in nodes) and text in texts, (name, text, obs.axtree)
    assert "hell" in texts  # part of a textbox's value
    assert "Cl" in texts  # shown inside a button named by aria-label: its name is not that text
    # a button's name made of its texts prints them: they are not repeated
    assert any(n.role == "button" and n.name == "Save changes now" for n in nodes)
    assert "Save" not in texts and "now" not in texts
    # ... but a text Chromium left out of that name (inside a group or a listbox in the button or link) is shown
    for text in ("soon", "cheap", "delta", "omega"):  # (as a text, or an element folded with its one text)
        assert text in [n.name for n in nodes if n.role in ("StaticText", "generic")], (text, obs.axtree)
