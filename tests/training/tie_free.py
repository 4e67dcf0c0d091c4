"""A tiny GLM-5 (DSA) model whose indexer never ties, for tests that compare two layouts of the same tokens."""

from __future__ import annotations

import torch
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM


def tie_free_glm(seed=2):
    """A tiny DSA model whose indexer never ties: 8 indexer heads with positive weights, so a key scores 0
    (relu) only if all 8 heads miss it (topk breaks ties by the whole row, which packing lengthens), and
    weights x6 so attention is peaked and the scores depend on positions and masks (a packing bug moves
    them by 0.03-0.6 here)."""
    torch.manual_seed(seed)
    config = GlmMoeDsaConfig(
        vocab_size=400, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
        num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=8, index_topk=32, index_head_dim=16, index_n_heads=8, first_k_dense_replace=1,
        max_position_embeddings=512, use_cache=False,
    )  # fmt: skip
    model = GlmMoeDsaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name and param.dim() > 1:
                param.mul_(6.0)
            if "weights_proj" in name:
                param.abs_()
    return model
