"""Real transitions for the world model: recorded on real pages, and the real states dreams start from.

    python world_model.py --collect runs/transitions.jsonl --seeds 20      # (world_model.py's CLI calls this)
    trs = load_transitions("runs/transitions.jsonl")
    states = start_states(trs)                  # every stage of every recorded episode, with how to reach it
    r = replay(states[7], ["click('13')"])      # the same actions on real pages: did the dream come true?

A transition is one real step: {task, seed, step, goal, obs: {url, axtree, error}, action, source
(expert | policy | random | near_miss), next_obs, delta (delta.diff, exact), reward, done, success, truncated},
one JSON line each, an episode's steps consecutive from step 0.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
from collections import Counter

from axtree import read_tree
from delta import as_state, diff, done_status
from env import Obs
from runlog import open_text, read_jsonl

logger = logging.getLogger(__name__)


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


_NEAR_MISS_VERBS = {"click", "dblclick", "check", "uncheck", "focus"}
_ANY_ELEMENT_VERBS = {"click", "dblclick", "focus"}  # verbs any element takes: check/uncheck need a checkbox
_SUBMIT_NAMES = ("Submit", "submit", "Login", "login")


def near_miss_action(action: str, obs, rng: random.Random) -> str | None:
    """The expert's `action` with one argument swapped for a plausible wrong one, or None when there is none.

    click / dblclick / check / uncheck / focus on bid b -> the same verb on another bid of b's role and
    another name (another link, button, checkbox, tab), or, where the page has none and the verb is click,
    dblclick or focus, on b's parent or another element under it (click-dialog: the dialog or its
    paragraph, not its one Close button; a lone checkbox gets no check on its parent); fill(b, text) -> fill(b, other text of another
    length: a name from the page, a stock word, `text` one character longer or shorter; another length,
    so a masked password's dots differ too); select_option(b, option) -> another option of b's list.
    Other verbs, or a bid the page lacks -> None. These are the world model's hard negatives: a step that
    looks like the expert's but mostly leaves the task unsolved (a click may still be one the task
    needs, e.g. another box to tick: the recorded outcome, not this, is the label).
    `action` must be canonical (actions.parse_action's output); the result is too.
    """
    from actions import canonical, split_action

    name, args = split_action(action)
    tree = read_tree(as_state(obs)["axtree"])
    nodes = [n for n in tree if n.bid is not None and n.role]
    target = next((n for n in nodes if args and n.bid == args[0]), None)
    if target is None:
        return None
    if name in _NEAR_MISS_VERBS:
        others = [n.bid for n in nodes if n.role == target.role and n.bid != target.bid
                  and not (target.name and n.name == target.name)]
        if not others and name in _ANY_ELEMENT_VERBS:
            others = _neighbour_bids(tree, target)
        return canonical(name, [rng.choice(others)] + args[1:]) if others else None
    if name == "fill" and len(args) == 2 and isinstance(args[1], str):
        text = args[1]
        pool = {n.name for n in nodes if n.name and n.role not in ("button", "StaticText")} | set(_WORDS)
        pool |= {text + ("x" if text[-1:] != "x" else "y"), text[:-1]} if text else set()
        pool = sorted(w for w in pool if len(w) != len(text))
        return canonical(name, [args[0], rng.choice(pool)])
    if name == "select_option" and len(args) == 2:
        chosen = args[1] if isinstance(args[1], str) else (args[1] or [None])[0]
        i = tree.index(target)
        below = []  # the list's own options: the lines under it, deeper than it
        for n in tree[i + 1:]:
            if n.depth <= target.depth:
                break
            below.append(n)
        options = sorted({n.name for n in below if n.role == "option" and n.name and n.name != chosen})
        return canonical(name, [args[0], rng.choice(options)]) if options else None
    return None


def _neighbour_bids(tree: list, target) -> list[str]:
    """The bids around `target` inside its parent: the parent itself and the parent's other descendants
    (not `target`'s own); [] for a top-level `target`. A click on a dialog or its text instead of its
    only button (click-dialog's Close): the step that looks like the finish and closes nothing."""
    i = tree.index(target)
    parent = next((j for j in range(i - 1, -1, -1) if tree[j].depth < target.depth), None)
    if parent is None:
        return []
    around, inside_target = [tree[parent]], False
    for n in tree[parent + 1:]:
        if n.depth <= tree[parent].depth:
            break
        if n is target:
            inside_target = True
            continue
        if inside_target and n.depth > target.depth:
            continue
        inside_target = False
        around.append(n)
    return [n.bid for n in around if n.bid is not None and n.role]


def submit_action(obs) -> str | None:
    """A click on the page's Submit / Login button (the first by that name order), or None when it has none."""
    nodes = [n for n in read_tree(as_state(obs)["axtree"]) if n.bid is not None and n.role == "button"]
    for name in _SUBMIT_NAMES:
        for n in nodes:
            if n.name == name:
                return f"click({n.bid!r})"
    return None


# One browser at a time, nothing else on the cores: BrowserGym's own 500 ms bound on an action's wait (not
# the 3 s that 16 browsers on 2 cores need), so a random click on an element that is not actionable costs
# half a second.
COLLECT_ACTION_TIMEOUT_MS = 500


def _obs_record(o: Obs) -> dict:
    rec = {"url": o.url, "axtree": o.axtree, "error": o.error}
    if o.hidden:  # WebEnv(hidden=True): the world model's view of what the page holds unshown
        rec["hidden"] = o.hidden
    return rec


def collect_transitions(tasks: list[str], seeds: list[int], path: str, *, policy_fn=None, random_frac: float = 0.3,
                        near_miss_frac: float = 0.0, max_steps: int = 6, progress: bool = False,
                        rng_seed: int = 0) -> dict:
    """Run real env.WebEnv episodes and append one JSON line per transition to `path`.

    Each step takes a random valid action (`random_action`) with probability `random_frac`, else
    `policy_fn(task, obs, history) -> text` if given (history: the episode's earlier turns, oldest first,
    each {"observation": page text, "response": the action text taken, random ones included}, as a
    rollout's prompt shows them; `checkpoint_policy` builds one), else the scripted expert
    (experts.expert_action; a random action where the expert cannot read the page). With probability
    `near_miss_frac` an expert step is replaced by `near_miss_action` (when it has one), and then, half of the
    time, the next step clicks the page's Submit button (`submit_action`) before the expert, which reads
    only the page and so would mostly undo the miss: finishes that look right but fail. Both are recorded
    as `near_miss`.
    Which seeds (train or held-out) is the caller's choice. Steps that end in an infrastructure fault (env_error) are not recorded.
    Record: {task, seed, step, goal, obs: {url, axtree, error, hidden (only when the page holds
    hidden content: env.Obs.hidden)}, action, source (expert|policy|random|near_miss), next_obs, delta,
    reward, done, success, truncated}. Returns counts {transitions, episodes, success, env_error, random,
    near_miss}.
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
    with open_text(path, "a") as f:
        for task in tasks:
            env = WebEnv(task, max_steps=max_steps, hidden=True, action_timeout_ms=COLLECT_ACTION_TIMEOUT_MS)
            try:
                for seed in seeds:
                    rng = random.Random(f"{rng_seed}-{task}-{seed}")
                    obs = env.reset(seed)
                    counts["episodes"] += 1
                    done = obs.env_error
                    counts["env_error"] += int(done)
                    history: list[dict] = []
                    submit_next = False
                    while not done:
                        source = "random"
                        text = None
                        if submit_next:  # the finish after a near miss, when the page has a Submit button
                            text, submit_next = submit_action(obs), False
                            source = "near_miss" if text else source
                        if text is None and rng.random() >= random_frac:
                            try:
                                text = policy_fn(task, obs, history) if policy_fn else expert_action(task, obs, rng)
                                source = "policy" if policy_fn else "expert"
                            except Exception as e:  # an expert that cannot read the page: act randomly
                                if policy_fn:  # a policy's failure is a bug, not a page the expert cannot read
                                    raise
                                logger.debug("expert failed on %s seed %s: %s", task, seed, e)
                            if source == "expert" and near_miss_frac and rng.random() < near_miss_frac:
                                miss = near_miss_action(text, obs, rng)
                                if miss is not None:
                                    text, source, submit_next = miss, "near_miss", rng.random() < 0.5
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
                               "delta": diff(obs, nxt, done_status(info["success"], terminated), action=info["action"]),
                               "reward": reward, "done": done, "success": info["success"],
                               "truncated": info["truncated"]}
                        f.write(json.dumps(rec) + "\n")
                        counts["transitions"] += 1
                        counts["random"] += int(source == "random")
                        counts["near_miss"] += int(source == "near_miss")
                        counts["success"] += int(info["success"])
                        history.append({"observation": obs.text, "response": text})
                        obs = nxt
                    bar.update(1)
            finally:
                env.close()
    bar.close()
    return dict(counts)


def checkpoint_policy(path: str, *, temperature: float = 1.0, seed: int = 0):
    """A `policy_fn` for collect_transitions: the policy checkpoint at `path` (or a model name) replies to
    each page, prompted as eval.py prompts it (its webdream.json settings: compress.PromptSettings) and
    sampled at `temperature` (0: greedy; 1: the policy's own distribution, what RL rollouts see). One
    reply at a time, batch 1. Seeded once (torch.manual_seed(seed)), so a collection is repeatable on
    one machine. Returns policy_fn(task, obs, history) -> reply text (the env parses it; a malformed
    reply becomes the error the next page shows, as in a rollout)."""
    import argparse

    import torch

    import checkpoint
    import policy

    args = argparse.Namespace(**{k: None for k in checkpoint.PROMPT_DEFAULTS})
    checkpoint.resolve_prompt_settings(args, path)  # a model name has no webdream.json: the defaults
    settings = checkpoint.prompt_settings(args)
    model, tok = policy.load_model(path)
    torch.manual_seed(seed)

    def policy_fn(task: str, obs, history: list[dict]) -> str:
        prompt = settings.build(tok, history, obs.text)
        (sample,) = policy.generate(model, tok, [prompt], max_new_tokens=args.max_new_tokens, temperature=temperature)
        return sample.text

    return policy_fn


def delta_label(t: dict) -> str:
    """The Δ label of a recorded transition, written by today's `delta.diff` from its two pages, its
    outcome and its action (so a file recorded before a change of the format, e.g. the `=` block or the
    typed-value placeholder, trains with the new one); equal to t["delta"] for transitions recorded since."""
    return diff(t["obs"], t["next_obs"], done_status(bool(t["success"]), bool(t["done"]) and not t.get("truncated")),
                action=t["action"])


def load_transitions(path: str) -> list[dict]:
    """The records of a transitions file (runlog.read_jsonl: a cut last line is skipped)."""
    return read_jsonl(path)


def start_states(transitions: list[dict], task: str | None = None, max_stage: int | None = None) -> list[dict]:
    """Distinct pre-action states {task, goal, url, axtree, error, hidden, seed, prefix, prefix_obs} of real
    transitions (every stage of an episode, not only its first page, as DynaWeb draws them), in
    first-seen order; only `task`'s when given, and only those reached after at most `max_stage`
    actions when given (0: episodes' first pages only; train.py --dream-max-stage). error is the error
    the page showed (the previous action's). Raises ValueError for a negative max_stage.

    seed and prefix (the actions taken on that seed since reset, in order) say how to reach the
    state again on real pages (`replay`); prefix_obs holds the recorded page ({url, axtree, error})
    each of those actions was taken on, so a dream can show the episode so far (`history`).
    Transitions must be in file order: an episode's steps consecutive, starting at step 0
    (collect_transitions writes them so)."""
    if max_stage is not None and max_stage < 0:
        raise ValueError(f"max_stage must be >= 0 (or None: every stage), got {max_stage}")
    seen, out, prefix, pages = set(), [], {}, {}
    for t in transitions:
        key_ep = (t["task"], t.get("seed"))
        if t.get("step", 0) == 0:
            prefix[key_ep], pages[key_ep] = [], []
        actions, obs = prefix.setdefault(key_ep, []), pages.setdefault(key_ep, [])
        if (task is None or t["task"] == task) and (max_stage is None or len(actions) <= max_stage):
            key = (t["task"], t["goal"], t["obs"]["url"], t["obs"]["axtree"])
            if key not in seen:
                seen.add(key)
                out.append({"task": t["task"], "goal": t["goal"], "url": t["obs"]["url"], "axtree": t["obs"]["axtree"],
                            "error": t["obs"].get("error", "") or "", "hidden": t["obs"].get("hidden", "") or "",
                            "seed": t.get("seed"), "prefix": list(actions), "prefix_obs": list(obs)})
        actions.append(t["action"])
        obs.append({k: t["obs"].get(k, "") or "" for k in ("url", "axtree", "error")})
    return out


def history(start: dict) -> list[dict]:
    """The episode so far of a start state, as prompt turns [{observation, response}]: each earlier
    page's observation text (env.Obs.text, as the agent saw it) and the action taken on it, oldest
    first; [] at an episode's first page or for a state recorded without prefix_obs."""
    pages = start.get("prefix_obs") or []
    return [{"observation": Obs(start.get("goal", ""), p.get("url", ""), p.get("axtree", ""), p.get("error", "") or "").text,
             "response": a} for p, a in zip(pages, start.get("prefix", []))]


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
    success: bool (real full-credit success), reward, done: bool (the task ended the real episode on the
    last action taken, not a step limit), steps (real browser steps, prefix included), env_error: bool}. Opens a WebEnv unless `env` (a WebEnv) is given; an env it opened is closed.
    """
    from env import WebEnv

    own = env is None
    env = env or WebEnv(start["task"], max_steps=max_steps)
    res = {"start_match": False, "observations": [], "states": [], "success": False, "reward": 0.0, "steps": 0,
           "env_error": False, "done": False}
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
                res.update(success=bool(info["success"]), reward=float(reward), done=not info.get("truncated"))
                break
    finally:
        if own:
            env.close()
    return res


def transition_key(r: dict) -> tuple:
    """(task, seed, step, action): what names one transition across files (a transitions record, a
    world model's or a judge's `--eval` predictions), for pairing them."""
    return (r["task"], r["seed"], r["step"], r["action"])


def episodes_of(transitions: list[dict]) -> list[list[dict]]:
    """Split transitions (in file order) into episodes: a new one at every step 0."""
    eps = []
    for t in transitions:
        if t.get("step", 0) == 0 or not eps or (eps[-1][-1]["task"], eps[-1][-1]["seed"]) != (t["task"], t["seed"]):
            eps.append([])
        eps[-1].append(t)
    return eps
