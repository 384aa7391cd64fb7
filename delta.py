"""The page change Δ: an exact, line-oriented edit of the flattened accessibility tree (DynaWeb's Δ).

    from delta import diff, apply
    d = diff(obs_t, obs_next, done="no", action=a)   # the Δ of a real transition (exact)
    page, n_bad = apply(obs_t, d, action=a)          # the next page; a model's bad lines are skipped and counted

DynaWeb trains an LLM to predict the change between two pages instead of the whole next page.
Here the change Δ is a precise, line-oriented edit of the flattened accessibility tree
(axtree.flatten_axtree: one node a line, `[13] button 'Submit'`), computed from real transitions by
`diff`, so every label is exact and every prediction can be checked exactly by `apply`.

Δ format (one operation a line; header, then edits in page order, then the done line):

    url: miniwob/other.html            the new URL (only when it changed)
    error: ValueError: Could not ...   the action's error shown to the agent (only when there is one)
    focus: [21] | none                 (FOCUS_HEADER) the focus moves to the line with bid 21 (or leaves
                                       every line) before the edits
    - REF                              remove the line REF
    ~ LINE                             LINE replaces the line with LINE's bid: `~ [21] checkbox 'Gh', checked`
    ~ REF LINE                         LINE replaces the line REF (a line without a bid: `~ [24]+1 StaticText 'x'`)
    + REF LINE                         insert LINE after the line REF (`^`: at the top); several inserts after
                                       the same REF keep their order
    = REF LINE                         replace the line REF and its subtree (the lines after it indented deeper)
    | LINE                             by the block LINE, LINE, ... (`= REF` alone: remove the subtree)
    done: yes|no|fail                  yes: the task is now complete (success); fail: the episode ended
                                       without success (MiniWoB ends on a wrong click); no: it goes on

In a LINE, `value=<typed>` is the text the action typed (fill's value, select_option's option) and
`value=<typed hidden>` one • per character of it (a password field): `diff(o, o2, action=a)` writes
them (TYPED_VALUES) and `apply(o, Δ, action=a)` writes the text back. Only where flatten_axtree writes
a value (after the bid, role and quoted name), so page text, always quoted, never reads as one:

    ~ [16] textbox value=<typed hidden>, focused     after fill('16', '3Pn38'): value='•••••'

REF names a line of the *old* tree: `[21]` is the line whose bid is 21 (bids that occur once); any
other line is `A+k`, the k-th line after the nearest bid line A above it (`^+k`: the k-th line from
the top, before any bid line). LINE is copied verbatim after one space, indentation included.
An unchanged page is the one-line Δ `done: no`. Example (click('21') checks a box and shows text):

    ~ [21] checkbox 'Gh', focused, checked
    + [24] StaticText 'Done!'
    done: no

With `FOCUS_HEADER` (or `diff(..., focus=True)`) a moved focus is a header, not two line edits:
three in four real transitions move it, and `focus: [21]` says in one short line what
`~ [18] textbox` then `~ [21] button 'next', focused` says by rewriting both lines. The `, focused`
flag is the first flag of a line (axtree._FLAG_PROPS); the edits that follow see the page with the
focus moved. Off by default: it helped exact next pages less than it hurt completion (FOCUS_HEADER).

A panel swap (click-tab-2: the tab panel [24] gives way to [31] and its text) is one `=` block; `diff`
writes a block wherever it makes the Δ shorter than the line-by-line edits (`subtree=False`: never):

    ~  [20] tab 'Tab #2', selected, expanded
    = [24] [31] tabpanel 'Tab #2'
    |  StaticText 'Vel'
    |  [33] generic 'aliquam'
    done: no

The paper predicts a free-text description of the change; we deviate on purpose: an exact format
makes the training labels noise-free and lets evaluation count exact next-page matches.

Pure text: nothing here needs a browser or a model (world_model.py predicts Δ, transitions.py
records real ones). Beside it: delta_edits.py (how diff lines two trees up, and its `=` blocks) and
axtree.py's tree-line helpers (a line's depth and subtree, the `focused` flag, hidden blocks).
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import asdict, is_dataclass

from actions import split_action
from axtree import BID as _BID, STRING as _STRING, drop_shown, has_focus, line_bid as _line_bid, move_focus
from axtree import quote as _quote, subtree_end
from delta_edits import best_block, line_edits

# ----------------------------------------------------------------------------------------------
# States and the Δ format

DONE_VALUES = ("yes", "no", "fail")
# diff writes a moved focus as a `focus:` header (True) or as rewritten lines (False, the default):
# measured on 329 held-out transitions (docs/dreams.md), the header gave +4.6 points of exact next pages
# (-0.4 to +9.6, not significant) and -6.7 points of completion accuracy (-10.6 to -2.8, p = 0.001).
# apply reads the header either way. Flip it (before training a world model) to try the header.
FOCUS_HEADER = False
MAX_LINES = 1000  # apply() never builds a tree longer than this (flatten_axtree writes at most ~201)
# diff(..., action=a) writes a changed line's value as `value=<typed>` when it is the text the action typed
# (typed_text: fill's value, select_option's option) and as `value=<typed hidden>` when it is one • per
# character of that text (a password field): a world model then copies no text and counts no dots (17 of
# the 5-epoch model's 69 held-out misses were a filled value, most of them a miscounted password;
# docs/dreams.md). apply(o, Δ, action=a) writes the text back, so the round trip stays exact on every tree
# flatten_axtree writes (it quotes every text value: a bare `value=<typed>` only occurs in a Δ); apply reads
# both forms whatever this switch says, so a model trained with either applies. False: values written out.
TYPED_VALUES = True
TYPED, TYPED_HIDDEN = "<typed>", "<typed hidden>"
HIDDEN_CHAR = "\u2022"  # what Chromium shows for each character of a password field's value

_REF = rf"(?:\^|\[{_BID}\])(?:\+[0-9]+)?"
_OP_REMOVE = re.compile(rf"- ({_REF}) *$")
_OP_ADD = re.compile(rf"\+ ({_REF}) (.*)$", re.S)
_OP_CHANGE_AT = re.compile(rf"~ ((?:\^|\[{_BID}\])\+[0-9]+) (.*)$", re.S)  # ~ REF LINE (a line without bid)
_OP_CHANGE = re.compile(r"~ (.*)$", re.S)  # ~ LINE (LINE holds the bid)
_OP_SUBTREE = re.compile(rf"= ((?:\^|\[{_BID}\])\+[0-9]+|\[{_BID}\])(?: (.*))?$", re.S)  # = REF [LINE]
_OP_BLOCK = re.compile(r"\|(?: (.*))?$", re.S)  # | LINE: the next line of the block above
_OP_HEADER = re.compile(r"(url|error|focus):(?: (.*))?$", re.S)
_FOCUS_VALUE = re.compile(rf"\[({_BID})\]|none")
_OP_DONE = re.compile(r"done: *(yes|no|fail) *$")
# a tree line's value field, where flatten_axtree writes it (after the indent, bid, role and name): page
# text can only put a placeholder inside a quoted string, never here
_VALUE_FIELD = re.compile(rf"( *(?:\[{_BID}\](?: |$))?\S*(?: (?:{_STRING}))? value=)({_STRING}|{TYPED}|{TYPED_HIDDEN})")


def as_state(o) -> dict:
    """{goal, url, axtree, error, hidden} from an env.Obs, a dict (a recorded JSON observation) or a state.
    hidden: the page's content without a layout box (env.Obs.hidden), "" when not observed."""
    if is_dataclass(o):
        o = asdict(o)
    return {"goal": o.get("goal", "") or "", "url": o.get("url", "") or "", "axtree": o.get("axtree", "") or "",
            "error": o.get("error", "") or "", "hidden": o.get("hidden", "") or ""}


