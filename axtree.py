"""The observation's page text: an accessibility tree flattened to one node a line, and its one reader.

    from axtree import flatten_axtree, read_tree, parse_line, line_bid
    text = flatten_axtree(bg_obs["axtree_object"])   # BrowserGym's AXTree -> text (env.WebEnv does this)
    for node in read_tree(text):                     # text -> Node(depth, bid, role, name, value, flags)
        if node.role == "button" and "focused" in node.flags: ...
    line_bid(" [13] button 'OK'")                    # -> "13" (fast: the Δ world model calls it per line)

The line format, written by flatten_axtree and read only here (experts.py, world_model.py, tests):

    [13] button 'Submit', focused
     [14] textbox 'Name' value='Myron', required
     StaticText 'Enter a name'

one space of indent per tree level; `[bid] ` when the node has a BrowserGym id (BID); the role; the
name and `value=` as Python string literals written by `quote` (a name may hold quotes, escaped); then
`, flag` or `, flag='x'` for a few properties. Only '\n' ends a line: `quote` escapes every other line
break and control character, and nothing else: the text is shown as the page shows it (U+00A0, a
zero-width space or U+FFFD are written as themselves, where Python's repr would write '\xa0').

Page text is made valid where it enters (browser.py calls `clean` on everything it reads from the page):
a lone surrogate (JavaScript strings may hold one; no encoder takes it) becomes U+FFFD, as the browser
draws it, and a surrogate pair split in two becomes its character. Everything downstream (prompts,
tokenizers, JSON, HTML reports) then holds valid Unicode.
Pure text and plain dicts: nothing here needs a browser.
"""
from __future__ import annotations

import ast
import json
import re
from typing import NamedTuple

# A bid as the tree writes it and parse_action accepts it: letters then digits, "13" or "a12"
# (BrowserGym's element ids; the letters prefix elements inside iframes).
BID = r"[A-Za-z]*[0-9]+"

# ----------------------------------------------------------------------------------------------
# Page text: made valid once where it enters, quoted where it is written


def clean_text(s: str) -> str:
    """`s` as valid Unicode: each lone surrogate becomes U+FFFD (what the browser draws), a surrogate
    pair split in two code points becomes its character; valid text comes back as the same object."""
    if s.isascii():
        return s
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def clean(obj):
    """`obj` (str, or dicts, lists and tuples of them, as Playwright returns) with every string,
    dict keys included, made valid by clean_text. Valid input is returned as it is, checked in one
    pass of the json encoder (about 1 ms for a MiniWoB page's tree)."""
    try:
        json.dumps(obj, ensure_ascii=False, default=str).encode("utf-8")
        return obj
    except UnicodeEncodeError:
        return _cleaned(obj)


