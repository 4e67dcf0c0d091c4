"""Training the DSA lightning indexer (RECIPE.md "Model"; DeepSeek-V3.2 §2.1, GLM-5 §2.1.1).

`transformers` runs the indexer under `no_grad` and only returns top-k indices, so the LM loss never reaches
it. Here each attention module of the model is switched (class swap, same parameters and state dict) to
`IndexerTrainingAttention`, which also computes

    L_I = Σ_t KL(p_t || softmax(I_t))                                              (RECIPE.md, eq. L_I)

with p_t the main attention distribution of query t (summed over heads, L1-normalised, detached) and I_t the
indexer scores computed from detached inputs, so L_I trains the indexer only and the LM loss trains the rest.
We average over queries and layers instead of summing (a constant factor, absorbed by the learning rate).

Modes (`set_dsa_mode`):
- `native`: the unmodified `transformers` forward (eval / generation / export parity).
- `dense`: dense causal attention, indexer unused (pre-training from scratch before DSA adaptation).
- `indexer_warmup`: stage 1, dense attention; L_I over all causal keys (freeze everything else).
- `sparse`: stage 2, attention over the indexer's top-k set S_t; L_I restricted to S_t.
- `sparse_gather`: `native`'s result for forward passes without a KV cache (`training.dsa_gather`: a
  GEMM indexer, and attention over each query's gathered top-k keys for long inputs); on CPU ~1.3-1.5x
  dense instead of ~5-7x for a full forward. For evaluation; no indexer loss, no stats; with a KV cache
  (generation) it runs `native`.

Stats per forward (`collect_dsa_stats`): the indexer loss and `topk_mass`, the share of the dense main
attention mass inside the indexer's top-k, over queries that see more than `index_topk` keys, and
`topk_mass_oracle`, the share the best possible top-k would hold (the ceiling the indexer can reach).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (
    GlmMoeDsaAttention,
    GlmMoeDsaIndexer,
    apply_rotary_pos_emb_interleave,
)

from training.dsa_gather import allowed_keys as _allowed_keys
from training.dsa_gather import gather_forward, indexer_inputs

DsaMode = Literal["native", "dense", "indexer_warmup", "sparse", "sparse_gather"]
DSA_MODES: tuple[str, ...] = ("native", "dense", "indexer_warmup", "sparse", "sparse_gather")


def indexer_scores(
    indexer: GlmMoeDsaIndexer,
    hidden_states: torch.Tensor,
    q_resid: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Unmasked indexer scores I [B, S, T] (float32), the math of `GlmMoeDsaIndexer.forward` with gradients."""
    q, k, weights = indexer_inputs(indexer, hidden_states, q_resid, position_embeddings)
    batch_size, seq_len, n_heads, head_dim = q.shape
    # One GEMM over all queries and heads; a broadcast matmul would copy the keys once per query.
    scores = torch.matmul(q.reshape(batch_size, seq_len * n_heads, head_dim), k.transpose(-1, -2))
    scores = F.relu(scores.view(batch_size, seq_len, n_heads, -1) * indexer.softmax_scale)
    return torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)


def indexer_kl_loss(p: torch.Tensor, scores: torch.Tensor, attend: torch.Tensor) -> torch.Tensor:
    """Per-query KL(p_t || softmax(I_t)) over the keys each query attends to (eq. L_I); [B, S].

    p: main attention distribution [B, S, T] (rows sum to 1 over `attend`), scores: indexer scores [B, S, T],
    attend: bool [B, S, T], the causal set (stage 1) or the selected top-k set S_t (stage 2).
    """
    with torch.autocast(scores.device.type, enabled=False):  # bf16 sums would make the KL slightly negative
        p = p.float()
        log_q = torch.log_softmax(scores.float().masked_fill(~attend, float("-inf")), dim=-1)
        log_q = log_q.masked_fill(~attend, 0.0)
        return (torch.xlogy(p, p) - p * log_q).sum(-1)


def mean_head_attention(
    query: torch.Tensor, key: torch.Tensor, scaling: float, attend: torch.Tensor
) -> torch.Tensor:
    """The main attention distribution summed over heads and L1-normalised: [B, S, T] float32, no grad."""
    with torch.no_grad(), torch.autocast(query.device.type, enabled=False):
        logits = torch.matmul(query.float(), key.float().transpose(2, 3)) * scaling
        probs = torch.softmax(logits.masked_fill(~attend[:, None], float("-inf")), dim=-1)
        return probs.mean(dim=1)