_TYPING = {"fill": 2, "select_option": 2, "keyboard_type": 1, "keyboard_insert_text": 1}  # name: arity (text last)


def typed_text(action: str | None) -> str | None:
    """The text `action` types into a field: fill's value, select_option's option (one option, given as
    text or a one-item list) or keyboard_type's and keyboard_insert_text's text; None for any other
    action, for a call with another number of arguments than its grammar's, and for text that does not
    parse as a call (a parse error's raw text, None). Never raises."""
    try:
        name, args = split_action(action)
    except Exception:
        return None
    if _TYPING.get(name) != len(args):
        return None
    text = args[-1]
    if name == "select_option" and isinstance(text, list) and len(text) == 1:  # select_option('9', ['a'])
        text = text[0]
    return text if isinstance(text, str) else None


def type_value(line: str, typed: str | None) -> str:
    """`line` with its value field written as TYPED when it is `typed` as the tree writes it, or as
    TYPED_HIDDEN when it is one HIDDEN_CHAR per character of a non-empty `typed`; else `line` unchanged."""
    m = _VALUE_FIELD.match(line) if typed is not None else None
    if m is None:
        return line
    if m.group(2) == _quote(typed):
        ph = TYPED
    elif typed and m.group(2) == _quote(HIDDEN_CHAR * len(typed)):
        ph = TYPED_HIDDEN
    else:
        return line
    return line[:m.start(2)] + ph + line[m.end(2):]


