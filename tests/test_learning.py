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
    batch = [(0, prompt, compress.encode_reply(tok, a)) for a in ACTIONS]
    with torch.no_grad():
        logp, rm, _ = update.score(model, tok, batch, 1.0, False, "cpu")
    return torch.tensor([math.exp(float((logp[i] * rm[i]).sum())) for i in range(len(ACTIONS))])


def warm_up(model, tok, prompt):
    """Supervised steps on the four actions, equally: the tiny model learns the format, not the answer."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = [(0, prompt, compress.encode_reply(tok, a)) for a in ACTIONS]
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
    cfg.old_from_rollout = gen.logprobs_are_pi_old  # as train.py: pi_old is the rollout's own log-probs
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


def test_pi_old_read_from_the_rollout_gives_the_update_of_pi_old_rescored(tok):
    # pi_old = the log-probs each turn stored when it was sampled (UpdateConfig.old_from_rollout, train.py's
    # default with HF sampling): the same optimizer steps as scoring pi_old again, one forward pass fewer.
    # A misaligned, shifted or wrongly tempered log-prob moves the ratio off 1 and changes the steps.
    # (SGD: a step linear in the gradient; Adam turns float rounding in a near-zero gradient into a full step.)
    import copy

    torch.manual_seed(0)
    model = policy.tiny_model(tok)
    prompts = [compress.PromptSettings().build(tok, [], PAGE.replace("right", w)) for w in ("right", "left")]
    samples = policy.generate(model, tok, [p for p in prompts for _ in range(4)], max_new_tokens=8, temperature=0.7)
    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    trajs = [{"task": "fake", "seed": j // 4, "reward": rewards[j], "env_error": False, "success": bool(rewards[j]),
              "turns": [{"prompt_ids": prompts[j // 4], "response_ids": s.ids, "response_logprobs": s.logprobs}]}
             for j, s in enumerate(samples)]
    trajs[7]["turns"][0].pop("response_logprobs")  # a turn without them is scored as before
    after, forwards = [], []
    for from_rollout in (False, True):
        net = copy.deepcopy(model)
        calls = [0]
        net.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        cfg = update.UpdateConfig(minibatches=2, micro_batch=8, temperature=0.7, old_from_rollout=from_rollout)
        stats = update.policy_update(net, opt, tok, trajs, cfg, "cpu", 1, seed=0)
        assert stats["loss/updates"] == 2, stats
        after.append(torch.cat([p.detach().flatten() for p in net.parameters()]))
        forwards.append(calls[0])
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    moved = (after[0] - start).abs().max()
    assert moved > 1e-4  # the steps did something
    assert (after[1] - after[0]).abs().max() < 1e-3 * moved, ((after[1] - after[0]).abs().max(), moved)
    assert forwards[1] < forwards[0], forwards


def test_train_reads_pi_old_from_the_rollout_only_for_the_trainers_own_fp32_samples(tok):
    # the trainer's own HF sampling (fp32) stores pi_old's log-probs; a scripted stand-in, vLLM (no
    # logprobs_are_pi_old) or --bf16 (sampling and scoring round differently) get pi_old scored again
    import train
    from scripted_train import ScriptedReplies

    gen = generators.HFGenerator(policy.tiny_model(tok), tok)
    args = train.parse_args(["--mode", "real", "--minibatches", "2"])
    assert train.update_config(args, gen).old_from_rollout
    assert not train.update_config(args).old_from_rollout
    assert not train.update_config(args, ScriptedReplies.__new__(ScriptedReplies)).old_from_rollout
    assert not generators.VLLMGenerator.__dict__.get("logprobs_are_pi_old", False)
    assert not train.update_config(train.parse_args(["--mode", "real", "--minibatches", "2", "--bf16", "1"]), gen).old_from_rollout
