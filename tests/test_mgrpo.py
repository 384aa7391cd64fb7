"""M-GRPO numbers checked against values computed by hand."""
import math

import pytest
import torch

import mgrpo


def test_equal_rewards_give_exactly_zero_advantage():
    adv, zero = mgrpo.group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), ["a", "a", "a", "b", "b", "b"])
    assert adv.tolist() == [0.0] * 6
    assert zero == 1.0


def test_advantages_by_hand():
    # group a: rewards 1,0,0,0: mean 0.25, population std sqrt(0.1875) = 0.4330127
    adv, zero = mgrpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]), ["a", "a", "a", "a", "b", "b"])
    s = math.sqrt(0.1875)
    assert torch.allclose(adv[:4], torch.tensor([0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]))
    assert adv[:4].tolist()[0] > 1.73 and adv[4:].tolist() == [0.0, 0.0]
    assert zero == 2 / 6


def test_negative_advantages_are_weighted_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    s = math.sqrt(0.1875)
    adv, _ = mgrpo.group_advantages(r, ["a", "a", "a", "a", "b", "b"], neg_weight=0.1)
    assert torch.allclose(adv[:4], torch.tensor([0.75 / s, -0.025 / s, -0.025 / s, -0.025 / s]))
    assert adv[4:].tolist() == [0.0, 0.0]
    adv0, _ = mgrpo.group_advantages(r, ["a", "a", "a", "a", "b", "b"], neg_weight=0.0)
    assert adv0.tolist()[1:] == [0.0] * 5 and adv0.tolist()[0] > 1.73
    with pytest.raises(ValueError):
        mgrpo.group_advantages(r, ["a"] * 6, neg_weight=-1.0)


def test_std_floor_keeps_tiny_differences_finite():
    adv, _ = mgrpo.group_advantages(torch.tensor([1.0, 1.0 - 1e-6], dtype=torch.float64), ["a", "a"], std_floor=1e-2)
    # (r - mean) = +-5e-7, std 5e-7 is floored to 1e-2: advantages +-5e-5, not +-1
    assert torch.allclose(adv, torch.tensor([5e-5, -5e-5]), atol=1e-10)


def test_token_weights_each_trajectory_counts_equally():
    # trajectory 0: two turns with 2 and 1 action tokens (3 in all); trajectory 1: one turn with 4 tokens
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    w = mgrpo.token_weights(mask, torch.tensor([0, 0, 1]))
    assert torch.allclose(w[0], torch.tensor([1 / 6, 1 / 6, 0, 0]))
    assert torch.allclose(w[1], torch.tensor([1 / 6, 0, 0, 0]))
    assert torch.allclose(w[2], torch.full((4,), 1 / 8))
    assert abs(float(w.sum()) - 1.0) < 1e-6


def test_token_weights_turn_and_token_modes_by_hand():
    # trajectory 0: two turns with 2 and 1 action tokens and a turn without a reply; trajectory 1: one
    # turn with 4 tokens. Turn mode: each trajectory 1/N, each of its turns with a reply the same share
    # of it (1/T_i), spread evenly over that turn's tokens. Token mode: each action token 1/7.
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    idx = torch.tensor([0, 0, 0, 1])
    w = mgrpo.token_weights(mask, idx, "turn")
    assert torch.allclose(w[0], torch.tensor([1 / 8, 1 / 8, 0, 0]))  # 1 / (N=2 * T=2 * 2 tokens)
    assert torch.allclose(w[1], torch.tensor([1 / 4, 0, 0, 0]))  # 1 / (2 * 2 * 1): the short turn weighs the same
    assert torch.allclose(w[2], torch.zeros(4)) and torch.allclose(w[3], torch.full((4,), 1 / 8))  # 1 / (2 * 1 * 4)
    assert abs(float(w.sum()) - 1.0) < 1e-6
    assert torch.allclose(mgrpo.token_weights(mask, idx, "token"), mask / 7)
    # the global counts of a batch spread over ranks (N = 4 trajectories, 14 action tokens) replace the local ones
    assert torch.allclose(mgrpo.token_weights(mask, idx, "turn", num_traj=4), w / 2)
    assert torch.allclose(mgrpo.token_weights(mask, idx, "token", num_tokens=14), mask / 14)
    assert torch.allclose(mgrpo.token_weights(mask, idx, "trajectory", num_traj=4),
                          mgrpo.token_weights(mask, idx, "trajectory") / 2)