def _cleaned(obj):
    if isinstance(obj, str):
        return clean_text(obj)
    if isinstance(obj, dict):
        return {_cleaned(k): _cleaned(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cleaned(v) for v in obj)
    return obj


_SHORT_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(c: str) -> str:
    """How `quote` writes one character that needs an escape (as repr would write it)."""
    if c in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


# what `quote` escapes: the backslash, control characters (C0, DEL, C1: \r, \x0b, \x1c, \x85 ... end
# lines for str.splitlines), the line and paragraph separators, and surrogates (never valid text)
_NEEDS_ESCAPE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def quote(s: str) -> str:
    """`s` as a Python string literal that shows it as the page shows it: quoted like repr (single
    quotes unless `s` holds one and no double quote), escaping only the backslash, the quote, control
    characters, line breaks and surrogates. ast.literal_eval(quote(s)) == s for every str; for text
    without other non-printable characters (every MiniWoB page) quote(s) == repr(s)."""
    q = '"' if "'" in s and '"' not in s else "'"
    body = _NEEDS_ESCAPE.sub(lambda m: _escaped(m.group()), s)
    return q + (body.replace(q, "\\" + q)) + q


# ----------------------------------------------------------------------------------------------
# Writing: BrowserGym's AXTree -> text

_DROP_ROLES = {"InlineTextBox", "LineBreak"}
# Roles an agent acts on: shown even without a name (an empty textbox is still a target).
_INTERACTIVE = {"button", "textbox", "searchbox", "checkbox", "radio", "combobox", "listbox", "option",
                "link", "tab", "menuitem", "menuitemcheckbox", "menuitemradio", "switch", "slider",
                "spinbutton", "treeitem", "gridcell", "cell", "columnheader", "rowheader", "row",
                "dialog", "alertdialog", "tablist", "tabpanel", "menu", "menubar", "tree", "grid",
                "table", "img", "image", "heading", "ListMarker"}
_FLAG_PROPS = ("focused", "required", "disabled", "checked", "selected", "expanded", "pressed")


def _name(node: dict) -> str:
    return " ".join(str((node.get("name") or {}).get("value", "") or "").split())


def _named_by_contents(node: dict) -> bool:
    """Whether Chromium computed the node's name from its contents (the text inside it), not from an
    attribute or a label: the source it used is the first one with a value not superseded (CDP's
    AXValueSource). False when the node lists no sources."""
    for source in (node.get("name") or {}).get("sources") or []:
        if "value" in source and not source.get("superseded"):
            return source.get("type") == "contents"
    return False


def flatten_axtree(axtree: dict, max_lines: int = 200) -> str:
    """The accessibility tree as text, one node a line, one space of indent per level.

    Kept: nodes an agent acts on (buttons, fields, options, ...) with their bid; text. A node
    with no name whose only content is one text (click-link's <span> links, list items, labels)
    is printed as one line with that text as its name: `[13] generic 'ornare'`. Dropped:
    InlineTextBox and LineBreak (Chromium 156 adds InlineTextBox nodes), the document's own line,
    unnamed containers (their children move up a level), every property but a few flags (focused,
    checked, selected, ...), and a text (StaticText) only where the tree already shows it at that point:
    inside a shown node whose name Chromium computed from its contents and found in that name (`[28] link 'Read
    more'`: its texts 'Read' and 'more' are that name; a text Chromium left out of it, inside a group or a listbox
    in the link, is shown), or exactly equal to its parent's name or value or a sibling's name
    (`[21] checkbox 'abc'` beside its label's text 'abc'); never because it is part of another name: the
    '7' beside `textbox 'Enter 7 digits'` is shown. The first `max_lines` lines are kept.
    """
    nodes = axtree.get("nodes", [])
    if not nodes:
        return ""
    by_id = {n["nodeId"]: n for n in nodes}
    lines: list[str] = []

    def children(node: dict) -> list[dict]:
        out = []
        for cid in node.get("childIds", []):
            child = by_id.get(cid)
            if child is None or cid == node["nodeId"]:
                continue
            if child.get("role", {}).get("value") in _DROP_ROLES:
                continue
            if child.get("ignored") and child.get("role", {}).get("value") not in ("RootWebArea",):
                out.extend(children(child))  # ignored wrappers can hold visible children
            else:
                out.append(child)
        return out

    def visit(node: dict, depth: int, context_names: set[str], content_name: str = "") -> None:
        # context_names: the texts the tree shows right here (see the docstring); content_name: the name of the
        # nearest shown ancestor that Chromium computed from its contents ('' if none): a text found in it is
        # already on that line (a text Chromium left out of it, e.g. inside a group or a listbox, is not)
        role = node.get("role", {}).get("value", "")
        name = _name(node)
        bid = node.get("browsergym_id")
        kids = children(node)
        # fold "one node + one text": <span>ornare</span> -> [13] generic 'ornare'
        if (role != "StaticText" and not name and len(kids) == 1
                and kids[0].get("role", {}).get("value") == "StaticText" and _name(kids[0])):
            name, kids = _name(kids[0]), []
            folded = True
        else:
            folded = False
        if role == "RootWebArea":
            show = False
        elif role == "StaticText":
            show = bool(name) and name not in content_name and name not in context_names
        elif role in _INTERACTIVE or role.lower() in _INTERACTIVE:
            show = True
        elif folded and name in context_names:
            show = False  # e.g. the text inside a filled textbox repeats its value
        else:
            show = bool(name)  # containers: only when they carry text
        if show:
            s = (f"[{bid}] " if bid is not None else "") + role + (f" {quote(name)}" if name else "")
            value = (node.get("value") or {}).get("value")
            if value not in (None, "") and str(value) != name:
                s += f" value={quote(value) if isinstance(value, str) else repr(value)}"
            props = {p.get("name"): (p.get("value") or {}).get("value") for p in node.get("properties", [])}
            attrs = [k for k in _FLAG_PROPS if props.get(k) not in (None, False, "false")]
            attrs = [k if props[k] in (True, "true") else
                     f"{k}={quote(props[k]) if isinstance(props[k], str) else repr(props[k])}" for k in attrs]
            if attrs:
                s += ", " + ", ".join(attrs)
            lines.append(" " * depth + s)
        # a child's text is redundant where the parent (shown or not) or a sibling already says exactly it
        sibling_names = {_name(k) for k in kids if k.get("role", {}).get("value") != "StaticText"}
        value = (node.get("value") or {}).get("value")
        ctx = ({name} if name else set()) | ({str(value)} if value not in (None, "") else set()) | sibling_names | (context_names if not show else set())
        if show and not folded and name and _named_by_contents(node):
            content_name = name
        for k in kids:
            visit(k, depth + 1 if show else depth, ctx, content_name)

    visit(nodes[0], 0, set())
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Hidden content: what the page holds but does not show (for the world model only)
#
# A click that opens a tab or a collapsed section shows text that is in the DOM but in no
# accessibility tree (display: none): no model can predict that text from the tree alone. The world
# model's prompt (world_model.wm_messages) adds it from HIDDEN_JS, run on the page after BrowserGym
# has marked the elements with bids (browser.py, WebEnv(hidden=True)); the policy never sees it.

HIDDEN_MAX_LINES = 40  # lines and characters per page: a bound on the world model's prompt
HIDDEN_MAX_CHARS = 2000

# Every topmost element that has no layout box (display: none, itself or an ancestor) and holds text,
# walked in document order: [depth, bid or null, role (the role attribute, else the tag), own text].
# An element with a bid and no child elements is one row with its text; text nodes are StaticText rows.
HIDDEN_JS = r"""(limits) => {
  const [maxLines, maxChars] = limits;
  const SKIP = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'SELECT', 'OPTION', 'HEAD']);
  const out = []; let chars = 0;
  const shown = el => el.getClientRects().length > 0 || getComputedStyle(el).display === 'contents';
  const text = s => s.replace(/\s+/g, ' ').trim();
  const emit = (row) => {
    if (out.length >= maxLines || chars >= maxChars) return;
    row[3] = row[3].slice(0, maxChars - chars);
    out.push(row); chars += row[3].length + 8;
  };
  const visit = (node, depth) => {
    if (node.nodeType === Node.TEXT_NODE) {
      const t = text(node.textContent);
      if (t) emit([depth, null, 'StaticText', t]);
      return;
    }
    if (node.nodeType !== Node.ELEMENT_NODE || SKIP.has(node.tagName.toUpperCase())) return;
    const bid = node.getAttribute('bid');
    let d = depth;
    if (bid !== null) {
      const leaf = node.children.length === 0;
      emit([depth, bid, node.getAttribute('role') || node.tagName.toLowerCase(), leaf ? text(node.textContent) : '']);
      if (leaf) return;
      d = depth + 1;
    }
    for (const c of node.childNodes) visit(c, d);
  };
  const walk = el => {
    for (const c of el.children) {
      if (SKIP.has(c.tagName.toUpperCase())) continue;
      if (!shown(c)) { if (text(c.textContent)) visit(c, 0); }
      else walk(c);
    }
  };
  if (document.body) walk(document.body);
  return out;
}"""

# tags as the accessibility tree names their roles (for rows without a role attribute)
_TAG_ROLES = {"p": "paragraph", "span": "generic", "div": "generic", "a": "link", "li": "listitem",
              "ul": "list", "ol": "list", "h1": "heading", "h2": "heading", "h3": "heading", "h4": "heading",
              "label": "LabelText", "input": "textbox", "textarea": "textbox", "table": "table", "tr": "row",
              "td": "cell", "th": "columnheader", "img": "img"}


def format_hidden(rows) -> str:
    """HIDDEN_JS's rows as tree-like lines (`[27] paragraph 'Habitasse ...'`, `StaticText '...'`, one
    space of indent per level, names written by `quote`). Untrusted page data (the page's own scripts
    run beside HIDDEN_JS and can forge its result): a row that is not [int, str | None, str, str] is
    dropped, depth is clamped to 0-20, bids must match BID, a role that is not a short word becomes
    generic, and the bounds are applied again here: at most HIDDEN_MAX_LINES lines and about
    HIDDEN_MAX_CHARS characters of names."""
    out, chars = [], 0
    for row in rows if isinstance(rows, list) else ():
        if len(out) >= HIDDEN_MAX_LINES or chars >= HIDDEN_MAX_CHARS:
            break
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], int) and isinstance(row[2], str)
                and isinstance(row[3], str) and (row[1] is None or isinstance(row[1], str))):
            continue
        depth, bid, role, name = min(max(row[0], 0), 20), row[1], row[2], row[3][:HIDDEN_MAX_CHARS - chars]
        if bid is not None and not re.fullmatch(BID, bid):
            continue
        chars += len(name) + 8
        role = _TAG_ROLES.get(role, role) if role.isalnum() and len(role) <= 40 else "generic"
        out.append(" " * depth + (f"[{bid}] " if bid is not None else "") + role + (f" {quote(name)}" if name else ""))
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# Reading: text -> nodes

