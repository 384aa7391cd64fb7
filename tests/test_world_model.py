"""The Δ world model: exact diff/apply, tolerance of model output, samples, DreamEnv with a tiny model.

tests/data/transitions.jsonl holds real MiniWoB transitions (real Chromium, experts + random
actions); rewrite it with `python tests/test_world_model.py`.
"""
import json
import os
import re
import shutil
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import compress  # noqa: E402
import policy  # noqa: E402
import delta as dfmt  # noqa: E402
import transitions as trans  # noqa: E402
import world_model as wm  # noqa: E402
import wm_eval  # noqa: E402
from actions import WEB_ACTIONS, parse_action, split_action  # noqa: E402
from axtree import line_bid, quote  # noqa: E402
from env import Obs  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "transitions.jsonl")

OLD = "\n".join([
    "[12] generic 'faucibus in nibh'",
    "[13] button 'no'",
    "[17] button 'submit'",
    "StaticText 'Hello'",
    " StaticText 'world'",
    "[19] textbox",
])


OLD2 = "[1] tablist\n [2] tab 'a'\n[3] tabpanel 'a'\n StaticText 'x'\n [4] link 'y'\n  StaticText 'z'\n[5] button 'ok'"


def st8(axtree, url="miniwob/a.html", error="", hidden=""):
    return {"goal": "Click no.", "url": url, "axtree": axtree, "error": error, "hidden": hidden}


def test_unchanged_page_is_one_short_line():
    assert dfmt.diff(st8(OLD), st8(OLD)) == "done: no"
    assert dfmt.diff(st8(""), st8("")) == "done: no"
    assert dfmt.apply(st8(OLD), "done: no") == (st8(OLD), 0)


@pytest.mark.parametrize("new, done, delta", [
    # changed bid line (flags), keyed by its bid
    (OLD.replace("[13] button 'no'", "[13] button 'no', checked"), True,
     "~ [13] button 'no', checked\ndone: yes"),
    # the focus moves: the line rewritten (the default; FOCUS_HEADER: a header, below)
    (OLD.replace("[13] button 'no'", "[13] button 'no', focused"), True, "~ [13] button 'no', focused\ndone: yes"),
    # removed bid line and removed line without bid (the 2nd line after [17])
    (OLD.replace("[13] button 'no'\n", "").replace(" StaticText 'world'\n", ""), "fail",
     "- [13]\n- [17]+2\ndone: fail"),
    # changed line without bid, keyed by position
    (OLD.replace("'Hello'", "'Bye'"), False, "~ [17]+1 StaticText 'Bye'\ndone: no"),
    # added lines: at the top, after a bid line, indented, at the end
    ("StaticText 'Top'\n" + OLD.replace("[17] button 'submit'\n", "[17] button 'submit'\n [30] link 'x'\n")
     + "\n[31] button 'end'", False, "+ ^ StaticText 'Top'\n+ [17]  [30] link 'x'\n+ [19] [31] button 'end'\ndone: no"),
])
def test_hand_written_deltas(new, done, delta):
    assert dfmt.diff(st8(OLD), st8(new), done) == delta
    assert dfmt.apply(st8(OLD), delta) == (st8(new), 0)


def test_focus_is_a_header_the_edits_see_applied():
    """diff(..., focus=True): `focus:` moves the flag (first among the flags) before the edits; a line that also changes
    otherwise is rewritten with the flag; a new focused line brings its own flag (`focus: none`)."""
    a = st8("[1] textbox value='x', focused\n[2] checkbox 'c'\n StaticText ', focused'\n[3] button 'go'")
    cases = [  # (new tree, Δ)
        ("[1] textbox value='x'\n[2] checkbox 'c', focused\n StaticText ', focused'\n[3] button 'go'",
         "focus: [2]\ndone: no"),
        ("[1] textbox value='x'\n[2] checkbox 'c', focused, checked\n StaticText ', focused'\n[3] button 'go'",
         "focus: [2]\n~ [2] checkbox 'c', focused, checked\ndone: no"),
        ("[1] textbox value='x'\n[2] checkbox 'c'\n StaticText ', focused'\n[3] button 'go'\n[4] button 'new', focused",
         "focus: none\n+ [3] [4] button 'new', focused\ndone: no"),
        ("[1] textbox value='xy', focused\n[2] checkbox 'c'\n StaticText ', focused'\n[3] button 'go'",
         "~ [1] textbox value='xy', focused\ndone: no"),  # the focus stays: no header
    ]
    for new, delta in cases:
        assert dfmt.diff(a, st8(new), focus=True) == delta
        assert dfmt.apply(a, delta) == (st8(new), 0)
    # a model's focus on a bid the page lacks: counted, the flag leaves its old line (a model that names the
    # focused line its own `+` adds still gets one focused line); not a bid: skipped and counted
    assert dfmt.apply(a, "focus: [9]\n~ [3] button 'stop'\ndone: no") == (
        st8(a["axtree"].replace("'go'", "'stop'").replace(", focused\n[2]", "\n[2]")), 1)
    assert dfmt.apply(a, "focus: here\ndone: no") == (a, 1)
    assert dfmt.apply(a, "focus: [2]\nfocus: [3]\ndone: no")[1] == 1


def test_url_and_error_lines_lead_and_only_when_there_is_one():
    a, b = st8(OLD), st8(OLD, url="miniwob/b.html", error="ValueError: Could not find element with bid \"99\"")
    d = dfmt.diff(a, b)
    assert d == 'url: miniwob/b.html\nerror: ValueError: Could not find element with bid "99"\ndone: no'
    assert dfmt.apply(a, d) == (b, 0)
    # the error belongs to the new page only: the next Δ without an error clears it
    assert dfmt.apply(b, "done: no")[0]["error"] == ""


def test_replaced_stretch_pairs_lines_without_bid_and_inserts_after_the_survivor():
    old = "[17] tablist\n [18] tab 'a'\n  StaticText 'p'\n  StaticText 'q'\n[24] tabpanel"
    new = "[17] tablist\n [19] tab 'a'\n  StaticText 'p2'\n  [30] link 'z'\n[24] tabpanel"
    d = dfmt.diff(st8(old), st8(new), subtree=False)
    assert d == ("+ [17]  [19] tab 'a'\n- [18]\n~ [18]+1   StaticText 'p2'\n+ [18]+1   [30] link 'z'\n"
                 "- [18]+2\ndone: no")
    assert dfmt.apply(st8(old), d) == (st8(new), 0)
    # the same change as one subtree block: [18] and its two children give way to three new lines
    d = dfmt.diff(st8(old), st8(new))
    assert d == "= [18]  [19] tab 'a'\n|   StaticText 'p2'\n|   [30] link 'z'\ndone: no"
    assert dfmt.apply(st8(old), d) == (st8(new), 0)


def test_done_lines():
    assert dfmt.predicted_done("~ [13] button 'no'\ndone: yes")
    assert not dfmt.predicted_done("done: no") and not dfmt.predicted_done("done: fail") and not dfmt.predicted_done("")
    assert dfmt.predicted_status("done: fail") == "fail"
    assert dfmt.predicted_status("done: maybe") == "no"
    assert dfmt.predicted_status("done: yes\ndone: no") == "yes"  # the first one wins
    assert dfmt.diff(st8(OLD), st8(OLD), "yes") == "done: yes"
    with pytest.raises(ValueError):
        dfmt.diff(st8(OLD), st8(OLD), "maybe")


