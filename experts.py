"""Scripted experts for the default MiniWoB++ suite, and demonstration collection. (MiniWoB only: there is
no scripted expert for WebArena-Lite; `--benchmark webarena-lite` is an error that says so.)

    python experts.py --out demos.jsonl --per-task 20                     # every task in env.SUITE
    python experts.py --out demos.jsonl --per-task 20 --tasks click-button,enter-text
    python experts.py --eval 20                   # success per task on 20 eval seeds, writes nothing

An expert sees exactly what the agent sees (the goal and the observation text: the flattened
accessibility tree with bids) and answers in the agent's action language. It never reads the
page's hidden state or the task's answer. Each expert is stateless: it decides from the current
observation alone (a checked box, a selected tab, a field's value), so it recovers from any state.
A little variety (equivalent actions, e.g. click vs. focus, the order in which fields are
filled) comes from a random.Random that collect_demos seeds per episode.
"""
from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
import time

from actions import parse_action
from axtree import Node, read_tree
from env import SUITE, Obs, WebEnv, train_seeds, eval_seeds
import runlog
from records import new_trajectory

# ----------------------------------------------------------------------------------------------
# Reading the observation (axtree.read_tree: one Node a line)


def quoted(goal: str) -> list[str]:
    """The double-quoted strings in a goal, in order."""
    return re.findall(r'"([^"]*)"', goal)


def find(nodes, role=None, name=None, roles=None) -> list[Node]:
    return [n for n in nodes if n.bid is not None
            and (role is None or n.role == role) and (roles is None or n.role in roles)
            and (name is None or n.name == name)]


class ExpertError(RuntimeError):
    """The expert cannot read the page (an unexpected goal or tree): a bug to fix, not a demo."""


def _one(nodes: list[Node], what: str) -> Node:
    if not nodes:
        raise ExpertError(f"expert found no {what}")
    return nodes[0]


def _submit(nodes, names=("Submit", "submit", "Login", "login")) -> str:
    for nm in names:
        hits = find(nodes, "button", nm)
        if hits:
            return f"click({hits[0].bid!r})"
    raise ExpertError("no submit button")


# ----------------------------------------------------------------------------------------------
# One expert per task. Each takes (goal, nodes, rng, last error) and returns an action string.


def _click_button(goal, nodes, rng, error):
    label = _one(quoted(goal), "quoted label")
    return f"click({_one(find(nodes, 'button', label), 'button ' + label).bid!r})"


def _click_button_sequence(goal, nodes, rng, error):
    one, two = _one(find(nodes, "button", "ONE"), "ONE"), _one(find(nodes, "button", "TWO"), "TWO")
    # the clicked button keeps the focus: that is the only trace of the first click
    target = two if "focused" in one.flags else one
    # buttons are placed at random and may overlap: when the last click was blocked by the other
    # button (the error says so), activate the button from the keyboard instead
    if "is on top of it" in error:
        return f"press({target.bid!r}, 'Enter')"
    return f"click({target.bid!r})"


def _click_link(goal, nodes, rng, error):
    word = _one(quoted(goal), "quoted link text")
    hits = [n for n in nodes if n.bid and n.role in ("generic", "link") and n.name == word]
    return f"click({_one(hits, 'link ' + word).bid!r})"


def _click_dialog(goal, nodes, rng, error):
    return f"click({_one(find(nodes, 'button', 'Close'), 'Close button').bid!r})"


def _click_dialog_2(goal, nodes, rng, error):
    label = _one(quoted(goal), "quoted label")
    name = {"x": "Close"}.get(label, label)  # the dialog's "x" is a button named Close
    return f"click({_one(find(nodes, 'button', name), 'button ' + name).bid!r})"


def _click_tab(goal, nodes, rng, error):
    m = re.search(r"Tab #\d+", goal)
    name = _one([m.group(0)] if m else [], "tab number")
    hits = find(nodes, "link", name) + find(nodes, "tab", name)
    return f"click({_one(hits, name).bid!r})"


