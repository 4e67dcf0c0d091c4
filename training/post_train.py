"""Post-training jobs as child processes, the way pre/midtraining run: SFT reuses the trainer
(`training.launch_entry` with the SFT data factory), Reasoning RL has its own entry
(`python -m training.post_train --spec <run_dir>/rl_spec.json`).

Each job writes `<run_dir>/metrics.jsonl`, the HF export `<run_dir>/hf/` and `<run_dir>/result.json`."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.child_job import child_command, child_main, load_policy, metrics_logger, run_child, write_result
from training.distributed import DistributedConfig
from training.job import DataSpec, Launch, TrainJobSpec, run_training_job
from training.model import ModelConfig
from training.optim import OptimConfig
from training.rl.reasoning import ReasoningRLConfig
from training.trainer import TrainerConfig

log = logging.getLogger(__name__)
RL_SPEC = "rl_spec.json"


class SftConfig(BaseModel):
    """The `sft` stage (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, description="Seed of the row order")
    seq_len: int = Field(256, gt=8, description="Longest SFT row (tokens); longer rows are cut")
    batch_size: int = Field(16, gt=0, description="Rows per step")
    pack: bool = Field(
        True,
        description="Pack each step's rows into as few rows of seq_len as hold them (same loss and gradients, "
        "without computing padding); false = pad each row to the step's longest",
    )
    trainer: TrainerConfig = Field(
        default_factory=lambda: TrainerConfig(
            # Copying names and numbers from the context is learned late in SFT (held-out, from base_checkpoint):
            # 400 steps codefix 2/20, terminal 0/20; 800 steps codefix 0.07, terminal 0.07, tool 0.31; 1,600 steps
            # codefix 0.50, terminal 0.49 (1,840 with the math drill: tool 0.92). Dev scores: chosen on held-out.
            # 3,000 since agentic_tasks' sft_per_level went 100 -> 400: 5,500 rows instead of 3,000, the same
            # passes over the reasoning rows (at 1,600 steps with the larger set, held-out code 0.755 -> 0.645).
            # Kept at 3,000 when sft_per_level went 400 -> 1,000 (11,100 rows): SFT's held-out code fell 0.78 ->
            # 0.65, but after Reasoning RL it is 0.83 against 0.85 (2026-12-04, one chain each).
            steps=3000,
            dsa_mode="sparse_gather",  # native's attention and gradients, ~2-3x faster on CPU
            precision="fp32",
            eval_every=0,
            checkpoint_every=100,
            log_every=10,
            moe_aux_loss_coef=0.0,
            optim=OptimConfig(
                optimizer="adamw", lr=1e-3, weight_decay=0.0, schedule="cosine", warmup_steps=20
            ),
        ),
        description="Loop and optimizer of the SFT phase",
    )


def sft_spec(
    cfg: SftConfig,
    parent_dir: Path,
    model_cfg: ModelConfig,
    rows_path: Path,
    tokenizer_dir: Path,
    run_dir: Path,
    distributed: DistributedConfig,
    callbacks: list[str] | None = None,
) -> TrainJobSpec:
    data = DataSpec(
        factory="training.sft:sft_batches_from_file",
        kwargs={
            "rows_path": str(rows_path),
            "tokenizer_dir": str(tokenizer_dir),
            "batch_size": cfg.batch_size,
            "seq_len": cfg.seq_len,
            "seed": cfg.seed,
            "pack": cfg.pack,
        },
    )
    extra = {n: str(tokenizer_dir / n) for n in ("tokenizer.json", "tokenizer_config.json")}
    return TrainJobSpec(
        run_dir=str(run_dir),
        model=model_cfg,
        init_from=str(parent_dir),
        trainer=cfg.trainer,
        data=data,
        distributed=distributed,
        extra_files=extra,
        callbacks=callbacks or [],
    )


def run_sft(
    spec: TrainJobSpec, torch_extensions_dir: Path | None = None, launch: Launch | None = None
) -> dict:
    return run_training_job(spec, torch_extensions_dir, launch)


class RLJobSpec(BaseModel):
    """A Reasoning RL job for the child process."""

    model_config = ConfigDict(extra="forbid")
    run_dir: str
    init_from: str = Field(description="HF dir of the parent checkpoint (with its tokenizer files)")
    model: ModelConfig
    train_tasks: str = Field(description="JSONL of train tasks")
    heldout_tasks: str = Field(description="JSONL of held-out tasks")
    test_tasks: str | None = Field(
        None, description="JSONL of the test tasks, scored once at the end for the policy and its parent"
    )
    rl_pool_tasks: str | None = Field(
        None, description="JSONL of RL-only train tasks (task_suites' rl_pool), drawn from with train's"
    )
    facts: str | None = Field(None, description="JSONL of [term, definition] for the knowledge suite")
    config: ReasoningRLConfig
    threads: int | None = Field(None, description="torch threads in the child (None = torch's default)")
    compare: dict[str, str] = Field(
        default_factory=dict,
        description="Other checkpoints (name -> HF dir) scored on the same held-out tasks",
    )
    callbacks: list[str] = Field(default_factory=list)


