"""The GLM-5 architecture at any size: `ModelConfig` -> `transformers.GlmMoeDsaConfig` -> `GlmMoeDsaForCausalLM`.

MLA attention, the DSA lightning indexer (top-k sparse attention), MoE with a shared expert, dense first
layers and RoPE all come from `transformers`; this module only chooses the sizes. The defaults are the `tiny`
profile (a few million parameters); `MODEL_SIZES` holds the `micro` (tests, seconds) and `cluster` presets.
Setting every field to the `transformers` defaults gives the real GLM-5 (744B).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

log = logging.getLogger(__name__)


class ModelConfig(BaseModel):
    """Sizes of a GLM-5 (glm_moe_dsa) model; defaults are the `tiny` profile."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(8192, gt=0, description="Vocabulary size; must match the tokenizer")
    hidden_size: int = Field(192, gt=0, description="Residual stream width")
    num_hidden_layers: int = Field(4, gt=0, description="Decoder layers")
    first_k_dense_replace: int = Field(
        1, ge=0, description="Leading layers with a dense MLP (the rest are MoE)"
    )
    intermediate_size: int = Field(384, gt=0, description="Hidden size of the dense MLP layers")
    num_attention_heads: int = Field(4, gt=0, description="Attention heads (MLA)")
    q_lora_rank: int = Field(96, gt=0, description="MLA query low-rank dimension")
    kv_lora_rank: int = Field(96, gt=0, description="MLA compressed key/value latent dimension")
    qk_nope_head_dim: int = Field(16, gt=0, description="Per-head query/key dimension without RoPE")
    qk_rope_head_dim: int = Field(16, gt=0, description="Per-head query/key dimension with RoPE (even)")
    v_head_dim: int = Field(32, gt=0, description="Per-head value dimension")
    n_routed_experts: int = Field(8, gt=0, description="Routed experts per MoE layer")
    num_experts_per_tok: int = Field(2, gt=0, description="Routed experts each token uses (top-k routing)")
    n_shared_experts: int = Field(1, ge=0, description="Shared experts every token uses")
    moe_intermediate_size: int = Field(96, gt=0, description="Hidden size of each expert")
    routed_scaling_factor: float = Field(1.0, gt=0, description="Scale of the routed experts' output")
    n_group: int = Field(1, gt=0, description="Expert groups for group-limited routing")
    topk_group: int = Field(1, gt=0, description="Groups each token may route into")
    index_topk: int = Field(128, gt=0, description="DSA: tokens each query attends to (top-k of the indexer)")
    index_n_heads: int = Field(4, gt=0, description="DSA indexer heads")
    index_head_dim: int = Field(32, gt=0, description="DSA indexer head dimension (>= qk_rope_head_dim)")
    max_position_embeddings: int = Field(4096, gt=0, description="Longest context the RoPE is set up for")
    rope_theta: float = Field(10000.0, gt=0, description="RoPE base (raised by ABF context extension)")
    rope_scaling: dict[str, Any] | None = Field(
        None, description="Extra RoPE parameters, e.g. {'rope_type': 'yarn', 'factor': 4.0, ...}"
    )
    tie_word_embeddings: bool = Field(False, description="Share the input embedding with the LM head")
    initializer_range: float = Field(0.02, gt=0, description="Std of the normal weight init")
    rms_norm_eps: float = Field(1e-5, gt=0, description="RMSNorm epsilon")
    bos_token_id: int | None = Field(0, description="Beginning-of-sequence token id")
    eos_token_id: int | None = Field(1, description="End-of-sequence token id")
    pad_token_id: int | None = Field(None, description="Padding token id")
    experts_implementation: Literal["grouped_mm", "eager"] = Field(
        "grouped_mm", description="How transformers runs the experts (grouped_mm is fastest on CPU)"
    )

    @classmethod
    def for_size(cls, size: str, **overrides: Any) -> ModelConfig:
        """The preset `size` (micro / tiny / cluster) with `overrides` applied."""
        if size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {size!r}; choose one of {sorted(MODEL_SIZES)}")
        return cls.model_validate({**MODEL_SIZES[size], **overrides})


