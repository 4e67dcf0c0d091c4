"""Settings every on-policy RL loop shares (Reasoning RL, General RL, distillation): the optimizer step, the
Eq. 1 bands, the rollout engine's precision and
the checkpoint period (training/rl/loop.py). Each loop's config extends this one."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PolicyUpdateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    learning_rate: float = Field(3e-5, gt=0, description="AdamW learning rate")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clip")
    beta: float = Field(2.0, gt=1, description="IcePop band [1/beta, beta] on rho")
    eps_low: float = Field(0.2, gt=0, lt=1, description="Lower clip of the policy ratio")
    eps_high: float = Field(0.28, gt=0, description="Upper clip of the policy ratio")
    engine_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Precision of the rollout engine (the trainer is fp32: IcePop's mismatch); auto = bf16 "
        "where the hardware has bf16 arithmetic, else fp32",
    )
    checkpoint_every: int = Field(
        20,
        ge=0,
        description="Save model, optimizer, RNG and the run's state every N steps; a rerun of the same job "
        "resumes there (0 = never)",
    )
