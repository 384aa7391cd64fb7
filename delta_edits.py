"""How delta.diff lines up two trees: the edit operations of a Δ, and the `=` blocks that shorten it.

    from delta_edits import line_edits, best_block
    ops, kept = line_edits(old, new, refs, okeys, nkeys, [])               # line by line
    best = best_block(old, new, refs, okeys, nkeys, [], ops, kept)          # one `=` block that shortens it, or None

old and new are tree lines (delta.tree_lines), refs the old lines' REFs (delta.line_refs), okeys and
nkeys each line's alignment key: ("b", bid) for a bid that is its own REF, else ("t", text). Lines are
aligned by difflib on those keys; a bid line whose text changed becomes `~`, and lines without a bid
in a replaced stretch are paired in order as `~` (one line instead of `-` and `+`). A block (i, e,
j, k) replaces the old subtree old[i:e] by new[j:k] (click-tab-2's panel swap: 262 tokens line by
line, 172 as a block); delta.diff chooses up to 4, greedily, each only when the Δ gets shorter.
The Δ format itself, and the REF and line syntax, are delta.py's docstring.
"""
from __future__ import annotations

import difflib

from axtree import line_bid, subtree_end


def _size(ops: list[tuple]) -> int:
    return sum(len(t) + 1 for *_, t in ops)


def best_block(old, new, refs, okeys, nkeys, blocks, ops, kept, tries: int = 3):
    """The `=` block that shortens the Δ most, given the blocks already chosen and their (ops, kept):
    ((i, e, j, k), (ops, kept)), or None when no block makes it shorter.

    A block replaces an old subtree old[i:e] by every new line between the kept lines before i and
    those from e on. Each candidate's size is estimated first (today's ops minus those on its
    subtree and the inserts that lead into it, plus the block's lines); the `tries` best estimates
    are then diffed for real, and the shortest exact Δ wins."""
    size = _size(ops)
    by_pos: dict[int, list[int]] = {}  # old position: [its edits' chars, the chars of inserts after it]
    for pos, kind, _, text in ops:
        by_pos.setdefault(pos, [0, 0])[kind] += len(text) + 1
    order = sorted(kept)
    cands = []
    for i in range(len(old)):
        e = subtree_end(old, i)
        if any(i <= bi < e or bi <= i < be for bi, be, _, _ in blocks):
            continue
        before = [x for x in order if x < i]
        j = kept[before[-1]][1] if before else 0
        k = next((kept[x][0] for x in order if x >= e), len(new))
        if k < j or any(bj == j for _, _, bj, _ in blocks):
            continue
        lead = before[-1] if before else -1  # the inserts after it are new lines of the block
        saved = sum(sum(by_pos.get(x, (0, 0))) for x in range(i, e)) + by_pos.get(lead, (0, 0))[1]
        est = size - saved + len(refs[i]) + 3 + sum(len(x) + 3 for x in new[j:k])
        if est < size:
            cands.append((est, i, e, j, k))
    best = None
    for est, i, e, j, k in sorted(cands)[:tries]:
        cand = line_edits(old, new, refs, okeys, nkeys, blocks + [(i, e, j, k)])
        if cand is not None and _size(cand[0]) < (size if best is None else _size(best[1][0])):
            best = ((i, e, j, k), cand)
    return best


def line_edits(old: list[str], new: list[str], refs: list[str], okeys: list, nkeys: list,
           blocks: list[tuple[int, int, int, int]]):
    """delta.diff's edit operations, old[i:e] replaced by new[j:k] for each (i, e, j, k) in `blocks`.

    Returns (ops [(old position, 0 edit / 1 insert, sequence, text)], kept {old index: (new start,
    new end)} of the lines (and blocks) that survive), or None when difflib does not keep a block
    in place (it moved past other kept lines). Each block is one sentinel key on both sides."""
    ob = {bl[0]: n for n, bl in enumerate(blocks)}
    nb = {bl[2]: n for n, bl in enumerate(blocks)}
    skip_o = {x for i, e, _, _ in blocks for x in range(i + 1, e)}
    skip_n = {x for _, _, j, k in blocks for x in range(j, k)}
    opos = [x for x in range(len(old)) if x not in skip_o]
    npos, nblock = [], []  # new positions of the reduced sequence; the block at each (or None)
    for x in range(len(new) + 1):
        if x in nb:
            npos.append(x)
            nblock.append(nb[x])
        if x < len(new) and x not in skip_n:
            npos.append(x)
            nblock.append(None)
    ok = [("s", ob[x]) if x in ob else okeys[x] for x in opos]
    nk = [("s", n) if n is not None else nkeys[x] for x, n in zip(npos, nblock)]
    ops: list[tuple[int, int, int, str]] = []
    kept: dict[int, tuple[int, int]] = {}

    def change(i: int, line: str) -> None:
        if old[i] != line:
            ops.append((i, 0, len(ops), f"~ {line}" if okeys[i][0] == "b" else f"~ {refs[i]} {line}"))

    def add(anchor: int, line: str) -> None:
        ops.append((anchor, 1, len(ops), f"+ {'^' if anchor < 0 else refs[anchor]} {line}"))

    anchor = -1  # the last old line that survives (kept or changed): inserts go after it
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ok, nk, autojunk=False).get_opcodes():
        if tag != "equal" and any(k[0] == "s" for k in ok[i1:i2] + nk[j1:j2]):
            return None
        if tag == "equal":
            for r, s in zip(range(i1, i2), range(j1, j2)):
                i = opos[r]
                if ok[r][0] == "s":
                    _, _, j, k = blocks[ok[r][1]]
                    lines = new[j:k]
                    text = f"= {refs[i]}" + (f" {lines[0]}" if lines else "")
                    ops.append((i, 0, len(ops), "\n".join([text] + [f"| {x}" for x in lines[1:]])))
                    kept[i] = (j, k)
                else:
                    change(i, new[npos[s]])
                    kept[i] = (npos[s], npos[s] + 1)
                anchor = i
        elif tag == "delete":
            ops.extend((opos[r], 0, len(ops) + q, f"- {refs[opos[r]]}") for q, r in enumerate(range(i1, i2)))
        elif tag == "insert":
            for s in range(j1, j2):
                add(anchor, new[npos[s]])
        else:  # replace: pair lines without a bid in order (one `~` instead of `-` and `+`)
            o_nb = [r for r in range(i1, i2) if line_bid(old[opos[r]]) is None]
            n_nb = [s for s in range(j1, j2) if line_bid(new[npos[s]]) is None]
            pair = dict(zip(n_nb, o_nb))
            paired = set(pair.values())
            ops.extend((opos[r], 0, len(ops) + q, f"- {refs[opos[r]]}")
                       for q, r in enumerate(range(i1, i2)) if r not in paired)
            for s in range(j1, j2):
                if s in pair:
                    i = opos[pair[s]]
                    change(i, new[npos[s]])
                    kept[i] = (npos[s], npos[s] + 1)
                    anchor = i
                else:
                    add(anchor, new[npos[s]])
    return ops, kept