# Presets; `tiny` is the field defaults. The profile YAMLs repeat micro/cluster (a test keeps them in sync).
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "micro": {
        "vocab_size": 512,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "index_topk": 16,
        "index_n_heads": 2,
        "index_head_dim": 16,
        "max_position_embeddings": 1024,
    },
    "tiny": {},
    # ~1.3B total / ~0.3B active with a 64K vocab; the transformers defaults are the real GLM-5 (744B).
    "cluster": {
        "vocab_size": 65536,
        "hidden_size": 1536,
        "num_hidden_layers": 16,
        "first_k_dense_replace": 2,
        "intermediate_size": 6144,
        "num_attention_heads": 16,
        "q_lora_rank": 768,
        "kv_lora_rank": 256,
        "qk_nope_head_dim": 96,
        "qk_rope_head_dim": 32,
        "v_head_dim": 96,
        "n_routed_experts": 32,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 512,
        "routed_scaling_factor": 2.5,
        "index_topk": 2048,
        "index_n_heads": 16,
        "index_head_dim": 64,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
    },
}


def hf_config(cfg: ModelConfig) -> GlmMoeDsaConfig:
    """The `transformers` config for `cfg` (model_type `glm_moe_dsa`)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})}
    return GlmMoeDsaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        first_k_dense_replace=cfg.first_k_dense_replace,
        intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_attention_heads,
        q_lora_rank=cfg.q_lora_rank,
        kv_lora_rank=cfg.kv_lora_rank,
        qk_nope_head_dim=cfg.qk_nope_head_dim,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        v_head_dim=cfg.v_head_dim,
        n_routed_experts=cfg.n_routed_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        n_shared_experts=cfg.n_shared_experts,
        moe_intermediate_size=cfg.moe_intermediate_size,
        routed_scaling_factor=cfg.routed_scaling_factor,
        n_group=cfg.n_group,
        topk_group=cfg.topk_group,
        index_topk=cfg.index_topk,
        index_n_heads=cfg.index_n_heads,
        index_head_dim=cfg.index_head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters=rope,
        tie_word_embeddings=cfg.tie_word_embeddings,
        initializer_range=cfg.initializer_range,
        rms_norm_eps=cfg.rms_norm_eps,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
        use_cache=False,
        experts_implementation=cfg.experts_implementation,
    )


def with_checkpoint_rope(cfg: ModelConfig, path: str | Path) -> ModelConfig:
    """`cfg` with the RoPE a saved checkpoint was trained with (rope_theta, rope_scaling, context length):
    a stage that continues a context-extended checkpoint must keep its RoPE, or it silently trains the
    extended model under the short-context positions (the inverse of `hf_config`'s rope_parameters)."""
    saved = GlmMoeDsaConfig.from_pretrained(str(path))
    rope = dict(saved.rope_parameters or {})
    theta = rope.pop("rope_theta", None) or cfg.rope_theta
    scaling = None if rope.get("rope_type", "default") == "default" and set(rope) <= {"rope_type"} else rope
    return cfg.model_copy(
        update={
            "rope_theta": float(theta),
            "rope_scaling": scaling,
            "max_position_embeddings": saved.max_position_embeddings,
        }
    )


def build_model(cfg: ModelConfig, seed: int = 0) -> GlmMoeDsaForCausalLM:
    """A freshly initialised GLM-5 model (fp32, train mode); same seed, same weights."""
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream untouched
        torch.manual_seed(seed)
        model = GlmMoeDsaForCausalLM(hf_config(cfg))
    model.train()
    return model


def load_model(path: str | Path, cfg: ModelConfig | None = None) -> GlmMoeDsaForCausalLM:
    """A GLM-5 model from an HF model dir (fp32, train mode). `cfg` overrides the saved config (same
    shapes; e.g. a larger RoPE base or YaRN for context extension)."""
    kwargs = {"config": hf_config(cfg)} if cfg is not None else {}
    model = GlmMoeDsaForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kwargs)
    model.train()
    return model


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """Total, per-token active (routed experts counted top-k/E), embedding and indexer parameter counts."""
    cfg = model.config
    total = embedding = indexer = routed = 0
    for name, p in model.named_parameters():
        n = p.numel()
        total += n
        if "embed_tokens" in name or name.startswith("lm_head"):
            embedding += n
        if ".indexer." in name:
            indexer += n
        if ".mlp.experts." in name:
            routed += n
    active = total - routed + routed * cfg.num_experts_per_tok // cfg.n_routed_experts
    return {"total": total, "active": active, "embedding": embedding, "indexer": indexer}
