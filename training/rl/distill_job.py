"""One on-policy distillation job (the child process of `distilled_checkpoint`): load the student and its
teachers, read each teacher's prompt set, distil, export the checkpoint.
`python -m training.rl.distill_job --spec <run_dir>/distill_spec.json`; writes `<run_dir>/metrics.jsonl`,
`<run_dir>/samples.json`, the HF export `<run_dir>/hf/` and `<run_dir>/result.json`; every `checkpoint_every`
steps a checkpoint under `<run_dir>/checkpoints/`, which a rerun of the same spec (a killed job) resumes."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.child_job import child_command, child_main, load_policy, metrics_logger, run_child, write_result
from training.model import ModelConfig
from training.rl.distill import DistillConfig

log = logging.getLogger(__name__)
SPEC = "distill_spec.json"


class DistillJobSpec(BaseModel):
    """A distillation job for the child process (paths only: it crosses a process boundary)."""

    model_config = ConfigDict(extra="forbid")
    run_dir: str
    init_from: str = Field(
        description="HF dir of the student's starting checkpoint (with its tokenizer files)"
    )
    model: ModelConfig
    teachers: dict[str, str] = Field(description="Teacher name -> HF dir of that stage's final checkpoint")
    teacher_tasks: dict[str, str] = Field(
        description="Teacher name -> JSONL of its own training prompts (Task rows) the student answers"
    )
    heldout_tasks: str | None = Field(
        None, description="JSONL of held-out tasks: greedy pass@1 of the verifiable domains, before and after"
    )
    teacher_heldout: dict[str, str] = Field(
        default_factory=dict,
        description="Teacher name -> JSONL of held-out prompts for greedy agreement and exact reverse KL",
    )
    facts: str | None = Field(None, description="JSONL of [term, definition] for the knowledge suite")
    agentic_facts: str | None = Field(
        None,
        description="facts.json of the agentic tasks (search documents); agentic families run in process",
    )
    config: DistillConfig
    threads: int | None = Field(None, description="torch threads in the child (None = torch's default)")
    callbacks: list[str] = Field(default_factory=list)


def distill_command(spec: DistillJobSpec, torch_extensions_dir: Path | None = None):
    return child_command(
        spec, "training.rl.distill_job", Path(spec.run_dir), SPEC, torch_extensions_dir, spec.threads or 0
    )


def run_distill_job(
    spec: DistillJobSpec, torch_extensions_dir: Path | None = None, launch: Any = None
) -> dict:
    """Run the job as a child process (through `launch`, the asset's Pipes launcher, when given)."""
    return run_child(distill_command(spec, torch_extensions_dir), Path(spec.run_dir), launch, "distillation")


def _check(spec: DistillJobSpec) -> None:
    if not spec.teachers:
        raise ValueError(
            "distillation spec: no teachers; give teachers = {name: HF dir of a stage checkpoint}"
        )
    missing = sorted(set(spec.teachers) - set(spec.teacher_tasks))
    if missing:
        raise ValueError(
            f"distillation spec: teacher(s) {missing} have no teacher_tasks JSONL (their prompt set)"
        )
    for name, path in {**spec.teachers, **spec.teacher_tasks}.items():
        if not Path(path).exists():
            raise FileNotFoundError(f"distillation spec: {name}: {path} does not exist")


def distill_job_fingerprint(spec: DistillJobSpec) -> str:
    """What decides a distillation job's result: its settings and the bytes of the student's start, the
    teachers and every prompt set (how it reports does not). A checkpoint of another fingerprint is never
    resumed."""
    from training.job import job_key
    from training.rl.loop import input_digest

    settings = spec.model_dump(mode="json", exclude={"run_dir", "callbacks", "threads"})
    paths = [spec.init_from, *spec.teachers.values(), *spec.teacher_tasks.values(), spec.heldout_tasks,
             *spec.teacher_heldout.values(), spec.facts, spec.agentic_facts]  # fmt: skip
    return job_key(settings, *[input_digest(p) for p in paths])


def _run(spec: DistillJobSpec) -> dict[str, Any]:
    from training.agentic.families import agentic_suites
    from training.checkpoint import export_hf
    from training.model import load_model
    from training.rl.distill import train_distill
    from training.rl.loop import resume_step, saved_trainer_state
    from training.tasks.suites import eval_subset, read_facts, read_tasks, suites

    _check(spec)
    run_dir, cfg = Path(spec.run_dir), spec.config
    tok, model = load_policy(spec.init_from, spec.model, spec.threads)
    teachers = {name: load_model(path, spec.model).eval() for name, path in spec.teachers.items()}
    prompts = {name: read_tasks(Path(spec.teacher_tasks[name])) for name in spec.teachers}
    facts = read_facts(spec.facts)
    registry = suites(facts)
    environments: dict[str, Any] = {}
    domains = {t.domain for tasks in prompts.values() for t in tasks}
    if spec.agentic_facts:
        agentic_facts = [tuple(f) for f in json.loads(Path(spec.agentic_facts).read_text())]
        environments = {d: s for d, s in agentic_suites(agentic_facts).items() if d in domains}
    heldout = (
        eval_subset(read_tasks(Path(spec.heldout_tasks)), cfg.eval_tasks_per_domain)
        if spec.heldout_tasks
        else []
    )
    teacher_heldout = {n: read_tasks(Path(p)) for n, p in spec.teacher_heldout.items()}
    checkpoints = run_dir / "checkpoints"
    log_metrics = metrics_logger(run_dir, spec, spec.callbacks, resume_after=resume_step(checkpoints))
    samples: dict[str, Any] = {}
    # the parent's scores: the step-0 evaluation, logged now or (a resumed run) kept in the checkpoint
    initial = saved_trainer_state(checkpoints).get("initial", {})
    first: dict[str, float] = {f"heldout/{k}": v for k, v in initial.items()}

    def logged(metrics: dict[str, float], step: int) -> None:
        if step == 0:
            first.update(metrics)
        log_metrics(metrics, step)

    final = train_distill(
        model, tok, teachers, prompts, cfg, logged, suites=registry, environments=environments,
        heldout_prompts=teacher_heldout, heldout_tasks=heldout,
        on_sample=lambda trajs, step: samples.__setitem__(str(step), [t.to_json() for t in trajs]),
        checkpoint_dir=checkpoints, job=distill_job_fingerprint(spec),
    )  # fmt: skip
    (run_dir / "samples.json").write_text(json.dumps(samples))
    extra = {n: Path(spec.init_from) / n for n in ("tokenizer.json", "tokenizer_config.json")}
    hf = export_hf(model, run_dir / "hf", extra)
    parent = {k.replace("heldout/", "parent/", 1): v for k, v in first.items()}
    result = {"metrics": {**final, **parent}, "hf_dir": str(hf), "step": cfg.steps, "teachers": spec.teachers}
    write_result(run_dir, result)
    return result


def main(argv: list[str] | None = None) -> int:
    return child_main(argv, DistillJobSpec, _run, "Run one on-policy distillation job from its spec")


if __name__ == "__main__":
    sys.exit(main())
