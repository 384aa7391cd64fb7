"""What a rollout's trajectories say about the policy: the `rollout/*` figures of the training log
(real.py, dream.py), and the two turn-level signs of a policy going wrong that they count.

    m = rollout_metrics(trajs, stats)   # trajs, stats = rollout.rollout(...); one rank's figures
    repeated_actions(traj)              # [bool] per turn after the first: a loop
    named_bid_missing(turn)             # the reply names a bid the page does not have
"""
from __future__ import annotations

import numpy as np

from actions import split_action
from records import Trajectory


def named_bid_missing(turn: dict) -> bool:
    """Whether the turn's action names a bid that is not on the page it acted on (a reply such as
    click('7777') on a page without [7777]): a sign of a policy that has stopped reading the page."""
    if not turn.get("action"):
        return False
    name, args = split_action(turn["action"])
    return bool(args) and name not in ("scroll", "send_msg_to_user") and f"[{args[0]}]" not in turn["observation"]


def repeated_actions(traj: Trajectory) -> list[bool]:
    """For each turn after the first: whether its action is exactly the previous turn's (a greedy
    policy stuck in a loop, e.g. clicking one checkbox on and off until the step limit). Turns
    without an action (unparsed replies) never count as repeats."""
    acts = [u.get("action") for u in traj["turns"]]
    return [a is not None and a == b for a, b in zip(acts[1:], acts[:-1])]


def rollout_metrics(trajs: list[Trajectory], stats: dict) -> dict:
    """One rank's rollout figures for the log, over the episodes that did not end in env_error:
    success, turns, parse errors, replies naming a bid not on the page, turns repeating the previous
    turn's action (`repeated_actions`), the sampling entropy (nats per reply token); the env_error
    share; the rollout's counts and timings (seconds)."""
    valid = [t for t in trajs if not t["env_error"]]
    turns = [u for t in valid for u in t["turns"]]
    repeats = [r for t in valid for r in repeated_actions(t)]
    ent = [u["entropy"] for u in turns if "entropy" in u]
    return {"rollout/success": np.mean([t["success"] for t in valid]) if valid else 0.0,
            "rollout/turns": np.mean([t["steps"] for t in valid]) if valid else 0.0,
            "rollout/parse_error": np.mean([bool(u["error"]) and u["action"] is None for u in turns] or [0]),
            "rollout/missing_bid": np.mean([named_bid_missing(u) for u in turns] or [0]),
            "rollout/repeated_action": np.mean(repeats or [0]),
            "rollout/entropy": np.mean(ent) if ent else 0.0,
            "env/env_error": np.mean([t["env_error"] for t in trajs]) if trajs else 0.0,
            "env/timeouts": stats.get("env_timeouts", 0.0),
            "perf/rollout_s": stats.get("wall_s", 0.0), "perf/generate_s": stats.get("generate_s", 0.0),
            "perf/env_s": stats.get("env_s", 0.0), "perf/generated_tokens": stats.get("generated_tokens", 0.0),
            "perf/prompt_tokens": stats.get("prompt_tokens", 0.0)}
