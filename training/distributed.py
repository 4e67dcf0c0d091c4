"""Distributed training: process-group setup and the DeepSpeed ZeRO engine behind the trainer's engine API.

Launched by `torchrun` or `deepspeed` (see `infra/launcher.py`), every rank runs `training/launch_entry.py`.
The engine wraps `deepspeed.initialize` with a ZeRO config (stage and offload per profile) and a torch
optimizer passed in directly (`zero_allow_untested_optimizer`), which avoids compiling fused Adam; on CPU it
runs on the gloo backend. Muon under DeepSpeed uses DeepSpeed's own ZeRO-aware `Muon` (params tagged
`use_muon`), since torch's Muon needs whole 2-D matrices and ZeRO hands it flat partitions.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from training.optim import OptimConfig, build_optimizers, is_muon_parameter

log = logging.getLogger(__name__)


class DistributedConfig(BaseModel):
    """How a training phase is launched; defaults are the `tiny` profile (one local process, no DeepSpeed)."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["torch", "deepspeed"] = Field("torch", description="Plain torch loop or DeepSpeed ZeRO")
    launcher: Literal["python", "torchrun", "deepspeed"] = Field(
        "python", description="How processes are started: one python process, torchrun or the deepspeed CLI"
    )
    nproc: int = Field(1, gt=0, description="Processes per node")
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage")
    offload_optimizer: Literal["none", "cpu"] = Field("none", description="ZeRO optimizer-state offload")
    offload_param: Literal["none", "cpu"] = Field("none", description="ZeRO-3 parameter offload")
    backend: Literal["gloo", "nccl"] = Field("gloo", description="torch.distributed backend (gloo on CPU)")
    threads_per_process: int = Field(0, ge=0, description="torch intra-op threads per process (0 = default)")
    timeout_s: float | None = Field(
        None, gt=0, description="Kill the run after this many seconds (None = no limit)"
    )

    @model_validator(mode="after")
    def _check(self) -> DistributedConfig:
        if self.nproc > 1 and self.engine != "deepspeed":
            raise ValueError("nproc > 1 needs engine: deepspeed")
        if self.nproc > 1 and self.launcher == "python":
            raise ValueError("nproc > 1 needs launcher: torchrun or deepspeed")
        return self


def init_process_group(cfg: DistributedConfig) -> tuple[int, int]:
    """Join the process group the launcher set up (RANK / WORLD_SIZE / MASTER_*); returns (rank, world_size)."""
    if cfg.engine != "deepspeed":
        return 0, 1
    import deepspeed

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=cfg.backend, auto_mpi_discovery=False)
    return dist.get_rank(), dist.get_world_size()


def deepspeed_config(
    dist_cfg: DistributedConfig, grad_accum_steps: int, grad_clip: float, world_size: int
) -> dict:
    """The DeepSpeed JSON config: ZeRO stage / offload, accumulation and clipping (precision stays autocast)."""
    zero: dict[str, Any] = {"stage": dist_cfg.zero_stage}
    if dist_cfg.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": dist_cfg.offload_optimizer}
    if dist_cfg.zero_stage == 3 and dist_cfg.offload_param != "none":
        zero["offload_param"] = {"device": dist_cfg.offload_param}
    return {
        "train_micro_batch_size_per_gpu": 1,  # bookkeeping only: the trainer feeds its own batches
        "gradient_accumulation_steps": grad_accum_steps,
        "train_batch_size": grad_accum_steps * world_size,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedEngine:
    """The trainer's engine API (see `training.trainer.TrainingEngine`) on a DeepSpeed ZeRO engine."""

    def __init__(
        self,
        model: nn.Module,
        optim: OptimConfig,
        dist_cfg: DistributedConfig,
        grad_accum_steps: int,
        grad_clip: float,
    ):
        import deepspeed

        self.model = model
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        config = deepspeed_config(dist_cfg, grad_accum_steps, grad_clip, self.world_size)
        trainable = [p for p in model.parameters() if p.requires_grad]
        if optim.optimizer == "muon":
            for name, p in model.named_parameters():
                p.use_muon = is_muon_parameter(name, p)
            config["optimizer"] = {
                "type": "Muon",
                "params": {
                    "lr": optim.lr,
                    "momentum": optim.muon_momentum,
                    "weight_decay": optim.weight_decay,
                },
            }
            self.ds, *_ = deepspeed.initialize(model=model, model_parameters=trainable, config=config)
        else:
            (optimizer,) = build_optimizers(model, optim)
            self.ds, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def forward(self, **inputs: torch.Tensor) -> Any:
        return self.ds(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        # The trainer already divides by the step's token count; DeepSpeed steps at the accumulation boundary.
        self.ds.backward(loss, scale_wrt_gas=False)
        self.ds.step()

    def step(self, grad_clip: float) -> float:
        norm = self.ds.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def param_groups(self) -> list[dict]:
        return self.ds.optimizer.param_groups

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def save_state(self, directory: Path) -> None:
        self.ds.save_checkpoint(str(directory), tag="deepspeed", save_latest=False)

    def load_state(self, directory: Path) -> None:
        self.ds.load_checkpoint(
            str(directory), tag="deepspeed", load_optimizer_states=True, load_lr_scheduler_states=False
        )

    def barrier(self) -> None:
        dist.barrier()