def test_obs_dataclass_and_recorded_dicts_are_both_states():
    o = Obs("g", "u", OLD, "", 3)
    assert dfmt.as_state(o) == {"goal": "g", "url": "u", "axtree": OLD, "error": "", "hidden": ""}
    assert dfmt.as_state({"url": "u", "axtree": OLD}) == {"goal": "", "url": "u", "axtree": OLD, "error": "",
                                                          "hidden": ""}


def test_hidden_content_is_in_the_prompt_and_kept_by_apply(tok):
    """A closed tab's text (Obs.hidden) goes into the world model's prompt, after the tree, and a Δ
    leaves it as it is; a state without it gets the prompt it always had."""
    hidden = "[26] tabpanel\n [27] paragraph 'Habitasse lectus'"
    s = st8(OLD2, hidden=hidden)
    user = wm.wm_messages("Click y.", s, "click('2')")[1]["content"]
    assert user.endswith(f"{OLD2}\nHidden:\n{hidden}\nAction: click('2')")
    assert "Hidden" not in wm.wm_messages("Click y.", st8(OLD2), "click('2')")[1]["content"]
    assert "\nHidden:\n" not in tok.decode(wm.wm_prompt(tok, "Click y.", st8(OLD2), "click('2')"))
    assert "Habitasse" in tok.decode(wm.wm_prompt(tok, "Click y.", s, "click('2')"))
    # a prompt budget too small for the hidden lines: they are cut from their end after the tree, never raised
    big = st8(OLD2, hidden="\n".join(f"[{i}] paragraph 'word {i}'" for i in range(100, 140)))
    full = wm.wm_prompt(tok, "Click y.", big, "click('2')", max_tokens=4096)
    cut = wm.wm_prompt(tok, "Click y.", big, "click('2')", max_tokens=len(full) // 3)
    assert len(cut) <= len(full) // 3 and "[100] paragraph" in tok.decode(cut) and "[139]" not in tok.decode(cut)
    nxt, bad = dfmt.apply(s, "~ [5] button 'ok', focused\ndone: no")
    assert bad == 0 and nxt["hidden"] == hidden and nxt["axtree"].endswith("focused")
    assert dfmt.as_state(Obs("g", "u", OLD, hidden=hidden))["hidden"] == hidden
    # a Δ that shows a hidden panel takes that panel's block (and only it) off the hidden list, as a real page does
    two = hidden + "\n[30] tabpanel\n [31] paragraph 'Other'"
    nxt, bad = dfmt.apply(st8(OLD2, hidden=two), "+ ^ [26] tabpanel\n+ ^ StaticText 'x'\ndone: no")
    assert bad == 0 and nxt["hidden"] == "[30] tabpanel\n [31] paragraph 'Other'"
    nxt, _ = dfmt.apply(st8(OLD2, hidden=two), "+ ^ [31] paragraph 'Other'\ndone: no")  # a bid deeper in a block
    assert nxt["hidden"] == hidden
    # a dream starts from a recorded page with its hidden content (DreamEnv.reset: as_state of the start state)
    rec = {"task": "click-tab-2", "seed": 1, "step": 0, "goal": "Click y.", "action": "click('2')",
           "obs": {"url": "miniwob/a.html", "axtree": OLD2, "error": "", "hidden": hidden}}
    (start,) = trans.start_states([rec])
    assert dfmt.as_state(start)["hidden"] == hidden


# ----------------------------------------------------------------------------------------------
# Round trip: generated trees and real transitions

ROLES = ["button", "textbox", "StaticText", "generic", "link", "tab", "checkbox", "heading"]
NAME = st.one_of(st.just(""),
                 st.text(st.characters(blacklist_characters="\n"), max_size=12).map(lambda s: " " + repr(s)))
BID_LINE = st.builds(lambda ind, bid, role, name, flags: " " * ind + f"[{bid}] {role}{name}{flags}",
                     st.integers(0, 3), st.one_of(st.integers(1, 40).map(str), st.just("a7")), st.sampled_from(ROLES),
                     NAME, st.sampled_from(["", ", focused", ", checked", ", focused, checked"]))
PLAIN_LINE = st.builds(lambda ind, role, name: " " * ind + role + name, st.integers(0, 3), st.sampled_from(ROLES), NAME)
# lines that look like Δ syntax, refs or nothing at all
WEIRD_LINE = st.one_of(st.sampled_from(["", " ", "[3]+1 x", "~ [3] x", "- [3]", "+ ^ x", "^+1", "done: yes",
                                        "url: x", "... (12 more lines)", "[3]", " [4]", "[x] y", "[5]x"]),
                       st.text(st.characters(blacklist_characters="\n"), max_size=15))
LINE = st.one_of(BID_LINE, BID_LINE, PLAIN_LINE, WEIRD_LINE)


def unique_bids(lines):
    """Real trees name each bid once (one line per node): keep the first line of each bid."""
    seen, out = set(), []
    for x in lines:
        b = line_bid(x)
        if b is None or b not in seen:
            seen.add(b)
            out.append(x)
    return out


@st.composite
def transition(draw):
    old = unique_bids(draw(st.lists(LINE, max_size=25)))
    if draw(st.booleans()):
        new = unique_bids(draw(st.lists(LINE, max_size=25)))  # an unrelated page
    else:  # a few edits of the old page
        new = list(old)
        for _ in range(draw(st.integers(0, 6))):
            kind = draw(st.sampled_from(["del", "ins", "chg", "move", "swap"]))
            i = draw(st.integers(0, max(0, len(new) - 1)))
            if kind == "ins" or not new:
                new.insert(draw(st.integers(0, len(new))), draw(LINE))
            elif kind == "swap":  # a panel swap: a line and its subtree give way to other lines
                new[i:dfmt.subtree_end(new, i)] = draw(st.lists(LINE, max_size=8))
            elif kind == "del":
                new.pop(i)
            elif kind == "chg":
                new[i] = new[i] + draw(st.sampled_from([", focused", "x", " value='a'"]))
            else:
                new.insert(draw(st.integers(0, len(new) - 1)), new.pop(i))
        new = unique_bids(new)
    text = st.text(st.characters(blacklist_characters="\n"), max_size=10)
    a = {"goal": "g", "url": draw(text), "axtree": "\n".join(old), "error": draw(text),
         "hidden": draw(st.text(st.characters(blacklist_characters="\n["), max_size=10))}  # no bid: stays
    b = {"goal": "g", "url": draw(st.one_of(st.just(a["url"]), text)), "axtree": "\n".join(new), "error": draw(text),
         "hidden": a["hidden"]}  # Δ edits the tree; hidden content without a bid the tree shows stays
    return a, b


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transition(), st.sampled_from([True, False, "fail"]))
def test_round_trip_on_generated_trees(t, done):
    a, b = t
    d = dfmt.diff(a, b, done)
    assert dfmt.apply(a, d) == (b, 0)
    assert dfmt.predicted_done(d) == (done is True)
    assert d.split("\n")[-1].startswith("done: ")
    lines = dfmt.diff(a, b, done, subtree=False)  # line by line: exact too, and never shorter
    assert dfmt.apply(a, lines) == (b, 0) and len(d) <= len(lines)
    assert "\n= " not in "\n" + lines and "\n| " not in "\n" + lines


