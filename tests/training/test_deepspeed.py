"""The same trainer under torchrun + DeepSpeed ZeRO on gloo (CPU)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.settings import REPO_ROOT
from training.distributed import DistributedConfig, deepspeed_config
from training.job import TrainJobSpec, read_metrics, run_training_job
from training.model import ModelConfig


def test_deepspeed_config_follows_the_profile():
    cfg = DistributedConfig(
        engine="deepspeed", launcher="torchrun", nproc=2, zero_stage=3, offload_optimizer="cpu"
    )
    ds = deepspeed_config(
        cfg.model_copy(update={"offload_param": "cpu"}), grad_accum_steps=4, grad_clip=1.0, world_size=2
    )
    assert ds["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": "cpu"},
    }
    assert ds["gradient_accumulation_steps"] == 4 and ds["train_batch_size"] == 8
    assert ds["zero_allow_untested_optimizer"] is True  # a torch optimizer: no fused-Adam JIT build
    with pytest.raises(ValidationError, match="needs engine: deepspeed"):
        DistributedConfig(nproc=2, launcher="torchrun")
    with pytest.raises(ValidationError, match="torchrun or deepspeed"):
        DistributedConfig(nproc=2, engine="deepspeed")


@pytest.mark.slow
def test_two_processes_zero2_train_in_lockstep(tmp_path):
    # DeepSpeed JIT-builds its shared-memory comm op once (~1-3 min); keep it in the state dir's cache.
    extensions = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or REPO_ROOT / ".crucible" / "torch_extensions")
    steps, batch, seq = 6, 4, 64
    spec = TrainJobSpec(
        run_dir=str(tmp_path),
        model=ModelConfig.for_size("micro"),
        trainer={
            "steps": steps,
            "grad_accum_steps": 2,
            "log_every": 1,
            "eval_every": 0,
            "checkpoint_every": 3,
            "progress": False,
            "optim": {"optimizer": "adamw", "lr": 1e-2, "warmup_steps": 0},
        },
        data={"kwargs": {"vocab_size": 512, "batch_size": batch, "seq_len": seq, "pattern": "markov"}},
        distributed={
            "engine": "deepspeed",
            "launcher": "torchrun",
            "nproc": 2,
            "zero_stage": 2,
            "threads_per_process": 1,
            "timeout_s": 900,
        },
    )
    result = run_training_job(spec, torch_extensions_dir=extensions)
    assert result["world_size"] == 2 and result["step"] == steps
    assert result["tokens"] == steps * 2 * batch * seq * 2  # steps * accum * rows * seq_len * ranks
    digests = [json.loads((tmp_path / f"result_rank{r}.json").read_text())["weights_digest"] for r in (0, 1)]
    assert digests[0] == digests[1]  # ZeRO-2 keeps every rank's weights identical
    losses = [r["loss"] for r in read_metrics(tmp_path) if "loss" in r]
    print("zero-2 losses", [round(x, 3) for x in losses])
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.5
    ckpt = Path(result["checkpoint"])
    assert ckpt.name == f"step_{steps:08d}" and (ckpt / "deepspeed").is_dir()
    assert {"rng_rank0.pt", "rng_rank1.pt", "data_rank0.json", "data_rank1.json"} <= {
        p.name for p in ckpt.iterdir()
    }
    assert (Path(result["hf_dir"]) / "model.safetensors").exists()