def untype_value(line: str, typed: str | None) -> str | None:
    """type_value's inverse: `line` with a TYPED or TYPED_HIDDEN value field written out from `typed`;
    `line` unchanged when it has neither; None when it has one and `typed` is None (the action typed
    nothing: apply skips and counts the line)."""
    m = _VALUE_FIELD.match(line)
    if m is None or m.group(2) not in (TYPED, TYPED_HIDDEN):
        return line
    if typed is None:
        return None
    text = typed if m.group(2) == TYPED else HIDDEN_CHAR * len(typed)
    return line[:m.start(2)] + _quote(text) + line[m.end(2):]


def tree_lines(axtree: str) -> list[str]:
    """The lines of a flattened tree, split on newlines only; an empty tree has none."""
    # split("\n"), not splitlines(): names may hold \r or \u2028 and the round trip must be exact
    return axtree.split("\n") if axtree else []


def line_refs(lines: list[str]) -> list[str]:
    """The REF of every line: `[bid]` for a bid that occurs once, else `A+k` (see the module doc)."""
    bids = [_line_bid(x) for x in lines]
    counts = Counter(b for b in bids if b is not None)
    refs, anchor, k = [], "^", 0
    for b in bids:
        if b is not None and counts[b] == 1:
            anchor, k = f"[{b}]", 0
            refs.append(anchor)
        else:
            k += 1
            refs.append(f"{anchor}+{k}")
    return refs


def _one_line(s: str) -> str:
    return s.replace("\n", " ")  # a header is one line; real URLs and errors (first line only) have no newline


def done_status(success: bool, terminated: bool) -> str:
    """The `done:` value of a real transition: yes on success, fail if the task ended otherwise."""
    return "yes" if success else ("fail" if terminated else "no")


def _focus_header(old: list[str], new: list[str]) -> tuple[str | None, list[str]]:
    """diff's `focus:` value (None: no header) and the old lines with it applied: a header when
    o_next has at most one focused line, not the one(s) o_t has; its value is that line's bid when
    o_t has a line with it, else `none` (the new line brings its own flag)."""
    fa = [_line_bid(x) for x in old if has_focus(x)]
    fb = [_line_bid(x) for x in new if has_focus(x)]
    if fa == fb or len(fb) > 1 or (fb and fb[0] is None):
        return None, old
    target = fb[0] if fb and any(_line_bid(x) == fb[0] for x in old) else None
    moved, _ = move_focus(old, target)
    return (None, old) if moved == old else (f"[{target}]" if target else "none", moved)


