"""One training loop for pre-training, mid-training and SFT (nanoGPT-style: read `Trainer.fit` top to bottom).

Per optimizer step: set the LR from the schedule, take `grad_accum_steps` micro-batches, and for each one
compute (under bf16 autocast where the hardware has bf16 arithmetic, see `resolve_precision`)

    loss = Σ CE(next token) / n_targets                 LM loss, token-weighted over the whole step; -100 = no loss
         + indexer_loss_coef * L_I / accum              DSA indexer KL (training/dsa_indexer.py)
         + moe_aux_loss_coef * L_bal / accum            MoE sequence-wise balance loss (training/moe_balance.py)

then clip, step, nudge the MoE router biases, log, evaluate and checkpoint. `dsa_mode` picks the DSA stage:
`dense` (pre-training), `indexer_warmup` (stage 1: only the indexer trains, on L_I), `sparse` (stage 2).
The same loop runs single-process (`LocalEngine`) or under torchrun / deepspeed (`training/distributed.py`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from tqdm.auto import tqdm

from infra.cpu import native_bf16
from training.batch_source import BatchSource
from training.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_model_state,
    save_checkpoint,
    save_model_state,
)
from training.dsa_indexer import collect_dsa_stats, freeze_all_but_indexer, set_dsa_mode
from training.logits import logits_at, predicting_positions, summed_cross_entropy
from training.moe_balance import RouterTaps, expert_loads, sequence_balance_loss, update_router_bias
from training.optim import OptimConfig, build_optimizers, lr_multiplier, set_lr

log = logging.getLogger(__name__)

MetricsCallback = Callable[[int, dict[str, float]], None]


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` -> bf16 where bf16 matmuls run natively, else fp32. On a CPU without AVX512-BF16 / AMX, bf16
    autocast is emulated: measured 8x slower than fp32 per step on the tiny model (AVX2, 1 thread)."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        return "bf16" if native_bf16() else "fp32"
    return "fp32"


class TrainerConfig(BaseModel):
    """One training phase; defaults are the `tiny` profile."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(300, gt=0, description="Optimizer steps in this phase")
    grad_accum_steps: int = Field(1, gt=0, description="Micro-batches per optimizer step")
    grad_clip: float = Field(1.0, ge=0, description="Clip the global gradient norm to this (0 = off)")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="bf16 autocast, plain fp32, or auto: bf16 where the hardware has bf16 arithmetic "
        "(CUDA with bf16, CPUs with AVX512-BF16 or AMX), else fp32",
    )
    dsa_mode: Literal["dense", "indexer_warmup", "sparse", "native", "sparse_gather"] = Field(
        "dense",
        description="DSA stage: dense pre-training, indexer warm-up (stage 1), sparse (stage 2); native / "
        "sparse_gather: the deployed top-k attention (same values and gradients, sparse_gather faster on CPU)",
    )
    indexer_loss_coef: float = Field(1.0, ge=0, description="Weight of the indexer KL loss L_I")
    moe_aux_loss_coef: float = Field(1e-3, ge=0, description="Weight α of the MoE sequence-wise balance loss")
    moe_bias_update_rate: float = Field(1e-3, ge=0, description="Aux-loss-free router bias step per update")
    eval_every: int = Field(100, ge=0, description="Evaluate every N steps (0 = only at the end)")
    eval_at_start: bool = Field(
        False, description="Also evaluate before the first step (the 'at init' numbers)"
    )
    checkpoint_every: int = Field(100, ge=0, description="Checkpoint every N steps (0 = only at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept on disk")
    log_every: int = Field(10, gt=0, description="Report metrics every N steps")
    seed: int = Field(0, description="Seed of this phase's RNG streams")
    progress: bool = Field(True, description="Show a tqdm progress bar (rank 0)")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer and LR schedule")