def _click_tab_2(goal, nodes, rng, error):
    word = _one(quoted(goal), "quoted link text")
    panel_depth = None
    for n in nodes:  # only the open tab's panel is in the tree; look for the link there
        if n.role == "tabpanel":
            panel_depth = n.depth
        elif panel_depth is not None and n.depth > panel_depth and n.bid and n.name == word \
                and n.role in ("generic", "link"):
            return f"click({n.bid!r})"
    # not here: open the next tab after the selected one
    tabs = find(nodes, "tab")
    cur = next((i for i, t in enumerate(tabs) if "selected" in t.flags), -1)
    if cur + 1 >= len(tabs):
        raise ExpertError(f"link {word!r} not found in any tab")
    nxt = tabs[cur + 1]
    link = find(nodes, "link", nxt.name)
    return f"click({(link[0] if link else nxt).bid!r})"


def _filled(node: Node, text: str) -> bool:
    """A field holds `text`; a password field shows one bullet per character."""
    v = node.value or ""
    return v == text or (len(v) == len(text) > 0 and set(v) <= {"•", "*"})


def _fill_then_submit(targets: list[tuple[Node, str]], nodes, rng, submit_names=("Submit", "submit", "Login")):
    todo = [(n, v) for n, v in targets if not _filled(n, v)]
    if todo:
        n, v = rng.choice(todo) if rng.random() < 0.3 else todo[0]  # mostly top to bottom
        return f"fill({n.bid!r}, {v!r})"
    return _submit(nodes, submit_names)


def _enter_text(goal, nodes, rng, error):
    text = _one(quoted(goal), "quoted text")
    box = _one(find(nodes, "textbox"), "textbox")
    return _fill_then_submit([(box, text)], nodes, rng)


def _enter_password(goal, nodes, rng, error):
    pw = _one(quoted(goal), "quoted password")
    boxes = find(nodes, "textbox")
    if len(boxes) != 2:
        raise ExpertError("expected two password fields")
    return _fill_then_submit([(b, pw) for b in boxes], nodes, rng)


def _login_user(goal, nodes, rng, error):
    q = quoted(goal)
    if len(q) != 2:
        raise ExpertError("expected a quoted username and password")
    boxes = find(nodes, "textbox")  # username field first, password second (labels above them)
    if len(boxes) != 2:
        raise ExpertError("expected two fields")
    return _fill_then_submit(list(zip(boxes, q)), nodes, rng)


def _focus_text(goal, nodes, rng, error):
    box = _one(find(nodes, "textbox"), "textbox")
    return f"{rng.choice(['focus', 'click'])}({box.bid!r})"


def _click_checkboxes(goal, nodes, rng, error):
    m = re.match(r"Select (.*) and click Submit", goal)
    if not m:
        raise ExpertError(f"unexpected goal {goal!r}")
    want = [] if m.group(1).strip() == "nothing" else [w.strip() for w in m.group(1).split(",")]
    boxes = find(nodes, "checkbox")
    todo = [b for b in boxes if (b.name in want) != ("checked" in b.flags)]
    if todo:
        return f"click({(rng.choice(todo) if rng.random() < 0.3 else todo[0]).bid!r})"
    return _submit(nodes)


def _choose_list(goal, nodes, rng, error):
    m = re.match(r"Select (.*) from the list and click Submit", goal)
    if not m:
        raise ExpertError(f"unexpected goal {goal!r}")
    item = m.group(1).strip()
    box = _one(find(nodes, "combobox"), "list")
    if box.value != item:
        return f"select_option({box.bid!r}, {item!r})"
    return _submit(nodes)


def _click_option(goal, nodes, rng, error):
    m = re.match(r"Select (.*) and click Submit", goal)
    if not m:
        raise ExpertError(f"unexpected goal {goal!r}")
    radio = _one(find(nodes, "radio", m.group(1).strip()), "radio " + m.group(1))
    if "checked" not in radio.flags:
        return f"click({radio.bid!r})"
    return _submit(nodes)


