"""MoE load balancing: the sequence-wise auxiliary loss and the aux-loss-free router bias (DeepSeek-V3 §2.1.2).

`transformers`' GLM-5 router scores experts with a sigmoid plus a correction bias (`e_score_correction_bias`)
and returns no balance loss. `RouterTaps` records each router's logits and choices during a forward, from
which the trainer adds

    L_bal = α Σ_i f_i P_i,  f_i = E / (K T) Σ_t 1[i ∈ top-k(t)],  P_i = 1/T Σ_t s_{i,t} / Σ_j s_{j,t}

per sequence (T tokens, E experts, K per token), and nudges the bias of over-loaded experts down and of
under-loaded ones up by `rate` after each optimizer step (the aux-loss-free strategy).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaTopkRouter


def sequence_balance_loss(
    router_logits: torch.Tensor, topk_indices: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """L_bal / α for one MoE layer, averaged over the `batch_size` sequences of the flattened tokens."""
    n_experts = router_logits.shape[-1]
    k = topk_indices.shape[-1]
    scores = router_logits.float().sigmoid().view(batch_size, -1, n_experts)
    p = (scores / scores.sum(-1, keepdim=True)).mean(1)  # [B, E]
    chosen = torch.zeros_like(scores).scatter_(-1, topk_indices.view(batch_size, -1, k), 1.0)
    f = chosen.mean(1) * n_experts / k  # [B, E], 1.0 everywhere when perfectly balanced
    return (f * p).sum(-1).mean()


class RouterTaps:
    """Forward hooks on every MoE router; `pop()` returns [(router, logits, topk_indices)] of the last forward."""

    def __init__(self, model: nn.Module):
        self.records: list[tuple[GlmMoeDsaTopkRouter, torch.Tensor, torch.Tensor]] = []
        self.routers = [m for m in model.modules() if isinstance(m, GlmMoeDsaTopkRouter)]
        self.handles = [r.register_forward_hook(self._record) for r in self.routers]

    def _record(self, module, args, output) -> None:
        router_logits, _, topk_indices = output
        self.records.append((module, router_logits, topk_indices))

    def pop(self) -> list[tuple[GlmMoeDsaTopkRouter, torch.Tensor, torch.Tensor]]:
        records, self.records = self.records, []
        return records

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def expert_loads(records, loads: dict[GlmMoeDsaTopkRouter, torch.Tensor] | None = None):
    """Add each router's per-expert token counts of `records` into `loads` (router -> [E] float64)."""
    loads = {} if loads is None else loads
    for router, _, topk_indices in records:
        counts = torch.bincount(topk_indices.flatten(), minlength=router.num_experts).double()
        loads[router] = loads.get(router, torch.zeros_like(counts)) + counts
    return loads


@torch.no_grad()
def update_router_bias(loads: dict[GlmMoeDsaTopkRouter, torch.Tensor], rate: float) -> float:
    """Aux-loss-free balancing: bias += rate * sign(mean load - load). Returns the mean max/mean load ratio."""
    ratios = []
    for router, load in loads.items():
        mean = load.mean()
        if rate > 0:
            router.e_score_correction_bias.add_(rate * torch.sign(mean - load).float())
        ratios.append(float(load.max() / mean.clamp_min(1e-9)))
    return sum(ratios) / max(len(ratios), 1)
