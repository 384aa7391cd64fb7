"""axtree.py: flatten_axtree's text is read back exactly by its one reader (read_tree, parse_line,
line_bid). Pure: no browser is started."""
from hypothesis import given, settings
from hypothesis import strategies as st

from axtree import flatten_axtree, line_bid, parse_line, read_tree


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
