"""The page change Δ: an exact, line-oriented edit of the flattened accessibility tree (DynaWeb's Δ).

    from delta import diff, apply
    d = diff(obs_t, obs_next, done="no")     # the Δ of a real transition (exact)
    page, n_bad = apply(obs_t, d)            # the next page; a model's bad lines are skipped and counted

DynaWeb trains an LLM to predict the change between two pages instead of the whole next page.
Here the change Δ is a precise, line-oriented edit of the flattened accessibility tree
(axtree.flatten_axtree: one node a line, `[13] button 'Submit'`), computed from real transitions by
`diff`, so every label is exact and every prediction can be checked exactly by `apply`.

Δ format (one operation a line; header, then edits in page order, then the done line):

    url: miniwob/other.html            the new URL (only when it changed)
    error: ValueError: Could not ...   the action's error shown to the agent (only when there is one)
    - REF                              remove the line REF
    ~ LINE                             LINE replaces the line with LINE's bid: `~ [21] checkbox 'Gh', checked`
    ~ REF LINE                         LINE replaces the line REF (a line without a bid: `~ [24]+1 StaticText 'x'`)
    + REF LINE                         insert LINE after the line REF (`^`: at the top); several inserts after
                                       the same REF keep their order
    done: yes|no|fail                  yes: the task is now complete (success); fail: the episode ended
                                       without success (MiniWoB ends on a wrong click); no: it goes on

REF names a line of the *old* tree: `[21]` is the line whose bid is 21 (bids that occur once); any
other line is `A+k`, the k-th line after the nearest bid line A above it (`^+k`: the k-th line from
the top, before any bid line). LINE is copied verbatim after one space, indentation included.
An unchanged page is the one-line Δ `done: no`. Example (click('21') checks a box and shows text):

    ~ [21] checkbox 'Gh', focused, checked
    + [24] StaticText 'Done!'
    done: no

The paper predicts a free-text description of the change; we deviate on purpose: an exact format
makes the training labels noise-free and lets evaluation count exact next-page matches.

Pure text: nothing here needs a browser or a model (world_model.py predicts Δ, transitions.py
records real ones).
"""
from __future__ import annotations

import difflib
import re
from collections import Counter, defaultdict
from dataclasses import asdict, is_dataclass

from axtree import BID as _BID, line_bid as _line_bid

# ----------------------------------------------------------------------------------------------
# States and the Δ format

DONE_VALUES = ("yes", "no", "fail")
MAX_LINES = 1000  # apply() never builds a tree longer than this (flatten_axtree writes at most ~201)

_REF = rf"(?:\^|\[{_BID}\])(?:\+[0-9]+)?"
_OP_REMOVE = re.compile(rf"- ({_REF}) *$")
_OP_ADD = re.compile(rf"\+ ({_REF}) (.*)$", re.S)
_OP_CHANGE_AT = re.compile(rf"~ ((?:\^|\[{_BID}\])\+[0-9]+) (.*)$", re.S)  # ~ REF LINE (a line without bid)
_OP_CHANGE = re.compile(r"~ (.*)$", re.S)  # ~ LINE (LINE holds the bid)
_OP_HEADER = re.compile(r"(url|error):(?: (.*))?$", re.S)
_OP_DONE = re.compile(r"done: *(yes|no|fail) *$")


def as_state(o) -> dict:
    """{goal, url, axtree, error} from an env.Obs, a dict (a recorded JSON observation) or a state."""
    if is_dataclass(o):
        o = asdict(o)
    return {"goal": o.get("goal", "") or "", "url": o.get("url", "") or "", "axtree": o.get("axtree", "") or "",
            "error": o.get("error", "") or ""}


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


def diff(o_t, o_next, done: bool | str = False) -> str:
    """The Δ that turns o_t into o_next (states: env.Obs or dicts with url, axtree, error).

    done: the `done:` line, True/"yes" (task complete), False/"no", or "fail" (ended unsuccessfully).
    apply(o_t, diff(o_t, o_next)) gives o_next's axtree, url and error exactly whenever o_next's tree
    repeats no bid (flatten_axtree never does: one line per node) and url/error hold no newline.
    Lines are aligned by bid (difflib on bid keys; text for lines without a bid); a bid line whose
    text changed is `~`, lines without a bid in a replaced stretch are paired in order as `~`.
    """
    status = ("yes" if done else "no") if isinstance(done, bool) else done
    if status not in DONE_VALUES:
        raise ValueError(f"done must be a bool or one of {DONE_VALUES}, got {done!r}")
    a, b = as_state(o_t), as_state(o_next)
    old, new = tree_lines(a["axtree"]), tree_lines(b["axtree"])
    refs = line_refs(old)
    anchors = {r[1:-1] for r in refs if r[0] == "[" and "+" not in r}  # bids that are their own REF
    okeys = [("b", _line_bid(x)) if _line_bid(x) in anchors else ("t", x) for x in old]
    nkeys = [("b", _line_bid(x)) if _line_bid(x) in anchors else ("t", x) for x in new]
    ops: list[tuple[int, int, int, str]] = []  # (old position, 0 edit / 1 insert, sequence, text)

    def change(i: int, line: str) -> None:
        if old[i] != line:
            ops.append((i, 0, len(ops), f"~ {line}" if okeys[i][0] == "b" else f"~ {refs[i]} {line}"))

    def add(anchor: int, line: str) -> None:
        ops.append((anchor, 1, len(ops), f"+ {'^' if anchor < 0 else refs[anchor]} {line}"))

    anchor = -1  # the last old line that survives (kept or changed): inserts go after it
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, okeys, nkeys, autojunk=False).get_opcodes():
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                change(i, new[j])
                anchor = i
        elif tag == "delete":
            ops.extend((i, 0, len(ops) + k, f"- {refs[i]}") for k, i in enumerate(range(i1, i2)))
        elif tag == "insert":
            for j in range(j1, j2):
                add(anchor, new[j])
        else:  # replace: pair lines without a bid in order (one `~` instead of `-` and `+`)
            o_nb = [i for i in range(i1, i2) if _line_bid(old[i]) is None]
            n_nb = [j for j in range(j1, j2) if _line_bid(new[j]) is None]
            pair = dict(zip(n_nb, o_nb))
            paired = set(pair.values())
            ops.extend((i, 0, len(ops) + k, f"- {refs[i]}") for k, i in enumerate(range(i1, i2)) if i not in paired)
            for j in range(j1, j2):
                if j in pair:
                    change(pair[j], new[j])
                    anchor = pair[j]
                else:
                    add(anchor, new[j])
    out = []
    if b["url"] != a["url"]:
        out.append(f"url: {_one_line(b['url'])}")
    if b["error"]:
        out.append(f"error: {_one_line(b['error'])}")
    out += [text for *_, text in sorted(ops)]
    out.append(f"done: {status}")
    return "\n".join(out)


