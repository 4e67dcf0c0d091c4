"""GLM-5 model configs, the DSA indexer's training forward, MoE balance and the HF export."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, GlmMoeDsaForCausalLM

from infra.settings import load_profile, validate_stage
from training.checkpoint import export_hf
from training.dsa_indexer import (
    collect_dsa_stats,
    current_dsa_mode,
    freeze_all_but_indexer,
    indexer_kl_loss,
    is_indexer_parameter,
    set_dsa_mode,
)
from training.evals import indexer_topk_mass
from training.model import MODEL_SIZES, ModelConfig, build_model, hf_config, parameter_counts
from training.moe_balance import RouterTaps, sequence_balance_loss, update_router_bias
from training.pretrain import PretrainConfig


@pytest.fixture()
def micro_model() -> GlmMoeDsaForCausalLM:
    return build_model(ModelConfig.for_size("micro"), seed=0)


def test_sizes_have_the_glm5_structure_and_expected_parameter_counts():
    micro = build_model(ModelConfig.for_size("micro"))
    tiny = build_model(ModelConfig())
    counts_micro, counts_tiny = parameter_counts(micro), parameter_counts(tiny)
    # Measured: micro 146,432, tiny 5,324,992 (cluster 1,464,700,416). Within 5%: tied embeddings (-22%, -30%,
    # -7%), a lost MoE layer or a wrong expert count breaks it; an exact count would break on any preset tweak.
    assert counts_micro["total"] == pytest.approx(146_432, rel=0.05)
    assert counts_tiny["total"] == pytest.approx(5_324_992, rel=0.05)  # "a few million"
    for model, counts in ((micro, counts_micro), (tiny, counts_tiny)):  # untied input and output embeddings
        assert counts["embedding"] == 2 * model.config.vocab_size * model.config.hidden_size
    assert counts_tiny["active"] < counts_tiny["total"]  # routed experts: top-2 of 8 per token
    cfg = tiny.config
    assert cfg.model_type == "glm_moe_dsa"
    assert cfg.mlp_layer_types == ["dense", "sparse", "sparse", "sparse"]  # first layer dense, then MoE
    layer = tiny.model.layers[1]
    assert layer.mlp.shared_experts is not None and layer.mlp.experts.num_experts == 8
    assert layer.self_attn.indexer.index_topk == 128 and layer.self_attn.kv_lora_rank == 96  # DSA + MLA
    # The cluster preset builds on the meta device (no memory) with ~1.5B parameters.
    with torch.device("meta"):
        cluster = GlmMoeDsaForCausalLM(hf_config(ModelConfig.for_size("cluster")))
    assert parameter_counts(cluster)["total"] == pytest.approx(1_464_700_416, rel=0.05)


def test_profile_model_sections_match_the_presets():
    for profile, size in (("micro", "micro"), ("tiny", "tiny"), ("cluster", "cluster")):
        cfg = validate_stage(load_profile(profile), "pretrain", PretrainConfig)
        assert cfg.model == ModelConfig.for_size(size), profile
    assert set(MODEL_SIZES) == {"micro", "tiny", "cluster"}
    cfg = validate_stage(load_profile("micro"), "pretrain", PretrainConfig)
    assert [cfg.dense.dsa_mode, cfg.indexer_warmup.dsa_mode, cfg.sparse.dsa_mode] == [
        "dense",
        "indexer_warmup",
        "sparse",
    ]
    assert cfg.indexer_warmup.optim.lr == 5e-3  # phase default survives a partial YAML section


def test_sparse_training_forward_equals_transformers_and_dense_differs_only_past_topk(micro_model):
    model = micro_model.eval()
    long_x = torch.randint(2, 512, (2, 48))  # longer than index_topk = 16
    short_x = long_x[:, :16]
    with torch.no_grad():
        native_long, native_short = model(input_ids=long_x).logits, model(input_ids=short_x).logits
        set_dsa_mode(model, "sparse")
        sparse_long = model(input_ids=long_x).logits
        stats = collect_dsa_stats(model)
        set_dsa_mode(model, "dense")
        dense_long, dense_short = model(input_ids=long_x).logits, model(input_ids=short_x).logits
    assert torch.equal(sparse_long, native_long)
    assert torch.allclose(dense_short, native_short, atol=1e-5)  # <= index_topk keys: top-k keeps everything
    assert (dense_long - native_long).abs().max() > 1e-3
    # First 16 queries see <= 16 keys; the other 32 per row are "long" queries for topk_mass.
    assert int(stats["long_queries"]) == 2 * 32 * 2  # batch * long queries * layers
    mass = float(stats["topk_mass_sum"] / stats["long_queries"])
    # A random init attends almost uniformly: 16 of the t + 1 keys of query t hold ~16 / (t + 1), 0.5424 on
    # average over t = 16..47 (measured 0.539). Counting short queries, or keys outside the causal window,
    # moves it by more than 0.01.
    assert mass == pytest.approx(sum(16 / (t + 1) for t in range(16, 48)) / 32, abs=0.008)


def test_indexer_loss_trains_only_the_indexer_and_lm_loss_never_reaches_it(micro_model):
    x = torch.randint(2, 512, (2, 40))
    set_dsa_mode(micro_model, "sparse")
    out = micro_model(input_ids=x)
    kl = collect_dsa_stats(micro_model)["indexer_loss"]
    kl.backward(retain_graph=True)
    with_grad = {
        n for n, p in micro_model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0
    }
    assert with_grad and all(is_indexer_parameter(n) for n in with_grad)
    micro_model.zero_grad(set_to_none=True)
    out.logits.float().logsumexp(-1).mean().backward()
    indexer_grads = [
        n for n, p in micro_model.named_parameters() if is_indexer_parameter(n) and p.grad is not None
    ]
    assert indexer_grads == []
    trainable = freeze_all_but_indexer(micro_model)
    assert trainable == parameter_counts(micro_model)["indexer"]


def test_indexer_kl_is_zero_on_a_match_and_positive_otherwise():
    torch.manual_seed(0)
    scores = torch.randn(2, 5, 5)
    attend = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5)
    p = torch.softmax(scores.masked_fill(~attend, float("-inf")), -1)
    assert indexer_kl_loss(p, scores, attend).abs().max() < 1e-5
    uniform = attend.float() / attend.sum(-1, keepdim=True)
    kl = indexer_kl_loss(uniform, scores, attend)
    assert (kl >= -1e-6).all() and kl[:, 1:].min() > 1e-3  # query 0 has a single key: KL 0


def test_moe_balance_loss_and_bias_update(micro_model):
    taps = RouterTaps(micro_model)
    micro_model(input_ids=torch.randint(2, 512, (4, 32)))
    ((router, logits, topk),) = taps.pop()  # one MoE layer in micro
    loss = sequence_balance_loss(logits, topk, batch_size=4)
    # 1.0 when perfectly balanced; a random router is nearly so (measured 1.002-1.004 over seeds 0-2), while
    # a wrong normalisation of f (by k or E) or of p (over tokens) is off by a factor.
    assert loss.requires_grad and 0.99 < float(loss.detach()) < 1.02
    # Perfect balance gives exactly 1: uniform scores, each expert chosen equally often.
    n, e = 8, 4
    even = torch.tensor([[0, 1], [2, 3]] * 4)
    assert float(sequence_balance_loss(torch.zeros(n, e), even, batch_size=1)) == pytest.approx(1.0)
    loads = {router: torch.tensor([10.0, 0.0, 5.0, 5.0], dtype=torch.float64)}
    ratio = update_router_bias(loads, rate=0.1)
    assert ratio == pytest.approx(2.0)
    assert router.e_score_correction_bias.tolist() == pytest.approx([-0.1, 0.1, 0.0, 0.0])
    taps.remove()


def test_hf_export_loads_with_automodel_and_gives_the_same_logits(micro_model, tmp_path):
    set_dsa_mode(micro_model, "sparse")  # the class swap must not leak into the export
    with torch.no_grad():
        micro_model.model.layers[1].mlp.gate.e_score_correction_bias.add_(0.5)  # a trained buffer survives
    out = export_hf(micro_model, tmp_path / "hf")
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(loaded.model.layers[0].self_attn).__name__ == "GlmMoeDsaAttention"
    set_dsa_mode(micro_model, "native")
    x = torch.randint(2, 512, (1, 40))
    with torch.no_grad():
        assert torch.equal(micro_model.eval()(input_ids=x).logits, loaded(input_ids=x).logits)
    assert not list(tmp_path.glob(".tmp_*"))


def test_export_writes_the_same_files_as_save_pretrained_without_importing_deepspeed(tmp_path):
    # A fresh interpreter: DeepSpeed must not be imported yet (every training child saves once; importing it
    # costs 1.5-3 s). Plain save_pretrained imports it (accelerate's wrapper probe) and must write the same bytes.
    script = f"""
