"""actions.py: parse_action on the replies models actually write: every reply gives exactly one
canonical action or an ActionParseError of a named kind, never an empty or silently different action.
Pure: no browser is started."""
import os
import pickle
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actions
import keys
from actions import ACTIONS, MAX_REPLY_CHARS, WEB_ACTIONS, ActionParseError, canonical, parse_action, split_action


def kind_of(text):
    """The kind of the ActionParseError that text raises (the test fails if it parses)."""
    with pytest.raises(ActionParseError) as e:
        parse_action(text)
    assert len(str(e.value)) > 10  # a message the agent can act on
    return e.value.kind


# ---------------------------------------------------------------------------------------------
# accepted and rejected replies


@pytest.mark.parametrize("text, want", [
    ("click('13')", "click('13')"),
    ('click("13")', "click('13')"),
    ("click(13)", "click('13')"),
    ("click( '13' )", "click('13')"),
    ("dblclick('a7')", "dblclick('a7')"),
    ("fill('14', 'Myron')", "fill('14', 'Myron')"),
    ("fill(14, \"it's\")", "fill('14', \"it's\")"),
    ("fill('14', 42)", "fill('14', '42')"),
    ("fill(bid='14', value='x')", "fill('14', 'x')"),
    ("select_option('9', 'Blue')", "select_option('9', 'Blue')"),
    ("select_option('9', ['a', 'b'])", "select_option('9', ['a', 'b'])"),
    ("press('14', 'Enter')", "press('14', 'Enter')"),
    ("scroll(0, -300)", "scroll(0, -300)"),
    ("send_msg_to_user('42')", "send_msg_to_user('42')"),
    ("noop()", "noop()"),
    ("focus('12')", "focus('12')"),
    ("clear('12')", "clear('12')"),
    ("hover('12')", "hover('12')"),
    ("check('3')", "check('3')"),
    ("uncheck('3')", "uncheck('3')"),
    # prose, <think> blocks and fences are ignored; the last call wins
    ("I will click the OK button: click('15')", "click('15')"),
    ("<think>maybe click('1')? no, the button is 15</think>\nclick('15')", "click('15')"),
    ("```python\nclick('15')\n```", "click('15')"),
    ("Action:\n```\nfill('3', 'a (b) c')\n```\nDone.", "fill('3', 'a (b) c')"),
    ("click('1') then click('2')", "click('2')"),
    ("fill('3', 'click(\"9\")')", "fill('3', 'click(\"9\")')"),
])
def test_parse_accepts(text, want):
    assert parse_action(text) == want
    assert parse_action(want) == want  # canonical strings are fixed points


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("   ", "empty"),
    ("I think the answer is the OK button.", "no action"),
    ("<think>click('3')</think> I am not sure.", "no action"),
    ("goto('http://example.com')", "unknown action"),
    ("rm('x')", "unknown action"),
    ("os.system('ls')", "plain action"),
    ("page.click('13')", "plain action"),
    ("__import__('os').system('ls')", "unknown action"),
    ("click(x)", "literal"),
    ("click('1' + '2')", "literal"),
    ("fill('3', open('/etc/passwd').read())", "literal"),
    ("click()", "missing"),
    ("fill('3')", "missing"),
    ("click('1', '2')", "argument"),
    ("click('a b')", "bid"),
    ("click(-1)", "bid"),
    ("scroll('a', 'b')", "number"),
    ("press('3', '')", "key"),
    ("click(*['1'])", "args"),
])
def test_parse_rejects(text, fragment):
    with pytest.raises(ActionParseError) as e:
        parse_action(text)
    assert fragment in str(e.value)
    assert isinstance(e.value, ValueError) and len(str(e.value)) > 10


# ---------------------------------------------------------------------------------------------
# text arguments


def test_escaped_quotes_in_text():
    assert parse_action(r"fill('14', 'He said \'hi\'')") == """fill('14', "He said 'hi'")"""
    assert parse_action(r'fill("14", "say \"hi\"")') == """fill('14', 'say "hi"')"""
    both = r"""fill('14', 'it\'s "x"')"""
    assert parse_action(both) == both  # repr keeps ' quotes and escapes the inner one
    assert split_action(both)[1] == ["14", """it's "x\""""]