def _click_collapsible(goal, nodes, rng, error):
    if not find(nodes, "tabpanel"):  # the section is closed: open it first
        section = [t for t in find(nodes, "tab") if t.name.startswith("Section")]
        return f"click({_one(section, 'section header').bid!r})"
    return _submit(nodes)


EXPERTS = {
    "click-button": _click_button,
    "click-button-sequence": _click_button_sequence,
    "click-link": _click_link,
    "click-dialog": _click_dialog,
    "click-dialog-2": _click_dialog_2,
    "click-tab": _click_tab,
    "click-tab-2": _click_tab_2,
    "enter-text": _enter_text,
    "enter-password": _enter_password,
    "login-user": _login_user,
    "focus-text": _focus_text,
    "click-checkboxes": _click_checkboxes,
    "choose-list": _choose_list,
    "click-option": _click_option,
    "click-collapsible": _click_collapsible,
}

_RNG = random.Random(0)


def expert_action(task: str, obs: Obs, rng: random.Random | None = None) -> str:
    """The expert's next action for `task` given the agent's observation.

    Returns a canonical action string (parse_action(a) == a).
    Errors: KeyError for a task without an expert; ExpertError if the page cannot be read.
    """
    if task not in EXPERTS:
        raise KeyError(f"no expert for {task!r}; experts exist for: {', '.join(EXPERTS)}")
    action = EXPERTS[task](obs.goal, read_tree(obs.axtree), rng or _RNG, obs.error)
    return parse_action(action)


def thought(observation: str, action: str) -> str:
    """A short rationale for an expert `action` taken on `observation` (the text the agent sees),
    for the thinking format (`train.py --think`: the reply is `<think>thought</think>action`).

    It names what the action does and the element it acts on, by role and name, before the bid:
    "Click the button 'no' [13]." or "Type 'Kasie' into the textbox [19]." (the name comes from the
    observation, so the thought is grounded in what the agent sees; no call syntax inside, so the
    parser cannot mistake it for the action). `action` is a canonical action string written by an
    expert (trusted); raises ExpertError if it is not a call.
    """
    try:
        call = ast.parse(action, mode="eval").body
        name, args = call.func.id, [ast.literal_eval(a) for a in call.args]
    except (SyntaxError, AttributeError, ValueError) as e:
        raise ExpertError(f"not an expert action: {action!r}") from e
    if not args or name in ("scroll", "send_msg_to_user"):
        return f"Next: {name.replace('_', ' ')}."
    bid = str(args[0])
    node = next((n for n in read_tree(observation) if n.bid == bid), None)
    what = f"the {node.role}{f' {node.name!r}' if node and node.name else ''}" if node else "the element"
    verbs = {"fill": "Type {v!r} into", "select_option": "Select {v!r} in", "press": "Press {v} on"}
    verb = verbs.get(name, name.capitalize()).format(v=args[1] if len(args) > 1 else "")
    return f"{verb} {what} [{bid}]."


def thought_reply(observation: str, action: str) -> str:
    """The thinking format's reply for an expert `action` on `observation`: `<think>{thought}</think>{action}`
    (what BC trains on with --think, supervised.expert_turns). Raises ExpertError as `thought` does."""
    return f"<think>{thought(observation, action)}</think>{action}"


# the element a thought names, at its end: "the ROLE 'NAME' [BID]." (NAME as Python's repr writes it, or absent)
_THOUGHT_ELEMENT = re.compile(r"the (\S+)(?: ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"))? \[([^\]\s]+)\]\.?\s*$")


def thought_element(text: str) -> tuple[str, str | None, str] | None:
    """The element a `thought` names, read back: (role, name as `thought` quoted it (repr) or None, bid),
    or None when `text` does not end the way `thought` ends. The inverse of `thought` on its own
    output; applied to a model's thought (untrusted text), it only matches a pattern, never evaluates
    anything. "Click the button 'no' [13]." -> ("button", "'no'", "13")."""
    m = _THOUGHT_ELEMENT.search(text.strip())
    return (m.group(1), m.group(2), m.group(3)) if m else None


# ----------------------------------------------------------------------------------------------
# Demonstrations