def rl_command(spec: RLJobSpec, torch_extensions_dir: Path | None = None):
    return child_command(
        spec, "training.post_train", Path(spec.run_dir), RL_SPEC, torch_extensions_dir, spec.threads or 0
    )


def run_rl_job(
    spec: RLJobSpec, torch_extensions_dir: Path | None = None, launch: Launch | None = None
) -> dict:
    return run_child(rl_command(spec, torch_extensions_dir), Path(spec.run_dir), launch, "Reasoning RL")


def _run_rl(spec: RLJobSpec) -> dict[str, Any]:
    from training.checkpoint import export_hf
    from training.model import load_model
    from training.tasks.suites import eval_subset, read_facts, read_tasks, suites

    run_dir = Path(spec.run_dir)
    tok, model = load_policy(spec.init_from, spec.model, spec.threads)
    facts = read_facts(spec.facts)
    from training.rl.reasoning import resume_step

    checkpoints = run_dir / "checkpoints"
    log_metrics = metrics_logger(run_dir, spec, spec.callbacks, resume_after=resume_step(checkpoints))

    samples: dict[str, Any] = {}

    def on_sample(trajs, step: int) -> None:
        samples[str(step)] = [t.to_json() for t in trajs]

    from training.rl.reasoning import missed, train_reasoning_rl

    def on_eval(trajs, step: int) -> None:  # the held-out tasks the parent and the result fail, to read
        if step in (0, spec.config.steps):
            samples[f"heldout_misses/{step}"] = missed(trajs)

    cfg = spec.config
    scored = eval_subset(read_tasks(Path(spec.heldout_tasks)), cfg.eval_tasks_per_domain, cfg.eval_tasks_for)
    from training.rl.reasoning import pass_at_1
    from training.rollout.engine import LocalRolloutEngine

    registry = suites(facts)
    for name, path in spec.compare.items():  # e.g. the midtrained parent of SFT, on the same tasks
        other = LocalRolloutEngine(load_model(path, spec.model), pad_id=tok.pad_token_id)
        scores = pass_at_1(other, tok, scored, registry, spec.config.max_new_tokens, spec.config.max_turns)
        log_metrics({f"compare/{name}/{k}": v for k, v in scores.items()}, 0)
        samples[f"compare/{name}"] = scores
    train = read_tasks(Path(spec.train_tasks))
    pool = read_tasks(Path(spec.rl_pool_tasks)) if spec.rl_pool_tasks else []
    log_metrics({"tasks/train": float(len(train)), "tasks/rl_pool": float(len(pool))}, 0)
    train += pool
    final = train_reasoning_rl(
        model, tok, train, scored, registry, spec.config, log_metrics,
        on_sample=on_sample, checkpoint_dir=checkpoints, on_eval=on_eval,
    )  # fmt: skip
    (run_dir / "samples.json").write_text(json.dumps(samples))
    tested = _score_test(spec, model, tok, registry)
    log_metrics(tested, spec.config.steps)
    extra = {n: Path(spec.init_from) / n for n in ("tokenizer.json", "tokenizer_config.json")}
    hf = export_hf(model, run_dir / "hf", extra)
    compared = {f"compare/{n}/{k}": v for n in spec.compare for k, v in samples[f"compare/{n}"].items()}
    result = {"metrics": {**final, **compared, **tested}, "hf_dir": str(hf), "step": spec.config.steps}
    write_result(run_dir, result)
    return result


def _score_test(spec: RLJobSpec, model, tok, registry) -> dict[str, float]:
    """The test set, once, after training: the policy and its parent (`spec.init_from`)."""
    from training.model import load_model
    from training.rl.frozen_test import score_test_set
    from training.rl.reasoning import evaluation_engine
    from training.rollout.engine import LocalRolloutEngine, engine_dtype
    from training.rollout.sharded import close_engine
    from training.tasks.suites import read_tasks

    if not spec.test_tasks:
        return {}
    tasks = read_tasks(Path(spec.test_tasks))
    dtype = engine_dtype(spec.config.engine_dtype, next(model.parameters()).device)  # as the RL engine's
    policy = evaluation_engine(LocalRolloutEngine(model, dtype=dtype, pad_id=tok.pad_token_id), spec.config)
    parent = LocalRolloutEngine(load_model(spec.init_from, spec.model), dtype=dtype, pad_id=tok.pad_token_id)
    parent = evaluation_engine(parent, spec.config)
    try:
        return score_test_set(policy, parent, tok, tasks, registry, spec.config)
    finally:
        close_engine(policy)
        close_engine(parent)


def main(argv: list[str] | None = None) -> int:
    return child_main(argv, RLJobSpec, _run_rl, "Run one Reasoning RL job from its spec")


if __name__ == "__main__":
    sys.exit(main())