class TrainingEngine(Protocol):
    """Forward, backward and optimizer step, single-process or distributed."""

    model: nn.Module  # the plain module (hooks, stats, export)
    rank: int
    world_size: int

    def forward(self, **inputs: torch.Tensor) -> Any: ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self, grad_clip: float) -> float: ...

    def param_groups(self) -> list[dict]: ...

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor: ...

    def save_state(self, directory: Path) -> None: ...

    def load_state(self, directory: Path) -> None: ...

    def barrier(self) -> None: ...


class LocalEngine:
    """Single-process training: Muon + AdamW (training/optim.py), global-norm clipping."""

    rank = 0
    world_size = 1

    def __init__(self, model: nn.Module, optim: OptimConfig):
        self.model = model
        self.optimizers = build_optimizers(model, optim)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def forward(self, **inputs: torch.Tensor) -> Any:
        return self.model(**inputs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, grad_clip: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.params, grad_clip if grad_clip > 0 else math.inf)
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        return float(norm)

    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def save_state(self, directory: Path) -> None:
        save_model_state(self.model, directory / "model.safetensors")
        torch.save([opt.state_dict() for opt in self.optimizers], directory / "optimizer.pt")

    def load_state(self, directory: Path) -> None:
        load_model_state(self.model, directory / "model.safetensors")
        for opt, state in zip(
            self.optimizers, torch.load(directory / "optimizer.pt", weights_only=False), strict=True
        ):
            opt.load_state_dict(state)

    def barrier(self) -> None:
        pass


class JsonlMetricsWriter:
    """Metrics callback appending one JSON line per report: {"step": N, "time": t, ...metrics}."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def drop_after(self, step: int) -> None:
        """Forget rows past `step` (a resumed run re-reports the steps after its checkpoint)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line + "\n")
            except (json.JSONDecodeError, KeyError):
                continue  # a line torn by a kill
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(kept))
        tmp.replace(self.path)

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), **metrics}) + "\n")


def count_targets(batch: dict[str, torch.Tensor]) -> int:
    """Positions that carry an LM loss (labels are shifted by one inside the loss)."""
    labels = batch.get("labels", batch["input_ids"])
    return int((labels[:, 1:] != -100).sum())


def prepare_model(model: nn.Module, cfg: TrainerConfig) -> None:
    """Set the DSA mode; stage 1 freezes everything but the indexer (before the optimizer is built)."""
    set_dsa_mode(model, cfg.dsa_mode)
    if cfg.dsa_mode == "indexer_warmup":
        freeze_all_but_indexer(model)
    else:
        for p in model.parameters():
            p.requires_grad_(True)


# Summed over micro-batches (and ranks) between reports; names of the reduced vector's slots.
_SUMS = (
    "lm_sum",
    "targets",
    "indexer_loss",
    "dsa_micro",
    "topk_mass_sum",
    "oracle_mass_sum",
    "long_queries",
    "aux",
    "aux_micro",
)


def _dsa_metrics(s: dict[str, float], prefix: str = "") -> dict[str, float]:
    """indexer_loss, topk_mass (share of dense attention mass in the indexer's top-k) and its ceiling."""
    out = {}
    if s["dsa_micro"]:
        out[f"{prefix}indexer_loss"] = s["indexer_loss"] / s["dsa_micro"]
    if s["long_queries"]:
        out[f"{prefix}topk_mass"] = s["topk_mass_sum"] / s["long_queries"]
        out[f"{prefix}topk_mass_oracle"] = s["oracle_mass_sum"] / s["long_queries"]
    return out


