"""General RL jobs as child processes, the way Reasoning RL runs (training/post_train.py): the asset writes a
JSON spec and runs

    python -m training.rl.general_job orm --spec <run_dir>/orm_spec.json   # the outcome reward model
    python -m training.rl.general_job rl  --spec <run_dir>/general_spec.json # the General RL loop

Each job writes `<run_dir>/metrics.jsonl` and `<run_dir>/result.json` (metrics, and `orm_dir` or `hf_dir`). The
General RL job checkpoints under `<run_dir>/checkpoints/` every `checkpoint_every` steps; rerun with the same
spec (a killed job), it resumes after the newest checkpoint."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from classifiers.judge.client import JudgeClientConfig
from classifiers.judge.judge_config import JudgeConfig
from training.child_job import child_command, load_policy, metrics_logger, run_child, write_result
from training.job import Launch
from training.model import ModelConfig
from training.rewards.hybrid import HybridRewardConfig
from training.rewards.orm import ORMConfig
from training.rl.general import GeneralRLConfig

log = logging.getLogger(__name__)
ORM_SPEC, GENERAL_SPEC = "orm_spec.json", "general_spec.json"


class GeneralRLStageConfig(GeneralRLConfig):
    """The `general_rl` stage: the loop's settings, the hybrid reward's weights and the GRM's judge."""

    reward: HybridRewardConfig = Field(
        default_factory=HybridRewardConfig, description="Per-component weights per objective dimension"
    )
    judge: JudgeConfig | None = Field(
        # local_threads None: the GRM runs between the policy's steps, never beside them, so it takes the
        # training process's threads (all cores) instead of the data-side judge's one
        default_factory=lambda: JudgeConfig(
            local_threads=None, client=JudgeClientConfig(show_progress=False, max_calls=4000)
        ),
        description="Judge of the GRM component (local SmolLM2 or an endpoint; client.max_calls is its budget); "
        "None = no GRM (then give grm no weight)",
    )

    def loop_config(self) -> GeneralRLConfig:
        return GeneralRLConfig.model_validate(self.model_dump(include=set(GeneralRLConfig.model_fields)))


class ORMJobSpec(BaseModel):
    """An outcome reward model training job for the child process."""

    model_config = ConfigDict(extra="forbid")
    run_dir: str
    tokenizer_dir: str = Field(
        description="Dir with tokenizer.json (the policy's, so the ORM reads its tokens)"
    )
    train_prompts: str = Field(description="JSONL of train General RL prompts (tasks with meta)")
    heldout_prompts: str = Field(description="JSONL of held-out General RL prompts")
    config: ORMConfig
    threads: int | None = Field(None, description="torch threads in the child (None = torch's default)")
    callbacks: list[str] = Field(default_factory=list)


class GeneralRLJobSpec(BaseModel):
    """A General RL job for the child process."""

    model_config = ConfigDict(extra="forbid")
    run_dir: str
    init_from: str = Field(description="HF dir of the parent checkpoint (with its tokenizer files)")
    model: ModelConfig
    train_prompts: str = Field(description="JSONL of train General RL prompts")
    heldout_prompts: str = Field(description="JSONL of held-out General RL prompts")
    facts: str | None = Field(None, description="JSONL of [term, definition] for the knowledge verifier")
    config: GeneralRLConfig
    reward: HybridRewardConfig
    orm_dir: str | None = Field(None, description="Trained outcome reward model (None = no ORM component)")
    judge: JudgeConfig | None = Field(None, description="Judge of the GRM component (None = no GRM)")
    judge_cache_dir: str | None = Field(None, description="Local store of the judge cache (default: run_dir)")
    lid_model: str | None = Field(None, description="lid.176 model file (None = no language component)")
    threads: int | None = Field(None, description="torch threads in the child (None = torch's default)")
    compare: dict[str, str] = Field(
        default_factory=dict,
        description="Other checkpoints (name -> HF dir) scored on the same held-out prompts",
    )
    callbacks: list[str] = Field(default_factory=list)


