"""The training loop: schedules, param groups, loss masks, accumulation, metrics, and the DSA indexer stages."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from training.batch_source import SyntheticBatches
from training.dsa_indexer import is_indexer_parameter
from training.model import ModelConfig, build_model
from training.optim import OptimConfig, lr_multiplier, param_groups
from training.trainer import JsonlMetricsWriter, Trainer, TrainerConfig, count_targets, resolve_precision

MICRO = ModelConfig.for_size("micro")


def quiet(**overrides) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {"progress": False, "eval_every": 0, "checkpoint_every": 0, **overrides}
    )


def test_lr_schedules():
    cos = OptimConfig(schedule="cosine", warmup_steps=10, min_lr_ratio=0.1)
    assert lr_multiplier(0, 100, cos) == pytest.approx(0.1)
    assert lr_multiplier(9, 100, cos) == pytest.approx(1.0)
    assert lr_multiplier(55, 100, cos) == pytest.approx(0.55)  # half-way through the decay
    assert lr_multiplier(100, 100, cos) == pytest.approx(0.1)
    wsd = OptimConfig(schedule="wsd", warmup_steps=10, decay_fraction=0.2, min_lr_ratio=0.0)
    assert [lr_multiplier(s, 100, wsd) for s in (10, 79)] == [1.0, 1.0]  # stable phase
    assert lr_multiplier(89, 100, wsd) == pytest.approx(0.5)
    assert lr_multiplier(99, 100, wsd) == pytest.approx(0.0)
    assert lr_multiplier(50, 100, OptimConfig(schedule="constant", warmup_steps=0)) == 1.0


def test_muon_takes_hidden_matrices_and_adamw_the_rest():
    model = build_model(MICRO)
    groups = {k: {n for n, _ in v} for k, v in param_groups(model, OptimConfig(optimizer="muon")).items()}
    assert "model.layers.0.self_attn.q_a_proj.weight" in groups["muon"]
    assert "model.layers.1.mlp.gate.weight" in groups["muon"]
    assert {
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.layers.1.mlp.experts.gate_up_proj",
    } <= groups["adamw_decay"]
    assert "model.norm.weight" in groups["adamw_no_decay"]
    assert all(p.ndim == 2 for n, p in model.named_parameters() if n in groups["muon"])
    adamw_only = param_groups(model, OptimConfig(optimizer="adamw"))
    assert not adamw_only["muon"]
    assert sum(len(v) for v in adamw_only.values()) == len(list(model.parameters()))


def _native_cpu_bf16() -> bool:
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def test_auto_precision_is_fp32_on_a_cpu_without_bf16_arithmetic_and_explicit_bf16_is_kept(tmp_path):
    """`auto` computes what `fp32` computes where bf16 would be emulated (and bf16 where it is native); an
    explicit `bf16` is kept: its logits differ from fp32's."""
    cpu = torch.device("cpu")
    assert resolve_precision("bf16", cpu) == "bf16" and resolve_precision("fp32", cpu) == "fp32"
    batch = next(SyntheticBatches(MICRO.vocab_size, 2, 32))
    logits = {}
    for precision in ("auto", "fp32", "bf16"):
        trainer = Trainer(build_model(MICRO, seed=0), quiet(steps=1, precision=precision), iter(()), tmp_path)
        with torch.no_grad(), trainer.autocast():
            logits[precision] = trainer.model(input_ids=batch["input_ids"]).logits.float()
    assert not torch.equal(logits["bf16"], logits["fp32"])
    same_as = "bf16" if _native_cpu_bf16() else "fp32"
    assert torch.equal(logits["auto"], logits[same_as])


