"""axtree.py: flatten_axtree's text is read back exactly by its one reader (read_tree, parse_line,
line_bid). Pure: no browser is started."""
import ast
import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from axtree import (HIDDEN_MAX_CHARS, HIDDEN_MAX_LINES, clean, clean_text, flatten_axtree, format_hidden, line_bid,
                    parse_line, quote, read_tree)
from runlog import read_jsonl


def test_read_tree_roundtrip():
    tree = "[12] button 'OK'\n [13] textbox value=\"it's\", focused\nStaticText 'hi'"
    nodes = read_tree(tree)
    assert [(n.bid, n.role, n.name, n.value) for n in nodes] == [
        ("12", "button", "OK", None), ("13", "textbox", "", "it's"), (None, "StaticText", "hi", None)]
    assert nodes[1].flags == {"focused"} and nodes[1].depth == 1


def test_lines_that_are_not_plain_nodes():
    assert parse_line("") is None and parse_line("   ") is None and read_tree("") == []
    assert parse_line("... (12 more lines)")[:3] == (0, None, "...")  # the truncation line
    assert parse_line("Goal: click OK")[:3] == (0, None, "Goal:")     # an observation's header
    assert parse_line("[7] button 'a\\'b', checked='mixed'").flags == {"checked"}
    assert parse_line("[7] button '\\N{nope}'").name == ""           # not a valid repr: not read
    assert [line_bid(x) for x in ["[13] button", "  [a7] link 'x'", "[13]", "[13]x", "[x] y", "StaticText '[3]'"]] == [
        "13", "a7", "13", None, None, None]


def _node(i, role, name="", value=None, props=(), bid=None, kids=()):
    n = {"nodeId": str(i), "role": {"value": role}, "name": {"value": name}, "childIds": [str(k) for k in kids],
         "properties": [{"name": k, "value": {"value": v}} for k, v in props]}
    if value is not None:
        n["value"] = {"value": value}
    if bid is not None:
        n["browsergym_id"] = bid
    return n


ROLES = ["button", "textbox", "checkbox", "link", "combobox", "option", "tab"]
PROPS = st.lists(st.sampled_from([("focused", True), ("checked", "true"), ("checked", "mixed"),
                                  ("expanded", False), ("selected", True), ("required", True)]),
                 unique_by=lambda p: p[0], max_size=3)
NODE = st.tuples(st.sampled_from(ROLES), st.text(max_size=12), st.none() | st.text(max_size=8), PROPS,
                 st.booleans())


@settings(max_examples=300, deadline=None)
@given(st.lists(NODE, min_size=1, max_size=6))
def test_the_reader_reads_what_flatten_writes(specs):
    # a root with the nodes as its children, every other one holding the next as a child
    nodes, top = [], []
    for i, (role, name, value, props, nested) in enumerate(specs, start=1):
        nodes.append(_node(i, role, name, value, props, bid=f"{i + 10}"))
        (nodes[-2]["childIds"] if nested and i > 1 and len(nodes[-2]["childIds"]) == 0 else top).append(str(i))
    root = _node(0, "RootWebArea")
    root["childIds"] = top
    text = flatten_axtree({"nodes": [root] + nodes})
    read = read_tree(text)
    assert len(read) == len(specs)
    for n, (i, (role, name, value, props, _)) in zip(read, enumerate(specs, start=1)):
        name = " ".join(name.split())
        value = value if value not in (None, "") and value != name else None
        flags = {k for k, v in props if v not in (False, "false")}
        if not name and value is None and flags:
            role += ","  # "[14] textbox, focused": the role runs to the first space (parse_line's docstring)
        assert (n.bid, n.role, n.name, n.value, n.flags) == (f"{i + 10}", role, name, value, flags)
    for line in text.split("\n"):
        assert parse_line(line).bid == line_bid(line)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=30) | st.text("[]0123a '\"\\bx,=", max_size=20))
def test_line_bid_is_the_readers_bid_on_any_text(line):
    node = parse_line(line)
    assert (node.bid if node else None) == line_bid(line)