def diff(o_t, o_next, done: bool | str = False, *, subtree: bool = True, focus: bool | None = None,
         action: str | None = None) -> str:
    """The Δ that turns o_t into o_next (states: env.Obs or dicts with url, axtree, error).

    done: the `done:` line, True/"yes" (task complete), False/"no", or "fail" (ended unsuccessfully).
    apply(o_t, diff(o_t, o_next)) gives o_next's axtree, url and error exactly whenever o_next's tree
    repeats no bid (flatten_axtree never does: one line per node) and url/error hold no newline.
    Lines are aligned by bid (delta_edits.line_edits: difflib on bid keys; text for lines without a bid);
    a bid line whose text changed is `~`, lines without a bid in a replaced stretch are paired in order as `~`.
    subtree: also try `=` blocks (an old subtree replaced by the new lines between the same kept
    neighbours), greedily, up to 4, each kept only when it makes the Δ text shorter.
    focus: write a moved focus as a `focus:` header (None: FOCUS_HEADER).
    action: the action taken (canonical, parse_action's); with TYPED_VALUES a new or changed line whose
    value is the text it typed is written with a TYPED / TYPED_HIDDEN placeholder (type_value), which
    apply(o_t, Δ, action=action) writes back: pass the same action to both.
    """
    status = ("yes" if done else "no") if isinstance(done, bool) else done
    if status not in DONE_VALUES:
        raise ValueError(f"done must be a bool or one of {DONE_VALUES}, got {done!r}")
    a, b = as_state(o_t), as_state(o_next)
    old, new = tree_lines(a["axtree"]), tree_lines(b["axtree"])
    moved_to, old = (_focus_header(old, new) if (FOCUS_HEADER if focus is None else focus)
                     else (None, old))  # the `focus:` value; the edits start from the moved page
    refs = line_refs(old)
    anchors = {r[1:-1] for r in refs if r[0] == "[" and "+" not in r}  # bids that are their own REF
    okeys = [("b", _line_bid(x)) if _line_bid(x) in anchors else ("t", x) for x in old]
    nkeys = [("b", _line_bid(x)) if _line_bid(x) in anchors else ("t", x) for x in new]
    typed = typed_text(action) if TYPED_VALUES else None
    if typed is not None:  # only lines the Δ writes: a line the old page already shows stays as it is
        shown = set(old)
        new = [x if x in shown else type_value(x, typed) for x in new]
    ops, kept = line_edits(old, new, refs, okeys, nkeys, [])
    blocks: list[tuple[int, int, int, int]] = []
    while subtree and len(blocks) < 4:
        best = best_block(old, new, refs, okeys, nkeys, blocks, ops, kept)
        if best is None:
            break
        blocks.append(best[0])
        ops, kept = best[1]
    out = []
    if b["url"] != a["url"]:
        out.append(f"url: {_one_line(b['url'])}")
    if b["error"]:
        out.append(f"error: {_one_line(b['error'])}")
    if moved_to is not None:
        out.append(f"focus: {moved_to}")
    out += [text for *_, text in sorted(ops)]
    out.append(f"done: {status}")
    return "\n".join(out)