STRING = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""  # a str's repr (quote's output), escaped quotes included
_BID_LINE = re.compile(rf" *\[({BID})\](?: |$)")
_NODE_LINE = re.compile(rf"(?P<indent> *)(?:\[(?P<bid>{BID})\](?: |$))?(?P<role>\S*)"
                        rf"(?: (?P<name>{STRING}))?(?: value=(?P<value>{STRING}))?(?P<rest>.*)")


class Node(NamedTuple):
    """One line of the flattened tree."""

    depth: int              # leading spaces: the node's level in the tree
    bid: str | None         # "13"; None for a line without one (text, containers)
    role: str               # "button", "StaticText", ...
    name: str               # the name, unquoted ("" if none)
    value: str | None       # the `value=` text, unquoted (None if none)
    flags: frozenset        # the flag names after the commas: {"focused", "checked"} (a flag's `='x'` is dropped)


def line_bid(line: str) -> str | None:
    """The bid a line starts with (after its indent): " [13] button 'OK'" -> "13", "[13]" -> "13";
    None for a line without one ("StaticText 'x'", "[13]x", "[x] y"). Equals parse_line(line).bid."""
    m = _BID_LINE.match(line)
    return m.group(1) if m else None


def _unquote(s: str | None, default):
    try:
        return ast.literal_eval(s) if s else default
    except (ValueError, SyntaxError):  # not a valid repr (only text no flatten_axtree wrote): not read
        return default