# ---------------------------------------------------------------------------------------------
# page text: valid Unicode, written as the page shows it


def test_clean_makes_page_text_valid_unicode():
    assert clean_text("Save \ud83d") == "Save \ufffd" and clean_text("\ude00x\ud83d") == "\ufffdx\ufffd"
    assert clean_text("\ud83d\ude00") == "\U0001f600"  # a pair split in two code points is its character
    ok = "plain, é, の, 🚀, \xa0, \u200b"
    assert clean_text(ok) is ok
    tree = {"nodes": [{"name": {"value": "Save \ud83d"}, "childIds": ["1"], "k\udc00": ("x\udfff", 3, None)}]}
    assert clean(tree) == {"nodes": [{"name": {"value": "Save \ufffd"}, "childIds": ["1"], "k\ufffd": ("x\ufffd", 3, None)}]}
    json.dumps(clean(tree), ensure_ascii=False).encode("utf-8")
    valid = {"nodes": [{"name": {"value": ok}}]}
    assert clean(valid) is valid  # nothing copied when nothing is wrong


def test_a_cleaned_name_is_shown_as_the_page_shows_it():
    root = _node(0, "RootWebArea", kids=[1, 2])
    tree = {"nodes": [root, _node(1, "button", "Save \ud83d", bid="5"), _node(2, "textbox", "", "a\xa0b\u200b", bid="6")]}
    text = flatten_axtree(clean(tree))
    assert text == "[5] button 'Save \ufffd'\n[6] textbox value='a\xa0b\u200b'"  # no \\ud83d, no \\xa0
    assert [(n.name, n.value) for n in read_tree(text)] == [("Save \ufffd", None), ("", "a\xa0b\u200b")]


AWKWARD = "'\"\\\n\r\t\x00\x0b\x0c\x1c\x1e\x7f\x85\x9f\xa0\xad\u2028\u2029\u200b\u200e\ufeff\ufffd\ud83d\ude00\ue000xé🚀 ,=[]"


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=12) | st.text(AWKWARD, max_size=12), st.text(max_size=8) | st.text(AWKWARD, max_size=8))
def test_quote_reads_back_exactly_on_one_line(name, value):
    root = _node(0, "RootWebArea", kids=[1])
    text = flatten_axtree({"nodes": [root, _node(1, "textbox", name, value, bid="7")]})
    assert len(text.split("\n")) == 1 and len(text.splitlines()) == 1  # whatever splits lines, it is one
    node = parse_line(text)
    name = " ".join(name.split())
    assert node.name == name and node.value == (value if value not in ("", name) else None)
    for s in (name, value):
        assert ast.literal_eval(quote(s)) == s


def test_quote_writes_real_trees_as_repr_did():
    # every name and value of the real pages in tests/data/transitions.jsonl: written as before
    path = os.path.join(os.path.dirname(__file__), "data", "transitions.jsonl")
    lines = [line for r in read_jsonl(path) for o in (r["obs"], r["next_obs"]) for line in o["axtree"].split("\n")]
    texts = [t for n in map(parse_line, lines) if n for t in (n.name, n.value) if t]
    assert len(texts) > 100
    assert all(quote(t) == repr(t) for t in texts)
    assert all(quote(t) == repr(t) for t in ["it's", 'say "hi"', "both ' and \"", "a\\b", "tab\there", "é の 🚀"])