class Trainer:
    """Trains `model` for `cfg.steps` on `batches`, resuming from the newest checkpoint under `run_dir`."""

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainerConfig,
        batches: BatchSource,
        run_dir: Path,
        eval_batches: Iterable[dict[str, torch.Tensor]] | None = None,
        callbacks: Iterable[MetricsCallback] = (),
        engine: Callable[[nn.Module, OptimConfig], TrainingEngine] | None = None,
    ):
        self.cfg = cfg
        self.batches = batches
        self.eval_batches = list(eval_batches) if eval_batches is not None else None
        self.run_dir = Path(run_dir)
        self.checkpoint_dir = self.run_dir / "checkpoints"
        self.callbacks = list(callbacks)
        prepare_model(model, cfg)
        self.engine = (engine or LocalEngine)(model, cfg.optim)
        self.model = self.engine.model
        self.device = next(self.model.parameters()).device  # after the engine placed the model
        self.router_taps = RouterTaps(self.model)
        self.step = 0
        self.tokens_seen = 0
        self.last_metrics: dict[str, float] = {}
        self.trains_main_model = cfg.dsa_mode != "indexer_warmup"
        self.precision = resolve_precision(cfg.precision, self.device)
        log.info("precision: %s (configured %s, device %s)", self.precision, cfg.precision, self.device.type)

    @property
    def is_main(self) -> bool:
        return self.engine.rank == 0

    def autocast(self):
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def loss_terms(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Forward one micro-batch: summed LM loss, indexer stats and the MoE balance loss."""
        inputs = {
            k: batch[k].to(self.device) for k in ("input_ids", "position_ids", "attention_mask") if k in batch
        }
        labels = batch.get("labels", batch["input_ids"]).to(self.device)
        # the head runs only where a target follows: SFT and recall rows train on a few tokens per row
        keep = predicting_positions(labels)
        with logits_at(self.model, keep):
            logits = self.engine.forward(**inputs).logits
        lm_sum = summed_cross_entropy(logits, labels[:, 1:][keep[:, :-1]])
        terms = {"lm_sum": lm_sum, "dsa": collect_dsa_stats(self.model)}
        records = self.router_taps.pop()
        batch_size = batch["input_ids"].shape[0]
        terms["aux"] = (
            torch.stack([sequence_balance_loss(lg, idx, batch_size) for _, lg, idx in records]).mean()
            if records
            else None
        )
        terms["records"] = records
        return terms

    def fit(self) -> dict[str, float]:
        """Train to `cfg.steps` (resuming if a checkpoint exists); returns the final metrics."""
        cfg = self.cfg
        self._resume_or_seed()
        bar = tqdm(
            total=cfg.steps,
            initial=self.step,
            disable=not (cfg.progress and self.is_main),
            unit="step",
            mininterval=0.1 if sys.stderr.isatty() else 10.0,  # a log file gets a line every 10 s, not 10/s
        )
        sums = torch.zeros(len(_SUMS), dtype=torch.float64)
        if cfg.eval_at_start and self.step == 0:
            self._emit(self.evaluate())
        window_start, window_tokens, grad_norm = time.perf_counter(), 0, 0.0
        while self.step < cfg.steps:
            lr = set_lr(self.engine.param_groups(), lr_multiplier(self.step, cfg.steps, cfg.optim))
            micro_batches = [next(self.batches) for _ in range(cfg.grad_accum_steps)]
            n_targets = max(sum(count_targets(b) for b in micro_batches), 1)
            loads: dict = {}
            for batch in micro_batches:
                with self.autocast():
                    terms = self.loss_terms(batch)
                loss = terms["lm_sum"] / n_targets if self.trains_main_model else 0.0
                if terms["dsa"] is not None:
                    loss = loss + cfg.indexer_loss_coef * terms["dsa"]["indexer_loss"] / cfg.grad_accum_steps
                if terms["aux"] is not None and self.trains_main_model and cfg.moe_aux_loss_coef > 0:
                    loss = loss + cfg.moe_aux_loss_coef * terms["aux"] / cfg.grad_accum_steps
                self.engine.backward(loss)
                expert_loads(terms["records"], loads)
                sums += self._micro_sums(terms, batch)
                window_tokens += batch["input_ids"].numel()
            grad_norm = self.engine.step(cfg.grad_clip)
            self._update_router_bias(loads)
            self.step += 1
            self.tokens_seen += sum(b["input_ids"].numel() for b in micro_batches) * self.engine.world_size
            bar.update(1)

            last = self.step == cfg.steps
            if self.step % cfg.log_every == 0 or last:
                elapsed = time.perf_counter() - window_start
                metrics = self._report_metrics(sums, grad_norm, lr, window_tokens, elapsed)
                bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
                self._emit(metrics)
                sums.zero_()
                window_start, window_tokens = time.perf_counter(), 0
            if (cfg.eval_every and self.step % cfg.eval_every == 0) or last:
                self._emit(self.evaluate())
            if (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0) or last:
                self.save()
        bar.close()
        return dict(self.last_metrics)

    def _micro_sums(self, terms: dict, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        row = dict.fromkeys(_SUMS, 0.0)
        row["lm_sum"], row["targets"] = float(terms["lm_sum"].detach()), count_targets(batch)
        if terms["dsa"] is not None:
            dsa = terms["dsa"]
            row["indexer_loss"], row["dsa_micro"] = float(dsa["indexer_loss"].detach()), 1
            for key in ("topk_mass_sum", "oracle_mass_sum", "long_queries"):
                row[key] = float(dsa[key])
        if terms["aux"] is not None:
            row["aux"], row["aux_micro"] = float(terms["aux"].detach()), 1
        return torch.tensor([row[k] for k in _SUMS], dtype=torch.float64)

    def _update_router_bias(self, loads: dict) -> None:
        if not loads:
            return
        routers = list(loads)
        total = self.engine.all_reduce_sum(torch.stack([loads[r] for r in routers]))
        rate = self.cfg.moe_bias_update_rate if self.trains_main_model else 0.0
        self.moe_load_ratio = update_router_bias(dict(zip(routers, total, strict=True)), rate)

    def _report_metrics(self, sums, grad_norm, lr, window_tokens, elapsed) -> dict[str, float]:
        s = dict(zip(_SUMS, self.engine.all_reduce_sum(sums.clone()).tolist(), strict=True))
        metrics = {
            "loss": s["lm_sum"] / max(s["targets"], 1),
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": float(self.tokens_seen),
            "tokens_per_s": window_tokens * self.engine.world_size / max(elapsed, 1e-9),
        }
        metrics.update(_dsa_metrics(s))
        if s["aux_micro"]:
            metrics["moe_aux_loss"] = s["aux"] / s["aux_micro"]
            metrics["moe_load_max_over_mean"] = getattr(self, "moe_load_ratio", float("nan"))
        return metrics

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Token-weighted loss (and DSA top-k mass) on the eval batches, summed over ranks."""
        if not self.eval_batches:
            return {}
        self.model.eval()
        sums = torch.zeros(len(_SUMS), dtype=torch.float64)
        for batch in self.eval_batches:
            with self.autocast():
                terms = self.loss_terms(batch)
            sums += self._micro_sums(terms, batch)
        self.model.train()
        s = dict(zip(_SUMS, self.engine.all_reduce_sum(sums).tolist(), strict=True))
        loss = s["lm_sum"] / max(s["targets"], 1)
        metrics = {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 50.0))}
        metrics.update(_dsa_metrics(s, prefix="eval_"))
        return metrics

    def _emit(self, metrics: dict[str, float]) -> None:
        if not metrics:
            return
        self.last_metrics.update(metrics)
        if self.is_main:
            log.info("step %d %s", self.step, " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
            for callback in self.callbacks:
                callback(self.step, metrics)

    def save(self) -> Path:
        state = {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "dsa_mode": self.cfg.dsa_mode,
            "metrics": self.last_metrics,
            "config": self.cfg.model_dump(),
        }
        return save_checkpoint(
            self.checkpoint_dir,
            self.step,
            self.engine,
            state,
            self.batches.state_dict(),
            self.cfg.keep_checkpoints,
        )

    def _resume_or_seed(self) -> None:
        path = latest_checkpoint(self.checkpoint_dir)
        if path is None:
            torch.manual_seed(self.cfg.seed + self.engine.rank)
            return
        trainer_state, data_state = load_checkpoint(path, self.engine)
        self.batches.load_state_dict(data_state)
        self.step = int(trainer_state["step"])
        self.tokens_seen = int(trainer_state["tokens_seen"])
        self.last_metrics = dict(trainer_state.get("metrics", {}))
        log.info("resumed from %s (step %d)", path, self.step)
