"""`sparse_gather` (training.dsa_gather) against transformers' `native` DSA attention on a random micro model."""

from __future__ import annotations

import pytest
import torch
from transformers import GlmMoeDsaForCausalLM

import training.dsa_gather as dsa_gather
from training.dsa_gather import gather_forward, indexer_topk
from training.dsa_indexer import indexer_scores, set_dsa_mode
from training.model import ModelConfig, build_model, hf_config

# Max |logit difference| sparse_gather vs native. Measured <= 2.4e-7 (micro, logits up to ~0.8, seeds 0-5);
# dense attention differs from native by ~0.2 here, so a wrong key set is ~4 orders of magnitude above it.
TOL = 5e-6
SEQ = 96  # > index_topk = 16 of micro: most queries keep 16 of up to 96 keys


@pytest.fixture()
def micro_model() -> GlmMoeDsaForCausalLM:
    return build_model(ModelConfig.for_size("micro"), seed=0).eval()


@pytest.fixture(params=["gather", "masked"])
def attention_path(request, monkeypatch) -> str:
    """Force one of sparse_gather's two attention paths (by length it would pick `masked` at T <= 8 k)."""
    monkeypatch.setattr(dsa_gather, "GATHER_MIN_KEYS_PER_TOPK", 0 if request.param == "gather" else 10**9)
    return request.param


def batch(seq_len: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows: left-padded, right-padded, unpadded."""
    ids = torch.randint(2, 512, (3, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, seq_len, dtype=torch.long)
    mask[0, :20] = 0
    mask[1, seq_len - 26 :] = 0
    return ids, mask


@torch.no_grad()
def logits(model, mode: str, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    set_dsa_mode(model, mode)
    return model(input_ids=ids, attention_mask=mask, use_cache=False).logits


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def test_sparse_gather_logits_equal_native_on_long_and_padded_batches(micro_model, attention_path):
    ids, mask = batch()
    for attention_mask in (None, mask):
        native = logits(micro_model, "native", ids, attention_mask)
        gathered = logits(micro_model, "sparse_gather", ids, attention_mask)
        dense = logits(micro_model, "dense", ids, attention_mask)
        assert max_diff(gathered, native) <= TOL
        if attention_path == "masked":  # native's own SDPA under native's own mask
            assert torch.equal(gathered, native)
        assert max_diff(dense, native) > 1000 * TOL  # the top-k selection matters at this length
    short = ids[:, :16]  # T <= index_topk: every key is selected; native's own SDPA call, bit for bit
    native_short = logits(micro_model, "native", short, None)
    assert torch.equal(logits(micro_model, "sparse_gather", short, None), native_short)


def test_wrong_keys_break_the_parity(micro_model, monkeypatch, attention_path):
    """The parity test above fails when the gather uses other keys: here each query's keys shifted by one."""
    ids, mask = batch()
    native = logits(micro_model, "native", ids, mask)
    right_topk = dsa_gather.indexer_topk
    monkeypatch.setattr(dsa_gather, "indexer_topk", lambda *a: (right_topk(*a) - 1).clamp_min(0))
    assert max_diff(logits(micro_model, "sparse_gather", ids, mask), native) > 1000 * TOL


def layer_calls(model, ids, mask) -> list[tuple]:
    """(attention module, its call kwargs, its native output) per layer, from a native forward."""
    calls = []
    hooks = [
        layer.self_attn.register_forward_hook(
            lambda m, a, kw, out: calls.append((m, kw, out)), with_kwargs=True
        )
        for layer in model.model.layers
    ]
    logits(model, "native", ids, mask)
    for hook in hooks:
        hook.remove()
    return calls


@torch.no_grad()
def test_each_layer_selects_natives_key_sets_and_matches_its_output(micro_model, attention_path):
    ids, mask = batch()
    ties = 0
    for attn, kw, (native_out, _, native_topk) in layer_calls(micro_model, ids, mask):
        hidden, rope, attention_mask = kw["hidden_states"], kw["position_embeddings"], kw["attention_mask"]
        q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden))
        ours = indexer_topk(attn.indexer, hidden, q_resid, rope, attention_mask)
        # Same key set per query, exactly (order within the set is free).
        assert torch.equal(ours.sort(-1).values, native_topk.sort(-1).values)
        out, _, _ = gather_forward(attn, hidden, rope, attention_mask)
        assert max_diff(out, native_out) <= 1e-6
        # Rows whose k-th and (k+1)-th indexer scores tie (exact zeros after the ReLU): the set depends on
        # topk's tie-breaking, which sees the bit-identical row only if the scores are computed identically.
        scores = indexer_scores(attn.indexer, hidden, q_resid, rope)
        top = scores.masked_fill(~attention_mask[:, 0], float("-inf")).topk(17, dim=-1).values
        ties += int(((top[..., 15] == top[..., 16]) & top[..., 16].isfinite()).sum())
    assert ties > 0  # the comparison above covered tie-breaking