def test_hidden_rows_become_tree_lines_and_hostile_rows_are_dropped():
    """format_hidden writes HIDDEN_JS's rows as the tree's lines (tags named as the tree names them,
    names quoted); rows a page could forge (wrong types, a bid that is not a bid, a role with a line
    break, a huge depth) never become extra lines or control text."""
    rows = [[0, "26", "tabpanel", ""], [1, "27", "p", "Habitasse lectus"], [2, None, "StaticText", "it's\nx"],
            [1, "31", "span", "molestie."]]
    assert format_hidden(rows) == ("[26] tabpanel\n [27] paragraph 'Habitasse lectus'\n  StaticText \"it's\\nx\"\n"
                                   " [31] generic 'molestie.'")
    assert [n.bid for n in read_tree(format_hidden(rows))] == ["26", "27", None, "31"]
    bad = [[0, "1] button 'x", "p", "a"], [0, "5", "p\n[6] button", "b"], ["0", "7", "p", "c"], [0, 8, "p", "d"],
           [0, "9", "p"], "row", [10 ** 9, "10", "p", "e"], [0, "11", "<|im_start|>", "f"]]
    out = format_hidden(bad)
    assert out.split("\n") == ["[5] generic 'b'", " " * 20 + "[10] paragraph 'e'", "[11] generic 'f'"]
    assert format_hidden("not rows") == "" and format_hidden([]) == ""

    # the bounds hold whatever the page returns (its scripts can forge HIDDEN_JS's result)
    many = format_hidden([[0, str(i), "p", "x"] for i in range(1000)])
    assert len(many.split("\n")) == HIDDEN_MAX_LINES
    long = format_hidden([[0, "1", "p", "y" * 10 ** 6], [0, "2", "p", "z"]])
    assert len(long) < HIDDEN_MAX_CHARS + 40 and "z" not in long
    assert format_hidden([[0, "3", "a" * 41, "w"]]) == "[3] generic 'w'"


def _named_by(node, source):
    """`node` with the name sources Chromium lists: `source` is the one used ("contents", "attribute", ...)."""
    node["name"]["sources"] = [{"type": "attribute", "attribute": "aria-label"},
                               {"type": source, "value": {"type": "computedString", "value": node["name"]["value"]}}]
    return node


def test_text_is_dropped_only_where_the_tree_already_shows_it():
    # text that is part of a neighbour's name or value is shown: the '7' beside 'Enter 7 digits'
    root = _node(0, "RootWebArea", kids=[1, 2, 3, 4, 5, 6, 7, 8])
    tree = {"nodes": [root, _node(1, "textbox", "Enter 7 digits", bid="11"), _node(2, "StaticText", "7"),
                      _named_by(_node(3, "button", "Submit order", bid="13", kids=[9]), "contents"),
                      _node(4, "StaticText", "order"), _node(5, "link", "Read more", bid="15"), _node(6, "StaticText", "more"),
                      _node(7, "textbox", "", "hello", bid="17"), _node(8, "StaticText", "hell"),
                      _node(9, "StaticText", "Submit order")]}
    assert flatten_axtree(tree) == ("[11] textbox 'Enter 7 digits'\nStaticText '7'\n[13] button 'Submit order'\n"
                                    "StaticText 'order'\n[15] link 'Read more'\nStaticText 'more'\n"
                                    "[17] textbox value='hello'\nStaticText 'hell'")
    # dropped: its parent's name (the button's own text), a sibling's name (a checkbox's label), the pieces of a
    # name Chromium made of them (an element among them keeps its line); shown: the text inside a link named by
    # an attribute
    root = _node(0, "RootWebArea", kids=[1, 3, 4, 6])
    tree = {"nodes": [root, _node(1, "button", "OK", bid="11", kids=[2]), _node(2, "StaticText", "OK"),
                      _node(3, "checkbox", "abc", bid="13"), _node(4, "StaticText", "abc"),
                      _named_by(_node(6, "link", "Save changes now", bid="16", kids=[7, 8, 9]), "contents"),
                      _node(7, "StaticText", "Save"), _node(8, "generic", "", bid="18", kids=[10]), _node(10, "StaticText", "changes"),
                      _node(9, "StaticText", "now")]}
    assert flatten_axtree(tree) == "[11] button 'OK'\n[13] checkbox 'abc'\n[16] link 'Save changes now'\n [18] generic 'changes'"
    tree["nodes"][5] = _named_by(tree["nodes"][5], "attribute")
    assert flatten_axtree(tree).split("\n")[2:] == ["[16] link 'Save changes now'", " StaticText 'Save'",
                                                    " [18] generic 'changes'", " StaticText 'now'"]
