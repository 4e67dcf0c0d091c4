"""DSA attention for forward passes without a KV cache (evaluation): `native`'s result, without its costs.

`transformers`' `GlmMoeDsaAttention` (eager / SDPA) scatters the indexer's top-k into a dense [B, S, T] mask
and runs full attention under it; its indexer multiplies the queries with keys expanded per query (a
[B, S, D, T] copy) before ranking them. On CPU that is ~10x dense attention, mostly the indexer. Here:

- indexer: one GEMM per query chunk, keys cut where the chunk's mask ends; each row is padded back to T
  with the -inf native's mask puts there, so `topk` ranks the bit-identical row and picks the same set of
  keys, ties included (topk's tie-breaking depends on the whole row);
- queries that see at most index_topk keys (the first index_topk of a causal row; every query when
  T <= index_topk) keep every key they see: dense SDPA, no indexer;
- T > GATHER_MIN_KEYS_PER_TOPK x index_topk: attention over the selected keys only, in MLA's latent
  space: the compressed latents [c_kv, k_rope] (shared by all heads) are gathered per query, W_UK is
  absorbed into the query and W_UV applied after the weighted sum (DeepSeek-V3 §2.1.1): O(k) per query,
  not O(T); equal to native up to float rounding (the absorption reorders sums);
- shorter T: native's own SDPA under native's own mask (allowed & top-k), bit-identical to native: there
  the gather is no faster.

Like native, the top-k is discrete: a float-rounding difference upstream can swap a near-tied key, so on
long inputs the gather path's logits can move by as much as native's own move when its input changes by
one ulp (benchmarks/dsa_attention.py prints both). A query that may see no key (padding) gets zeros, as
from SDPA (eager attention averages all keys there). Memory is bounded by processing queries in chunks.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import (
    GlmMoeDsaAttention,
    GlmMoeDsaIndexer,
    apply_rotary_pos_emb_interleave,
)

# Largest per-chunk temporaries, in elements: gathered latents [B, C, k, kv_lora + rope] and indexer scores
# [B, C, H_I, T]. Measured on a 2-core CPU, tiny model, T = 1024, one thread: the gather is fastest at 2 MB
# (fp32) chunks (8 MB: 2x slower), the indexer is flat from 2 to 16 MB. The indexer takes the larger one:
# fewer, larger ops, as each op pays a thread wake-up when two threads share a busy box.
CHUNK_ELEMENTS = 1 << 19
INDEXER_CHUNK_ELEMENTS = 1 << 21

# Gather only when T > this x index_topk. Per selected key the gather costs ~3.5x what dense SDPA pays per
# key (latent width kv_lora + rope instead of the head dim, GEMMs only H rows tall); measured on the tiny
# model at T = 8k they tie. Below it, native's own masked SDPA is as fast and bit-identical to native.
GATHER_MIN_KEYS_PER_TOPK = 8


def gather_forward(
    attn: GlmMoeDsaAttention,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor,
    prev_topk_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None, torch.Tensor]:
    """`GlmMoeDsaAttention.forward` without a cache. Returns (output, None, topk_indices)."""
    batch_size, seq_len = hidden_states.shape[:-1]
    q_resid, q_pass, q_rot, latent, k_rot = _mla_projections(attn, hidden_states, position_embeddings)
    allowed = allowed_keys(attention_mask)  # [B, S, T]
    n_keys = allowed.shape[-1]
    topk = min(attn.config.index_topk, n_keys)
    # Leading queries that see no key past the first `topk` keep every key they see: their top-k, restricted
    # to the keys they may see, is all of them (the same set as native's). No indexer needed there.
    n_dense = _dense_prefix(allowed, topk)
    indices = torch.arange(topk, dtype=torch.int32, device=allowed.device).expand(batch_size, n_dense, topk)
    if n_dense == seq_len:
        out = _dense_attention(attn, q_pass, q_rot, latent, k_rot, allowed)
        return attn.o_proj(out.reshape(batch_size, seq_len, -1)), None, indices
    sparse = _layer_topk(
        attn, hidden_states, q_resid, position_embeddings, attention_mask, prev_topk_indices, n_dense
    )
    if n_keys <= GATHER_MIN_KEYS_PER_TOPK * topk:
        out = _dense_attention(attn, q_pass, q_rot, latent, k_rot, _topk_mask(allowed, sparse, n_dense))
    else:
        out = q_pass.new_empty(batch_size, seq_len, attn.num_heads, attn.v_head_dim)
        out[:, :n_dense] = _dense_attention(
            attn,
            q_pass[:, :, :n_dense],
            q_rot[:, :, :n_dense],
            latent[:, :topk],
            k_rot[:, :topk],
            allowed[:, :n_dense, :topk],
        )
        out[:, n_dense:] = gathered_attention(
            attn, q_pass[:, :, n_dense:], q_rot[:, :, n_dense:], latent, k_rot, sparse, allowed[:, n_dense:]
        )
    indices = torch.cat((indices, sparse), dim=1)
    return attn.o_proj(out.reshape(batch_size, seq_len, -1)), None, indices


def _topk_mask(allowed: torch.Tensor, sparse: torch.Tensor, n_dense: int) -> torch.Tensor:
    """native's attention mask: allowed keys within the top-k ([B, S, T]; every key for the dense prefix)."""
    selected = torch.zeros_like(allowed)
    selected[:, :n_dense] = True
    selected[:, n_dense:].scatter_(-1, sparse.long(), True)
    return allowed & selected