def test_empty_mask_trajectory_is_skipped_not_nan():
    w = mgrpo.token_weights(torch.tensor([[0.0, 0.0], [1.0, 1.0]]), torch.tensor([0, 1]))
    assert torch.isfinite(w).all() and torch.allclose(w, torch.tensor([[0.0, 0.0], [0.5, 0.5]]))


def test_loss_by_hand_with_clipping():
    # one sample, two action tokens, advantage +1, eps 0.2
    logp = torch.log(torch.tensor([[0.5, 0.9]]))
    old = torch.log(torch.tensor([[0.5, 0.6]]))  # ratios 1.0 and 1.5 (clipped to 1.2 since A > 0)
    w = torch.tensor([[0.5, 0.5]])
    loss, s = mgrpo.mgrpo_loss(logp, old, torch.tensor([1.0]), w, clip_low=0.2, clip_high=0.2)
    assert abs(float(loss) - (-(0.5 * 1.0 + 0.5 * 1.2))) < 1e-6
    assert abs(s["clip_frac"] - 0.5) < 1e-6 and abs(s["ratio"] - 1.25) < 1e-6
    # negative advantage: min(rho A, clip(rho) A) = min(-1.5, -1.2) = -1.5: not clipped from below
    loss, _ = mgrpo.mgrpo_loss(logp, old, torch.tensor([-1.0]), w)
    assert abs(float(loss) - (0.5 * 1.0 + 0.5 * 1.5)) < 1e-6


def test_gradient_is_advantage_times_weight_on_policy():
    # at rho = 1 the gradient of -rho*A*w w.r.t. logp is -A*w
    logp = torch.log(torch.tensor([[0.3, 0.7]])).requires_grad_()
    loss, _ = mgrpo.mgrpo_loss(logp, logp.detach(), torch.tensor([2.0]), torch.tensor([[0.25, 0.0]]))
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 0.0]]))


def test_kl_k3_is_zero_at_reference_and_positive_elsewhere():
    logp = torch.log(torch.tensor([[0.5]]))
    w = torch.ones(1, 1)
    l0, s0 = mgrpo.mgrpo_loss(logp, logp, torch.tensor([0.0]), w, ref_logp=logp, kl_coef=0.1)
    assert float(l0) == 0.0 and s0["kl"] == 0.0
    ref = torch.log(torch.tensor([[0.25]]))  # d = log(0.5): k3 = 0.5 - log 0.5 - 1 = 0.193147
    l1, s1 = mgrpo.mgrpo_loss(logp, logp, torch.tensor([0.0]), w, ref_logp=ref, kl_coef=0.1)
    assert abs(s1["kl"] - (0.5 - math.log(0.5) - 1)) < 1e-6 and abs(float(l1) - 0.1 * s1["kl"]) < 1e-6
    # kl_coef 0 with a reference (train.py --log-kl): the KL is reported, the loss has no penalty
    l2, s2 = mgrpo.mgrpo_loss(logp, logp, torch.tensor([0.0]), w, ref_logp=ref, kl_coef=0.0)
    assert abs(s2["kl"] - s1["kl"]) < 1e-9 and float(l2) == 0.0


