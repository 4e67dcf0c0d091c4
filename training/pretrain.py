"""Pre-training the GLM-5 model in three phases, each a child-process training job (training/job.py):

1. `dense`: LM pre-training from scratch with dense attention (the indexer is not used yet);
2. `indexer_warmup`: DSA stage 1, only the indexer trains, on its KL loss against the dense attention;
3. `sparse`: DSA stage 2, top-k sparse attention, the indexer on L_I over its selection, the rest on the LM loss.

Each phase starts from the previous phase's HF export and resumes from its own checkpoints when rerun.
`run_pretraining` returns a `StageResult` with the final HF dir, per-phase numbers (including the indexer's
top-k attention mass at init and after training) and a loss plot.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from infra.stage import StageResult, markdown_table
from training.data import capped_mixture
from training.distributed import DistributedConfig
from training.job import DataSpec, Launch, TrainJobSpec, read_metrics, run_training_job
from training.model import ModelConfig
from training.trainer import TrainerConfig

log = logging.getLogger(__name__)

PHASES = ("dense", "indexer_warmup", "sparse")

# Per-phase defaults (tiny); a profile's partial phase section is merged onto these.
PHASE_DEFAULTS: dict[str, dict[str, Any]] = {
    "dense": {"steps": 300, "eval_every": 100, "checkpoint_every": 100},
    # GLM-5 warms the indexer up at LR 5e-3 (RECIPE.md); only the indexer's parameters are in the optimizer.
    "indexer_warmup": {
        "steps": 50,
        "eval_every": 0,
        "eval_at_start": True,
        "checkpoint_every": 50,
        "optim": {"optimizer": "adamw", "lr": 5e-3, "warmup_steps": 5, "schedule": "constant"},
    },
    "sparse": {
        "steps": 100,
        "eval_every": 50,
        "checkpoint_every": 50,
        "optim": {"lr": 1e-3, "warmup_steps": 5},
    },
}


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _phase_default(name: str):
    return lambda: TrainerConfig.model_validate({**PHASE_DEFAULTS[name], "dsa_mode": name})


class PretrainConfig(BaseModel):
    """The `pretrain` stage; defaults are the `tiny` profile."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(
        default_factory=ModelConfig, description="Model sizes (vocab set from the tokenizer)"
    )
    seq_len: int = Field(256, gt=1, description="Pre-training context length (tokens)")
    micro_batch_size: int = Field(8, gt=0, description="Sequences per micro-batch and process")
    repeat_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of training rows that repeat a passage after a gap (grows copy heads; 0 = off)",
    )
    # A small source at a large weight is otherwise replayed many times: with the old 600-page crawl, tiny's
    # ~95-document web source (93k tokens, weight 0.5 of a ~0.8M-token run) got ~4.9 passes here and ~8.6 more
    # in midtraining, and held-out web perplexity rose. Four passes of repeated data train about as well as
    # fresh data (Muennighoff et al., 2023, "Scaling Data-Constrained Language Models"); beyond that a source
    # is memorised rather than learned. Now it holds the one rescued knowledge document to 4 passes.
    max_source_epochs: float | None = Field(
        4.0,
        gt=0,
        description="Cap on the passes over any one source's train tokens in pretraining; what a capped source "
        "gives up goes to the others by their weights (None = the mixture's weights as they are)",
    )
    dense: TrainerConfig = Field(default_factory=_phase_default("dense"), description="Phase 1: dense LM")
    indexer_warmup: TrainerConfig = Field(
        default_factory=_phase_default("indexer_warmup"), description="Phase 2: DSA indexer warm-up"
    )
    sparse: TrainerConfig = Field(default_factory=_phase_default("sparse"), description="Phase 3: sparse DSA")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="Launch settings")

    @field_validator(*PHASES, mode="before")
    @classmethod
    def _phase_defaults(cls, value: Any, info) -> Any:
        if isinstance(value, dict):  # partial YAML section: fill in this phase's defaults, fix its DSA mode
            return {**_merge(PHASE_DEFAULTS[info.field_name], value), "dsa_mode": info.field_name}
        return value


def trained_tokens(cfg: PretrainConfig) -> int:
    """Tokens the language model trains on: the dense and sparse phases (the indexer warm-up trains the
    indexer only), over all processes."""
    steps = sum(getattr(cfg, p).steps * getattr(cfg, p).grad_accum_steps for p in ("dense", "sparse"))
    return steps * cfg.micro_batch_size * cfg.seq_len * cfg.distributed.nproc


def pretrain_mixture(
    cfg: PretrainConfig, weights: Mapping[str, float], tokens: Mapping[str, int]
) -> tuple[dict[str, float], dict[str, float]]:
    """The weights pretraining draws sources with (the mixture's, capped at `max_source_epochs` passes per
    source) and their metrics: `mixture_pretrain/<source>` and `source_epochs/<source>`."""
    return capped_mixture(weights, tokens, trained_tokens(cfg), cfg.max_source_epochs, "pretrain")


def phase_spec(
    cfg: PretrainConfig,
    phase: str,
    run_root: Path,
    data: DataSpec,
    eval_data: DataSpec | None,
    init_from: str | None,
    extra_files: dict[str, str] | None = None,
    callbacks: list[str] | None = None,
) -> TrainJobSpec:
    """The job spec of one phase: batch shape injected into the data factories' kwargs."""
    shape = {"seq_len": cfg.seq_len, "batch_size": cfg.micro_batch_size}
    return TrainJobSpec(
        run_dir=str(Path(run_root) / phase),
        model=cfg.model,
        init_from=init_from,
        trainer=getattr(cfg, phase),
        data=DataSpec(factory=data.factory, kwargs={**data.kwargs, **shape}),
        eval_data=DataSpec(factory=eval_data.factory, kwargs={**eval_data.kwargs, **shape})
        if eval_data
        else None,
        distributed=cfg.distributed,
        extra_files=extra_files or {},
        callbacks=callbacks or [],
    )


