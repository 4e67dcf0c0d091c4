"""The RL losses against a direct, loop-by-loop transcription of the recipe's equations: values and gradients,
including masked tokens (rho outside the band), clipping on both sides, all-equal-reward groups and padding."""

from __future__ import annotations

import math

import pytest
import torch

from training.rl.losses import (
    double_sided_is_loss,
    group_advantages,
    grpo_icepop_loss,
    on_policy_distillation_advantages,
    on_policy_distillation_loss,
)

BETA, EL, EH = 2.0, 0.2, 0.28


def _eq1_reference(logp, logp_old, logp_infer, adv, lengths):
    """Eq. 1 written out with scalars: -1/B Σ_i 1/|y_i| Σ_t pop(ρ) · min(r Â, clip(r) Â)."""
    total = 0.0
    for i, n in enumerate(lengths):
        seq = 0.0
        for t in range(n):
            rho = math.exp(float(logp_old[i, t]) - float(logp_infer[i, t]))
            pop = rho if 1 / BETA <= rho <= BETA else 0.0
            r = torch.exp(logp[i, t] - float(logp_old[i, t]))
            a = float(adv[i])
            seq = seq + pop * torch.minimum(r * a, torch.clamp(r, 1 - EL, 1 + EH) * a)
        total = total + seq / max(n, 1)
    return -total / len(lengths)


def _batch(seed=0, b=6, t=5):
    g = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(b, t, generator=g) * 3
    logp_infer = logp_old + torch.randn(b, t, generator=g) * 0.5  # some rho outside [0.5, 2]
    logp = (logp_old + torch.randn(b, t, generator=g) * 0.3).requires_grad_(True)
    lengths = [5, 3, 5, 1, 4, 2]
    mask = torch.zeros(b, t)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return logp, logp_old, logp_infer, mask, lengths


def test_eq1_value_and_gradient_match_the_transcription():
    logp, logp_old, logp_infer, mask, lengths = _batch()
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    adv = group_advantages(rewards).flatten()
    loss, stats = grpo_icepop_loss(logp, logp_old, logp_infer, adv, mask, BETA, EL, EH)
    (grad,) = torch.autograd.grad(loss, logp)
    logp_ref = logp.detach().clone().requires_grad_(True)
    ref = _eq1_reference(logp_ref, logp_old, logp_infer, adv, lengths)
    (grad_ref,) = torch.autograd.grad(ref, logp_ref)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(grad, grad_ref, atol=1e-6)
    assert torch.all(grad[mask == 0] == 0)  # padding never trains
    assert 0 < stats.masked_fraction < 1 and 0 < stats.clip_fraction < 1
    assert stats.tokens == sum(lengths)


def test_group_advantages_normalise_and_zero_for_equal_rewards():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]))
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    assert torch.all(adv[1] == 0)
    assert torch.allclose(
        group_advantages(torch.tensor([[3.0, 1.0]]), normalise_std=False), torch.tensor([[1.0, -1.0]])
    )