@st.composite
def typed_transition(draw):
    """A fill and the page it leaves: lines whose value is the typed text, its dots, other text, or
    page text that looks like a placeholder (inside a quoted name, or a value the old page showed)."""
    typed = draw(st.text(st.characters(blacklist_characters="\n"), max_size=8))
    value = st.sampled_from([quote(typed), quote(dfmt.HIDDEN_CHAR * len(typed)), "'x'", "''", "5"])
    name = st.one_of(NAME, st.sampled_from([" ' value=<typed>'", " \"it's value=<typed hidden>\"", " '<typed>'"]))
    line = st.builds(lambda ind, bid, role, nm, v, flags: " " * ind + f"[{bid}] {role}{nm} value={v}{flags}",
                     st.integers(0, 2), st.integers(1, 40).map(str), st.sampled_from(ROLES), name, value,
                     st.sampled_from(["", ", focused"]))
    old = unique_bids(draw(st.lists(st.one_of(LINE, line), max_size=12)))
    new = unique_bids(draw(st.permutations(old + draw(st.lists(st.one_of(LINE, line), max_size=6)))))
    bid = str(draw(st.integers(1, 40)))
    action = draw(st.sampled_from([f"fill({bid!r}, {typed!r})", f"select_option({bid!r}, {typed!r})",
                                   f"select_option({bid!r}, [{typed!r}])", f"keyboard_type({typed!r})"]))
    return st8("\n".join(old)), st8("\n".join(new)), parse_action(action, WEB_ACTIONS)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_transition())
def test_typed_values_round_trip_exactly(t):
    a, b, action = t
    d = dfmt.diff(a, b, action=action)
    assert dfmt.apply(a, d, action=action) == (b, 0)
    assert dfmt.apply(a, dfmt.diff(a, b), action=action) == (b, 0)  # values written out: page text kept as it is


def test_a_typed_value_is_a_placeholder_the_action_fills_back():
    a = st8("[14] textbox 'Name'\n[16] textbox, focused\n[13] combobox value='Maryl'\n[15] button 'Submit'")
    b = st8("[14] textbox 'Name' value='Myron', focused\n[16] textbox\n[13] combobox value='Maryl'\n[15] button 'Submit'")
    d = dfmt.diff(a, b, action="fill('14', 'Myron')")
    assert d == "~ [14] textbox 'Name' value=<typed>, focused\n~ [16] textbox\ndone: no"
    assert dfmt.apply(a, d, action="fill('14', 'Myron')") == (b, 0)
    assert dfmt.diff(a, b) == dfmt.diff(a, b, action="click('14')") == d.replace("<typed>", "'Myron'")
    # a password field shows one dot per character: the Δ does not count them
    pw = st8("[16] textbox value='\u2022\u2022\u2022\u2022\u2022', focused\n[13] combobox value='Maryl'\n[15] button 'Submit'")
    d = dfmt.diff(a, pw, action="fill('16', '3Pn38')")
    assert "~ [16] textbox value=<typed hidden>, focused" in d.split("\n")
    assert dfmt.apply(a, d, action="fill('16', '3Pn38')") == (pw, 0)
    # line precision/recall compare the lines written out: a model trained before the placeholder scores alike
    assert dfmt.delta_lines(d, "fill('16', '3Pn38')") == dfmt.delta_lines(dfmt.diff(a, pw), "fill('16', '3Pn38')")
    assert dfmt.delta_lines(d) != dfmt.delta_lines(dfmt.diff(a, pw))
    o, bad = dfmt.apply(a, d, action="fill('16', 'abc')")  # the model's dots are the action's: three
    assert bad == 0 and "[16] textbox value='\u2022\u2022\u2022', focused" in o["axtree"]
    # select_option's option; a value the old page already showed is not rewritten
    sel = st8(a["axtree"].replace("value='Maryl'", "value='Christy'"))
    assert dfmt.diff(a, sel, action="select_option('13', 'Christy')") == "~ [13] combobox value=<typed>\ndone: no"
    assert dfmt.diff(a, a, action="fill('13', 'Maryl')") == "done: no"
    # a placeholder with an action that typed nothing cannot be written out: skipped and counted
    for act in ("click('16')", None, "not an action"):
        o, bad = dfmt.apply(a, "~ [16] textbox value=<typed>\n= [15] [15] button 'Go' value=<typed hidden>\n"
                               "| StaticText 'x'\ndone: no", action=act)
        assert bad == 3 and o["axtree"] == a["axtree"]
    # page text that reads like a placeholder is text: inside a quoted name it is never replaced
    odd = st8("[20] StaticText ' value=<typed>'\n[21] textbox ' value=<typed>' value='<typed>'")
    o, bad = dfmt.apply(st8(""), "+ ^ [20] StaticText ' value=<typed>'\n+ ^ [21] textbox ' value=<typed>' value=<typed>\n"
                                 "done: no", action="fill('21', '<typed>')")
    assert bad == 0 and o["axtree"] == "[20] StaticText ' value=<typed>'\n[21] textbox ' value=<typed>' value='<typed>'"
    assert dfmt.apply(st8(""), dfmt.diff(st8(""), odd, action="fill('21', '<typed>')"), action="fill('21', '<typed>')") == (odd, 0)


def test_typed_text_of_each_action():
    assert dfmt.typed_text("fill('14', 'Myron')") == "Myron"
    assert dfmt.typed_text("select_option('9', 'b')") == dfmt.typed_text("select_option('9', ['b'])") == "b"
    assert dfmt.typed_text("keyboard_type('hi')") == "hi"
    for a in ("select_option('9', ['a', 'b'])", "click('3')", "press('3', 'a')", "noop()", "fill('3'", "", None, 7,
              "fill('14')", "fill('14', 'x', 'y')", "keyboard_type(['a'])", "fill('14', 3)"):
        assert dfmt.typed_text(a) is None


def fixture_transitions():
    return trans.load_transitions(DATA)


def test_round_trip_on_real_transitions():
    ts = fixture_transitions()
    assert 15 <= len(ts) <= 40
    assert {"yes", "no", "fail"} <= {dfmt.predicted_status(t["delta"]) for t in ts}
    assert sum(f"value={dfmt.TYPED}" in t["delta"] for t in ts) >= 3  # the fills' Δs: placeholders
    for t in ts:
        status = dfmt.predicted_status(t["delta"])
        assert dfmt.diff(t["obs"], t["next_obs"], status, action=t["action"]) == t["delta"]  # deterministic
        assert trans.delta_label(t) == t["delta"]
        nxt = t["next_obs"]
        for d in (t["delta"], dfmt.diff(t["obs"], nxt, status, subtree=False, action=t["action"]),
                  dfmt.diff(t["obs"], nxt, status)):  # values written out: applies without the action too
            o, bad = dfmt.apply(t["obs"], d, action=t["action"])
            assert bad == 0
            assert (o["url"], o["axtree"], o["error"]) == (nxt["url"], nxt["axtree"], nxt["error"])
            assert dfmt.predicted_done(d) == t["success"]


