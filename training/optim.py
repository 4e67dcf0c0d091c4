"""Optimizers and learning-rate schedules.

Muon (`torch.optim.Muon`, as the GLM-5 report trains with) takes the 2-D weight matrices inside the blocks;
AdamW takes everything else: embeddings and LM head, norms and biases (no weight decay), and the 3-D stacked
expert weights (torch's Muon is 2-D only). Muon's `match_rms_adamw` LR adjustment lets both share one LR.
The schedule is a pure function of the step (nothing to checkpoint beyond the step itself).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn


class OptimConfig(BaseModel):
    """Optimizer and schedule; defaults are the `tiny` profile."""

    model_config = ConfigDict(extra="forbid")

    optimizer: Literal["muon", "adamw"] = Field(
        "muon", description="Muon for 2-D hidden weights, or AdamW only"
    )
    lr: float = Field(
        3e-3, gt=0, description="Peak learning rate (AdamW; Muon matched to AdamW's update RMS)"
    )
    weight_decay: float = Field(0.1, ge=0, description="Decoupled weight decay on matrices and embeddings")
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW beta1")
    beta2: float = Field(0.95, ge=0, lt=1, description="AdamW beta2")
    eps: float = Field(1e-8, gt=0, description="AdamW epsilon")
    muon_momentum: float = Field(0.95, ge=0, lt=1, description="Muon momentum (Nesterov)")
    schedule: Literal["cosine", "wsd", "constant"] = Field(
        "cosine", description="warmup + cosine decay, warmup-stable-decay, or warmup + constant"
    )
    warmup_steps: int = Field(20, ge=0, description="Linear warmup steps")
    decay_fraction: float = Field(0.2, gt=0, le=1, description="WSD: share of steps spent in the final decay")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final LR as a fraction of the peak")


def lr_multiplier(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """LR / peak LR at `step` (0-based) of `total_steps`: linear warmup, then cosine, WSD or constant."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    floor = cfg.min_lr_ratio
    if cfg.schedule == "cosine":
        span = max(total_steps - cfg.warmup_steps, 1)
        progress = min((step - cfg.warmup_steps) / span, 1.0)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    # WSD: hold the peak, then decay linearly to the floor over the last `decay_fraction` of the steps.
    decay_steps = max(int(round(total_steps * cfg.decay_fraction)), 1)
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return 1.0
    progress = min((step - decay_start + 1) / decay_steps, 1.0)
    return 1.0 - (1 - floor) * progress


# MLA's fused latent + shared-RoPE-key projection: one orthogonalised Muon update over both blocks kept the
# micro GLM-5 from learning to copy from context (held-out copy loss 3.10 vs 0.29 with it on AdamW).
MUON_EXCLUDED_SUFFIXES = ("kv_a_proj_with_mqa.weight",)


def is_muon_parameter(name: str, p: torch.Tensor) -> bool:
    """2-D weights inside the blocks; embeddings and the LM head stay on AdamW (as in the Muon reference),
    and so does MLA's fused `kv_a_proj_with_mqa` (see `MUON_EXCLUDED_SUFFIXES`)."""
    return (
        p.ndim == 2
        and "embed_tokens" not in name
        and not name.startswith("lm_head")
        and not name.endswith(MUON_EXCLUDED_SUFFIXES)
    )


def param_groups(model: nn.Module, cfg: OptimConfig) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Trainable parameters split into `muon`, `adamw_decay` and `adamw_no_decay` (norms, biases)."""
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {"muon": [], "adamw_decay": [], "adamw_no_decay": []}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if cfg.optimizer == "muon" and is_muon_parameter(name, p):
            groups["muon"].append((name, p))
        elif p.ndim >= 2:
            groups["adamw_decay"].append((name, p))
        else:
            groups["adamw_no_decay"].append((name, p))
    return groups


def build_optimizers(model: nn.Module, cfg: OptimConfig) -> list[torch.optim.Optimizer]:
    """[Muon, AdamW] (or [AdamW]) over the trainable parameters; each group remembers its peak `initial_lr`."""
    groups = param_groups(model, cfg)
    optimizers: list[torch.optim.Optimizer] = []
    if groups["muon"]:
        muon = torch.optim.Muon(
            [p for _, p in groups["muon"]],
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            momentum=cfg.muon_momentum,
            adjust_lr_fn="match_rms_adamw",
        )
        optimizers.append(muon)
    adam_groups = [
        {"params": [p for _, p in groups["adamw_decay"]], "weight_decay": cfg.weight_decay},
        {"params": [p for _, p in groups["adamw_no_decay"]], "weight_decay": 0.0},
    ]
    adam_groups = [g for g in adam_groups if g["params"]]
    if adam_groups:
        optimizers.append(
            torch.optim.AdamW(adam_groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=True)
        )
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = cfg.lr
    return optimizers


def set_lr(groups: list[dict], multiplier: float) -> float:
    """Scale each param group's peak LR (`initial_lr`) by `multiplier`; returns the last group's LR."""
    lr = 0.0
    for group in groups:
        group["lr"] = group.setdefault("initial_lr", group["lr"]) * multiplier
        lr = group["lr"]
    return lr
