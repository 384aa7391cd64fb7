"""RL learns at all: the real rollout, loss and optimizer raise the probability of the rewarded action.

A fake page shows four buttons; the reward depends only on the reply (1 for click('12'), 0 for the
other three valid clicks). A tiny model is first taught the reply format with the four actions
equally likely (a few supervised steps), then trained with M-GRPO or GSPO (several optimizer steps
per batch, so the clipped ratio acts) on groups sampled by rollout.py. Any sign, mask or alignment
error between sampling, the advantage and the loss makes the rewarded action's probability fall or
stand still instead of rising.
"""
import math
from types import SimpleNamespace

import pytest
import torch

import compress
import generators
import policy
import update
from actions import parse_action
from rollout import EnvPool, rollout

PAGE = "Goal: press the right button\nURL: fake.html\n[11] button 'A'\n[12] button 'B'\n[13] button 'C'\n[14] button 'D'"
ACTIONS = ["click('11')", "click('12')", "click('13')", "click('14')"]
REWARDED = "click('12')"


class OneStepPage:
    """A page whose reward depends on the reply alone: 1 for REWARDED, 0 otherwise; one step."""

    def __init__(self, task):
        self.task = task

    def reset(self, seed, task=None):
        return SimpleNamespace(text=PAGE, goal="press the right button", env_error=False)

    def step(self, text):
        try:
            action, error = parse_action(text), ""
        except ValueError as e:
            action, error = None, str(e)
        ok = action == REWARDED
        info = {"action": action, "error": error, "success": ok, "env_error": False}
        return SimpleNamespace(text=PAGE, goal="", env_error=False), float(ok), True, info

    def close(self):
        pass


def action_probs(model, tok, prompt):
    """p(each of ACTIONS + end of turn | prompt) under the model (temperature 1)."""
    batch = [(0, prompt, compress.encode_text(tok, a) + [tok.eos_token_id]) for a in ACTIONS]
    with torch.no_grad():
        logp, rm, _ = update.score(model, tok, batch, 1.0, False, "cpu")
    return torch.tensor([math.exp(float((logp[i] * rm[i]).sum())) for i in range(len(ACTIONS))])


def warm_up(model, tok, prompt):
    """Supervised steps on the four actions, equally: the tiny model learns the format, not the answer."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = [(0, prompt, compress.encode_text(tok, a) + [tok.eos_token_id]) for a in ACTIONS]
    for _ in range(150):
        logp, rm, _ = update.score(model, tok, batch, 1.0, False, "cpu")
        loss = -(logp * rm).sum() / rm.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if action_probs(model, tok, prompt).sum() > 0.9:
            break


@pytest.mark.parametrize("loss,epochs,minibatches", [("mgrpo", 2, 2), ("gspo", 2, 2)])
def test_rl_raises_the_rewarded_action(tok, loss, epochs, minibatches):
    torch.manual_seed(0)
    model = policy.tiny_model(tok)
    prompt = compress.PromptSettings().build(tok, [], PAGE)
    warm_up(model, tok, prompt)
    before = action_probs(model, tok, prompt)
    assert before.sum() > 0.9 and before.min() > 0.1, before  # the format is learnt, the answer is not
    clip = {"mgrpo": (0.2, 0.2), "gspo": (3e-4, 4e-4)}[loss]
    cfg = update.UpdateConfig(loss=loss, clip_low=clip[0], clip_high=clip[1], ppo_epochs=epochs,
                              minibatches=minibatches, micro_batch=8)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3 if loss == "mgrpo" else 1e-3)
    gen = generators.HFGenerator(model, tok)
    pool = EnvPool(OneStepPage, tok, num_envs=16)
    clip_seen = 0.0
    try:
        for it in range(4):
            # all 16 agents in one generate call (a long linger), rows in job order: the same samples for
            # the same episodes whatever the thread timing
            trajs, st = rollout(gen, tok, pool, [("fake", k // 8) for k in range(16)], temperature=1.0,
                                max_new_tokens=8, linger=1.0)
            assert st["generate_calls"] == 1
            stats = update.policy_update(model, opt, tok, trajs, cfg, "cpu", 1, seed=it)
            clip_seen = max(clip_seen, stats["loss/clip_frac"])
    finally:
        pool.close()
    after = action_probs(model, tok, prompt)
    k = ACTIONS.index(REWARDED)
    assert after[k] > before[k] + 0.1, (before, after)  # a clear rise, not noise
    assert after[k] > max(after[j] for j in range(len(ACTIONS)) if j != k)
    assert clip_seen > 0  # the later steps of a batch were off-policy enough for the clip to act
