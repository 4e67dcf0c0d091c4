"""The pretrain stage: dense -> indexer warm-up -> sparse, each a child process, HF export at the end."""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from infra.settings import load_profile, validate_stage
from training.job import DataSpec
from training.pretrain import PretrainConfig, pretrain_mixture, run_pretraining, trained_tokens


@pytest.mark.slow
def test_pretrain_runs_three_phases_and_skips_them_on_rerun(tmp_path):
    overrides = {"dense": {"steps": 60, "optim": {"lr": 1e-2}}, "indexer_warmup": {"steps": 20}}
    cfg = validate_stage(load_profile("micro"), "pretrain", PretrainConfig, overrides)
    copy_task = {"vocab_size": 512, "pattern": "repeat", "period": 3, "alphabet": 16}
    data = DataSpec(kwargs=copy_task)
    eval_data = DataSpec(factory="training.batch_source:synthetic_eval_batches", kwargs=copy_task)
    result = run_pretraining(cfg, tmp_path, data, eval_data)

    m = result.metrics
    print({k: round(v, 3) for k, v in m.items() if "topk" in k or "loss" in k})
    assert m["dense/eval_loss"] < 3.0
    assert m["topk_mass_after_warmup"] > m["topk_mass_init"]
    assert m["indexer_warmup/eval_loss"] == pytest.approx(
        m["dense/eval_loss"], abs=1e-6
    )  # LM frozen in stage 1
    assert m["params_total"] == 146432 and m["sparse/tokens"] == 10 * 8 * 64
    assert "| indexer_warmup |" in result.report_md and result.artifacts["plots/pretrain_loss.png"].exists()
    model = AutoModelForCausalLM.from_pretrained(result.outputs["hf_dir"])
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.randint(2, 18, (1, 32))).logits).all()

    start = time.monotonic()
    again = run_pretraining(cfg, tmp_path, data, eval_data)
    assert time.monotonic() - start < 5  # every phase finished with the same spec: nothing reruns
    assert again.data_version == result.data_version


def test_pretraining_draws_no_source_past_max_source_epochs():
    """The tiny defaults: 400 LM steps of 8 x 256 tokens (the indexer warm-up trains the indexer only) would
    pass ~4.4 times over a 93k-token web source at weight 0.5; capped at 4, web gives up share to the rest."""
    cfg = PretrainConfig()
    assert trained_tokens(cfg) == (300 + 100) * 8 * 256
    wider = PretrainConfig.model_validate(
        {
            "dense": {"grad_accum_steps": 2},
            "distributed": {"nproc": 2, "engine": "deepspeed", "launcher": "deepspeed"},
        }
    )
    assert trained_tokens(wider) == (300 * 2 + 100) * 8 * 256 * 2
    tokens = {"web": 93_000, "code": 136_000_000, "math": 5_000_000}
    weights, metrics = pretrain_mixture(cfg, {"web": 0.5, "code": 0.3, "math": 0.2}, tokens)
    assert metrics["source_epochs/web"] == pytest.approx(4.0) and weights["web"] < 0.5
    assert metrics["mixture_pretrain/code"] / metrics["mixture_pretrain/math"] == pytest.approx(1.5)
    uncapped, m = pretrain_mixture(
        cfg.model_copy(update={"max_source_epochs": None}), {"web": 1, "code": 1}, tokens
    )
    assert uncapped == {"code": 0.5, "web": 0.5} and m["source_epochs/web"] == pytest.approx(
        0.5 * 819_200 / 93_000
    )