import hashlib, pathlib, sys
from training.checkpoint import export_hf
from training.model import ModelConfig, build_model
model = build_model(ModelConfig.for_size("micro"), seed=0)
export_hf(model, pathlib.Path({str(tmp_path / "ours")!r}))
print("after export", "deepspeed" in sys.modules)
model.save_pretrained({str(tmp_path / "plain")!r}, safe_serialization=True)
print("after plain", "deepspeed" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "after export False" in out and "after plain True" in out
    names = sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "ours").iterdir()) and "model.safetensors" in names
    for name in names:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name


def test_indexer_topk_mass_compares_the_trained_indexer_with_a_fresh_one(micro_model):
    with torch.no_grad():  # peaked main attention: a good top-k holds much more than k/T of it
        for name, p in micro_model.named_parameters():
            if name.endswith(("q_b_proj.weight", "kv_a_proj_with_mqa.weight")):
                p.mul_(6.0)
    x = torch.randint(2, 512, (4, 64))
    before = indexer_topk_mass(micro_model, x)
    assert abs(before["dsa/topk_mass"] - before["dsa/topk_mass_untrained_indexer"]) < 0.03  # both random
    freeze_all_but_indexer(micro_model)
    set_dsa_mode(micro_model, "indexer_warmup")
    opt = torch.optim.AdamW([p for p in micro_model.parameters() if p.requires_grad], lr=5e-3)
    for _ in range(60):
        micro_model(input_ids=x, use_cache=False)
        collect_dsa_stats(micro_model)["indexer_loss"].backward()
        opt.step()
        opt.zero_grad()
    set_dsa_mode(micro_model, "sparse")
    weights = {n: p.clone() for n, p in micro_model.named_parameters()}
    after = indexer_topk_mass(micro_model, x)
    assert after["dsa/topk_mass"] > after["dsa/topk_mass_untrained_indexer"] + 0.04
    assert after["dsa/topk_mass"] <= after["dsa/topk_mass_oracle"] + 1e-6
    assert after["dsa/topk_mass_untrained_indexer"] == pytest.approx(
        before["dsa/topk_mass_untrained_indexer"]
    )
    assert current_dsa_mode(micro_model) == "sparse"  # restored
    # the fresh indexer was a re-initialised copy: the model's own weights are untouched
    assert all(torch.equal(p, weights[n]) for n, p in micro_model.named_parameters())
