"""The trajectory record: one episode, as rollout.py writes it and everything else reads it.

Real episodes (rollout on env.WebEnv), dreams (rollout on world_model.DreamEnv), expert
demonstrations (experts.py) and evaluation episodes (eval.py) are all this one record, stored one
JSON object a line (trajectories.jsonl, demos.jsonl). The reward's path from the page to the loss:
WebEnv.step's reward -> Trajectory.reward (1.0 only on full task success, `success` says the same)
-> mgrpo.group_advantages over (task, seed) groups -> the loss (update.py). An episode that ended
by an infrastructure fault has env_error=True and is neither a success nor a failure: training and
evaluation leave it out.

Token-in, token-out: `prompt_ids` and `response_ids` are exactly the ids that were generated from
and sampled; training scores those ids and never re-encodes text. Demonstrations have no ids (their
turns are tokenised at training time, supervised.expert_turns).
"""
from __future__ import annotations

from typing import NotRequired, TypedDict


class Turn(TypedDict):
    """One step of an episode: the prompt the agent saw, its reply, and what the page did."""

    observation: str                 # env.Obs.text the agent acted on (goal, URL, tree, last error)
    action: str | None               # actions.parse_action's canonical action; None when it did not parse
    error: str                       # the error the next observation shows ("" if none)
    response: NotRequired[str]       # the reply as text (decoded, special tokens dropped); absent in
                                     # demonstrations, whose reply is built at training time (with or without a thought)
    prompt_ids: NotRequired[list[int]]          # the compressed chat prompt, exactly as generated from
    response_ids: NotRequired[list[int]]        # sampled ids, ending with a stop id unless truncated
    response_logprobs: NotRequired[list[float]]  # log softmax(logits / T) of each sampled id, at sampling time
    truncated: NotRequired[bool]                # the reply was cut by max_new_tokens
    entropy: NotRequired[float]                 # mean entropy (nats) of the sampling distribution over the reply
    screenshot: NotRequired[str]                # base64 JPEG of the page acted on (WebEnv(screenshots=True))
    real_observation: NotRequired[str | None]   # dream replays: the real page at this step (train dream)


class Trajectory(TypedDict):
    """One episode: a group member in RL (groups are (task, seed)), an eval episode, or a demo."""

    task: str
    seed: int | str                  # the page's seed (dream mode: the dream's start-state seed)
    goal: str
    source: str                      # "real", "dream" or "expert"
    turns: list[Turn]
    reward: float                    # 1.0 on full success, else 0.0
    success: bool
    env_error: bool                  # an infrastructure fault ended it: neither success nor failure
    steps: int                       # environment steps taken (= len(turns))
    error: NotRequired[str]          # why an env_error episode ended
    final_screenshot: NotRequired[str]  # base64 JPEG of the last page
    advantage: NotRequired[float]    # a fixed advantage instead of the group's (dream experts, --expert-loss gspo)
    replayed: NotRequired[bool]      # dream mode: this dream was replayed on real pages
    iteration: NotRequired[int]      # dream replays: the training iteration
    predicted_success: NotRequired[bool]  # dream replays: the world model's judgement
    real_success: NotRequired[bool]  # dream replays: what happened on real pages
    start_match: NotRequired[bool]   # dream replays: the real page after the prefix equals the dream's start
    start: NotRequired[dict]         # dream replays: {task, seed, prefix} of the start state
    context: NotRequired[list[dict]]  # dreams from stage k of a real episode: its first k turns
                                     # [{observation, response}], the prompts' history; never trained on
    final_observation: NotRequired[str]  # env.Obs.text of the page after the last action (rollout.py)
    done_success: NotRequired[bool]  # dreams: the world model's `done: yes` (the reward under --dream-reward done)
    judge_p: NotRequired[float]      # dreams under --dream-reward judge: the judge's P(yes) (judge.py)


def new_trajectory(task: str, seed, source: str) -> Trajectory:
    """An empty record: no turns yet, reward 0, not a success, no env_error."""
    return {"task": task, "seed": seed, "goal": "", "source": source, "turns": [], "reward": 0.0,
            "success": False, "env_error": False, "steps": 0}


def trainable(t: Trajectory) -> bool:
    """Whether a trajectory can enter a policy update: no env_error, and a reply token in some turn."""
    return not t["env_error"] and any(u.get("response_ids") for u in t["turns"])