def test_all_equal_reward_groups_give_no_gradient():
    logp, logp_old, logp_infer, mask, _ = _batch(seed=1)
    adv = group_advantages(torch.ones(2, 3)).flatten()
    loss, _ = grpo_icepop_loss(logp, logp_old, logp_infer, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == 0 and torch.all(grad == 0)


def test_tokens_outside_the_icepop_band_are_masked_and_inside_weighted_by_rho():
    logp_old = torch.zeros(1, 4)
    # rho = exp(old - infer): 3.0 (masked), 0.4 (masked), 1.5 (kept, weight 1.5), 0.5 (kept: band is closed)
    logp_infer = -torch.log(torch.tensor([[3.0, 0.4, 1.5, 0.5]]))
    logp = logp_old.clone().requires_grad_(True)
    loss, stats = grpo_icepop_loss(logp, logp_old, logp_infer, torch.tensor([1.0]), torch.ones(1, 4))
    (grad,) = torch.autograd.grad(loss, logp)
    # at r = 1, d/dlogp of -1/4 · pop · r · Â = -pop/4
    assert torch.allclose(grad, torch.tensor([[0.0, 0.0, -1.5 / 4, -0.5 / 4]]), atol=1e-6)
    assert stats.masked_fraction == 0.5 and stats.rho_max == pytest.approx(3.0, rel=1e-5)


@pytest.mark.parametrize(
    "log_ratio, adv, clipped",
    [
        (math.log(1.5), 1.0, True),
        (math.log(1.1), 1.0, False),
        (math.log(0.5), -1.0, True),
        (math.log(0.9), -1.0, False),
    ],
)
def test_clip_on_both_sides(log_ratio, adv, clipped):
    logp_old = torch.zeros(1, 1)
    logp = torch.full((1, 1), log_ratio, requires_grad=True)
    loss, stats = grpo_icepop_loss(logp, logp_old, logp_old.clone(), torch.tensor([adv]), torch.ones(1, 1))
    (grad,) = torch.autograd.grad(loss, logp)
    assert stats.clip_fraction == (1.0 if clipped else 0.0)
    # clipped: the min picks the constant clip value, so no gradient; else -Â·r
    expected = 0.0 if clipped else -adv * math.exp(log_ratio)
    assert grad.item() == pytest.approx(expected, abs=1e-6)


def test_double_sided_is_matches_eq_3_to_5():
    g = torch.Generator().manual_seed(3)
    logp_rollout = -torch.rand(3, 4, generator=g) * 2
    logp = (logp_rollout + torch.randn(3, 4, generator=g) * 0.3).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0]]), normalise_std=False).flatten()  # no std (Eq. 5)
    loss, stats = double_sided_is_loss(logp, logp_rollout, adv, mask, EL, EH)
    (grad,) = torch.autograd.grad(loss, logp)
    ref_grad = torch.zeros(3, 4)
    ref_loss = 0.0
    for i in range(3):
        for t in range(4):
            if mask[i, t]:
                r = math.exp(float(logp.detach()[i, t]) - float(logp_rollout[i, t]))
                f = r if 1 - EL < r < 1 + EH else 0.0
                ref_loss -= f * float(adv[i]) * float(logp.detach()[i, t]) / 7
                ref_grad[i, t] = -f * float(adv[i]) / 7
    assert loss.item() == pytest.approx(ref_loss, rel=1e-5)
    assert torch.allclose(grad, ref_grad, atol=1e-6)
    assert 0 <= stats.masked_fraction <= 1 and stats.tokens == 7


def test_distillation_advantage_is_detached_teacher_minus_student():
    student = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    teacher = torch.tensor([[-0.5, -3.0]])
    adv = on_policy_distillation_advantages(teacher, student)
    assert torch.allclose(adv, torch.tensor([[0.5, -1.0]])) and not adv.requires_grad
    logp = student.detach().clone().requires_grad_(True)
    loss, _ = on_policy_distillation_loss(logp, student.detach(), student.detach(), teacher, torch.ones(1, 2))
    (grad,) = torch.autograd.grad(loss, logp)
    # r = 1, rho = 1: gradient -Â_t / |y| per token: raises tokens the teacher likes more, lowers the others
    assert torch.allclose(grad, torch.tensor([[-0.25, 0.5]]), atol=1e-6)


def test_double_sided_is_masks_tokens_outside_the_band_on_both_sides_and_never_rescales_by_std():
    # ratios exp(log π_θ - log π_rollout): 0.7 (below 1 - 0.2), 1.1 (inside), 1.4 (above 1 + 0.28), 0.9 (inside)
    ratios = torch.tensor([[0.7, 1.1, 1.4, 0.9]])
    logp_rollout = torch.full((1, 4), -1.0)
    logp = (logp_rollout + ratios.log()).requires_grad_(True)
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]])  # one group: Â = R - mean R = 0.75 for the first sample
    adv = group_advantages(rewards, normalise_std=False).flatten()[:1]
    assert adv.item() == pytest.approx(0.75)  # with std it would be 0.75 / 0.433 = 1.73
    loss, stats = double_sided_is_loss(logp, logp_rollout, adv, torch.ones(1, 4), EL, EH)
    (grad,) = torch.autograd.grad(loss, logp)
    assert grad[0, 0] == 0 and grad[0, 2] == 0  # outside the band: no gradient at all
    assert grad[0, 1].item() == pytest.approx(-1.1 * 0.75 / 4) and grad[0, 3].item() == pytest.approx(
        -0.9 * 0.75 / 4
    )
    assert stats.masked_fraction == pytest.approx(0.5) and stats.rho_min == pytest.approx(0.7)
    # environment tokens (mask 0) contribute nothing, and the token mean is over policy tokens only
    loss2, stats2 = double_sided_is_loss(
        logp, logp_rollout, adv, torch.tensor([[0.0, 1.0, 0.0, 1.0]]), EL, EH
    )
    (grad2,) = torch.autograd.grad(loss2, logp)
    assert grad2[0, 0] == grad2[0, 2] == 0 and grad2[0, 1].item() == pytest.approx(-1.1 * 0.75 / 2)
    assert stats2.tokens == 2 and stats2.masked_fraction == 0