def test_shared_indexer_layer_reuses_the_previous_layers_keys(attention_path):
    config = hf_config(ModelConfig.for_size("micro"))
    config.indexer_types = ["full", "shared"]  # layer 1 reuses layer 0's top-k
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GlmMoeDsaForCausalLM(config).eval()
    assert model.model.layers[1].self_attn.indexer is None
    ids, mask = batch()
    assert max_diff(logits(model, "sparse_gather", ids, mask), logits(model, "native", ids, mask)) <= TOL


def test_eager_attention_additive_masks_match_native_on_real_tokens(attention_path):
    config = hf_config(ModelConfig.for_size("micro"))
    config._attn_implementation = "eager"  # float additive masks instead of SDPA's boolean ones
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GlmMoeDsaForCausalLM(config).eval()
    ids, mask = batch()
    diff = (logits(model, "sparse_gather", ids, mask) - logits(model, "native", ids, mask)).abs().amax(-1)
    # Padding queries see no key: SDPA (and sparse_gather) give zeros there, eager a uniform average.
    assert float(diff[mask.bool()].max()) <= TOL


def test_generation_with_a_kv_cache_runs_native(micro_model):
    prompt = torch.randint(2, 512, (1, 40), generator=torch.Generator().manual_seed(1))
    out = {}
    for mode in ("native", "sparse_gather"):
        set_dsa_mode(micro_model, mode)
        out[mode] = micro_model.generate(prompt, max_new_tokens=6, do_sample=False, use_cache=True)
    assert torch.equal(out["sparse_gather"], out["native"])


def test_chunking_does_not_change_the_result(micro_model, monkeypatch, attention_path):
    ids, mask = batch()
    whole = logits(micro_model, "sparse_gather", ids, mask)
    monkeypatch.setattr(dsa_gather, "CHUNK_ELEMENTS", 1)  # one query per chunk
    monkeypatch.setattr(dsa_gather, "INDEXER_CHUNK_ELEMENTS", 1)
    assert max_diff(logits(micro_model, "sparse_gather", ids, mask), whole) <= 1e-6


def test_gradients_through_sparse_gather_match_native(micro_model, attention_path):
    """Training runs backward through sparse_gather (SFT, the RL policy's forward): its gradients are
    native's. Rows with no visible key (left padding) must not break autograd either."""
    ids, mask = batch()
    grads = {}
    for mode in ("native", "sparse_gather"):
        micro_model.zero_grad(set_to_none=True)
        set_dsa_mode(micro_model, mode)
        out = micro_model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        out.float().logsumexp(-1).mul(mask).sum().backward()
        grads[mode] = {n: p.grad.clone() for n, p in micro_model.named_parameters() if p.grad is not None}
    assert grads["native"].keys() == grads["sparse_gather"].keys()
    worst = max(max_diff(grads["native"][n], grads["sparse_gather"][n]) for n in grads["native"])
    scale = max(float(g.abs().max()) for g in grads["native"].values())
    assert worst <= 1e-4 * scale


def test_training_indexer_scores_equal_the_broadcast_formula_with_gradients(micro_model):
    """The indexer's training scores come from one GEMM over queries x heads; the reference is the
    per-query broadcast matmul of `GlmMoeDsaIndexer.forward`, values and gradients."""
    ids, mask = batch()
    attn, kw, _ = layer_calls(micro_model, ids, mask)[0]
    hidden = kw["hidden_states"].detach().requires_grad_(True)
    rope = kw["position_embeddings"]
    q_resid = attn.q_a_layernorm(attn.q_a_proj(hidden))
    ours = indexer_scores(attn.indexer, hidden, q_resid, rope)
    q, k, weights = dsa_gather.indexer_inputs(attn.indexer, hidden, q_resid, rope)
    ref = torch.relu(torch.matmul(q, k.transpose(-1, -2).unsqueeze(1)) * attn.indexer.softmax_scale)
    ref = torch.matmul(weights.unsqueeze(-2), ref).squeeze(-2)
    assert ours.shape == (3, SEQ, SEQ) and max_diff(ours, ref) <= 1e-5
    probe = torch.randn_like(ref)
    (g_ours,) = torch.autograd.grad((ours * probe).sum(), hidden, retain_graph=True)
    (g_ref,) = torch.autograd.grad((ref * probe).sum(), hidden)
    assert g_ours.abs().sum() > 0 and max_diff(g_ours, g_ref) <= 1e-5