def test_hash_in_text_is_not_a_comment():
    assert parse_action("fill('14', 'item #2')") == "fill('14', 'item #2')"
    assert parse_action("```python\nfill('14', 'a # b')  # the box\n```") == "fill('14', 'a # b')"
    assert parse_action("fill('14',  # the name box\n     'Myron')") == "fill('14', 'Myron')"


def test_backslash_n_written_literally_is_a_newline():
    # Python's literal rules: \n written in quotes is a newline; \\n is a backslash and an n
    assert parse_action(r"fill('14', 'one\ntwo')") == r"fill('14', 'one\ntwo')"
    assert split_action(parse_action(r"fill('14', 'one\ntwo')"))[1] == ["14", "one\ntwo"]
    assert parse_action(r"fill('14', 'one\\ntwo')") == r"fill('14', 'one\\ntwo')"
    assert split_action(parse_action(r"fill('14', 'one\\ntwo')"))[1] == ["14", "one\\ntwo"]


def test_real_newlines_in_text_are_kept():
    assert parse_action("fill('14', 'one\ntwo')") == r"fill('14', 'one\ntwo')"  # was 'one two'
    assert parse_action("fill('14', 'one\r\ntwo')") == r"fill('14', 'one\r\ntwo')"  # was no action
    assert parse_action("fill('14', '''one\ntwo''')") == r"fill('14', 'one\ntwo')"
    assert parse_action("fill('14', 'one\\\ntwo')") == "fill('14', 'onetwo')"  # Python's line joining


def test_unknown_escape_keeps_its_backslash_even_with_warnings_as_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ast.parse warns on '\d'; -W error made it 'no action found'
        assert parse_action(r"fill('14', 'C:\dir\sub')") == r"fill('14', 'C:\\dir\\sub')"
        assert parse_action(r"fill('14', r'\d+')") == r"fill('14', '\\d+')"


def test_unicode_text():
    texts = ["Zoë", "東京タワー", "🚀 launch", "مرحبا ١٢٣", "naïve café — ok", "\u2028sep", "tab\there"]
    for s in texts:
        want = f"fill('14', {s!r})"
        assert parse_action(f"fill('14', '{s}')") == want
        assert parse_action(want) == want
    assert parse_action("send_msg_to_user('Ответ: 42 ✓')") == "send_msg_to_user('Ответ: 42 ✓')"
    assert kind_of("click('١٢')") == "bad_bid"  # Arabic-Indic digits are not a bid


def test_markup_inside_text_is_text():
    for s in ["</think>", "<think>", "```", "click('9')", "a) # b"]:
        want = f"fill('3', {s!r})"
        assert parse_action(want) == want
        assert parse_action(f"<think>type it</think>\n{want}") == want


def test_numbers_where_text_is_expected_are_kept_as_written():
    assert parse_action("fill('3', 42)") == "fill('3', '42')"
    assert parse_action("fill('3', 1.50)") == "fill('3', '1.50')"  # was '1.5'
    assert parse_action("fill('3', -7)") == "fill('3', '-7')"
    assert parse_action("select_option('9', [1, 'b'])") == "select_option('9', ['1', 'b'])"
    assert parse_action("click(13)") == "click('13')"
    assert kind_of("click(0x1F)") == "bad_bid"  # was click('31')
    assert kind_of("scroll(0, 1e999)") == "bad_number"  # was scroll(0, inf), not a fixed point
    assert kind_of("select_option('9', [])") == "bad_options"


# ---------------------------------------------------------------------------------------------
# where the action is


def test_action_in_the_middle_of_prose():
    reply = "The OK button is [15], so I'll click('15') and then it's done (I think)."
    assert parse_action(reply) == "click('15')"


def test_action_after_a_full_stop():
    # was 'only plain action calls are allowed, not button.click': the regex allowed "button. click("
    assert parse_action("I will press the OK button. click('15')") == "click('15')"
    assert parse_action("Done thinking.\nclick('15')") == "click('15')"
    assert parse_action("e.g. click('15')") == "click('15')"
    assert kind_of("page.click('13')") == "not_plain"