def test_a_panel_swap_is_one_block_and_much_shorter(tok):
    # click-tab-2: clicking a tab replaces the whole tab panel ([24] tabpanel and its children)
    swaps = [t for t in fixture_transitions() if t["task"] == "click-tab-2"
             and t["obs"]["axtree"].split("tabpanel")[1][:12] != t["next_obs"]["axtree"].split("tabpanel")[1][:12]]
    assert len(swaps) == 3
    n_block = n_lines = 0
    for t in swaps:
        status = dfmt.predicted_status(t["delta"])
        block, lines = dfmt.diff(t["obs"], t["next_obs"], status), dfmt.diff(t["obs"], t["next_obs"], status, subtree=False)
        assert len(re.findall(r"\n= \[[0-9]+\] \[[0-9]+\] tabpanel", block)) == 1 and "\n|  StaticText" in block
        n = len(compress.encode_text(tok, block)), len(compress.encode_text(tok, lines))
        assert n[0] <= 0.85 * n[1], n
        n_block, n_lines = n_block + n[0], n_lines + n[1]
    assert (n_block, n_lines) == (172 + 146 + 160, 262 + 183 + 203)  # a quarter shorter, a third on the largest


def test_subtree_block_by_hand():
    old = "[1] tablist\n [2] tab 'a'\n[3] tabpanel 'a'\n StaticText 'x'\n [4] link 'y'\n  StaticText 'z'\n[5] button 'ok'"
    new = "[1] tablist\n [2] tab 'a', selected\n[6] tabpanel 'b'\n StaticText 'u'\n [7] link 'v'\n[5] button 'ok'"
    d = dfmt.diff(st8(old), st8(new))
    assert d == "~  [2] tab 'a', selected\n= [3] [6] tabpanel 'b'\n|  StaticText 'u'\n|  [7] link 'v'\ndone: no"
    assert dfmt.apply(st8(old), d) == (st8(new), 0)
    assert dfmt.parse_delta(d)[1][1] == ("=", "[3]", ["[6] tabpanel 'b'", " StaticText 'u'", " [7] link 'v'"])
    # `= REF` alone removes the subtree; a REF without a bid works; inserts after the REF follow the block
    assert dfmt.apply(st8(old), "= [3]")[0]["axtree"] == "[1] tablist\n [2] tab 'a'\n[5] button 'ok'"
    assert dfmt.apply(st8(old), "= [4]+1   StaticText 'w'")[0]["axtree"] == old.replace("'z'", "'w'")
    o, bad = dfmt.apply(st8(old), "= [4] [8] link 'q'\n|  [9] img\n+ [4] [10] button 'n'")
    assert bad == 0 and o["axtree"] == old.replace(" [4] link 'y'\n  StaticText 'z'",
                                                   "[8] link 'q'\n [9] img\n[10] button 'n'")


@pytest.mark.parametrize("delta, n_bad, axtree", [
    ("| [9] img\n~  [2] tab 'b'\n| x", 2, OLD2.replace("tab 'a'", "tab 'b'")),     # `|` after no `=`
    ("- [4]\n= [3] [6] x\n| y", 2, OLD2.replace(" [4] link 'y'\n", "")),        # its subtree was edited
    ("= [3] [6] x\n- [4]\n~ [3]+1  StaticText 'w'", 2, OLD2.split("\n[3]")[0] + "\n[6] x\n[5] button 'ok'"),
    ("= [3] [5] x\n| [6] y\n|  [6] z", 2, OLD2.split("\n[3]")[0] + "\n[6] y\n[5] button 'ok'"),  # bids taken
    ("= [3] [6] x\n= [3] [7] y\n| z", 2, OLD2.split("\n[3]")[0] + "\n[6] x\n[5] button 'ok'"),  # twice
    ("= ^ x\n= [99] y\n| z\n=[3] x", 4, OLD2),                                    # bad REFs, no space
])
def test_hostile_blocks_are_skipped_and_counted(delta, n_bad, axtree):
    o, bad = dfmt.apply(st8(OLD2), delta)
    assert (bad, o["axtree"]) == (n_bad, axtree)


# ----------------------------------------------------------------------------------------------
# Hostile Δ text


@pytest.mark.parametrize("delta, n_bad, axtree", [
    ("hello world\n```\nThe page changes.\ndone: no", 3, OLD),             # prose and fences
    ("- [99]\n~ [98] button 'x'\n+ [97] [50] button 'y'\n- [17]+9", 4, OLD),  # unknown refs
    ("+ [12] [13] button 'again'", 1, OLD),                                # the bid is already on the page
    ("+ [12] [40] button 'a'\n+ [12] [40] button 'a'", 1,                  # a duplicate add
     OLD.replace("'faucibus in nibh'", "'faucibus in nibh'\n[40] button 'a'")),
    ("- [13]\n- [13]\n~ [13] button 'x'", 2, OLD.replace("[13] button 'no'\n", "")),  # contradictions
    ("~ [13] link 'no'\n~ [17]+1 [55] button 'z'", 1,                     # a change may not give a line a bid
     OLD.replace("button 'no'", "link 'no'")),
    ("url: a\nurl: b\ndone: yes\ndone: no\nerror: e\nerror: f", 3, OLD),   # repeated headers: first wins
    ("- [13] extra\n~ [13]+1\n+ [13]\n~ ^ x\n- ^\n+ ^+1", 6, OLD),            # half-formed edits
])
def test_hostile_deltas_are_skipped_and_counted(delta, n_bad, axtree):
    o, bad = dfmt.apply(st8(OLD), delta)
    assert bad == n_bad
    assert o["axtree"] == axtree


def test_removes_and_changes_resolve_before_inserts_whatever_their_order():
    # a bid that moves: its insert comes before its removal in the Δ
    o, bad = dfmt.apply(st8(OLD), "+ [12] [19] textbox\n- [19]")
    assert bad == 0 and o["axtree"].split("\n")[1] == "[19] textbox" and o["axtree"].count("[19]") == 1


def test_huge_and_binary_text_never_raises():
    huge = "\n".join(["+ ^ StaticText 'x'"] * 5000 + ["garbage \x00\x01 line"] * 5000 + ["- [13]"] * 100)
    o, bad = dfmt.apply(st8(OLD), huge)
    assert len(o["axtree"].split("\n")) == dfmt.MAX_LINES  # the tree stops growing at MAX_LINES
    assert bad == (5000 - (dfmt.MAX_LINES - 5)) + 5000 + 99
    o, bad = dfmt.apply(st8(OLD), "= [13] [13] x\n" + "| StaticText 'y'\n" * 5000)  # a block grows no further
    assert len(o["axtree"].split("\n")) == dfmt.MAX_LINES and bad == 5001 - (dfmt.MAX_LINES - 5)
    o, bad = dfmt.apply(st8(OLD), "+ ^ " + "x" * 2_000_000)
    assert bad == 0 and len(o["axtree"]) > 2_000_000
    for junk in (None, 42, b"- [13]", "\n\n\n", "\r\n\r\n"):
        o, bad = dfmt.apply(st8(OLD), junk)
        assert o["axtree"] == OLD


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=30), LINE.map(lambda x: "+ [13] " + x), LINE.map(lambda x: "~ " + x),
                          st.sampled_from(["- [12]", "- [17]+1", "- ^+1", "done: yes", "url: z", "+ ^ [13] b", "= [12]",
                                           "= [17] [13] c", "= [17]+1  [19] d", "| [12] e", "|  [40] f", "|"]),
                          LINE.map(lambda x: "| " + x), LINE.map(lambda x: "= [13] " + x)),
                max_size=30))