def run_expert_episode(env: WebEnv, seed: int, max_steps: int = 10, rng: random.Random | None = None) -> dict:
    """One expert episode on `env`: a records.Trajectory (source "expert") whose turns hold the
    observation, the canonical action and the error that followed, but no reply: the reply is
    built at training time (supervised.expert_turns), with or without a thought."""
    rng = rng or random.Random(seed)
    obs = env.reset(seed)
    record = new_trajectory(env.task, seed, "expert")
    record.update(goal=obs.goal, env_error=obs.env_error)
    done = record["env_error"]
    while not done and len(record["turns"]) < max_steps:
        try:
            action = expert_action(env.task, obs, rng)
        except ExpertError as e:
            record["expert_error"] = str(e)
            break
        turn = {"observation": obs.text, "action": action}
        obs, reward, done, info = env.step(action)
        record["turns"].append({**turn, "error": info["error"]})
        record.update(reward=reward, success=info["success"], env_error=info["env_error"], steps=len(record["turns"]))
    return record


def collect_demos(tasks: list[str], seeds_per_task: int, path: str, max_steps: int = 10,
                  progress: bool = True, seeds: list[int] | None = None) -> dict:
    """Run the experts on TRAIN seeds (env.train_seeds) and append one JSON line per successful
    episode to `path`.

    Returns {task: {"episodes": n, "success": n_success, "env_error": n_env_error}}.
    """
    from tqdm import tqdm

    counts = {}
    bar = tqdm(total=len(tasks) * seeds_per_task, disable=not progress, desc="demos")
    with runlog.open_text(path, "a") as f:
        for task in tasks:
            c = counts[task] = {"episodes": 0, "success": 0, "env_error": 0}
            env = WebEnv(task, max_steps=max_steps)
            try:
                for seed in (seeds if seeds is not None else train_seeds(seeds_per_task)):
                    rec = run_expert_episode(env, seed, max_steps)
                    c["episodes"] += 1
                    c["success"] += int(rec["success"])
                    c["env_error"] += int(rec["env_error"])
                    if rec["success"]:
                        rec.pop("expert_error", None)
                        f.write(json.dumps(rec) + "\n")
                    bar.update(1)
                    bar.set_postfix(task=task, ok=f"{c['success']}/{c['episodes']}")
            finally:
                env.close()
    bar.close()
    return counts


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Write expert demonstrations (JSONL) or measure the experts.")
    ap.add_argument("--out", default="demos.jsonl", help="output JSONL (appended to)")
    ap.add_argument("--per-task", type=int, default=20, help="episodes (train seeds) per task")
    ap.add_argument("--tasks", default=",".join(SUITE), help="comma-separated MiniWoB task names")
    ap.add_argument("--max-steps", type=int, default=10, help="step limit per episode")
    ap.add_argument("--eval", type=int, default=0, help="instead: success on this many EVAL seeds, write nothing")
    ap.add_argument("--benchmark", choices=["miniwob", "webarena-lite"], default="miniwob",
                    help="the experts are MiniWoB's; webarena-lite has none (an error that says so)")
    args = ap.parse_args()
    if args.benchmark != "miniwob":
        ap.error("there is no scripted expert for WebArena-Lite: its tasks need real reasoning on real sites. "
                 "Demonstrations for --mode bc must come from elsewhere (e.g. successful trajectories of a stronger "
                 "agent), written as demos.jsonl records (records.py); --mode real can start from any checkpoint")
    tasks = [t for t in args.tasks.split(",") if t]
    t0 = time.time()
    if args.eval:
        import os
        counts = collect_demos(tasks, args.eval, os.devnull, args.max_steps, seeds=eval_seeds(args.eval))
    else:
        counts = collect_demos(tasks, args.per_task, args.out, args.max_steps)
    for task, c in counts.items():
        print(f"{task:24s} success {c['success']}/{c['episodes']}  env_error {c['env_error']}")
    total = sum(c["episodes"] for c in counts.values())
    print(f"{total} episodes in {time.time() - t0:.0f} s", file=sys.stderr)