def test_fenced_block_with_comment_and_assignment_before_the_call():
    reply = "Here:\n```python\n# the name box is 14\nname = 'Myron'\nfill('14', 'Myron')\n```\n"
    assert parse_action(reply) == "fill('14', 'Myron')"
    reply = "```python\n# click('3') would be wrong\nbid = '15'  # the OK button\nclick('15')\n```"
    assert parse_action(reply) == "click('15')"
    assert parse_action("```python\naction = click('15')\n```") == "click('15')"
    # a variable is not resolved: a clear error, not a guess
    assert kind_of("```python\nname = 'Myron'\nfill('14', name)\n```") == "not_literal"


def test_comment_after_the_call_is_ignored():
    assert parse_action("fill('14', 'a')  # not click('1')") == "fill('14', 'a')"  # was click('1')
    assert parse_action("```\nfill('14', 'a')\n# click('1') is wrong\n```") == "fill('14', 'a')"  # was click('1')


def test_reply_already_ending_with_the_closing_parenthesis():
    assert parse_action("click('15'))") == "click('15')"
    assert parse_action("fill('3', 'a (b)'))") == "fill('3', 'a (b)')"
    assert parse_action("click('15')") == "click('15')"
    assert kind_of("click('15'") == "unclosed"  # cut before it: an error, not a guess
    assert kind_of("fill('3', 'abc") == "unclosed"


def test_two_calls_the_last_wins():
    assert parse_action("click('1') then click('2')") == "click('2')"
    assert parse_action("fill('3', 'x')\nclick('4')") == "click('4')"
    assert parse_action("<think>click('1')?</think> click('2') or maybe click('3')") == "click('3')"
    # the last call decides even when it is wrong: an earlier call is never used instead
    assert kind_of("click('15') and then goto('http://x')") == "unknown_action"
    assert kind_of("click('15')? no, fill('3', 'Myr") == "unclosed"


def test_think_blocks():
    assert parse_action("<think>maybe click('1')? no, 15</think>\nclick('15')") == "click('15')"
    assert parse_action("</think> click('15')") == "click('15')"  # template opened the block
    assert kind_of("<think>click('3')</think> I am not sure.") == "no_action"
    assert kind_of("<think>maybe click('1')? the button is") == "unclosed_think"  # was click('1')


class _TooMuchWork(Exception):
    pass


class _CountedReply(str):
    """A reply that counts the parser's reads of it: the lexer (actions._match_paren) reads one character
    at each of its steps. Past `limit` reads it raises, so a quadratic scan fails at once."""

    def __getitem__(self, k):
        self.reads += 1
        if self.reads > self.limit:
            raise _TooMuchWork(f"more than {self.limit} reads of a {len(self)}-character reply")
        return str.__getitem__(self, k)


def work(monkeypatch, text, per_char=8):
    """parse_action(text) (or the ActionParseError it raised) and the work it took: lexer steps plus
    the characters handed to ast.parse, checked to be at most per_char a character of the reply."""
    import ast
    import types

    parsed = [0]

    def parse(src, *a, **k):
        parsed[0] += len(src)
        return ast.parse(src, *a, **k)
    monkeypatch.setattr(actions, "ast", types.SimpleNamespace(**{**{k: getattr(ast, k) for k in dir(ast)}, "parse": parse}))
    reply = _CountedReply(text)
    reply.reads, reply.limit = 0, per_char * len(text)
    try:
        out = parse_action(reply)
    except ActionParseError as e:
        out = e
    assert reply.reads + parsed[0] <= per_char * len(text), (text[:20], reply.reads, parsed[0])
    return out, reply.reads + parsed[0]