def test_any_text_applies_without_raising_and_keeps_bids_unique(lines):
    o, bad = dfmt.apply(st8(OLD), "\n".join(lines))
    assert bad >= 0
    bids = [line_bid(x) for x in o["axtree"].split("\n") if line_bid(x)]
    assert len(bids) == len(set(bids))


# ----------------------------------------------------------------------------------------------
# The model side, with the real tokenizer and a tiny real model


@pytest.fixture(scope="module")
def tok():
    return policy.load_tokenizer()


def forced_model(tok, text):
    """A tiny model whose greedy reply is exactly `text` + <|im_end|> (a logits hook).

    A forward call over more than one input token is a prefill (a shared prefix's or the prompts'): it
    forces the reply's first token; each one-token call after it (a decode step) forces the next one.
    """
    m = policy.tiny_model(tok, seed=1)
    target = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    steps = [0]

    def count(mod, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        steps[0] = 0 if ids.shape[1] > 1 else steps[0] + 1

    def hook(mod, inp, out):
        out = out.clone()
        out[:, -1, :] = -1e4
        out[:, -1, target[steps[0] % len(target)]] = 1e4
        return out

    m.register_forward_pre_hook(count, with_kwargs=True)
    m.lm_head.register_forward_hook(hook)
    return m


def test_wm_samples_target_is_delta_then_end_of_turn(tok):
    ts = fixture_transitions()
    samples = wm.wm_samples(ts, tok, max_tokens=4096)
    assert len(samples) == len(ts)
    for (prompt, target), t in zip(samples, ts):
        assert target[-1] == tok.eos_token_id
        assert tok.decode(target[:-1]) == t["delta"]  # decodes back exactly: Δ predictions stay checkable
        assert prompt == compress.render(tok, wm.wm_messages(t["goal"], t["obs"], t["action"]))
        assert tok.decode(prompt).endswith("Action: " + t["action"] + "<|im_end|>\n<|im_start|>assistant\n")
    longest = max(len(p) + len(t) for p, t in samples)
    assert len(wm.wm_samples(ts, tok, max_tokens=longest - 1)) < len(ts)  # too long: skipped, not cut
    sys_tokens = len(tok.encode(wm.WM_SYSTEM_PROMPT, add_special_tokens=False))
    assert sys_tokens < 70  # (66 with the `=` block's clause)


def test_prompt_budget_cuts_the_tree_from_its_end(tok):
    t = max(fixture_transitions(), key=lambda t: len(t["obs"]["axtree"]))
    full = wm.wm_prompt(tok, t["goal"], t["obs"], t["action"], max_tokens=4096)
    cut = wm.wm_prompt(tok, t["goal"], t["obs"], t["action"], max_tokens=len(full) - 20)
    assert len(cut) <= len(full) - 20
    assert tok.decode(cut).endswith("Action: " + t["action"] + "<|im_end|>\n<|im_start|>assistant\n")
    assert f"Goal: {t['goal']}\nURL: " in tok.decode(cut)  # the goal is not cut with the tree
    # a tree of 40 numbered lines and a budget that holds about half of them: the first lines stay, whole
    # and in order, the last go
    lines = [f"[{100 + i}] button 'line number {i}'" for i in range(40)]
    obs = st8("\n".join(lines))
    full = wm.wm_prompt(tok, "Click no.", obs, "click('100')", max_tokens=4096)
    text = tok.decode(wm.wm_prompt(tok, "Click no.", obs, "click('100')", max_tokens=len(full) * 2 // 3))
    shown = [line for line in lines if line in text]
    assert 5 < len(shown) < 35 and shown == lines[:len(shown)]
    # the goal, the URL and the action survive the cut, around the lines kept
    assert f"Goal: Click no.\nURL: miniwob/a.html\n{chr(10).join(shown)}\nAction: click('100')" in text


def test_predict_and_evaluate_with_a_forced_model(tok):
    ts = fixture_transitions()[:6]
    m = forced_model(tok, "done: no")
    assert wm.predict_delta(m, tok, [dict(t["obs"], goal=t["goal"]) for t in ts], [t["action"] for t in ts],
                            max_new_tokens=8) == ["done: no"] * len(ts)
    r = wm_eval.evaluate_world_model(m, tok, ts, max_new_tokens=8)
    same = sum(t["next_obs"]["axtree"] == t["obs"]["axtree"] and t["next_obs"]["url"] == t["obs"]["url"] for t in ts)
    assert r["wm/exact_match"] == same / len(ts)
    assert r["wm/line_precision"] == 1.0 and r["wm/line_recall"] == (1.0 if all(
        not dfmt.delta_lines(t["delta"]) for t in ts) else 0.0)
    assert r["wm/done_accuracy"] == sum(not t["success"] for t in ts) / len(ts)
    assert r["wm/done_false_positive_rate"] == 0.0 and r["wm/n"] == len(ts) and r["wm/bad_lines"] == 0


def test_evaluate_checkpoint_writes_the_predictions_that_compare_reads(tok, tmp_path, monkeypatch):
    """`python world_model.py --eval CKPT --data F`: the scores, and one predictions line per transition
    with its recorded label and whether the predicted page is the real one (what --compare and
    done_calibration.py read)."""
    ts = [t for t in fixture_transitions() if t["task"] != "click-tab-2"]
    monkeypatch.setattr(policy, "load_model", lambda path, **k: (forced_model(tok, "done: no"), tok))
    out = tmp_path / "e.json"
    res = wm_eval.evaluate_checkpoint(str(tmp_path), DATA, sorted({t["task"] for t in ts}), drift_k=1, out=str(out))
    rows = [json.loads(x) for x in open(tmp_path / "e_predictions.jsonl")]
    assert [(r["task"], r["seed"], r["step"], r["action"]) for r in rows] == [(t["task"], t["seed"], t["step"], t["action"])
                                                                             for t in ts]
    assert all(r["predicted"] == "done: no" and r["label"] == trans.delta_label(t) for r, t in zip(rows, ts))
    same = [t["next_obs"]["axtree"] == t["obs"]["axtree"] and t["next_obs"]["url"] == t["obs"]["url"] for t in ts]
    assert [r["exact"] for r in rows] == same and 0 < sum(same) < len(ts)
    assert res["one_step"]["wm/exact_match"] == sum(same) / len(ts) and json.loads(out.read_text())["drift"]["1"]["n"] > 0
    assert set(res["by_task"]) == {t["task"] for t in ts}
    r = wm_eval.compare_predictions(tmp_path / "e_predictions.jsonl", tmp_path / "e_predictions.jsonl")["all"]
    assert r["n"] == len(ts) and r["diff"] == 0 and r["gained"] == r["lost"] == 0


def test_a_reply_cut_by_the_length_limit_loses_its_unfinished_line(tok):
    text = "~ [14] textbox value='Myron', focused\n~ [15] button 'Submit', focused"
    m = forced_model(tok, text)
    state = {"goal": "g", "url": "u", "axtree": "[14] textbox\n[15] button 'Submit'"}
    n = len(tok.encode(text, add_special_tokens=False))
    assert wm.predict_delta(m, tok, [state], ["click('15')"], max_new_tokens=n - 3) == [text.split("\n")[0]]


def test_start_states_cover_later_stages():
    ts = fixture_transitions()
    states = trans.start_states(ts)
    assert len(states) == len({(t["task"], t["goal"], t["obs"]["axtree"], t["obs"]["url"]) for t in ts})
    assert any(t["step"] > 0 for t in ts)
    only = trans.start_states(ts, "enter-text")
    assert only and all(s["task"] == "enter-text" for s in only)
    first = trans.start_states(ts, max_stage=0)  # --dream-max-stage 0: the pages every real episode starts on
    assert first and all(s["prefix"] == [] and s["prefix_obs"] == [] for s in first)
    assert {(s["task"], s["seed"]) for s in first} == {(t["task"], t["seed"]) for t in ts if t["step"] == 0}
    upto1 = trans.start_states(ts, max_stage=1)
    assert len(first) < len(upto1) < len(states) + 1 and max(len(s["prefix"]) for s in upto1) == 1
    with pytest.raises(ValueError, match="max_stage"):
        trans.start_states(ts, max_stage=-1)


def test_dream_env_steps_and_ends_at_dream_len(tok):
    states = trans.start_states(fixture_transitions(), "enter-text")
    env = wm.DreamEnv(policy.tiny_model(tok), tok, states, dream_len=3, max_new_tokens=6)
    assert env.task == "enter-text"
    obs = env.reset(seed=7)
    assert obs == env.reset(seed=7)  # the seed picks the start state
    assert isinstance(obs, Obs) and obs.goal and obs.axtree
    for t in range(1, 4):
        text = "no action here" if t == 1 else "<think>type</think> fill('14', 'Myron')"
        obs, reward, done, info = env.step(text)
        assert set(info) >= {"action", "error", "success", "env_error", "raw_reward", "truncated", "delta"}
        assert reward == 0.0 and obs.step == t
        if t == 1:  # a parse error costs a step and changes nothing, as in WebEnv
            assert info["action"] is None and obs.error.startswith("ActionParseError") and info["delta"] == ""
        else:
            assert info["action"] == "fill('14', 'Myron')"
        assert done == (t == 3)
    assert info["truncated"] and not info["success"]
    with pytest.raises(RuntimeError):
        env.step("click('14')")
    env.close()


def test_dream_env_applies_the_predicted_delta_and_ends_on_done(tok):
    state = {"task": "enter-text", "goal": "Enter \"Myron\" and press Submit.", "url": "miniwob/enter-text.html",
             "axtree": "[14] textbox\n[15] button 'Submit'"}
    env = wm.DreamEnv(forced_model(tok, "~ [14] textbox value='Myron', focused\ndone: no"), tok, [state], dream_len=5)
    env.reset(0)
    obs, reward, done, info = env.step("fill('14', 'Myron')")
    assert obs.axtree == "[14] textbox value='Myron', focused\n[15] button 'Submit'" and not done and reward == 0.0
    env = wm.DreamEnv(forced_model(tok, "~ [15] button 'Submit', focused\ndone: yes"), tok, [state], dream_len=5)
    env.reset(0)
    obs, reward, done, info = env.step("click('15')")
    assert (reward, done, info["success"], info["truncated"], info["raw_reward"]) == (1.0, True, True, False, 1.0)
    env = wm.DreamEnv(forced_model(tok, "done: fail"), tok, [state], dream_len=5)
    env.reset(0)
    obs, reward, done, info = env.step("click('14')")
    assert (reward, done, info["success"], info["truncated"]) == (0.0, True, False, False)


# ----------------------------------------------------------------------------------------------
# Real pages


def test_random_actions_are_valid_actions():
    import random

    rng = random.Random(0)
    for t in fixture_transitions():
        for _ in range(5):
            a = trans.random_action(t["obs"], rng)
            assert parse_action(a) == a


def test_near_miss_actions_swap_one_argument_for_a_wrong_one():
    import random

    obs = Obs(goal="g", url="u", axtree="[3] link 'alpha'\n[4] link 'beta'\n[5] button 'Submit'\n[6] textbox 'User'\n"
                                         "[7] combobox 'Pick'\n  [8] option 'red'\n  [9] option 'blue'\n[10] checkbox 'x'\n"
                                         "[11] link 'alpha'\n[12] combobox 'Pet'\n  [13] option 'cat'\n  [14] option 'dog'\n"
                                         "[15] link 'gamma'")
    rng = random.Random(0)
    links = set()
    for _ in range(40):
        links.add(trans.near_miss_action("click('3')", obs, rng))  # another link by another name: never [11] 'alpha'
        assert trans.near_miss_action("select_option('7', 'red')", obs, rng) == "select_option('7', 'blue')"
        assert trans.near_miss_action("select_option('7', ['blue'])", obs, rng) == "select_option('7', 'red')"
        assert trans.near_miss_action("select_option('12', 'cat')", obs, rng) == "select_option('12', 'dog')"
        for text in ("Alice", "fE", ""):
            miss = trans.near_miss_action(f"fill('6', {text!r})", obs, rng)
            assert miss.startswith("fill('6', ") and parse_action(miss) == miss
            assert len(split_action(miss)[1][1]) != len(text)  # a masked password's dots differ too
    assert links == {"click('4')", "click('15')"}
    assert trans.near_miss_action("click('5')", obs, rng) is None      # the only button: nothing to swap it for
    assert trans.near_miss_action("check('10')", obs, rng) is None
    assert trans.near_miss_action("press('6', 'Enter')", obs, rng) is None
    assert trans.near_miss_action("fill('99', 'z')", obs, rng) is None  # a bid the page lacks
    assert trans.submit_action(obs) == "click('5')"
    assert trans.submit_action(Obs(goal="g", url="u", axtree="[3] button 'OK'")) is None
    # click-dialog: the only button is the dialog's Close; the miss clicks the dialog or its text, never the
    # button, the paragraph's own child, or what lies outside the dialog
    dialog = Obs(goal="g", url="u", axtree="[2] heading 'Top'\n[17] dialog\n [20] button 'Close', focused\n"
                                           "  [21] StaticText 'x'\n [24] paragraph 'Faucibus.'\n[30] link 'out'")
    misses = {trans.near_miss_action("click('20')", dialog, rng) for _ in range(40)}
    assert misses == {"click('17')", "click('24')"}
    assert trans.near_miss_action("click('2')", dialog, rng) is None  # top level, the only heading
    # check/uncheck only on another checkbox: never on a lone box's parent or its label
    lone = Obs(goal="g", url="u", axtree="[40] group 'Pick'\n [41] checkbox 'x'\n [42] LabelText 'x'\n[43] button 'Submit'")
    assert trans.near_miss_action("check('41')", lone, rng) is None
    assert trans.near_miss_action("uncheck('41')", lone, rng) is None
    assert trans.near_miss_action("click('41')", lone, rng) in {"click('40')", "click('42')"}


@pytest.mark.skipif(not shutil.which(os.environ.get("WEBDREAM_CHROMIUM", "/usr/bin/chromium")), reason="no Chromium")
def test_collect_near_misses_records_wrong_finishes(tmp_path):
    """Every expert step swapped: click-link's wrong link ends the episode as a failure, recorded as near_miss."""
    path = str(tmp_path / "t.jsonl")
    counts = trans.collect_transitions(["click-link"], [0], path, random_frac=0.0, near_miss_frac=1.0, max_steps=1)
    (t,) = trans.load_transitions(path)
    assert counts["near_miss"] == 1 and t["source"] == "near_miss"
    import experts

    expert = experts.expert_action("click-link", Obs(goal=t["goal"], url=t["obs"]["url"], axtree=t["obs"]["axtree"]))
    assert not t["success"] and t["delta"] == "done: fail" and t["action"] != expert

    path = str(tmp_path / "login.jsonl")  # a wrong field, then (half of the time) Login at once: a failed finish
    trans.collect_transitions(["login-user"], [0, 1, 2, 3], path, random_frac=0.0, near_miss_frac=1.0, max_steps=3)
    rows = trans.load_transitions(path)
    finishes = [(a, b) for a, b in zip(rows, rows[1:]) if (a["task"], a["seed"]) == (b["task"], b["seed"])
                and b["source"] == "near_miss" and b["action"] == trans.submit_action(b["obs"])]
    assert finishes and all(a["source"] == "near_miss" and a["action"].startswith("fill(") for a, _ in finishes)
    assert all(b["delta"].endswith("done: fail") for _, b in finishes)


@pytest.mark.skipif(not shutil.which(os.environ.get("WEBDREAM_CHROMIUM", "/usr/bin/chromium")), reason="no Chromium")
def test_collect_one_real_transition(tmp_path):
    path = str(tmp_path / "t.jsonl")
    counts = trans.collect_transitions(["click-button"], [0], path, random_frac=0.0, max_steps=1)
    assert counts["transitions"] == 1
    (t,) = trans.load_transitions(path)
    assert t["source"] == "expert" and t["success"] and dfmt.predicted_done(t["delta"])
    o, bad = dfmt.apply(t["obs"], t["delta"])
    assert bad == 0 and o["axtree"] == t["next_obs"]["axtree"]


@pytest.mark.skipif(not shutil.which(os.environ.get("WEBDREAM_CHROMIUM", "/usr/bin/chromium")), reason="no Chromium")
def test_collect_with_a_policy_shows_it_the_episode_so_far(tmp_path, tok):
    """policy_fn sees the episode's earlier turns as a rollout's prompt shows them, and its samples are
    recorded as `policy`; checkpoint_policy's reply is what a rollout would sample (a tiny model here)."""
    seen = []

    def policy_fn(task, obs, history):
        seen.append([dict(h) for h in history])
        return "click('9999')"  # a bid on no page: an error, the episode goes on

    path = str(tmp_path / "t.jsonl")
    counts = trans.collect_transitions(["click-button"], [0], path, policy_fn=policy_fn, random_frac=0.0, max_steps=2)
    t0, t1 = trans.load_transitions(path)
    assert counts["transitions"] == 2 and t0["source"] == t1["source"] == "policy"
    assert seen[0] == [] and len(seen[1]) == 1 and seen[1][0]["response"] == "click('9999')"
    assert seen[1][0]["observation"].startswith("Goal: ") and t0["goal"] in seen[1][0]["observation"]

    def broken(task, obs, history):
        raise RuntimeError("a bug in the policy")

    with pytest.raises(RuntimeError, match="a bug in the policy"):  # not swallowed as an unreadable page
        trans.collect_transitions(["click-button"], [0], str(tmp_path / "u.jsonl"), policy_fn=broken, random_frac=0.0,
                                  max_steps=1)

    ckpt = str(tmp_path / "ckpt")
    policy.tiny_model(tok, seed=3).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    fn = trans.checkpoint_policy(ckpt, temperature=0.0)
    obs = Obs(goal="Click the button.", url="file:///click-button.html", axtree="[13] button 'Submit'")
    reply = fn("click-button", obs, [])
    from checkpoint import PROMPT_DEFAULTS

    prompt = compress.PromptSettings(think=PROMPT_DEFAULTS["think"], bid_last=PROMPT_DEFAULTS["bid_last"]).build(tok, [], obs.text)
    model, _ = policy.load_model(ckpt)
    (want,) = policy.generate(model, tok, [prompt], max_new_tokens=64, temperature=0.0)
    assert reply == want.text


def record_fixture(path=DATA):
    """Rewrite tests/data/transitions.jsonl from real pages (about 15 s)."""
    if os.path.exists(path):
        os.remove(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    print(trans.collect_transitions(["click-tab-2", "enter-text"], [0, 1], path, random_frac=0.3, max_steps=5))
    print(trans.collect_transitions(["click-checkboxes"], [0], path, random_frac=0.3, max_steps=5))
    print(trans.collect_transitions(["click-button"], [0, 1, 2], path, random_frac=1.0, max_steps=3))


if __name__ == "__main__":
    record_fixture()


def test_the_delta_server_batches_waiting_dreams_and_gives_batch_1_deltas(tok):
    import threading

    import torch

    ts = fixture_transitions()[::3]  # seven states of four tasks, prompts of different lengths
    states = [dict(t["obs"], goal=t["goal"]) for t in ts]
    actions = [t["action"] for t in ts]
    # a tiny random model whose greedy reply depends on its prompt (weights x20: the residual stream
    # no longer just repeats the last token) and holds a newline now and then (so a cut reply keeps lines)
    m = policy.tiny_model(tok, seed=3)
    with torch.no_grad():
        for name, w in m.named_parameters():
            if "layers" in name and w.dim() == 2:
                w.mul_(20)
    newline = tok.encode("\n", add_special_tokens=False)[0]

    def more_newlines(mod, inp, out):
        out = out.clone()
        out[..., newline] += 0.6
        return out

    m.lm_head.register_forward_hook(more_newlines)
    one = [wm.predict_delta(m, tok, [s], [a], max_new_tokens=16, batch_size=1)[0] for s, a in zip(states, actions)]
    assert len(set(one)) == len(one) and sum("\n" in d for d in one) >= 4  # seven different Δs, most multi-line
    server = wm.DeltaServer(m, tok, max_new_tokens=16, linger=2.0)
    out = [None] * len(states)
    go = threading.Barrier(len(states))

    def ask(i):
        go.wait()
        out[i] = server.predict(states[i], actions[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(states))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    server.close()
    assert out == one
    assert server.stats["requests"] == len(states) and server.stats["calls"] < len(states)
    with pytest.raises(RuntimeError):
        server.predict(states[0], actions[0])


def test_delta_server_generates_under_the_predict_lock(tok):
    """The server's generation and DreamEnv's P(yes) check share the world model's tokenizer (its encode
    flags are state): the server generates only while holding world_model._PREDICT_LOCK."""
    import threading

    server = wm.DeltaServer(policy.tiny_model(tok), tok, max_new_tokens=4, linger=0.0)
    state = {"goal": "g", "url": "u", "axtree": "[14] textbox"}
    out = []
    with wm._PREDICT_LOCK:
        th = threading.Thread(target=lambda: out.append(server.predict(state, "click('14')")))
        th.start()
        th.join(timeout=3)
        assert th.is_alive() and not out  # held here: the server waits
    th.join(timeout=120)
    server.close()
    assert len(out) == 1 and isinstance(out[0], str)


def test_dream_env_asks_its_server(tok):
    state = {"task": "enter-text", "goal": "Enter \"Myron\".", "url": "u", "axtree": "[14] textbox\n[15] button 'Submit'"}

    class Server:
        calls = []

        def predict(self, s, a):
            self.calls.append((s["axtree"], a))
            return "~ [14] textbox value='Myron'\ndone: yes"

    env = wm.DreamEnv(None, tok, [state], dream_len=3, server=Server())
    assert env.reset(0).context == []  # an episode's first page: no history
    obs, reward, done, info = env.step("fill('14', 'Myron')")
    assert Server.calls == [(state["axtree"], "fill('14', 'Myron')")]
    assert (reward, done) == (1.0, True) and obs.axtree.startswith("[14] textbox value='Myron'")


def test_dream_env_done_threshold_reads_p_yes(tok, monkeypatch):
    """With done_threshold above 0.5 a `done: yes` counts only when done_p_yes (teacher-forced after the Δ,
    on the page before the step) is above it; below it the dream goes on with reward 0."""
    import done_calibration

    state = {"task": "enter-text", "goal": "Enter \"Myron\".", "url": "u", "axtree": "[14] textbox\n[15] button 'Submit'"}
    delta = "~ [14] textbox value=<typed>\ndone: yes"

    class Server:
        def predict(self, s, a):
            return delta

    model = policy.tiny_model(tok, seed=2)
    (p,) = done_calibration.done_p_yes(model, tok, [{"goal": state["goal"], "obs": state, "action": "fill('14', 'Myron')"}],
                                       [delta])
    assert 0.0 < p < 0.5  # a random tiny model: about a third on each of yes / no / fail
    env = wm.DreamEnv(model, tok, [state], dream_len=3, server=Server(), done_threshold=0.6)
    env.reset(0)
    obs, reward, done, info = env.step("fill('14', 'Myron')")
    assert (reward, done, info["success"]) == (0.0, False, False) and info["p_yes"] == pytest.approx(p)
    assert obs.axtree.startswith("[14] textbox value='Myron'")  # the Δ's lines still apply
    env = wm.DreamEnv(model, tok, [state], dream_len=3, server=Server())  # None: the greedy line as it is
    env.reset(0)
    obs, reward, done, info = env.step("fill('14', 'Myron')")
    assert (reward, done, info["p_yes"]) == (1.0, True, None)
    monkeypatch.setattr(done_calibration, "done_p_yes", lambda *a, **k: [0.9])
    env = wm.DreamEnv(model, tok, [state], dream_len=3, server=Server(), done_threshold=0.85)
    env.reset(0)
    obs, reward, done, info = env.step("fill('14', 'Myron')")
    assert (reward, done, info["p_yes"]) == (1.0, True, 0.9)
    env = wm.DreamEnv(model, tok, [state], dream_len=3, server=Server(), done_threshold=0.9)
    env.reset(0)
    assert env.step("fill('14', 'Myron')")[1:3] == (0.0, False)  # at the threshold is not above it
    delta = "~ [14] textbox value=<typed>\ndone: no"
    env.reset(0)
    assert env.step("fill('14', 'Myron')")[3]["p_yes"] is None  # only a `yes` is checked
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="done_threshold"):
            wm.DreamEnv(model, tok, [state], done_threshold=bad)


def test_compare_predictions_pairs_by_transition(tmp_path):
    """world_model.py --compare: B's gain over A counts only the transitions both files hold."""
    def write(name, rows):
        p = tmp_path / name
        p.write_text("".join(json.dumps({"task": t, "seed": s, "step": 0, "action": "noop()", "exact": e}) + "\n"
                             for t, s, e in rows))
        return str(p)
    a = write("a.jsonl", [("x", 1, False), ("x", 2, True), ("y", 1, False), ("y", 9, True)])
    b = write("b.jsonl", [("x", 1, True), ("x", 2, True), ("y", 1, True), ("z", 1, True)])
    r = wm_eval.compare_predictions(a, b)
    assert (r["all"]["n"], r["all"]["gained"], r["all"]["lost"]) == (3, 2, 0)
    assert set(r) == {"all", "x", "y"} and r["y"]["diff"] == 1.0
    with pytest.raises(ValueError):
        wm_eval.compare_predictions(a, write("c.jsonl", [("q", 1, True)]))


def test_a_world_model_checkpoint_records_its_delta_format_and_a_mismatch_is_refused(tmp_path, monkeypatch, capsys):
    import json

    import train

    assert train.parse_args(["--mode", "wm"]).prompt_settings["delta_focus_header"] is dfmt.FOCUS_HEADER
    assert "delta_focus_header" not in train.parse_args(["--mode", "bc"]).prompt_settings
    ckpt = tmp_path / "wm"
    ckpt.mkdir()
    wm.check_delta_format(str(ckpt))  # no webdream.json (the base model): nothing to check
    (ckpt / "webdream.json").write_text(json.dumps({"step": 3, "think": True}))
    wm.check_delta_format(str(ckpt))  # written before the record existed
    (ckpt / "webdream.json").write_text(json.dumps({"step": 3, **wm.delta_format()}))
    wm.check_delta_format(str(ckpt))
    monkeypatch.setattr(dfmt, "FOCUS_HEADER", not dfmt.FOCUS_HEADER)
    with pytest.raises(ValueError, match="delta_focus_header"):
        wm.check_delta_format(str(ckpt))
    monkeypatch.setattr(dfmt, "FOCUS_HEADER", not dfmt.FOCUS_HEADER)
    assert train.parse_args(["--mode", "wm"]).prompt_settings["delta_typed_values"] is dfmt.TYPED_VALUES
    monkeypatch.setattr(dfmt, "TYPED_VALUES", not dfmt.TYPED_VALUES)  # apply reads both: not refused
    wm.check_delta_format(str(ckpt))
    monkeypatch.setattr(dfmt, "FOCUS_HEADER", not dfmt.FOCUS_HEADER)
    with pytest.raises(SystemExit):  # nor does train.py --mode wm continue from it
        train.parse_args(["--mode", "wm", "--init", str(ckpt)])
    assert "was trained with delta_focus_header" in capsys.readouterr().err