def parse_delta(delta: str) -> tuple[dict, list[tuple], int]:
    """Parse Δ text into (header {url?, error?, focus?, done?}, edits, n_bad). Never raises.

    edits: ("-", ref) | ("~", ref or None, line) | ("+", ref, line) | ("=", ref, [lines]), in Δ
    order; a `=` edit's lines are its own LINE (if any) then the `| LINE` lines that follow it. A
    line that matches no operation, a `|` line after anything but `=` or `|`, or a second
    url/error/done line counts as bad. Blank lines are ignored.
    """
    header: dict = {}
    edits: list[tuple] = []
    n_bad = 0
    if not isinstance(delta, str):
        return header, edits, 1
    block: list[str] | None = None  # the open `=` block, while `|` lines may follow
    for line in delta.split("\n"):
        if not line.strip():
            continue
        if m := _OP_BLOCK.match(line):
            if block is None:
                n_bad += 1
            else:
                block.append(m.group(1) or "")
            continue
        block = None
        if m := _OP_DONE.match(line):
            key, val = "done", m.group(1)
        elif m := _OP_HEADER.match(line):
            key, val = m.group(1), m.group(2) or ""
        elif m := _OP_REMOVE.match(line):
            edits.append(("-", m.group(1)))
            continue
        elif m := _OP_ADD.match(line):
            edits.append(("+", m.group(1), m.group(2)))
            continue
        elif m := _OP_SUBTREE.match(line):
            block = [] if m.group(2) is None else [m.group(2)]
            edits.append(("=", m.group(1), block))
            continue
        elif m := _OP_CHANGE_AT.match(line):
            edits.append(("~", m.group(1), m.group(2)))
            continue
        elif (m := _OP_CHANGE.match(line)) and _line_bid(m.group(1)) is not None:
            edits.append(("~", None, m.group(1)))
            continue
        else:
            n_bad += 1
            continue
        if key in header or (key == "focus" and not _FOCUS_VALUE.fullmatch(val)):
            n_bad += 1  # contradictory or repeated header (the first one wins), or not a focus value
        else:
            header[key] = val
    return header, edits, n_bad


def predicted_status(delta: str) -> str:
    """The Δ's `done:` value (yes, no or fail); "no" when it has none."""
    return parse_delta(delta)[0].get("done", "no")


def predicted_done(delta: str) -> bool:
    """True iff the Δ says the task is now complete (`done: yes`)."""
    return predicted_status(delta) == "yes"


