"""How far checkpoints prefer a recorded reply over one alternative on the same prompts: a drift check.

An RL run can flip a decision its start policy made by a thin margin on a task it never trained on
(docs/dreams.md: dream runs at real ratio 0.4 turned choose-list's first reply into a click on
Submit). The margin says where and when, without running episodes:

    margin = log p(recorded reply | prompt) - log p(alternative reply | prompt)    (nats)

each reply's token log-probs summed, its end-of-turn token included (the reply as BC trains on it:
supervised.expert_turns). Positive: the checkpoint prefers the recorded reply. The prompts and
recorded replies are turns of an eval's trajectories.jsonl (eval.py writes prompt_ids); the
alternative clicks the element of the turn's page named --click (e.g. Submit), worded as the
experts word it (experts.thought_reply) when the recorded reply has a thought.
The prompts are the recorded ones, so compare checkpoints that share the recording run's prompt
settings (a checkpoint and the RL runs started from it do).

    python reply_margin.py runs/bc/final runs/dream-d6/final --trajectories runs/bc/final/eval/trajectories.jsonl \\
        --task choose-list --click Submit
"""
from __future__ import annotations

import argparse
import json

import torch

import compress
import experts
import policy
from axtree import read_tree
from runlog import read_jsonl


def click_reply(observation: str, name: str, think: bool) -> str | None:
    """The reply that clicks the first element of `observation` (a page's text as recorded in a
    turn) whose name is `name`: `click('BID')`, after `<think>Click the ROLE 'NAME' [BID].</think>`
    when `think`. None when the page has no element of that name."""
    node = next((n for n in read_tree(observation) if n.name == name and n.bid), None)
    if node is None:
        return None
    action = f"click({node.bid!r})"
    return experts.thought_reply(observation, action) if think else action


def summed_logprobs(model, tok, prompt: list[int], replies: list[str]) -> list[float]:
    """log p(reply | prompt) under `model` for each reply text, in nats: its tokens' log-probs summed,
    the reply encoded as untrusted text (compress.encode_text) plus the end-of-turn token, as BC
    trains on it. One forward pass of batch len(replies), no gradients."""
    ids = [compress.encode_reply(tok, r) for r in replies]
    with torch.no_grad():
        logp, mask, _ = policy.reply_logprobs(model, [prompt] * len(replies), ids, tok.pad_token_id)
    return (logp * mask).sum(-1).tolist()


def margins(model, tok, cases: list[tuple[list[int], str, str]]) -> list[float]:
    """Per case (prompt ids, reply text, alternative text): log p(reply) - log p(alternative) under
    `model`, in nats (summed_logprobs)."""
    out = []
    for prompt, reply, alt in cases:
        a, b = summed_logprobs(model, tok, prompt, [reply, alt])
        out.append(a - b)
    return out


def cases_from(path: str, task: str, click: str, *, turn: int = 0, successful: bool = True,
               limit: int = 0) -> list[tuple[list[int], str, str]]:
    """(prompt ids, recorded reply, alternative) of turn `turn` of `task`'s episodes in a
    trajectories.jsonl (only successful episodes when `successful`; at most `limit`, 0: all), skipping
    turns whose page has no element named `click` or whose recorded reply already clicks it.
    Raises ValueError when no turn qualifies."""
    out = []
    for t in read_jsonl(path):
        if t.get("task") != task or (successful and not t.get("success")) or len(t.get("turns", [])) <= turn:
            continue
        u = t["turns"][turn]
        alt = click_reply(u["observation"], click, u["response"].startswith("<think>"))
        if alt is not None and u.get("prompt_ids") and alt != u["response"]:
            out.append((u["prompt_ids"], u["response"], alt))
        if limit and len(out) == limit:
            break
    if not out:
        raise ValueError(f"{path}: no turn {turn} of {task!r} with an element named {click!r} to compare against")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpts", nargs="+", help="checkpoints to score (train.py --out DIR/final or DIR/step-N)")
    ap.add_argument("--trajectories", required=True, help="an eval's trajectories.jsonl (prompts and recorded replies)")
    ap.add_argument("--task", required=True)
    ap.add_argument("--click", required=True, help="the alternative reply clicks the element of this name")
    ap.add_argument("--turn", type=int, default=0, help="which turn of each episode (0: its first page)")
    ap.add_argument("--limit", type=int, default=12, help="episodes scored (0: all)")
    a = ap.parse_args(argv)
    cases = cases_from(a.trajectories, a.task, a.click, turn=a.turn, limit=a.limit)
    print(f"{len(cases)} turns of {a.task}: log p(recorded reply) - log p(click {a.click!r}), nats")
    print("| checkpoint | mean | min | max | alternative preferred |\n|---|---|---|---|---|")
    for ck in a.ckpts:
        model, tok = policy.load_model(ck)
        m = margins(model.eval(), tok, cases)
        print(f"| {ck} | {sum(m) / len(m):+.2f} | {min(m):+.2f} | {max(m):+.2f} | {sum(x < 0 for x in m)} of {len(m)} |")
        print(json.dumps({"ckpt": ck, "margins": [round(x, 3) for x in m]}))


if __name__ == "__main__":
    main()
