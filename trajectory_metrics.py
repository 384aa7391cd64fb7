"""What a rollout's trajectories say about the policy: the `rollout/*` figures of the training log
(real.py, dream.py), and the two turn-level signs of a policy going wrong that they count.

    m = rollout_metrics(trajs, stats)   # trajs, stats = rollout.rollout(...); one rank's figures
    repeated_actions(traj)              # [bool] per turn after the first: a loop
    named_bid_missing(turn)             # the reply names a bid the page does not have
    ungrounded_thought(turn)            # the reply's thought names an element the page does not have at that bid
    shape_rewards(trajs, "grounded")    # train.py --reward grounded: a success counts only with grounded thoughts
"""
from __future__ import annotations

import numpy as np

from actions import WEB_ACTIONS, ActionParseError, split_action
from axtree import parse_line, read_tree
from experts import thought_element
from records import Trajectory


def action_bid(turn: dict) -> str | None:
    """The bid the turn's action acts on (its first parameter is a bid: click, fill, press, ...), or None
    for an action without one (scroll, send_msg_to_user, noop, goto, ...) or no parsed action."""
    if not turn.get("action"):
        return None
    try:
        name, args = split_action(turn["action"])
    except (SyntaxError, ValueError, AttributeError, ActionParseError):
        return None
    params = WEB_ACTIONS.get(name, ())
    return str(args[0]) if params and params[0] == "bid" and args else None


def named_bid_missing(turn: dict) -> bool:
    """Whether the turn's action names a bid that is not on the page it acted on (a reply such as
    click('7777') on a page without [7777]): a sign of a policy that has stopped reading the page."""
    bid = action_bid(turn)
    return bid is not None and f"[{bid}]" not in turn["observation"]


def ungrounded_thought(turn: dict) -> bool | None:
    """Whether the reply's <think> block names an element that is not the page's element at that bid:
    `<think>Click the link 'Turpis' [19].</think>click('19')` on a page where [19] is link 'Tab #1'
    (a name copied from the goal, not read off the page), a bid the page does not have, or a bid other
    than the one the action acts on. The thought is the expert's template (experts.thought: role,
    name, bid), read back by experts.thought_element; the name is compared as text (either quoting);
    only the name and the bids count: a role taken from the goal's words ("the link 'ornare'" for a
    generic 'ornare', which MiniWoB's goals call a link) still points at the right element. None when
    the reply has no thought in that form (no <think> block, or other words): nothing to check."""
    reply = turn.get("response") or ""
    start, end = reply.find("<think>"), reply.find("</think>")
    if start < 0 or end < start:
        return None
    named = thought_element(reply[start + len("<think>"):end])
    if named is None:
        return None
    _, quoted, bid = named
    said = parse_line(f"[0] x {quoted}").name if quoted else ""  # the quoted name as text (a literal, never run)
    node = next((n for n in read_tree(turn.get("observation") or "") if n.bid == bid), None)
    acted = action_bid(turn)
    return node is None or node.name != said or (acted is not None and acted != bid)


def grounded(traj: Trajectory) -> bool:
    """Whether every turn that acts on an element has a thought naming the element the page has at
    the bid it acts on (ungrounded_thought is False): the condition of `--reward grounded`. A turn
    acting on a bid without a thought in the expert's form counts against it, so that dropping the
    thought is no way around the check; a turn whose action takes no bid (scroll, send_msg_to_user,
    noop, goto: the expert's thought for them names no element) passes."""
    return all(ungrounded_thought(u) is False for u in traj["turns"] if action_bid(u) is not None)


def shape_rewards(trajs: list[Trajectory], mode: str) -> int:
    """Set each trajectory's reward by `mode` (train.py --reward), in place: "success" leaves the
    environment's binary task reward (WebAgent-R1); "grounded" keeps a success's 1 only when the
    trajectory is `grounded`, else 0 (a format reward, as R1-style training adds one; ours checks the
    thought against the page, not only its form). `success` is never changed. Returns how many
    successes lost their reward. Errors: ValueError for another mode."""
    if mode not in ("success", "grounded"):
        raise ValueError(f"unknown reward {mode!r}: success or grounded")
    zeroed = 0
    for t in trajs:
        if mode == "grounded" and t["reward"] > 0 and not t["env_error"] and not grounded(t):
            t["reward"], zeroed = 0.0, zeroed + 1
    return zeroed


def repeated_actions(traj: Trajectory) -> list[bool]:
    """For each turn after the first: whether its action is exactly the previous turn's (a greedy
    policy stuck in a loop, e.g. clicking one checkbox on and off until the step limit). Turns
    without an action (unparsed replies) never count as repeats."""
    acts = [u.get("action") for u in traj["turns"]]
    return [a is not None and a == b for a, b in zip(acts[1:], acts[:-1])]


def rollout_metrics(trajs: list[Trajectory], stats: dict) -> dict:
    """One rank's rollout figures for the log, over the episodes that did not end in env_error:
    success, turns, parse errors, replies naming a bid not on the page, turns repeating the previous
    turn's action (`repeated_actions`), thoughts naming an element the page does not have at their bid
    (`ungrounded_thought`, over the turns with a thought in the expert's form), the episodes whose
    success `--reward grounded` did not reward (stats["ungrounded_successes"]), the sampling entropy
    (nats per reply token); the env_error share; the rollout's counts and timings (seconds)."""
    valid = [t for t in trajs if not t["env_error"]]
    turns = [u for t in valid for u in t["turns"]]
    repeats = [r for t in valid for r in repeated_actions(t)]
    ent = [u["entropy"] for u in turns if "entropy" in u]
    ungrounded = [g for g in map(ungrounded_thought, turns) if g is not None]
    return {"rollout/success": np.mean([t["success"] for t in valid]) if valid else 0.0,
            "rollout/turns": np.mean([t["steps"] for t in valid]) if valid else 0.0,
            "rollout/parse_error": np.mean([bool(u["error"]) and u["action"] is None for u in turns] or [0]),
            "rollout/missing_bid": np.mean([named_bid_missing(u) for u in turns] or [0]),
            "rollout/repeated_action": np.mean(repeats or [0]),
            "rollout/ungrounded_thought": np.mean(ungrounded or [0]),
            "rollout/entropy": np.mean(ent) if ent else 0.0,
            "rollout/ungrounded_success": stats.get("ungrounded_successes", 0.0) / len(valid) if valid else 0.0,
            "env/env_error": np.mean([t["env_error"] for t in trajs]) if trajs else 0.0,
            "env/timeouts": stats.get("env_timeouts", 0.0),
            "perf/rollout_s": stats.get("wall_s", 0.0), "perf/generate_s": stats.get("generate_s", 0.0),
            "perf/env_s": stats.get("env_s", 0.0), "perf/generated_tokens": stats.get("generated_tokens", 0.0),
            "perf/prompt_tokens": stats.get("prompt_tokens", 0.0)}
