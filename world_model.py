"""The Δ-based web world model (DynaWeb, arXiv 2601.22149): o_{t+1} = apply(o_t, Δ), Δ ~ p(Δ | goal, o_t, a_t).

    python world_model.py --collect runs/transitions.jsonl --seeds 20                 # real transitions, train seeds
    python world_model.py --collect runs/wm_eval.jsonl --seeds 10 --eval-seeds       # held-out pages
    python world_model.py --eval runs/wm/final --data runs/wm_eval.jsonl             # exact match, line F1, done acc.

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
"""
from __future__ import annotations

import difflib
import json
import logging
import os
import random
import re
import threading
from collections import Counter, defaultdict
from dataclasses import asdict, is_dataclass

import compress
import policy
from actions import ActionParseError, parse_action
from axtree import BID as _BID, line_bid as _line_bid, read_tree
from env import Obs
from runlog import read_jsonl

logger = logging.getLogger(__name__)

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


def _lines(axtree: str) -> list[str]:
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
    old, new = _lines(a["axtree"]), _lines(b["axtree"])
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
    old = _lines(s["axtree"])
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


# ----------------------------------------------------------------------------------------------
# Real transitions

_WORDS = ["hello", "Submit", "OK", "yes", "no", "blue", "42", "Alice", "password", "test", "ornare", "Cancel"]
_TEXT_ROLES = {"textbox", "searchbox", "combobox", "spinbutton"}


def random_action(obs, rng: random.Random) -> str:
    """A random but well-formed action for the page: mostly clicks on a random bid, sometimes fill,
    select_option, press, check, hover, scroll, noop, or a click on a bid the page lacks (an error).
    The world model must also learn failures and no-ops, not only the expert's path."""
    nodes = [(n.bid, n.role, n.name) for n in read_tree(as_state(obs)["axtree"]) if n.bid is not None and n.role]
    names = [n for _, _, n in nodes if n] or _WORDS
    texts = [b for b, r, _ in nodes if r in _TEXT_ROLES]
    selects = [b for b, r, _ in nodes if r in ("combobox", "listbox")]
    options = [n for _, r, n in nodes if r == "option" and n]
    boxes = [b for b, r, _ in nodes if r in ("checkbox", "radio", "switch")]
    r = rng.random()
    if not nodes or r < 0.04:
        return rng.choice(["noop()", "scroll(0, 200)", "scroll(0, -200)"])
    if r < 0.08:
        return f"click('{max(int(re.sub('[^0-9]', '', b) or 0) for b, _, _ in nodes) + rng.randint(1, 50)}')"
    if r < 0.28 and texts:
        return f"fill({rng.choice(texts)!r}, {rng.choice(_WORDS + names)!r})"
    if r < 0.34 and selects and options:
        return f"select_option({rng.choice(selects)!r}, {rng.choice(options)!r})"
    if r < 0.38:
        return f"press({rng.choice(nodes)[0]!r}, {rng.choice(['Enter', 'Tab', 'a'])!r})"
    if r < 0.44 and boxes:
        return f"{rng.choice(['check', 'uncheck'])}({rng.choice(boxes)!r})"
    if r < 0.48:
        return f"{rng.choice(['hover', 'focus', 'dblclick'])}({rng.choice(nodes)[0]!r})"
    return f"click({rng.choice(nodes)[0]!r})"


def _obs_record(o: Obs) -> dict:
    return {"url": o.url, "axtree": o.axtree, "error": o.error}