class IndexerTrainingAttention(GlmMoeDsaAttention):
    """`GlmMoeDsaAttention` plus the indexer's training loss; same parameters, `native` mode = unchanged."""

    dsa_mode: str = "native"
    dsa_stats: dict[str, torch.Tensor] | None = None

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor,
        past_key_values=None,
        position_ids: torch.Tensor | None = None,
        prev_topk_indices: torch.Tensor | None = None,
        **kwargs,
    ):
        if self.dsa_mode == "native" or past_key_values is not None:
            return super().forward(
                hidden_states,
                position_embeddings,
                attention_mask,
                past_key_values=past_key_values,
                position_ids=position_ids,
                prev_topk_indices=prev_topk_indices,
                **kwargs,
            )
        if self.dsa_mode == "sparse_gather":
            return gather_forward(self, hidden_states, position_embeddings, attention_mask, prev_topk_indices)
        batch_size, seq_length = hidden_states.shape[:-1]
        # MLA projections, as in GlmMoeDsaAttention.forward (no cache while training).
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
        q_states = self.q_b_proj(q_resid).view(batch_size, seq_length, -1, self.qk_head_dim).transpose(1, 2)
        q_pass, q_rot = torch.split(q_states, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        kv_pass, k_rot = torch.split(
            self.kv_a_proj_with_mqa(hidden_states), [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1
        )
        k_pass = self.kv_a_layernorm(kv_pass).view(batch_size, 1, seq_length, self.kv_lora_rank)
        k_rot = k_rot.view(batch_size, 1, seq_length, self.qk_rope_head_dim)
        cos, sin = position_embeddings
        q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
        query_states = torch.cat((q_pass, q_rot), dim=-1)
        key_states, value_states = self.expand_kv(k_pass, k_rot)

        allowed = _allowed_keys(attention_mask)  # [B, S, T] causal (and padding) mask
        attend, topk_indices, scores = allowed, None, None
        if self.dsa_mode != "dense":
            if self.indexer is not None:
                # Detached inputs: L_I trains the indexer only, the LM loss never sees the indexer.
                scores = indexer_scores(
                    self.indexer, hidden_states.detach(), q_resid.detach(), position_embeddings
                )
                topk = min(self.indexer.index_topk, scores.shape[-1])
                masked = scores.detach().masked_fill(~allowed, float("-inf"))
                topk_indices = masked.topk(topk, dim=-1).indices.to(torch.int32)
            else:
                topk_indices = prev_topk_indices
            if self.dsa_mode == "sparse" and topk_indices is not None:
                selected = torch.zeros_like(allowed).scatter(-1, topk_indices.long(), True)
                attend = allowed & selected

        attn_output = F.scaled_dot_product_attention(
            query_states, key_states, value_states, attn_mask=attend[:, None], scale=self.scaling
        )
        if scores is not None:
            self.dsa_stats = self._indexer_stats(
                query_states, key_states, allowed, attend, scores, topk_indices
            )
        attn_output = self.o_proj(attn_output.transpose(1, 2).reshape(batch_size, seq_length, -1))
        return attn_output, None, topk_indices

    def _indexer_stats(self, query, key, allowed, attend, scores, topk_indices) -> dict[str, torch.Tensor]:
        dense_p = mean_head_attention(query, key, self.scaling, allowed)
        if self.dsa_mode == "sparse":  # p_t of the sparse main attention = dense p_t renormalised on S_t
            p = dense_p * attend
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
        else:
            p = dense_p
        loss = indexer_kl_loss(p, scores, attend).mean()
        with torch.no_grad():
            selected = torch.zeros_like(allowed).scatter(-1, topk_indices.long(), True) & allowed
            mass = (dense_p * selected).sum(-1)  # [B, S]
            long_query = allowed.sum(-1) > topk_indices.shape[-1]
            mass_sum = (mass * long_query).sum()
            best = dense_p.topk(topk_indices.shape[-1], dim=-1).values.sum(-1)  # the best any top-k could do
            oracle_sum = (best * long_query).sum()
            n_long = long_query.sum()
        return {
            "indexer_loss": loss,
            "topk_mass_sum": mass_sum,
            "oracle_mass_sum": oracle_sum,
            "long_queries": n_long,
        }


def set_dsa_mode(model: nn.Module, mode: str) -> None:
    """Switch every attention module of `model` to `mode` (see the module docstring)."""
    if mode not in DSA_MODES:
        raise ValueError(f"unknown DSA mode {mode!r}; choose one of {DSA_MODES}")
    for module in model.modules():
        if isinstance(module, GlmMoeDsaAttention):
            if not isinstance(module, IndexerTrainingAttention):
                module.__class__ = IndexerTrainingAttention
            module.dsa_mode = mode
            module.dsa_stats = None


def current_dsa_mode(model: nn.Module) -> str:
    """The DSA mode of `model`'s attention modules (`native` until `set_dsa_mode` switched them)."""
    for module in model.modules():
        if isinstance(module, GlmMoeDsaAttention):
            return getattr(module, "dsa_mode", "native")
    return "native"


def collect_dsa_stats(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Pop the last forward's indexer stats: mean `indexer_loss` (with grad) over layers; `topk_mass_sum`,
    `oracle_mass_sum` (the mass of the best possible top-k) and `long_queries` summed over layers
    (topk_mass = topk_mass_sum / long_queries). None when no layer computed them."""
    losses, mass, oracle, count = [], 0.0, 0.0, 0
    for module in model.modules():
        stats = getattr(module, "dsa_stats", None)
        if isinstance(module, IndexerTrainingAttention) and stats is not None:
            losses.append(stats["indexer_loss"])
            mass = mass + stats["topk_mass_sum"]
            oracle = oracle + stats["oracle_mass_sum"]
            count = count + stats["long_queries"]
            module.dsa_stats = None
    if not losses:
        return None
    return {
        "indexer_loss": torch.stack(losses).mean(),
        "topk_mass_sum": mass,
        "oracle_mass_sum": oracle,
        "long_queries": count,
    }


def is_indexer_parameter(name: str) -> bool:
    """True for the DSA indexer's own parameters (wq_b, wk, k_norm, weights_proj)."""
    return ".indexer." in name


def freeze_all_but_indexer(model: nn.Module) -> int:
    """Stage 1: only the indexer trains. Returns the number of trainable parameters left."""
    trainable = 0
    for name, p in model.named_parameters():
        p.requires_grad_(is_indexer_parameter(name))
        trainable += p.numel() if p.requires_grad else 0
    return trainable