def apply(o_t, delta: str, *, max_lines: int = MAX_LINES, action: str | None = None) -> tuple[dict, int]:
    """Apply Δ to o_t. Returns (o_next as a state dict {goal, url, axtree, error, hidden}, n_bad_lines).
    Δ edits the tree (and the URL); o_next keeps o_t's hidden content less the blocks (a top-level
    hidden line and the deeper lines under it) that hold a bid the new tree shows: a panel a click
    opens leaves the hidden list as it does on a real page. What a change hides is not added (a Δ
    does not say it).

    Tolerant of model output: a line that does not parse, names a REF that o_t lacks, edits a line
    already removed or changed, changes a line's bid, adds a bid that is already on the page (or was
    already added), repeats a header, moves the focus to a bid o_t lacks (the flag still leaves its
    old line), or would grow the tree past `max_lines` is skipped and counted.
    A `=` whose subtree holds a line already removed or changed is skipped with its block lines
    (each counted); a block line with a bid already on the page is skipped and counted alone.
    Never raises. Removes, changes and blocks are resolved before inserts, so their order is free;
    an insert after a block's REF goes after the block.
    action: the action taken: a line's TYPED / TYPED_HIDDEN value is the text it typed (untype_value;
    with an action that typed nothing, such a line is skipped and counted, a `=` line with its block).
    """
    s = as_state(o_t)
    old = tree_lines(s["axtree"])
    header, edits, n_bad = parse_delta(delta)
    typed, written = typed_text(action), []
    for e in edits:  # placeholders written out first: every check below sees the line the page would show
        if e[0] == "=":
            lines = [untype_value(x, typed) for x in e[2]]
            if None in lines:
                n_bad += max(1, len(lines))
                continue
            e = ("=", e[1], lines)
        elif e[0] != "-":
            line = untype_value(e[2], typed)
            if line is None:
                n_bad += 1
                continue
            e = (e[0], e[1], line)
        written.append(e)
    edits = written
    if "focus" in header:  # the focus moves first; the edits see the moved page
        old, found = move_focus(old, None if header["focus"] == "none" else header["focus"][1:-1])
        n_bad += not found  # a bid not on o_t (a line the edits add?): the flag leaves the old line all the same
    refs = line_refs(old)
    index = {r: i for i, r in enumerate(refs)}
    removed: set[int] = set()
    changed: dict[int, str] = {}
    blocks: dict[int, list[str]] = {}  # the root of each replaced subtree: its new lines
    adds: list[tuple[int, str]] = []
    for e in edits:
        if e[0] == "+":
            a = -1 if e[1] == "^" else index.get(e[1])
            if a is None:
                n_bad += 1
            else:
                adds.append((a, e[2]))
            continue
        if e[0] == "=":
            i = index.get(e[1])
            span = range(i, subtree_end(old, i)) if i is not None else range(0)
            if i is None or any(x in removed or x in changed or x in blocks for x in span):
                n_bad += 1 + max(0, len(e[2]) - 1)  # the `=` line and its `|` lines
            else:
                blocks[i] = e[2]
                removed.update(span[1:])
            continue
        if e[0] == "-":
            i = index.get(e[1])
        else:  # "~": REF given, or the bid of the new line
            bid = _line_bid(e[2])
            i = index.get(e[1] if e[1] is not None else f"[{bid}]")
            if i is not None and _line_bid(old[i]) != bid:  # a change keeps the bid (else: - then +)
                i = None
        if i is None or i in removed or i in changed or i in blocks:
            n_bad += 1
        elif e[0] == "-":
            removed.add(i)
        else:
            changed[i] = e[2]
    present = Counter(_line_bid(x) for i, x in enumerate(old) if i not in removed and i not in blocks)
    n_lines = len(old) - len(removed) - len(blocks)

    def admit(line: str) -> bool:  # a new line: its bid not yet on the page, the tree not too long
        nonlocal n_bad, n_lines
        bid = _line_bid(line)
        if (bid is not None and present[bid]) or n_lines >= max_lines:
            n_bad += 1
            return False
        present[bid] += 1
        n_lines += 1
        return True

    blocks = {i: [x for x in lines if admit(x)] for i, lines in sorted(blocks.items())}
    after: dict[int, list[str]] = defaultdict(list)
    for a, line in adds:
        if admit(line):
            after[a].append(line)
    out = list(after[-1])
    for i, line in enumerate(old):
        if i in blocks:
            out.extend(blocks[i])
        elif i not in removed:
            out.append(changed.get(i, line))
        out.extend(after.get(i, ()))
    return {"goal": s["goal"], "url": header.get("url", s["url"]), "axtree": "\n".join(out),
            "error": header.get("error", ""), "hidden": drop_shown(s["hidden"], out)}, n_bad


def _written_out(op: str, typed: str | None) -> str:
    """One Δ line with the placeholder of its LINE (if any) written out from `typed` (kept when None)."""
    for rx, g in ((_OP_BLOCK, 1), (_OP_HEADER, 0), (_OP_REMOVE, 0), (_OP_ADD, 2), (_OP_SUBTREE, 2),
                  (_OP_CHANGE_AT, 2), (_OP_CHANGE, 1)):  # parse_delta's order
        m = rx.match(op)
        if m:
            line = m.group(g) if g else None
            new = untype_value(line, typed) if line else None
            return op if new is None else op[:m.start(g)] + new + op[m.end(g):]
    return op


def delta_lines(delta: str, action: str | None = None) -> list[str]:
    """The Δ's non-empty lines other than `done:` (what line precision/recall compare), each value
    placeholder written out from the text `action` typed, so Δs written with and without
    TYPED_VALUES compare alike."""
    typed = typed_text(action)
    return [_written_out(x, typed) for x in (delta or "").split("\n") if x.strip() and not _OP_DONE.match(x)]