def job_command(kind: str, spec: ORMJobSpec | GeneralRLJobSpec, torch_extensions_dir: Path | None = None):
    name = ORM_SPEC if kind == "orm" else GENERAL_SPEC
    return child_command(
        spec,
        "training.rl.general_job",
        Path(spec.run_dir),
        name,
        torch_extensions_dir,
        spec.threads or 0,
        (kind,),
    )


def _run_child(kind: str, spec, torch_extensions_dir: Path | None, launch: Launch | None) -> dict:
    return run_child(job_command(kind, spec, torch_extensions_dir), Path(spec.run_dir), launch, kind)


def run_orm_job(
    spec: ORMJobSpec, torch_extensions_dir: Path | None = None, launch: Launch | None = None
) -> dict:
    """Train the ORM in a child process; returns {"metrics": ..., "orm_dir": ...}."""
    return _run_child("orm", spec, torch_extensions_dir, launch)


def run_general_rl_job(
    spec: GeneralRLJobSpec, torch_extensions_dir: Path | None = None, launch: Launch | None = None
) -> dict:
    """Run General RL in a child process; returns {"metrics": ..., "hf_dir": ..., "step": ...}."""
    return _run_child("rl", spec, torch_extensions_dir, launch)


def _callbacks(spec, run_dir: Path):
    return metrics_logger(run_dir, spec, spec.callbacks)


def _run_orm(spec: ORMJobSpec) -> dict[str, Any]:
    import torch

    from training.rewards.orm import preference_pairs, train_orm
    from training.tasks.suites import read_tasks
    from training.tokenizer import load_tokenizer

    run_dir = Path(spec.run_dir)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    prompts = {
        "train": read_tasks(Path(spec.train_prompts)),
        "heldout": read_tasks(Path(spec.heldout_prompts)),
    }
    pairs = preference_pairs(prompts, spec.config.seed)
    orm, metrics = train_orm(
        pairs, load_tokenizer(spec.tokenizer_dir), spec.config, _callbacks(spec, run_dir)
    )
    out = orm.save(run_dir / "orm")
    metrics |= {
        "train/pairs": float(len(pairs["train"])),
        "heldout/pairs_total": float(len(pairs["heldout"])),
    }
    result = {"metrics": metrics, "orm_dir": str(out)}
    write_result(run_dir, result)
    return result


def build_reward(
    reward: HybridRewardConfig,
    facts: list[tuple[str, str]],
    orm_dir: str | Path | None = None,
    judge: JudgeConfig | None = None,
    judge_cache_dir: str | Path | None = None,
    lid_model: str | Path | None = None,
):
    """The hybrid reward `reward` configures; only the models its weights use are loaded (the results table
    builds the same reward for `general.general_scorer`)."""
    from infra.store import LocalStore
    from training.rewards.exemplars import ExemplarStyle
    from training.rewards.grm import build_grm
    from training.rewards.hybrid import HybridReward
    from training.rewards.orm import ORM
    from training.rewards.rules import LanguageId
    from training.tasks.suites import suites

    used = reward.used_components()
    grm = None
    if judge is not None and "grm" in used:
        if judge_cache_dir is None:
            raise ValueError("build_reward: a GRM needs judge_cache_dir (where the judge cache lives)")
        grm = build_grm(judge, LocalStore(Path(judge_cache_dir)))
    return HybridReward(
        reward,
        lid=LanguageId(lid_model) if lid_model and "language" in used else None,
        orm=ORM.load(Path(orm_dir)) if orm_dir and "orm" in used else None,
        grm=grm,
        exemplars=ExemplarStyle() if "exemplar" in used else None,
        suites={d: s for d, s in suites(facts).items() if d in ("math", "knowledge")},
    )


