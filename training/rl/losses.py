"""RL losses as pure functions of tensors, each next to the equation it implements (docs/recipe.md).

Shapes: per-token tensors are [B, T] (B responses, T generated tokens, right-padded); `mask` is 1.0 on tokens
that train (policy tokens of the response) and 0.0 on padding, prompt, tool output and masked error segments.
Log-probs are of the sampled token under each policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossStats:
    """Per-step statistics the loops log (all over tokens with mask = 1)."""

    rho_mean: float = 1.0
    rho_min: float = 1.0
    rho_max: float = 1.0
    masked_fraction: float = 0.0  # IcePop / double-sided IS: tokens outside the band
    clip_fraction: float = 0.0  # PPO clip active
    tokens: int = 0


def group_advantages(rewards: torch.Tensor, normalise_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Â_i = (R_i - mean(R)) / std(R) within each group (Eq. 1); without std for Eq. 5.

    rewards: [n_groups, G]. A group whose rewards are all equal gets Â = 0 (no signal, no update)."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not normalise_std:
        return centred
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    return torch.where(std > eps, centred / std.clamp_min(eps), torch.zeros_like(centred))


def icepop_weight(rho: torch.Tensor, beta: float) -> torch.Tensor:
    """pop(ρ, 1/β, β) = ρ inside [1/β, β], 0 outside (IcePop masks tokens whose engines disagree too much)."""
    inside = (rho >= 1.0 / beta) & (rho <= beta)
    return torch.where(inside, rho, torch.zeros_like(rho))


def _per_sequence_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1/|y_i| Σ_t x_it: the token mean of each response (empty responses count 0)."""
    return (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)


def _masked_stats(mask: torch.Tensor, rho: torch.Tensor, **fractions: torch.Tensor) -> LossStats:
    on = mask > 0
    n = int(on.sum())
    if n == 0:
        return LossStats()
    r = rho[on]
    return LossStats(
        rho_mean=float(r.mean()),
        rho_min=float(r.min()),
        rho_max=float(r.max()),
        tokens=n,
        **{k: float(v[on].float().mean()) for k, v in fractions.items()},
    )


def _icepop_ppo(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_infer: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    eps_low: float,
    eps_high: float,
) -> tuple[torch.Tensor, LossStats]:
    """Eq. 1's body for per-token advantages `adv` [B, T]: -mean_i 1/|y_i| Σ_t pop(ρ) · min(r Â, clip(r) Â)."""
    rho = torch.exp(logp_old - logp_infer).detach()
    weight = icepop_weight(rho, beta)
    ratio = torch.exp(logp - logp_old.detach())
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    loss = -_per_sequence_mean(weight * surrogate, mask).mean()
    return loss, _masked_stats(mask, rho, masked_fraction=weight == 0, clip_fraction=clipped < unclipped)


def grpo_icepop_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_infer: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 2.0,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, LossStats]:
    """Eq. 1, GRPO with IcePop and no KL term:

        L(θ) = -E[ 1/G Σ_i 1/|y_i| Σ_t pop(ρ_it, 1/β, β) · min(r_it Â_i, clip(r_it, 1-ε_low, 1+ε_high) Â_i) ]
        ρ_it = π_train_θold / π_infer_θold,  r_it = π_train_θ / π_train_θold

    logp: [B, T] under the policy being trained (carries the gradient); logp_old: the training engine's
    log-probs before the update; logp_infer: the rollout engine's; advantages: [B] (one per response).
    The expectation over groups and the 1/G average together are the mean over the B responses."""
    adv = advantages.detach().unsqueeze(1).expand_as(logp)
    return _icepop_ppo(logp, logp_old, logp_infer, adv, mask, beta, eps_low, eps_high)


def double_sided_is_loss(
    logp: torch.Tensor,
    logp_rollout: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, LossStats]:
    """Eq. 3-5, direct double-sided importance sampling (the rollout log-probs stand in for π_old):

        L(θ) = -E_t[ f(r_t) · Â_t · log π_θ(a_t|s_t) ],  r_t = exp(log π_θ - log π_rollout),
        f(x) = x if 1-ε_l < x < 1+ε_h else 0,  Â = r(x, y_i) - mean_k r(x, y_k)

    f(r_t) is an importance weight: detached, so the gradient is f(r_t) · Â_t · ∇log π_θ. Token mean over
    all valid tokens of the batch (E_t)."""
    ratio = torch.exp(logp - logp_rollout).detach()
    inside = (ratio > 1.0 - eps_low) & (ratio < 1.0 + eps_high)
    weight = torch.where(inside, ratio, torch.zeros_like(ratio))
    adv = advantages.detach().unsqueeze(1).expand_as(logp)
    per_token = weight * adv * logp
    loss = -(per_token * mask).sum() / mask.sum().clamp_min(1.0)
    return loss, _masked_stats(mask, ratio, masked_fraction=~inside)


def on_policy_distillation_advantages(logp_teacher: torch.Tensor, logp_student: torch.Tensor) -> torch.Tensor:
    """Eq. 2: Â_it = sg[log π_teacher(y_it) - log π_θ(y_it)], a per-token reverse-KL signal (group size 1)."""
    return (logp_teacher - logp_student).detach()


def on_policy_distillation_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_infer: torch.Tensor,
    logp_teacher: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 2.0,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, LossStats]:
    """Eq. 1 with the advantage replaced per token by Eq. 2 (on-policy cross-stage distillation)."""
    adv = on_policy_distillation_advantages(logp_teacher, logp_old)
    return _icepop_ppo(logp, logp_old, logp_infer, adv, mask, beta, eps_low, eps_high)


def exact_reverse_kl_distillation_loss(
    logp_all: torch.Tensor,
    logp_teacher_all: torch.Tensor,
    logp_old: torch.Tensor,
    logp_infer: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 2.0,
) -> tuple[torch.Tensor, LossStats]:
    """Eq. 2 in expectation: at each position of the student's own sample, the reverse KL over the whole
    vocabulary instead of its one-token estimate,

        L(θ) = E[ 1/|y_i| Σ_t pop(ρ_it, 1/β, β) · KL(π_θ(·|y_<t) || π_teacher(·|y_<t)) ]

    Its gradient at a position is E_{y~π_θ}[(log π_θ(y) - log π_teacher(y)) ∇log π_θ(y)], the expectation of
    Eq. 2's policy gradient there, without the noise of one sampled token (the report averages that noise
    away over a batch of 1024; a CPU batch of 16 cannot). IcePop masks positions as in Eq. 1.

    logp_all / logp_teacher_all: [B, T, V] log-softmax at each response position (gradient through
    `logp_all` only); logp_old / logp_infer: [B, T] of the sampled tokens (training / rollout engine)."""
    rho = torch.exp(logp_old - logp_infer).detach()
    weight = icepop_weight(rho, beta)
    kl = (logp_all.exp() * (logp_all - logp_teacher_all.detach())).sum(-1)
    loss = _per_sequence_mean(weight * kl, mask).mean()
    return loss, _masked_stats(mask, rho, masked_fraction=weight == 0)