def test_loss_mask_ignores_prompt_positions(tmp_path):
    source = SyntheticBatches(MICRO.vocab_size, 4, 32, prompt_fraction=0.5)
    batch = next(source)
    assert count_targets(batch) == 4 * 16  # labels 16..31 carry the loss (15 of 31 shifted targets masked)
    trainer = Trainer(build_model(MICRO), quiet(steps=1, precision="fp32"), source, tmp_path)
    with torch.no_grad():
        lm_sum = trainer.loss_terms(batch)["lm_sum"]
        logits = trainer.model(input_ids=batch["input_ids"]).logits
    keep = slice(16, 32)  # labels[:, 16:] carry the loss, predicted from positions 15..30
    manual = F.cross_entropy(
        logits[:, keep.start - 1 : -1].flatten(0, 1), batch["input_ids"][:, keep].flatten(), reduction="sum"
    )
    assert float(lm_sum) == pytest.approx(float(manual), rel=1e-5)
    unmasked = dict(batch, labels=batch["input_ids"])
    with torch.no_grad():
        assert float(trainer.loss_terms(unmasked)["lm_sum"]) > float(lm_sum) * 1.5


class Halves:
    """Each batch of `source` as two half batches (for the accumulation test)."""

    def __init__(self, source):
        self.source, self.pending = source, []

    def __iter__(self):
        return self

    def __next__(self):
        if not self.pending:
            batch = next(self.source)
            self.pending = [{k: v[2:] for k, v in batch.items()}, {k: v[:2] for k, v in batch.items()}]
        return self.pending.pop()

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_gradient_accumulation_equals_one_big_batch(tmp_path):
    cfg = dict(steps=2, precision="fp32", moe_aux_loss_coef=0.0, moe_bias_update_rate=0.0, log_every=1)
    cfg["optim"] = {"optimizer": "adamw", "warmup_steps": 0}
    big = build_model(MICRO, seed=1)
    Trainer(big, quiet(**cfg), SyntheticBatches(512, 4, 32, seed=3), tmp_path / "a").fit()
    acc = build_model(MICRO, seed=1)
    Trainer(
        acc, quiet(**cfg, grad_accum_steps=2), Halves(SyntheticBatches(512, 4, 32, seed=3)), tmp_path / "b"
    ).fit()
    before = build_model(MICRO, seed=1).state_dict()
    for (name, a), b in zip(big.state_dict().items(), acc.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-5), name  # a real mismatch shows at the LR scale, 3e-3
    assert not torch.equal(big.state_dict()["lm_head.weight"], before["lm_head.weight"])


def test_training_reduces_loss_and_reports_metrics(tmp_path):
    reports: list[tuple[int, dict]] = []
    source = SyntheticBatches(MICRO.vocab_size, 8, 64, pattern="markov")
    evals = [SyntheticBatches(MICRO.vocab_size, 8, 64, pattern="markov", seed=99).batch_at(0)]
    cfg = quiet(
        steps=40, log_every=10, eval_every=20, eval_at_start=True, optim={"lr": 1e-2, "warmup_steps": 5}
    )
    model = build_model(MICRO)
    callbacks = [lambda step, m: reports.append((step, m)), JsonlMetricsWriter(tmp_path / "metrics.jsonl")]
    final = Trainer(model, cfg, source, tmp_path, eval_batches=evals, callbacks=callbacks).fit()
    train = [m for _, m in reports if "loss" in m]
    evals_seen = [(s, m["eval_loss"]) for s, m in reports if "eval_loss" in m]
    assert [s for s, _ in evals_seen] == [0, 20, 40]
    assert evals_seen[0][1] > math.log(512) - 0.2 and evals_seen[-1][1] < evals_seen[0][1] - 2.0
    assert train[-1]["loss"] < train[0]["loss"] - 1.5
    assert all(m["tokens_per_s"] > 0 and math.isfinite(m["grad_norm"]) for m in train)
    assert {"lr", "moe_aux_loss", "moe_load_max_over_mean", "tokens"} <= set(train[-1])
    assert final["tokens"] == 40 * 8 * 64
    assert (
        model.model.layers[1].mlp.gate.e_score_correction_bias.abs().sum() > 0
    )  # aux-loss-free balancing ran
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == len(reports)
    assert (tmp_path / "checkpoints" / "step_00000040").is_dir()  # the end of a phase is always saved