def _finished(spec: TrainJobSpec) -> dict | None:
    """The phase's result if it already ran to completion with exactly this spec."""
    run_dir = Path(spec.run_dir)
    spec_path, result_path = run_dir / "spec.json", run_dir / "result.json"
    if not (spec_path.exists() and result_path.exists()):
        return None
    if TrainJobSpec.model_validate_json(spec_path.read_text()) != spec:
        return None
    result = json.loads(result_path.read_text())
    return result if result.get("step") == spec.trainer.steps else None


def run_pretraining(
    cfg: PretrainConfig,
    run_root: Path,
    data: DataSpec,
    eval_data: DataSpec | None = None,
    extra_files: dict[str, str] | None = None,
    torch_extensions_dir: Path | None = None,
    callbacks: list[str] | None = None,
    launch: Launch | None = None,
) -> StageResult:
    """Run the three phases (skipping finished ones); raises `infra.launcher.LaunchError` if a phase fails.
    `launch` runs each phase's command (default: a plain subprocess; the asset layer passes Dagster Pipes)."""
    run_root = Path(run_root)
    init_from, rows, results = None, [], {}
    for phase in PHASES:
        spec = phase_spec(cfg, phase, run_root, data, eval_data, init_from, extra_files, callbacks)
        result = _finished(spec)
        if result is None:
            log.info("pretrain phase %s: %d steps (%s)", phase, spec.trainer.steps, spec.trainer.dsa_mode)
            result = run_training_job(spec, torch_extensions_dir, launch)
        results[phase] = result
        init_from = result["hf_dir"]
        m = result["metrics"]
        rows.append(
            {
                "phase": phase,
                "steps": result["step"],
                "tokens": result["tokens"],
                "loss": round(m.get("loss", float("nan")), 4),
                "eval_loss": round(m.get("eval_loss", float("nan")), 4),
                "topk_mass": round(m.get("eval_topk_mass", m.get("topk_mass", float("nan"))), 4),
                "tokens_per_s": round(m.get("tokens_per_s", 0.0)),
            }
        )
    metrics = _stage_metrics(run_root, results)
    plot = plot_losses(run_root, run_root / "pretrain_loss.png")
    artifacts = {f"metrics/{p}.jsonl": run_root / p / "metrics.jsonl" for p in PHASES}
    artifacts["plots/pretrain_loss.png"] = plot
    report = "## Pre-training\n\n" + markdown_table(rows)
    report += (
        f"\n\nDSA indexer: top-k share of the main attention mass {metrics.get('topk_mass_init', float('nan')):.3f}"
        f" at init -> {metrics.get('topk_mass_after_warmup', float('nan')):.3f} after warm-up ->"
        f" {metrics.get('topk_mass_final', float('nan')):.3f} after sparse training.\n"
    )
    return StageResult(
        metrics=metrics,
        outputs={"hf_dir": results["sparse"]["hf_dir"]},
        report_md=report,
        artifacts=artifacts,
        data_version=results["sparse"]["weights_digest"],
        history=[
            {"step": r["step"], **{f"{p}/{k}": v for k, v in r.items() if k not in ("step", "time")}}
            for p in PHASES
            for r in read_metrics(run_root / p)
        ],
        extra={"phases": results},
    )


def _stage_metrics(run_root: Path, results: dict[str, dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    counts = results["sparse"]["parameters"]
    out.update({f"params_{k}": float(v) for k, v in counts.items()})
    for phase, result in results.items():
        for key in (
            "loss",
            "eval_loss",
            "tokens_per_s",
            "eval_topk_mass",
            "eval_topk_mass_oracle",
            "indexer_loss",
            "eval_indexer_loss",
        ):
            if key in result["metrics"]:
                out[f"{phase}/{key}"] = float(result["metrics"][key])
        out[f"{phase}/tokens"] = float(result["tokens"])
    start = [r for r in read_metrics(run_root / "indexer_warmup") if r["step"] == 0 and "eval_topk_mass" in r]
    if start:
        out["topk_mass_init"] = float(start[0]["eval_topk_mass"])
    for name, phase in (("topk_mass_after_warmup", "indexer_warmup"), ("topk_mass_final", "sparse")):
        m = results[phase]["metrics"]
        if "eval_topk_mass" in m or "topk_mass" in m:
            out[name] = float(m.get("eval_topk_mass", m.get("topk_mass")))
    return out


def plot_losses(run_root: Path, out_path: Path) -> Path:
    """Training (and eval) loss of all phases on one step axis; the indexer KL on a second panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lm, ax_idx) = plt.subplots(1, 2, figsize=(10, 3.5))
    offset = 0
    for phase in PHASES:
        rows = read_metrics(Path(run_root) / phase)
        train = [(offset + r["step"], r["loss"]) for r in rows if "loss" in r]
        evals = [(offset + r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
        kl = [(offset + r["step"], r["indexer_loss"]) for r in rows if "indexer_loss" in r]
        if train:
            ax_lm.plot(*zip(*train, strict=True), label=f"{phase} train")
        if evals:
            ax_lm.plot(*zip(*evals, strict=True), "o--", label=f"{phase} eval")
        if kl:
            ax_idx.plot(*zip(*kl, strict=True), label=phase)
        offset += max((r["step"] for r in rows), default=0)
    ax_lm.set(xlabel="step", ylabel="LM loss", title="LM loss")
    ax_idx.set(xlabel="step", ylabel="KL", title="DSA indexer loss L_I")
    ax_lm.legend(fontsize=7)
    ax_idx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