def collect_transitions(tasks: list[str], seeds: list[int], path: str, *, policy_fn=None, random_frac: float = 0.3,
                        max_steps: int = 6, progress: bool = False, rng_seed: int = 0) -> dict:
    """Run real env.WebEnv episodes and append one JSON line per transition to `path`.

    Each step takes a random valid action (`random_action`) with probability `random_frac`, else
    `policy_fn(task, obs) -> text` if given, else the scripted expert (experts.expert_action; a
    random action where the expert cannot read the page). Which seeds (train or held-out) is the
    caller's choice. Steps that end in an infrastructure fault (env_error) are not recorded.
    Record: {task, seed, step, goal, obs: {url, axtree, error}, action, source (expert|policy|random),
    next_obs, delta, reward, done, success, truncated}. Returns counts {transitions, episodes,
    success, env_error, random}.
    """
    from tqdm import tqdm

    from env import WebEnv

    expert_action = None
    if policy_fn is None:
        import experts  # lazily: experts.py imports the browser stack and is optional here

        expert_action = experts.expert_action
    counts = Counter()
    bar = tqdm(total=len(tasks) * len(seeds), disable=not progress, desc="transitions")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        for task in tasks:
            env = WebEnv(task, max_steps=max_steps)
            try:
                for seed in seeds:
                    rng = random.Random(f"{rng_seed}-{task}-{seed}")
                    obs = env.reset(seed)
                    counts["episodes"] += 1
                    done = obs.env_error
                    counts["env_error"] += int(done)
                    while not done:
                        source = "random"
                        text = None
                        if rng.random() >= random_frac:
                            try:
                                text = policy_fn(task, obs) if policy_fn else expert_action(task, obs, rng)
                                source = "policy" if policy_fn else "expert"
                            except Exception as e:  # an expert that cannot read the page: act randomly
                                logger.debug("expert failed on %s seed %s: %s", task, seed, e)
                        if text is None:
                            text = random_action(obs, rng)
                        nxt, reward, done, info = env.step(text)
                        if info["env_error"]:
                            counts["env_error"] += 1
                            break
                        terminated = done and not info["truncated"]
                        rec = {"task": task, "seed": seed, "step": env.t - 1, "goal": obs.goal,
                               "obs": _obs_record(obs), "action": info["action"] or text, "source": source,
                               "next_obs": _obs_record(nxt),
                               "delta": diff(obs, nxt, done_status(info["success"], terminated)),
                               "reward": reward, "done": done, "success": info["success"],
                               "truncated": info["truncated"]}
                        f.write(json.dumps(rec) + "\n")
                        counts["transitions"] += 1
                        counts["random"] += int(source == "random")
                        counts["success"] += int(info["success"])
                        obs = nxt
                    bar.update(1)
            finally:
                env.close()
    bar.close()
    return dict(counts)


def load_transitions(path: str) -> list[dict]:
    """The records of a transitions file (runlog.read_jsonl: a cut last line is skipped)."""
    return read_jsonl(path)


def start_states(transitions: list[dict], task: str | None = None) -> list[dict]:
    """Distinct pre-action states {task, goal, url, axtree, seed, prefix} of real transitions (every
    stage of an episode, not only its first page), in first-seen order; only `task`'s when given.

    seed and prefix (the actions taken on that seed since reset, in order) say how to reach the
    state again on real pages (`replay`). Transitions must be in file order: an episode's steps
    consecutive, starting at step 0 (collect_transitions writes them so)."""
    seen, out, prefix = set(), [], {}
    for t in transitions:
        key_ep = (t["task"], t.get("seed"))
        if t.get("step", 0) == 0:
            prefix[key_ep] = []
        actions = prefix.setdefault(key_ep, [])
        if task is None or t["task"] == task:
            key = (t["task"], t["goal"], t["obs"]["url"], t["obs"]["axtree"])
            if key not in seen:
                seen.add(key)
                out.append({"task": t["task"], "goal": t["goal"], "url": t["obs"]["url"], "axtree": t["obs"]["axtree"],
                            "seed": t.get("seed"), "prefix": list(actions)})
        actions.append(t["action"])
    return out


def pick_start_state(states: list[dict], seed: int, task: str | None = None) -> dict:
    """The start state a dream of (task, seed) begins from: deterministic in the seed, so that
    DreamEnv.reset and a later replay on real pages agree. Raises ValueError if `task` has none."""
    pool = states if task is None else [s for s in states if s.get("task") == task]
    if not pool:
        raise ValueError(f"no start state of task {task!r}")
    return pool[random.Random(seed).randrange(len(pool))]