def _dense_prefix(allowed: torch.Tensor, topk: int) -> int:
    """How many leading queries see only keys < topk (all of them: T <= topk; causal: topk)."""
    late = (visible_key_ends(allowed) > topk).nonzero()
    return int(late[0]) if len(late) else allowed.shape[1]


def _layer_topk(attn, hidden_states, q_resid, position_embeddings, attention_mask, prev_topk_indices, first):
    """This layer's top-k for queries >= first: its own indexer's, or on a `shared` layer the previous one's."""
    if attn.indexer is not None:
        return indexer_topk(attn.indexer, hidden_states, q_resid, position_embeddings, attention_mask, first)
    if prev_topk_indices is None:
        raise ValueError("Shared DSA layers require top-k indices from a previous full indexer layer.")
    return prev_topk_indices[:, first:]


def _mla_projections(
    attn: GlmMoeDsaAttention,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, ...]:
    """q_resid [B,S,q_lora], q_pass [B,H,S,nope], q_rot [B,H,S,rope], latent c_kv [B,T,kv_lora], k_rot
    [B,T,rope]: the projections of `GlmMoeDsaAttention.forward`, before `expand_kv`."""
    batch_size, seq_len = hidden_states.shape[:-1]
    q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden_states))
    q_states = attn.q_b_proj(q_resid).view(batch_size, seq_len, -1, attn.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q_states, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
    kv_pass, k_rot = torch.split(
        attn.kv_a_proj_with_mqa(hidden_states), [attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1
    )
    latent = attn.kv_a_layernorm(kv_pass)
    k_rot = k_rot.view(batch_size, 1, seq_len, attn.qk_rope_head_dim)
    cos, sin = position_embeddings
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    return q_resid, q_pass, q_rot, latent, k_rot[:, 0]


def _dense_attention(attn, q_pass, q_rot, latent, k_rot, mask: torch.Tensor) -> torch.Tensor:
    """SDPA of the queries over the keys under a bool `mask` [B, S, T], as native calls it: [B, S, H, Dv]."""
    query = torch.cat((q_pass, q_rot), dim=-1)
    key, value = attn.expand_kv(latent.unsqueeze(1), k_rot.unsqueeze(1))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask[:, None], scale=attn.scaling)
    return out.transpose(1, 2)


def _query_chunk(batch_size: int, per_query: int, seq_len: int, budget: int | None = None) -> int:
    """Queries per chunk so that a chunk's temporary holds at most `budget` (`CHUNK_ELEMENTS`) elements."""
    return max(1, min(seq_len, (budget or CHUNK_ELEMENTS) // max(1, batch_size * per_query)))


# ---------------------------------------------------------------------------------------------- indexer


@torch.no_grad()
def indexer_topk(
    indexer: GlmMoeDsaIndexer,
    hidden_states: torch.Tensor,
    q_resid: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor,
    first_query: int = 0,
) -> torch.Tensor:
    """The int32 top-k key indices [B, S - first_query, k] of `GlmMoeDsaIndexer.forward` for the queries from
    `first_query` on: the same set per query (the order within it may differ; neither attention path uses it)."""
    q, k, weights = indexer_inputs(indexer, hidden_states, q_resid, position_embeddings)
    q, weights, mask = q[:, first_query:], weights[:, first_query:], attention_mask[:, 0, first_query:]
    batch_size, seq_len, n_keys = mask.shape[0], q.shape[1], k.shape[1]
    topk = min(indexer.index_topk, n_keys)
    out = torch.empty(batch_size, seq_len, topk, dtype=torch.int32, device=q.device)
    chunk = _query_chunk(batch_size, indexer.n_heads * n_keys, seq_len, INDEXER_CHUNK_ELEMENTS)
    buffer = q.new_full((batch_size, chunk, n_keys), float("-inf"))  # reused across chunks
    filled = 0  # columns of `buffer` written so far
    key_ends = visible_key_ends(mask) if mask.dtype == torch.bool else None
    for start in range(0, seq_len, chunk):
        stop = min(seq_len, start + chunk)
        end = int(key_ends[start:stop].max()) if key_ends is not None else n_keys
        scores = _indexer_scores(
            indexer, q[:, start:stop], k[:, :end], weights[:, start:stop], mask[:, start:stop]
        )
        rows, end = scores, scores.shape[-1]
        if end < n_keys:  # pad back to T with native's -inf, so topk ranks the bit-identical row
            rows = buffer[:, : stop - start]
            rows[..., :end] = scores
            rows[..., end:filled] = float("-inf")
            filled = max(filled, end)
        # sorted=False: the same nth_element picks the same set; sorted only reorders it (TopKImpl.h).
        out[:, start:stop] = rows.topk(topk, dim=-1, sorted=False).indices
    return out


def indexer_inputs(indexer, hidden_states, q_resid, position_embeddings):
    """Indexer queries [B,S,H,D] (float32), keys [B,T,D] (float32) and head weights [B,S,H], computed
    exactly as in `GlmMoeDsaIndexer.forward`."""
    q, k, weights = indexer_projections(indexer, hidden_states, q_resid, position_embeddings)
    return q, k.float(), weights


def indexer_projections(indexer, hidden_states, q_resid, position_embeddings):
    """`indexer_inputs` with the keys [B,S,D] left in the model's dtype, as `GlmMoeDsaIndexer.forward` puts
    them in its KV cache."""
    batch_size, seq_len, _ = hidden_states.shape
    cos, sin = position_embeddings
    rope = indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(batch_size, seq_len, indexer.n_heads, indexer.head_dim)
    q_rot, q_pass = torch.split(q, [rope, indexer.head_dim - rope], dim=-1)
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [rope, indexer.head_dim - rope], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1).float()
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    weights = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float()
    return q, k, weights * (indexer.n_heads**-0.5)


def cached_indexer_topk(
    indexer,
    hidden_states,
    q_resid,
    position_embeddings,
    attention_mask,
    *args,
    past_key_values=None,
    **kwargs,
) -> torch.Tensor:
    """`GlmMoeDsaIndexer.forward` (its arguments, its KV cache, its int32 [B, S, k] indices) with the scores
    of all queries and heads in one GEMM: native's broadcast matmul copies the keys once per query, which
    made the indexer's scores ~8% of an Agentic RL stage's time (prefills of long multi-turn prompts). The
    dot products are the same ones (`_indexer_scores`), so the selected key sets are native's."""
    q, k, weights = indexer_projections(indexer, hidden_states, q_resid, position_embeddings)
    if past_key_values is not None:
        k = past_key_values.update_indexer(k, indexer.layer_idx)
    scores = _indexer_scores(indexer, q, k.float(), weights, attention_mask)
    return scores.topk(min(indexer.index_topk, scores.shape[-1]), dim=-1).indices.to(torch.int32)


def _indexer_scores(indexer, q, k, weights, mask) -> torch.Tensor:
    """Masked indexer scores [B, C, T'] of one query chunk against the first T' keys, bit-identical to
    `native`'s; with a boolean mask native has -inf at every key past T' (the callers choose T' so)."""
    batch_size, n_queries, n_heads, head_dim = q.shape
    end = k.shape[1]
    # One GEMM for all heads: per element the same dot product as native's broadcast matmul.
    scores = torch.matmul(q.reshape(batch_size, n_queries * n_heads, head_dim), k.transpose(-1, -2))
    scores = scores.view(batch_size, n_queries, n_heads, end).mul_(indexer.softmax_scale).relu_()
    scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)  # [B, C, T']
    if mask.dtype != torch.bool:
        return scores + mask
    return scores.masked_fill_(~mask[..., :end], float("-inf"))


def visible_key_ends(mask: torch.Tensor) -> torch.Tensor:
    """Per query, 1 + the last key any batch row lets it see (0 if none), from a bool [B, S, T] mask: [S]."""
    seen = functools.reduce(torch.logical_or, mask.unbind(0))  # ~10x faster than mask.any(dim=0) on CPU
    positions = torch.arange(1, seen.shape[-1] + 1, dtype=torch.int32, device=seen.device)
    return (seen * positions).amax(dim=-1)


# ---------------------------------------------------------------------------------------------- attention


def gathered_attention(
    attn: GlmMoeDsaAttention,
    q_pass: torch.Tensor,
    q_rot: torch.Tensor,
    latent: torch.Tensor,
    k_rot: torch.Tensor,
    indices: torch.Tensor,
    allowed: torch.Tensor,
) -> torch.Tensor:
    """Softmax attention of each query over its `indices` [B, S, k] keys that `allowed` [B, S, T] permits
    (the keys `native` leaves unmasked), computed on gathered MLA latents: [B, S, H, Dv]."""
    batch_size, n_heads, seq_len, _ = q_pass.shape
    n_keys, rank = latent.shape[1], attn.kv_lora_rank
    w_uk, w_uv = _absorbed_weights(attn)
    # q_nope . (W_UK c) == (W_UK^T q_nope) . c: score queries against the latents directly.
    q_latent = torch.cat((torch.einsum("bhsd,hdr->bshr", q_pass, w_uk), q_rot.transpose(1, 2)), dim=-1)
    keys = torch.cat((latent, k_rot), dim=-1).reshape(batch_size * n_keys, -1)  # [B*T, rank + rope]
    offsets = torch.arange(batch_size, device=indices.device).view(-1, 1, 1) * n_keys
    out = q_pass.new_empty(batch_size, seq_len, n_heads, attn.v_head_dim)
    topk = indices.shape[-1]
    chunk = _query_chunk(batch_size, topk * keys.shape[-1], seq_len)
    for start in range(0, seq_len, chunk):
        stop = min(seq_len, start + chunk)
        idx = indices[:, start:stop].long()
        picked = keys.index_select(0, (idx + offsets).view(-1)).view(-1, topk, keys.shape[-1])
        valid = allowed[:, start:stop].gather(-1, idx).view(-1, 1, topk)
        probs = _masked_softmax(
            torch.bmm(q_latent[:, start:stop].reshape(-1, n_heads, keys.shape[-1]), picked.transpose(1, 2)),
            valid,
            attn.scaling,
        )
        latent_out = torch.bmm(probs, picked[..., :rank])  # [B*C, H, rank]
        out[:, start:stop] = torch.einsum("nhr,hvr->nhv", latent_out, w_uv).view(
            batch_size, -1, n_heads, attn.v_head_dim
        )
    return out


def _absorbed_weights(attn: GlmMoeDsaAttention) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj split per head: W_UK [H, nope, rank] and W_UV [H, Dv, rank]."""
    weight = attn.kv_b_proj.weight.view(attn.num_heads, attn.qk_nope_head_dim + attn.v_head_dim, -1)
    return weight[:, : attn.qk_nope_head_dim], weight[:, attn.qk_nope_head_dim :]


def _masked_softmax(logits: torch.Tensor, valid: torch.Tensor, scaling: float) -> torch.Tensor:
    """Softmax over the valid keys (float32, like SDPA's accumulation); a row with none gives zeros, as
    SDPA gives for a fully masked query (e.g. a padding position)."""
    logits = (logits * scaling).masked_fill(~valid, float("-inf"))
    # Out of place: softmax's backward reads its own output.
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32).nan_to_num(0.0)
    return probs.to(logits.dtype)


def allowed_keys(attention_mask: torch.Tensor) -> torch.Tensor:
    """The keys each query may see, bool [B, S, T], from a bool or additive [B, 1, S, T] mask."""
    mask = attention_mask[:, 0]
    if mask.dtype == torch.bool:
        return mask
    return mask > torch.finfo(mask.dtype).min / 2