def test_dsa_indexer_warmup_raises_topk_mass_then_sparse_training_runs(tmp_path):
    """RECIPE.md: stage 1 trains only the indexer on L_I; its top-k then holds more of the attention mass."""
    data = dict(
        vocab_size=MICRO.vocab_size, batch_size=8, seq_len=64, pattern="repeat", period=3, alphabet=16
    )
    evals = [SyntheticBatches(**data, seed=99).batch_at(i) for i in range(2)]
    model = build_model(MICRO)
    # A copy task gives the main attention a clear structure (3 tokens back) for the indexer to learn.
    cfg = quiet(steps=100, log_every=50, optim={"lr": 3e-3, "warmup_steps": 10})
    dense = Trainer(model, cfg, SyntheticBatches(**data), tmp_path / "dense", eval_batches=evals).fit()
    assert dense["eval_loss"] < 2.0

    main_before = {n: p.detach().clone() for n, p in model.named_parameters() if not is_indexer_parameter(n)}
    reports: list[tuple[int, dict]] = []
    warm_cfg = quiet(
        steps=40,
        dsa_mode="indexer_warmup",
        log_every=20,
        eval_at_start=True,
        optim={"optimizer": "adamw", "lr": 1e-2, "warmup_steps": 3, "schedule": "constant"},
    )
    warm = Trainer(
        model,
        warm_cfg,
        SyntheticBatches(**data, seed=1),
        tmp_path / "warm",
        eval_batches=evals,
        callbacks=[lambda s, m: reports.append((s, m))],
    )
    after = warm.fit()
    at_init = next(m for s, m in reports if s == 0)
    print(
        f"topk_mass {at_init['eval_topk_mass']:.3f} -> {after['eval_topk_mass']:.3f}"
        f" (oracle {after['eval_topk_mass_oracle']:.3f})"
    )
    assert after["eval_topk_mass"] > at_init["eval_topk_mass"] + 0.05
    # The best any top-k could hold (after == init: the LM is frozen); the trained indexer gets close to it.
    assert after["eval_topk_mass_oracle"] == pytest.approx(at_init["eval_topk_mass_oracle"])
    assert after["eval_topk_mass"] > 0.95 * after["eval_topk_mass_oracle"] > at_init["eval_topk_mass"]
    assert after["eval_indexer_loss"] < 0.5 * at_init["eval_indexer_loss"]
    assert after["eval_loss"] == pytest.approx(at_init["eval_loss"], abs=1e-9)  # the LM is frozen
    for name, p in model.named_parameters():
        if name in main_before:
            assert torch.equal(p, main_before[name]), name

    snapshot = {n: p.detach().clone() for n, p in model.named_parameters()}
    sparse = Trainer(
        model,
        quiet(steps=5, dsa_mode="sparse", log_every=5),
        SyntheticBatches(**data, seed=2),
        tmp_path / "sparse",
    ).fit()
    assert math.isfinite(sparse["loss"]) and math.isfinite(sparse["indexer_loss"]) and "topk_mass" in sparse
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, snapshot[n])}
    assert "model.layers.0.self_attn.indexer.wk.weight" in changed and "lm_head.weight" in changed


def test_glm_learns_in_context_copy_of_unseen_segments(tmp_path):
    """Induction (copy from context) is what passkey retrieval is built on: the micro GLM-5 learns to copy a
    random segment it has never seen, far below the ln(alphabet) loss of guessing. With MLA's fused
    kv_a_proj_with_mqa on Muon it stayed at 3.10 (ln 32 = 3.47): see training/optim.py."""
    data = dict(vocab_size=MICRO.vocab_size, batch_size=16, seq_len=64, pattern="repeat", period=16)
    data["alphabet"] = 32
    model = build_model(MICRO)
    cfg = quiet(steps=300, log_every=100, precision="fp32", optim={"lr": 3e-3, "warmup_steps": 10})
    print("optimizer groups", {k: len(v) for k, v in param_groups(model, cfg.optim).items()})
    Trainer(model, cfg, SyntheticBatches(**data), tmp_path).fit()
    batch = SyntheticBatches(**data, seed=12345).batch_at(0)  # segments the training stream never drew
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits[:, 15:-1].float()
    copy_loss = F.cross_entropy(logits.flatten(0, 1), batch["input_ids"][:, 16:].flatten())
    print(f"held-out copy loss {copy_loss:.3f}")
    assert copy_loss < 0.3 * math.log(32), f"copy loss {copy_loss:.3f} vs ln 32 = {math.log(32):.3f}"