def test_kl_clip_caps_a_token_far_below_the_reference_and_its_gradient():
    # two tokens at advantage 0: one 0.5 nats below the reference (k3 = 0.1065), one 12 nats below
    # (k3 = e^12 - 13 = 162741.8, gradient 1 - e^12 per unit of log pi). Capped at 10 the far token
    # adds 10 to the loss and no gradient; the near one is untouched; the reported KL stays uncapped
    d = torch.tensor([[0.5, 12.0]], dtype=torch.float64)
    ref = torch.log(torch.tensor([[0.5, 0.9]], dtype=torch.float64))
    w = torch.full((1, 2), 0.5, dtype=torch.float64)
    k3 = torch.exp(d) - d - 1
    for clip, loss_by_hand, grad_by_hand in ((0.0, 0.1 * 0.5 * (k3[0, 0] + k3[0, 1]), 0.1 * 0.5 * (1 - torch.exp(d[0]))),
                                             (10.0, 0.1 * 0.5 * (k3[0, 0] + 10.0), torch.tensor([0.1 * 0.5 * (1 - math.exp(0.5)), 0.0]))):
        logp = (ref - d).clone().requires_grad_()
        loss, s = mgrpo.mgrpo_loss(logp, logp.detach(), torch.tensor([0.0], dtype=torch.float64), w, ref_logp=ref,
                                   kl_coef=0.1, kl_clip=clip)
        loss.backward()
        assert abs(loss.item() - float(loss_by_hand)) < 1e-9 * float(loss_by_hand)
        assert torch.allclose(logp.grad[0], grad_by_hand.to(torch.float64), rtol=1e-9)
        assert abs(s["kl"] - float(k3.mean())) < 1e-6 * float(k3.mean())  # the logged KL: uncapped
        assert s["kl_capped"] == (0.5 if clip else 0.0)


def test_asymmetric_clip_bounds_by_hand():
    # clip_low 0.1, clip_high 0.3: the range is [0.9, 1.3]. Token ratios 0.85 and 1.4 fall outside it
    # (one on each side), 0.95 and 1.2 inside; 1.2 is outside [0.7, 1.1] (the bounds swapped) and
    # 0.85 is inside it. One sample per sign of the advantage, each token weighted 1/4.
    ratios = torch.tensor([0.85, 0.95, 1.2, 1.4], dtype=torch.float64)
    w = torch.full((1, 4), 0.25, dtype=torch.float64)
    want = {1.0: [0.85, 0.95, 1.2, 1.3],  # A > 0: min(rho, clip(rho)) clips only from above
            -1.0: [-0.9, -0.95, -1.2, -1.4]}  # A < 0: min(-rho, -clip(rho)) clips only from below
    for a, surr in want.items():
        logp = torch.log(ratios)[None].clone().requires_grad_()
        loss, s = mgrpo.mgrpo_loss(logp, torch.zeros(1, 4, dtype=torch.float64), torch.tensor([a], dtype=torch.float64),
                                   w, clip_low=0.1, clip_high=0.3)
        loss.backward()
        assert abs(loss.item() + sum(surr) / 4) < 1e-12, (a, loss.item())
        # d(-rho A w)/d logp = -rho A w where the surrogate is unclipped, 0 where it is clipped
        grad = [0.0 if abs(x) in (0.9, 1.3) else -x * 0.25 for x in surr]
        assert torch.allclose(logp.grad[0], torch.tensor(grad, dtype=torch.float64), atol=1e-12), (a, logp.grad)
        # the clip fraction counts the tokens the min() clipped (zero gradient), not every ratio outside
        # the range: one of the four on each sign (TRL #3032)
        assert s["clip_frac"] == 0.25
        assert s["clip_frac"] == float((logp.grad[0] == 0).double().mean())


def test_clip_frac_counts_only_tokens_the_clip_takes():
    # the case: ratio 0.5 with A = +1 is outside [0.8, 1.2] but min(0.5, 0.8) = 0.5 is the
    # unclipped term, so the token keeps its gradient and is not clipped; ratio 1.5 with A = -1 likewise
    # (min(-1.5, -1.2) = -1.5). A = 0 tokens are never clipped. Ratio 1.5 with A = +1 and 0.5 with
    # A = -1 are.
    w = torch.full((1, 1), 1.0)
    for ratio, a, clipped in ((0.5, 1.0, 0.0), (1.5, -1.0, 0.0), (1.5, 0.0, 0.0), (0.5, 0.0, 0.0),
                              (1.5, 1.0, 1.0), (0.5, -1.0, 1.0), (1.1, 1.0, 0.0)):
        logp = torch.log(torch.tensor([[ratio]])).requires_grad_()
        loss, s = mgrpo.mgrpo_loss(logp, torch.zeros(1, 1), torch.tensor([a]), w)
        loss.backward()
        assert s["clip_frac"] == clipped, (ratio, a, s["clip_frac"])
        assert (float(logp.grad[0, 0]) == 0.0) == (clipped == 1.0 or a == 0.0), (ratio, a, logp.grad)