def replay(start: dict, actions: list[str], *, env=None, max_steps: int = 30) -> dict:
    """Replay a dream's actions on real pages: reset `start`'s seed, take its prefix actions, check
    that the page equals the start state, then take `actions` one by one (untrusted model text:
    env.step parses it, never executes it). Stops when the real episode ends.

    Returns {start_match: bool (the real page after the prefix equals start's tree and URL),
    observations: [real Obs text after each action taken], states: [real {url, axtree, error}],
    success: bool (real full-credit success), reward, steps (real browser steps, prefix included),
    env_error: bool}. Opens a WebEnv unless `env` (a WebEnv) is given; an env it opened is closed.
    """
    from env import WebEnv

    own = env is None
    env = env or WebEnv(start["task"], max_steps=max_steps)
    res = {"start_match": False, "observations": [], "states": [], "success": False, "reward": 0.0, "steps": 0,
           "env_error": False}
    try:
        obs = env.reset(start["seed"], task=start["task"])
        if obs.env_error:
            res["env_error"] = True
            return res
        done = False
        for a in start.get("prefix", []):
            obs, _, done, info = env.step(a)
            res["steps"] += 1
            if info.get("env_error"):
                res["env_error"] = True
                return res
            if done:
                break
        res["start_match"] = not done and obs.url == start["url"] and obs.axtree == start["axtree"]
        if done:
            return res
        for a in actions:
            obs, reward, done, info = env.step(a)
            res["steps"] += 1
            res["observations"].append(obs.text)
            res["states"].append(_obs_record(obs))
            if info.get("env_error"):
                res["env_error"] = True
                return res
            if done:
                res.update(success=bool(info["success"]), reward=float(reward))
                break
    finally:
        if own:
            env.close()
    return res


# ----------------------------------------------------------------------------------------------
# The model: p(Δ | goal, o_t, a_t)

# Short on purpose: it is in every world-model sequence.
WM_SYSTEM_PROMPT = ("Predict how the page changes after the action. Reply with edits: `- REF` remove, "
                    "`~ LINE` change, `+ REF LINE` add after REF, then `done: yes|no|fail`.")