def test_long_reply_takes_work_linear_in_its_length(monkeypatch):
    # Bounded work, not a clock: each reply of 50k characters (the most accepted) is read in at most
    # 8 steps a character (4.6 for the worst below; a rescan from every call start would be ~10^9)
    prose = "The page shows a form; I'll look at every field (twice) before acting. " * 800
    reply = (prose + "click('15')")[-MAX_REPLY_CHARS:]
    assert len(reply) == 50_000
    assert work(monkeypatch, reply)[0] == "click('15')"
    assert work(monkeypatch, "<think>" + reply[:-40] + "</think>fill('3', 'x')")[0] == "fill('3', 'x')"
    for bad in ["a(", "click(", "f(' ", "f(f(f(f(x y)))) ", "f() # ", "(", "'", "```", "fill('3', "]:
        out, _ = work(monkeypatch, (bad * (50_000 // len(bad) + 1))[:50_000])
        assert isinstance(out, ActionParseError), (bad, out)
    out, steps = work(monkeypatch, "x" * 10_000_000 + "click('1')")
    assert out.kind == "too_long" and steps == 0  # refused unread


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("text, kind", [
    ("", "empty"),
    ("  \n ", "empty"),
    ("I think the answer is the OK button.", "no_action"),
    ("click('15'", "unclosed"),
    ("click('1' '2' x)", "syntax"),
    ("fill('14', r'raw\nnewline')", "syntax"),
    ("select_option('9', [[[[['a']]]]])", "syntax"),  # nested too deeply to be an action: not parsed
    ("page.click('13')", "not_plain"),
    ("os.system('ls')", "not_plain"),
    ("goto('http://example.com')", "unknown_action"),
    ("__import__('os').system('ls')", "unknown_action"),
    ("click(*['1'])", "star_args"),
    ("click(x)", "not_literal"),
    ("fill('3', open('/etc/passwd').read())", "not_literal"),
    ("click(True)", "not_literal"),
    ("click('1', '2')", "too_many_args"),
    ("click(bid='1', foo='2')", "bad_keyword"),
    ("fill('3')", "missing_arg"),
    ("click('a b')", "bad_bid"),
    ("click(-1)", "bad_bid"),
    ("scroll('a', 'b')", "bad_number"),
    ("select_option('9', [['a']])", "bad_options"),
    ("fill('3', ['a'])", "bad_text"),
    ("press('3', '  ')", "bad_key"),
])
def test_error_kinds(text, kind):
    assert kind_of(text) == kind


def test_model_text_is_never_executed(tmp_path):
    target = tmp_path / "pwned"
    for reply in [f"fill('3', open({str(target)!r}, 'w').write('x'))",
                  f"click(__import__('pathlib').Path({str(target)!r}).touch())",
                  f"```python\nopen({str(target)!r}, 'w')\nclick('1')\n```"]:
        try:
            parse_action(reply)
        except ActionParseError:
            pass
    assert not target.exists()


def test_error_keeps_its_kind_when_pickled():
    e = pickle.loads(pickle.dumps(ActionParseError("bad bid", "bad_bid")))
    assert (str(e), e.kind, isinstance(e, ValueError)) == ("bad bid", "bad_bid", True)


# ---------------------------------------------------------------------------------------------
# press(): the keys Playwright knows, and only those


@pytest.mark.parametrize("key, want", [
    (" ", "Space"), ("Space", "Space"), ("space", "Space"), ("\n", "Enter"), ("enter", "Enter"), (" Enter ", "Enter"),
    ("Control+a", "Control+a"), ("ctrl+A", "Control+A"), ("Control++", "Control++"), ("+", "+"), ("Shift+ ", "Shift+Space"),
    ("ControlOrMeta+Shift+ArrowLeft", "ControlOrMeta+Shift+ArrowLeft"), ("esc", "Escape"), ("f5", "F5"), ("#", "#"),
])
def test_press_takes_every_key_playwright_takes(key, want):
    assert parse_action(f"press('14', {key!r})") == f"press('14', {want!r})"
    assert parse_action(f"press('14', {want!r})") == f"press('14', {want!r})"  # a fixed point


@pytest.mark.parametrize("key", ["", "  ", "Foo", "Shift+", "a+", "é", "Enter key", "Ctrl-a", "\t"])
def test_press_refuses_keys_playwright_does_not_know(key):
    with pytest.raises(ActionParseError) as e:
        parse_action(f"press('14', {key!r})")
    assert e.value.kind == "bad_key" and "Control+a" in str(e.value)


def test_the_key_list_is_playwrights_own():
    # the keys of Playwright's US layout as its own keyboard code builds them (server/input.js), from
    # the installed driver, by its own node
    import json
    import subprocess

    import playwright
    driver = os.path.join(os.path.dirname(playwright.__file__), "driver")
    script = f"""const {{USKeyboardLayout}} = require({json.dumps(driver + '/package/lib/server/usKeyboardLayout.js')});
const aliases = {{ShiftLeft: ['Shift'], ControlLeft: ['Control'], AltLeft: ['Alt'], MetaLeft: ['Meta'], Enter: ['\\n', '\\r']}};
const names = new Set(['ControlOrMeta']);
for (const code in USKeyboardLayout) {{ const d = USKeyboardLayout[code]; names.add(code);
  for (const a of aliases[code] || []) names.add(a);
  if (d.location) continue;
  if (d.key.length === 1) names.add(d.key);
  if (d.shiftKey) names.add(d.shiftKey); }}
console.log(JSON.stringify([...names]));"""
    names = json.loads(subprocess.run([os.path.join(driver, "node"), "-e", script], capture_output=True, text=True,
                                      check=True).stdout)
    assert {n for n in names if len(n) > 1} == keys.NAMED_KEYS
    assert {n for n in names if len(n) == 1} == keys.KEY_CHARS


# ---------------------------------------------------------------------------------------------
# property: every action of the language is a fixed point, wherever it is written

SPECIAL = "'\"\\#\n\r\t ()[]{},=<>/`xX9éの🚀\u2028\x00"
TEXT = st.text(max_size=30) | st.text(alphabet=SPECIAL, max_size=30)
BID = st.from_regex(r"[a-zA-Z]{0,2}[0-9]{1,4}", fullmatch=True)
# a key combination in canonical form (' ' and line breaks are written 'Space' and 'Enter')
KEYS = st.lists(st.sampled_from(sorted(keys.NAMED_KEYS) + [chr(c) for c in range(0x21, 0x7F)]),
                min_size=1, max_size=3).map("+".join)
PIXELS = st.integers(-10**9, 10**9) | st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False)


@st.composite
def any_action(draw):
    """(canonical string, name, args) for any action, built the way parse_action builds it."""
    name = draw(st.sampled_from(sorted(ACTIONS)))
    args = []
    for p in ACTIONS[name]:
        if p == "bid":
            args.append(draw(BID))
        elif p in ("delta_x", "delta_y"):
            args.append(draw(PIXELS))
        elif p == "options":
            args.append(draw(TEXT | st.lists(TEXT, min_size=1, max_size=4)))
        elif p == "key_comb":
            args.append(draw(KEYS))
        else:
            args.append(draw(TEXT))
    return f"{name}({', '.join(repr(a) for a in args)})", name, args


PROSE_BEFORE = ["", "I'll do it: ", "The box (id 3) isn't filled, so ", "Action:\n", "# Plan\n", "it's `"]
PROSE_AFTER = ["", ".", "` — that's it.", "\nDone (I hope).", "  # the final step", "\n</answer>"]
THOUGHT = st.text(alphabet=st.characters(blacklist_characters="()"), max_size=60)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_action(), st.sampled_from(PROSE_BEFORE), st.sampled_from(PROSE_AFTER), THOUGHT, any_action())
def test_canonical_is_a_fixed_point_wherever_written(action, before, after, thought, other):
    canon, name, args = action
    assert canonical(name, args) == canon
    assert parse_action(canon) == canon
    assert split_action(canon) == (name, args)
    assert parse_action(before + canon + after) == canon
    assert parse_action(f"```python\n{canon}\n```") == canon
    assert parse_action(f"Here it is:\n```python\n# {thought.splitlines()[0] if thought.strip() else 'go'}\n"
                        f"x = 1\n{canon}  # done\n```\n") == canon
    assert parse_action(f"<think>{thought}</think>{before}{canon}{after}") == canon
    assert parse_action(f"<think>first {other[0]}, then</think>\n{canon}") == canon  # think is ignored
    assert parse_action(f"{other[0]} or rather {canon}") == canon  # the last call wins


FRAGMENT = st.sampled_from(["click(", "fill(", "select_option(", "scroll(", "page.", "'", '"', "'''", "\\", "#",
                            "\n", "(", ")", "[", "]", ", ", "'15'", "1", "x", "r'", "b'", ".", "-", "1e999", "0x1",
                            "<think>", "</think>", "```", " # c"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(FRAGMENT | st.text(max_size=4), max_size=40).map("".join))
def test_any_reply_gives_a_canonical_action_or_a_named_error(reply):
    try:
        action = parse_action(reply)
    except ActionParseError as e:
        assert e.kind != "invalid" and str(e)  # every error names its kind
        return
    assert parse_action(action) == action
    assert canonical(*split_action(action)) == action


# ---------------------------------------------------------------------------------------------
# the general web's grammar (WEB_ACTIONS): BrowserGym's own navigation, tab and keyboard calls

# BrowserGym's test cases and docstring examples for these actions (browsergym-core 0.14.3:
# tests/core/test_actions_highlevel.py test_goto, test_fill_type_press, test_key_press; the Examples of
# browsergym.core.action.functions), one call each: each must parse to the call BrowserGym's own parser reads
BROWSERGYM_CALLS = [
    "goto('file:///tests/core/data/input_type/text_input.html')", "goto('http://www.example.com')",  # test_goto
    "go_back()", "go_forward()",
    "keyboard_type('Gérard')", "keyboard_insert_text('Jugnot')", "keyboard_press('End')",  # test_fill_type_press
    "keyboard_down('Shift')", "keyboard_press('Home')", "keyboard_up('Shift')", "keyboard_press('Backspace')",
    "keyboard_insert_text('Gérard')", "keyboard_type('Jean')", "keyboard_type('Reno')",
    "keyboard_press('Control+a')", "keyboard_press('Control+c')", "keyboard_press('Control+v')",  # test_key_press
    "keyboard_press('Meta+a')", "keyboard_press('Meta+c')", "keyboard_press('Meta+v')",
    "keyboard_press('ControlOrMeta+a')", "keyboard_press('Meta+Shift+t')", "keyboard_up('c')",  # docstrings
    "keyboard_type('Hello world!')", "keyboard_insert_text('Hello world!')",
    "new_tab()", "tab_close()", "tab_focus(2)",
    "send_msg_to_user('Based on the results of my search, the city was built in 1751.')",
    "report_infeasible('I cannot follow these instructions because there is no email field in this form.')",
]


@pytest.mark.parametrize("call", BROWSERGYM_CALLS)
def test_browsergym_calls_parse_as_browsergym_parses_them(call):
    from browsergym.core.action.parsers import highlevel_action_parser

    (name, args), = [tuple(c) for c in highlevel_action_parser.parse_string(call, parse_all=True)]
    assert parse_action(call, WEB_ACTIONS) == call  # already canonical
    assert split_action(parse_action(call, WEB_ACTIONS)) == (name, list(args))
    assert parse_action(f"<think>go on</think>\nOK: {call}", WEB_ACTIONS) == call
    if name not in ACTIONS:  # MiniWoB's grammar is as it was: not its actions
        assert kind_of(call) == "unknown_action"


def test_web_arguments_are_checked_and_canonical():
    W = WEB_ACTIONS
    assert parse_action("tab_focus('1')", W) == "tab_focus(1)"
    assert parse_action("keyboard_press(key='ctrl+A')", W) == "keyboard_press('Control+A')"
    assert parse_action('goto(url="http://shop:7770/?q=a b")', W) == "goto('http://shop:7770/?q=a b')"
    assert parse_action("send_msg_to_user(text='42')", W) == "send_msg_to_user('42')"
    for bad, kind in [("tab_focus(-1)", "bad_number"), ("tab_focus(1.5)", "bad_number"), ("tab_focus('x')", "bad_number"),
                      ("keyboard_press('Hyper')", "bad_key"), ("goto('')", "bad_text"), ("goto(['a'])", "bad_text"),
                      ("go_back(1)", "too_many_args"), ("keyboard_type()", "missing_arg"),
                      ("mouse_click(1, 2)", "unknown_action"), ("goto('http://x'", "unclosed")]:
        with pytest.raises(ActionParseError) as info:
            parse_action(bad, W)
        assert info.value.kind == kind, bad
    assert "keyboard_press() got unknown key 'Hyper'" in str(pytest.raises(ActionParseError, parse_action,
                                                                              "keyboard_press('Hyper')", W).value)