def general_job_fingerprint(spec: GeneralRLJobSpec) -> str:
    """What decides a General RL job's result: its settings and the bytes of its parent and inputs (how it
    reports, where the judge cache lives and what it compares with do not). A checkpoint of another
    fingerprint is never resumed."""
    from training.job import job_key
    from training.rl.loop import input_digest

    settings = spec.model_dump(
        mode="json", exclude={"run_dir", "callbacks", "threads", "judge_cache_dir", "compare"}
    )
    paths = (spec.init_from, spec.train_prompts, spec.heldout_prompts, spec.facts, spec.orm_dir)
    return job_key(settings, *[input_digest(p) for p in paths])


def _run_general(spec: GeneralRLJobSpec) -> dict[str, Any]:
    from training.checkpoint import export_hf
    from training.model import load_model
    from training.rl.general import evaluate_general, heldout_subset, train_general_rl
    from training.rl.loop import resume_step
    from training.rollout.engine import LocalRolloutEngine
    from training.tasks.suites import read_facts, read_tasks

    run_dir = Path(spec.run_dir)
    tok, model = load_policy(spec.init_from, spec.model, spec.threads)
    facts = read_facts(spec.facts)
    cache = spec.judge_cache_dir or run_dir / "judge_cache"
    reward = build_reward(spec.reward, facts, spec.orm_dir, spec.judge, cache, spec.lid_model)
    checkpoints = run_dir / "checkpoints"
    resumed = resume_step(checkpoints)
    log_metrics = metrics_logger(run_dir, spec, spec.callbacks, resume_after=resumed)
    heldout = heldout_subset(read_tasks(Path(spec.heldout_prompts)), spec.config.eval_prompts)
    samples: dict[str, Any] = {}
    for name, path in spec.compare.items():  # e.g. the parent (agentic_rl_distilled), on the same prompts
        other = LocalRolloutEngine(load_model(path, spec.model), pad_id=tok.pad_token_id)
        scores = evaluate_general(other, tok, heldout, reward, spec.config.max_new_tokens)
        if not resumed:  # a resumed run logged them at step 0 already
            log_metrics({f"compare/{name}/{k}": v for k, v in scores.items()}, 0)
        samples[f"compare/{name}"] = scores

    def on_sample(trajs, step: int) -> None:
        samples[str(step)] = [t.to_json() for t in trajs]

    final = train_general_rl(
        model, tok, read_tasks(Path(spec.train_prompts)), heldout, reward, spec.config, log_metrics,
        on_sample=on_sample, checkpoint_dir=checkpoints, job=general_job_fingerprint(spec),
    )  # fmt: skip
    (run_dir / "samples.json").write_text(json.dumps(samples))
    extra = {n: Path(spec.init_from) / n for n in ("tokenizer.json", "tokenizer_config.json")}
    hf = export_hf(model, run_dir / "hf", extra)
    compared = {f"compare/{n}/{k}": v for n in spec.compare for k, v in samples[f"compare/{n}"].items()}
    result = {"metrics": {**final, **compared}, "hf_dir": str(hf), "step": spec.config.steps}
    write_result(run_dir, result)
    return result


def build_general_scorer(
    reward: HybridRewardConfig,
    facts: list[tuple[str, str]],
    orm_dir: str | None,
    judge: JudgeConfig | None,
    judge_cache_dir: str | None,
    lid_model: str | None,
    prompts: list,
    max_new_tokens: int,
):
    """The results table's general-reward scorer (`general.general_scorer` on `build_reward`), from plain
    values: a partial of this is what a scoring process receives and builds once."""
    from training.rl.general import general_scorer

    hybrid = build_reward(reward, facts, orm_dir, judge, judge_cache_dir, lid_model)
    return general_scorer(hybrid, prompts, max_new_tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one General RL job (orm | rl) from its spec")
    parser.add_argument("kind", choices=["orm", "rl"])
    parser.add_argument("--spec", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    from training.child_job import run_once

    text = args.spec.read_text()
    if args.kind == "orm":
        run_once(ORMJobSpec.model_validate_json(text), _run_orm)
    else:
        run_once(GeneralRLJobSpec.model_validate_json(text), _run_general)
    return 0


if __name__ == "__main__":
    sys.exit(main())