def wm_messages(goal: str, obs, action: str, *, max_tree_lines: int | None = None) -> list[dict]:
    """Chat messages asking for Δ: system prompt, then goal, URL, tree and the action.
    max_tree_lines: show only the first lines of the tree (for a prompt token budget)."""
    s = as_state(obs)
    lines = _lines(s["axtree"])
    tree = "\n".join(lines[:max_tree_lines]) if max_tree_lines is not None else s["axtree"]
    user = f"Goal: {goal}\nURL: {s['url']}\n{tree}\nAction: {action}"
    return [{"role": "system", "content": WM_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def wm_prompt(tokenizer, goal: str, obs, action: str, max_tokens: int = 1024) -> list[int]:
    """Prompt ids for Δ, at most `max_tokens` long: the tree is cut from its end when needed (the
    lines kept keep their REFs). Raises ValueError if even an empty tree does not fit."""
    ids = compress.render(tokenizer, wm_messages(goal, obs, action))
    n = len(_lines(as_state(obs)["axtree"]))
    while len(ids) > max_tokens:
        if n == 0:
            raise ValueError(f"max_tokens={max_tokens} cannot hold the world-model prompt without a tree")
        n = max(0, min(n - 1, n * max_tokens // len(ids)))
        ids = compress.render(tokenizer, wm_messages(goal, obs, action, max_tree_lines=n))
    return ids


def wm_samples(transitions: list[dict], tokenizer, max_tokens: int = 1024) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) per transition for train.py --mode wm, where the loss is
    -log p(Δ | goal, o_t, a_t) summed over the target tokens only (DynaWeb Sec. 3, Eq. 2).

    target = Δ's tokens + the end-of-turn id (tokenizer.eos_token_id, as in bc_samples). A
    transition whose prompt + target exceeds `max_tokens` is skipped (cutting the tree would make
    the label refer to lines the prompt no longer shows); the number skipped is logged.
    """
    eos = tokenizer.eos_token_id
    out, skipped = [], 0
    for t in transitions:
        prompt = compress.render(tokenizer, wm_messages(t["goal"], t["obs"], t["action"]))
        target = compress.encode_text(tokenizer, t["delta"]) + [eos]
        if len(prompt) + len(target) > max_tokens:
            skipped += 1
            continue
        out.append((prompt, target))
    if skipped:
        logger.warning("wm_samples: skipped %d of %d transitions longer than %d tokens", skipped, len(transitions),
                       max_tokens)
    return out


def predict_delta(model, tokenizer, states: list, actions: list[str], max_new_tokens: int = 256, *,
                  goals: list[str] | None = None, max_prompt_tokens: int = 1024, batch_size: int = 8,
                  bf16: bool = False, progress: bool = False) -> list[str]:
    """Greedy Δ for each (state, action), batched through policy.generate.

    states: env.Obs or dicts with goal (unless `goals` is given), url and axtree. Returns the Δ
    texts. A reply cut by max_new_tokens loses its unfinished last line (a half line such as
    `~ [14] textbox value='My` would still apply, wrongly); with no `done:` line it reads as `done: no`.
    Opening a tab on click-tab-2 takes 180-260 Δ tokens: keep max_new_tokens at 256 or more.
    """
    if not states:
        return []
    goals = goals if goals is not None else [as_state(s)["goal"] for s in states]
    prompts = [wm_prompt(tokenizer, g, s, a, max_prompt_tokens) for g, s, a in zip(goals, states, actions)]
    from tqdm import tqdm

    samples = []
    with tqdm(total=len(prompts), desc="Δ", disable=not progress, leave=False) as bar:
        for k in range(0, len(prompts), 4 * batch_size):  # chunks only for the progress bar
            chunk = prompts[k:k + 4 * batch_size]
            samples += policy.generate(model, tokenizer, chunk, max_new_tokens=max_new_tokens, temperature=0.0,
                                       batch_size=batch_size, bf16=bf16)
            bar.update(len(chunk))
    return [s.text.rsplit("\n", 1)[0] if s.truncated and "\n" in s.text else ("" if s.truncated else s.text)
            for s in samples]


def evaluate_world_model(model, tokenizer, transitions: list[dict], *, max_new_tokens: int = 256,
                         batch_size: int = 8, max_prompt_tokens: int = 1024, by_task: bool = False,
                         progress: bool = False) -> dict:
    """Score greedy Δ predictions against real transitions.

    Returns {wm/exact_match: share whose apply(o_t, Δ̂) equals o_{t+1} (url and tree),
    wm/line_precision, wm/line_recall, wm/line_f1: over Δ lines other than `done:`, pooled over all
    transitions (multiset match), wm/done_accuracy: predicted_done == success,
    wm/done_false_positive_rate: predicted done among transitions that did not succeed,
    wm/bad_lines: mean skipped lines per Δ̂, wm/n}; with by_task, also {"by_task": {task: the same}}
    from the same predictions.
    """
    if not transitions:
        return {"wm/n": 0}
    preds = predict_delta(model, tokenizer, [dict(t["obs"], goal=t["goal"]) for t in transitions],
                          [t["action"] for t in transitions], max_new_tokens, batch_size=batch_size,
                          max_prompt_tokens=max_prompt_tokens, progress=progress)
    res = score_predictions(transitions, preds)
    if by_task:
        res["by_task"] = {task: score_predictions([t for t in transitions if t["task"] == task],
                                                  [d for t, d in zip(transitions, preds) if t["task"] == task])
                          for task in dict.fromkeys(t["task"] for t in transitions)}
    return res


def score_predictions(transitions: list[dict], preds: list[str]) -> dict:
    """evaluate_world_model's figures for given Δ predictions (one per transition)."""
    n = len(transitions)
    exact = tp = n_pred = n_true = bad = done_ok = fp = negatives = 0
    for t, d in zip(transitions, preds):
        o, nb = apply(t["obs"], d)
        exact += int(o["axtree"] == t["next_obs"]["axtree"] and o["url"] == t["next_obs"]["url"])
        bad += nb
        p, q = Counter(delta_lines(d)), Counter(delta_lines(t["delta"]))
        tp += sum((p & q).values())
        n_pred += sum(p.values())
        n_true += sum(q.values())
        pd = predicted_done(d)
        done_ok += int(pd == bool(t["success"]))
        if not t["success"]:
            negatives += 1
            fp += int(pd)
    # an empty prediction of an empty change is perfect, hence the 1.0 for empty denominators
    prec = tp / n_pred if n_pred else 1.0
    rec = tp / n_true if n_true else 1.0
    return {"wm/exact_match": exact / n if n else 0.0, "wm/line_precision": prec, "wm/line_recall": rec,
            "wm/line_f1": 2 * prec * rec / (prec + rec) if prec + rec else 0.0,
            "wm/done_accuracy": done_ok / n if n else 0.0,
            "wm/done_false_positive_rate": fp / negatives if negatives else 0.0,
            "wm/bad_lines": bad / n if n else 0.0, "wm/n": n}


def episodes_of(transitions: list[dict]) -> list[list[dict]]:
    """Split transitions (in file order) into episodes: a new one at every step 0."""
    eps = []
    for t in transitions:
        if t.get("step", 0) == 0 or not eps or (eps[-1][-1]["task"], eps[-1][-1]["seed"]) != (t["task"], t["seed"]):
            eps.append([])
        eps[-1].append(t)
    return eps


def tree_f1(a: str, b: str) -> float:
    """F1 of the multisets of lines of two flattened trees (1.0 when both are empty)."""
    p, q = Counter(_lines(a)), Counter(_lines(b))
    tp = sum((p & q).values())
    if not p and not q:
        return 1.0
    return 2 * tp / (sum(p.values()) + sum(q.values()))


def drift(model, tokenizer, transitions: list[dict], k_max: int = 5, *, max_new_tokens: int = 256,
          batch_size: int = 8, progress: bool = False) -> dict:
    """How far k imagined steps drift from the real pages, k = 1..k_max (DynaWeb's compounding error).

    For every recorded real episode with at least k steps, start from its first page, apply the
    world model's Δ for the episode's own actions k times (each prediction reads the previous
    imagined page), and compare the k-th imagined page with the real page after the same k actions
    (recorded when the episode ran on real pages). Returns {k: {exact_match, tree_f1, n}}: the share
    of identical pages (URL and tree) and the mean line F1 of the trees, over the n episodes.
    """
    eps = [e for e in episodes_of(transitions) if e]
    states = [dict(e[0]["obs"], goal=e[0]["goal"]) for e in eps]
    out = {}
    for k in range(1, k_max + 1):
        live = [i for i, e in enumerate(eps) if len(e) >= k]
        if not live:
            break
        preds = predict_delta(model, tokenizer, [states[i] for i in live], [eps[i][k - 1]["action"] for i in live],
                              max_new_tokens, goals=[eps[i][0]["goal"] for i in live], batch_size=batch_size,
                              progress=progress)
        exact, f1 = 0, 0.0
        for i, d in zip(live, preds):
            o, _ = apply(states[i], d)
            states[i] = dict(o, goal=eps[i][0]["goal"])
            real = eps[i][k - 1]["next_obs"]
            exact += int(o["axtree"] == real["axtree"] and o["url"] == real["url"])
            f1 += tree_f1(o["axtree"], real["axtree"])
        out[k] = {"exact_match": exact / len(live), "tree_f1": f1 / len(live), "n": len(live)}
    return out


# ----------------------------------------------------------------------------------------------
# Dreams

_PREDICT_LOCK = threading.Lock()


class DreamEnv:
    """An environment with WebEnv's interface whose pages come from the world model (DynaWeb's
    imagined rollouts).

    reset(seed) starts from a real state (`start_states`, any stage of a real episode), chosen
    deterministically from the seed; step(text) parses the action like WebEnv (a parse error costs a
    step, changes nothing and is shown as Obs.error), predicts Δ greedily and applies it. The episode
    ends when Δ says `done: yes` (reward 1) or `done: fail` (reward 0), or after `dream_len` steps
    (truncated). info: WebEnv's keys (action, error, success, env_error, raw_reward, truncated) plus
    delta and bad_lines.

    rollout.py steps its environments one at a time after one batched policy generate, so each
    step here is its own generate call (batch 1), serialised by a process-wide lock (rollout's
    worker threads would otherwise run several generations at once on the same cores). On CPU,
    generation is prefill-bound and batching barely helps; on GPUs, batching the Δ of every waiting
    DreamEnv in one predict_delta call is the next speed-up. `self.start` is the real state the
    current dream began from (with its seed and prefix, for `replay`).
    """

    def __init__(self, model, tokenizer, start_states: list[dict], dream_len: int = 5, *, task: str | None = None,
                 max_new_tokens: int = 256, max_prompt_tokens: int = 1024, bf16: bool = False):
        states = [s for s in start_states if task is None or s.get("task") == task]
        if not states:
            raise ValueError(f"DreamEnv needs at least one start state{f' of task {task!r}' if task else ''}")
        if dream_len < 1:
            raise ValueError(f"dream_len must be >= 1, got {dream_len}")
        tasks = {s.get("task") for s in states}
        self.task = task or (tasks.pop() if len(tasks) == 1 else None)
        self.model, self.tokenizer, self.states, self.dream_len = model, tokenizer, states, dream_len
        self.max_new_tokens, self.max_prompt_tokens, self.bf16 = max_new_tokens, max_prompt_tokens, bf16
        self.state: dict | None = None
        self.seed: int | None = None
        self.goal = ""
        self.start: dict | None = None
        self.t = 0
        self.done = True

    def reset(self, seed: int, task: str | None = None) -> Obs:
        """Start a dream from the start state that `seed` picks (among those of `task`, when given).
        Raises ValueError if there is no start state of that task."""
        self.seed, self.t, self.done = seed, 0, False
        try:
            s = pick_start_state(self.states, seed, task)
        except ValueError:
            raise ValueError(f"DreamEnv has no start state of task {task!r}") from None
        self.start = s
        self.state = as_state(s)
        self.goal = self.state["goal"]
        if s.get("task"):
            self.task = s["task"]
        return Obs(self.goal, self.state["url"], self.state["axtree"], "", 0)

    def step(self, text: str) -> tuple[Obs, float, bool, dict]:
        if self.done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        self.t += 1
        info = {"action": None, "error": "", "success": False, "env_error": False, "raw_reward": 0.0,
                "truncated": False, "delta": "", "bad_lines": 0}
        try:
            action = parse_action(text)
        except ActionParseError as e:
            action, info["error"] = None, f"ActionParseError: {e}"
        status = "no"
        if action is not None:
            info["action"] = action
            with _PREDICT_LOCK:  # one Δ generation at a time: on CPU, concurrent calls only fight for cores
                delta = predict_delta(self.model, self.tokenizer, [self.state], [action], self.max_new_tokens,
                                      max_prompt_tokens=self.max_prompt_tokens, batch_size=1, bf16=self.bf16)[0]
            self.state, info["bad_lines"] = apply(self.state, delta)
            info["delta"], info["error"] = delta, self.state["error"]
            status = predicted_status(delta)
        success = status == "yes"
        truncated = status == "no" and self.t >= self.dream_len
        self.done = status != "no" or truncated
        info.update(success=success, truncated=truncated, raw_reward={"yes": 1.0, "fail": -1.0}.get(status, 0.0))
        obs = Obs(self.goal, self.state["url"], self.state["axtree"], info["error"], self.t)
        return obs, (1.0 if success else 0.0), self.done, info

    def close(self) -> None:
        self.done = True


if __name__ == "__main__":
    import argparse

    import env as webenv

    ap = argparse.ArgumentParser(description="Collect real transitions for the world model, or evaluate one.")
    ap.add_argument("--collect", default=None, help="append transitions (JSONL) to this file")
    ap.add_argument("--tasks", default=",".join(webenv.SUITE), help="comma-separated MiniWoB tasks")
    ap.add_argument("--seeds", type=int, default=20, help="episodes per task")
    ap.add_argument("--eval-seeds", action="store_true", help="use held-out EVAL seeds instead of train seeds")
    ap.add_argument("--random-frac", type=float, default=0.3, help="share of random actions among the expert's")
    ap.add_argument("--max-steps", type=int, default=6, help="step limit per episode")
    ap.add_argument("--eval", default=None, help="checkpoint folder of a world model to evaluate on --data")
    ap.add_argument("--data", default="runs/wm_eval.jsonl", help="transitions to evaluate on")
    ap.add_argument("--drift", type=int, default=5, help="measure k-step drift for k = 1..this")
    ap.add_argument("--out", default=None, help="where --eval writes its JSON (default <checkpoint>/wm_eval.json)")
    a = ap.parse_args()
    tasks = [t for t in a.tasks.split(",") if t]
    if a.collect:
        seeds = webenv.eval_seeds(a.seeds) if a.eval_seeds else webenv.train_seeds(a.seeds)
        print(collect_transitions(tasks, seeds, a.collect, random_frac=a.random_frac, max_steps=a.max_steps,
                                  progress=True))
    if a.eval:
        import time

        m, tok = policy.load_model(a.eval)
        data = [t for t in load_transitions(a.data) if t["task"] in tasks]
        t0 = time.time()
        one = evaluate_world_model(m, tok, data, by_task=True, progress=True)
        print(json.dumps(one, indent=1), flush=True)
        res = {"by_task": one.pop("by_task"), "one_step": one, "drift": drift(m, tok, data, a.drift, progress=True),
               "data": a.data, "checkpoint": a.eval, "seconds": time.time() - t0}
        out = a.out or os.path.join(a.eval, "wm_eval.json")
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
        print(json.dumps({"one_step": res["one_step"], "drift": res["drift"]}, indent=1))
        print(f"wrote {out}")
