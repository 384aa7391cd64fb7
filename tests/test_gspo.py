"""GSPO numbers checked against values computed by hand."""
import math

import torch

import gspo


def test_one_token_trajectory_ratio_is_the_token_ratio():
    logp, old = torch.log(torch.tensor([[0.6]])), torch.log(torch.tensor([[0.5]]))
    s = torch.exp(gspo.sequence_log_ratio(logp, old, torch.ones(1, 1), torch.tensor([0]), 1))
    assert abs(float(s) - 1.2) < 1e-6


def test_ratio_is_geometric_mean_over_all_turns():
    # trajectory 0 has two turns: tokens with ratios 2 and 0.5 (turn 1) and 4 (turn 2)
    old = torch.zeros(2, 2)
    logp = torch.log(torch.tensor([[2.0, 0.5], [4.0, 1.0]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    s = torch.exp(gspo.sequence_log_ratio(logp, old, mask, torch.tensor([0, 0]), 1))
    assert abs(float(s) - (2 * 0.5 * 4) ** (1 / 3)) < 1e-5


def test_padding_and_observation_tokens_do_not_change_the_ratio():
    logp, old = torch.log(torch.tensor([[0.6, 0.9, 0.01]])), torch.log(torch.tensor([[0.5, 0.9, 0.9]]))
    m = torch.tensor([[1.0, 1.0, 0.0]])  # the third position is padding or observation
    r = gspo.sequence_log_ratio(logp, old, m, torch.tensor([0]), 1)
    assert abs(math.exp(float(r)) - math.sqrt(1.2)) < 1e-6


def test_equal_rewards_group_contributes_nothing():
    logp = torch.log(torch.tensor([[0.6], [0.3]])).requires_grad_()
    loss, _ = gspo.gspo_loss(logp, logp.detach() + 0.1, torch.zeros(2), torch.ones(2, 1), torch.tensor([0, 1]), num_traj=2)
    loss.backward()
    assert loss.item() == 0.0 and torch.all(logp.grad == 0)


def test_loss_and_clipping_by_hand():
    # s = 1.0002 (inside 1 + 4e-4) with A = +1; s = 1.001 (clipped to 1.0004) with A = +2; N = 4
    old = torch.zeros(2, 1)
    logp = torch.log(torch.tensor([[1.0002], [1.001]]))
    loss, st = gspo.gspo_loss(logp, old, torch.tensor([1.0, 2.0]), torch.ones(2, 1), torch.tensor([0, 1]), num_traj=4)
    assert abs(float(loss) - (-(1.0002 * 1 + 1.0004 * 2) / 4)) < 1e-6
    assert st["clip_frac"] == 0.5


def test_on_policy_gradient_is_sequence_mean():
    # at s = 1 the gradient w.r.t. each action token's logp is -A / (|y_i| N)
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # one trajectory, two turns, 3 action tokens
    loss, _ = gspo.gspo_loss(logp, logp.detach(), torch.tensor([3.0]), mask, torch.tensor([0, 0]), num_traj=2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -0.5], [-0.5, 0.0]]))


def test_asymmetric_clip_bounds_by_hand():
    # four one-token trajectories with sequence ratios 0.85, 0.95, 1.2, 1.4; clip_low 0.1, clip_high
    # 0.3: the range is [0.9, 1.3] (swapped it would be [0.7, 1.1]); N = 4
    ratios = torch.tensor([[0.85], [0.95], [1.2], [1.4]])
    want = {1.0: [0.85, 0.95, 1.2, 1.3],  # A > 0: clipped only from above
            -1.0: [-0.9, -0.95, -1.2, -1.4]}  # A < 0: clipped only from below
    for a, surr in want.items():
        logp = torch.log(ratios).requires_grad_()
        loss, s = gspo.gspo_loss(logp, torch.zeros(4, 1), torch.full((4,), a),
                                 torch.ones(4, 1), torch.arange(4), num_traj=4, clip_low=0.1, clip_high=0.3)
        loss.backward()
        assert abs(loss.item() + sum(surr) / 4) < 1e-6, (a, loss.item())
        grad = [[0.0 if abs(x) in (0.9, 1.3) else -x / 4] for x in surr]  # d(-s A / N)/d log s = -s A / N unclipped
        assert torch.allclose(logp.grad, torch.tensor(grad), atol=1e-6), (a, logp.grad)
        # counted: the trajectories the min() clipped (zero gradient), one of the four on each sign
        assert s["clip_frac"] == 0.25
        assert s["clip_frac"] == float((logp.grad == 0).float().mean())


def test_clip_frac_counts_only_trajectories_the_clip_takes():
    # sequence ratio 0.5 with A = +1 and 1.5 with A = -1 lie outside the range but keep their
    # gradient (min() takes the unclipped term): not counted; 1.5 with A = +1 and 0.5 with A = -1 are
    logp = torch.log(torch.tensor([[0.5], [1.5], [1.5], [0.5]]))
    _, s = gspo.gspo_loss(logp, torch.zeros(4, 1), torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.ones(4, 1),
                          torch.arange(4), num_traj=4)
    assert s["clip_frac"] == 0.5
    _, s = gspo.gspo_loss(logp[:2], torch.zeros(2, 1), torch.tensor([1.0, -1.0]), torch.ones(2, 1),
                          torch.arange(2), num_traj=2)
    assert s["clip_frac"] == 0.0