def parse_delta(delta: str) -> tuple[dict, list[tuple], int]:
    """Parse Δ text into (header {url?, error?, done?}, edits, n_bad). Never raises.

    edits: ("-", ref) | ("~", ref or None, line) | ("+", ref, line), in Δ order. A line that matches
    no operation, or a second url/error/done line, counts as bad. Blank lines are ignored.
    """
    header: dict = {}
    edits: list[tuple] = []
    n_bad = 0
    if not isinstance(delta, str):
        return header, edits, 1
    for line in delta.split("\n"):
        if not line.strip():
            continue
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
        elif m := _OP_CHANGE_AT.match(line):
            edits.append(("~", m.group(1), m.group(2)))
            continue
        elif (m := _OP_CHANGE.match(line)) and _line_bid(m.group(1)) is not None:
            edits.append(("~", None, m.group(1)))
            continue
        else:
            n_bad += 1
            continue
        if key in header:  # contradictory or repeated header: the first one wins
            n_bad += 1
        else:
            header[key] = val
    return header, edits, n_bad


def predicted_status(delta: str) -> str:
    """The Δ's `done:` value (yes, no or fail); "no" when it has none."""
    return parse_delta(delta)[0].get("done", "no")


def predicted_done(delta: str) -> bool:
    """True iff the Δ says the task is now complete (`done: yes`)."""
    return predicted_status(delta) == "yes"


def apply(o_t, delta: str, *, max_lines: int = MAX_LINES) -> tuple[dict, int]:
    """Apply Δ to o_t. Returns (o_next as a state dict {goal, url, axtree, error}, n_bad_lines).

    Tolerant of model output: a line that does not parse, names a REF that o_t lacks, edits a line
    already removed or changed, changes a line's bid, adds a bid that is already on the page (or was
    already added), repeats a header, or would grow the tree past `max_lines` is skipped and counted.
    Never raises. Removes and changes are resolved before inserts, so their order in Δ is free.
    """
    s = as_state(o_t)
    old = tree_lines(s["axtree"])
    refs = line_refs(old)
    index = {r: i for i, r in enumerate(refs)}
    header, edits, n_bad = parse_delta(delta)
    removed: set[int] = set()
    changed: dict[int, str] = {}
    adds: list[tuple[int, str]] = []
    for e in edits:
        if e[0] == "+":
            a = -1 if e[1] == "^" else index.get(e[1])
            if a is None:
                n_bad += 1
            else:
                adds.append((a, e[2]))
            continue
        if e[0] == "-":
            i = index.get(e[1])
        else:  # "~": REF given, or the bid of the new line
            bid = _line_bid(e[2])
            i = index.get(e[1] if e[1] is not None else f"[{bid}]")
            if i is not None and _line_bid(old[i]) != bid:  # a change keeps the bid (else: - then +)
                i = None
        if i is None or i in removed or i in changed:
            n_bad += 1
        elif e[0] == "-":
            removed.add(i)
        else:
            changed[i] = e[2]
    present = Counter(_line_bid(x) for i, x in enumerate(old) if i not in removed)
    n_lines = len(old) - len(removed)
    after: dict[int, list[str]] = defaultdict(list)
    for a, line in adds:
        bid = _line_bid(line)
        if (bid is not None and present[bid]) or n_lines >= max_lines:
            n_bad += 1
            continue
        present[bid] += 1
        n_lines += 1
        after[a].append(line)
    out = list(after[-1])
    for i, line in enumerate(old):
        if i not in removed:
            out.append(changed.get(i, line))
        out.extend(after.get(i, ()))
    return {"goal": s["goal"], "url": header.get("url", s["url"]), "axtree": "\n".join(out),
            "error": header.get("error", "")}, n_bad


def delta_lines(delta: str) -> list[str]:
    """The Δ's non-empty lines other than `done:` (what line precision/recall compare)."""
    return [x for x in (delta or "").split("\n") if x.strip() and not _OP_DONE.match(x)]

def tree_f1(a: str, b: str) -> float:
    """F1 of the multisets of lines of two flattened trees (1.0 when both are empty)."""
    p, q = Counter(tree_lines(a)), Counter(tree_lines(b))
    tp = sum((p & q).values())
    if not p and not q:
        return 1.0
    return 2 * tp / (sum(p.values()) + sum(q.values()))