def parse_line(line: str) -> Node | None:
    """One line of flatten_axtree's text -> Node; None for a line without a node (empty, blank). Never raises.

    Reads any text: the bid is exactly line_bid's; the role is everything up to the next space (after
    the indent when there is no bid: "Goal: x" reads as role "Goal:"; "... (5 more lines)" as role "...").
    So a node with flags but no name or value, "[14] textbox, focused", reads as role "textbox," (as
    every reader of this format has so far). A name or value that is not a valid repr reads as "" / None.
    """
    m = _NODE_LINE.match(line)
    if m["bid"] is None and not m["role"]:
        return None
    flags = frozenset(f.strip().split("=")[0] for f in m["rest"].split(",") if f.strip())
    return Node(len(m["indent"]), m["bid"], m["role"], _unquote(m["name"], ""), _unquote(m["value"], None), flags)


def read_tree(text: str) -> list[Node]:
    """Every node of a flattened tree (or of a whole observation text: its Goal/URL lines read as
    nodes without a bid), in order. Lines end at '\n' only, as in the world model's Δ format."""
    return [n for n in map(parse_line, text.split("\n")) if n is not None]


# ----------------------------------------------------------------------------------------------
# Tree lines: depth, subtrees, the focus flag, hidden blocks (what delta.py's diff and apply edit)

_FOCUS_FLAG = re.compile(rf"{STRING}|, focused(?=,|$)")  # quoted names and values are skipped
_FIRST_FLAG = re.compile(rf"{STRING}|, ")


def indent(line: str) -> int:
    """A tree line's depth: its leading spaces (flatten_axtree writes one per level)."""
    return len(line) - len(line.lstrip(" "))


def subtree_end(lines: list[str], i: int) -> int:
    """One past the last line of line i's subtree: i, then every following line indented deeper."""
    d, e = indent(lines[i]), i + 1
    while e < len(lines) and indent(lines[e]) > d:
        e += 1
    return e


def has_focus(line: str) -> bool:
    """Whether a tree line carries the `focused` flag (not inside its quoted name or value)."""
    return _without_focus(line) != line


def _without_focus(line: str) -> str:  # the line without its first `, focused` flag
    for m in _FOCUS_FLAG.finditer(line):
        if m.group(0) == ", focused":
            return line[:m.start()] + line[m.end():]
    return line


def _with_focus(line: str) -> str:  # `focused` goes first among the flags, as flatten_axtree writes it
    for m in _FIRST_FLAG.finditer(line):
        if m.group(0) == ", ":
            return line[:m.start()] + ", focused" + line[m.start():]
    return line + ", focused"


def move_focus(lines: list[str], bid: str | None) -> tuple[list[str], bool]:
    """The lines with the `focused` flag taken off every line and put on the first line whose bid is
    `bid` (None: on none). Returns (lines, found): found is False when no line has that bid (the
    flag is then on no line)."""
    out = [_without_focus(x) for x in lines]
    if bid is None:
        return out, True
    i = next((i for i, x in enumerate(out) if line_bid(x) == bid), None)
    if i is None:
        return out, False
    out[i] = _with_focus(out[i])
    return out, True


def drop_shown(hidden: str, tree: list[str]) -> str:
    """`hidden` (axtree.format_hidden's lines) without each top-level block that holds a bid `tree`'s
    lines show. Unchanged when no block does (also when the text is no such listing)."""
    if not hidden or not isinstance(hidden, str):
        return hidden
    shown = {line_bid(x) for x in tree} - {None}
    lines = hidden.split("\n")
    base = min(map(indent, lines))
    blocks: list[list[str]] = []
    for x in lines:
        if not blocks or indent(x) <= base:
            blocks.append([])
        blocks[-1].append(x)
    kept = [b for b in blocks if not any(line_bid(x) in shown for x in b)]
    return hidden if len(kept) == len(blocks) else "\n".join(x for b in kept for x in b)
