"""On-policy cross-stage distillation after every RL stage and as the final stage (docs/recipe.md): the
student starts from an RL stage's checkpoint and the final checkpoints of that stage and of every earlier
one teach it on prompts from their own training sets. `reasoning_rl_distilled` and `agentic_rl_distilled`
are what the next RL stage starts from; `distilled_checkpoint` (after General RL) is the chain's last. Each
checkpoint's lineage names its parent and every teacher."""

import shutil
from dataclasses import dataclass
from pathlib import Path

from assets.factory import Launches, tracked_asset
from assets.pipes_launch import CALLBACK, PipesLaunch
from assets.post_training import (
    AGENTIC_TASKS_PREFIX,
    TASKS_PREFIX,
    _local,
    _model_cfg,
    _publish_checkpoint,
    _work,
)
from assets.stage_config import launchpad_config
from infra.committed import is_committed, read_committed
from infra.settings import load_profile
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from training.agentic.families import read_agentic_sft_tasks, read_agentic_tasks
from training.curves import plot_history
from training.job import job_key, read_metrics, tree_digest
from training.rl import distill
from training.rl import distill_job as distill_job_module
from training.rl.distill import DistillConfig, latest_owner
from training.tasks.suites import read_tasks, write_tasks

PROFILE = load_profile()
DistillRunConfig = launchpad_config("distill", DistillConfig, PROFILE)
# The General RL stage's committed prompt set (train.jsonl, heldout.jsonl), which assets/general.py commits.
GENERAL_PROMPTS_PREFIX = "post_training/general_prompts"
TEACHER_STAGES = ["sft", "reasoning_rl", "agentic_rl", "general_rl"]  # chain order


@dataclass(frozen=True)
class Distillation:
    """One distillation: its asset (the checkpoint is committed under checkpoints/<asset>), the RL stage whose
    checkpoint the student starts from, and the teachers: that stage and every earlier one."""

    asset: str
    parent: str
    registered: str  # MLflow registered model

    @property
    def teachers(self) -> list[str]:
        return TEACHER_STAGES[: TEACHER_STAGES.index(self.parent) + 1]

    @property
    def name(self) -> str:
        """The checkpoint's name in the results table."""
        return self.asset.removesuffix("_checkpoint")


DISTILLATIONS = [
    Distillation("reasoning_rl_distilled", "reasoning_rl", "crucible-reasoning_rl_distilled"),
    Distillation("agentic_rl_distilled", "agentic_rl", "crucible-agentic_rl_distilled"),
    Distillation("distilled_checkpoint", "general_rl", "crucible-distilled"),
]
# What each RL stage after the first starts from: the distilled checkpoint of the stage before it.
REASONING_RL_DISTILLED, AGENTIC_RL_DISTILLED = (f"checkpoints/{d.asset}" for d in DISTILLATIONS[:2])
DISTILL_PANELS = {
    "reverse KL per teacher (log pi_student - log pi_teacher, sampled tokens)": r"reverse_kl/(?!mean)\w+",
    "held-out greedy agreement with each teacher": r"heldout/agreement/\w+",
    "held-out exact reverse KL per teacher": r"heldout/reverse_kl_exact/\w+",
    "held-out pass@1 (greedy)": r"heldout/pass_at_1/\w+",
    "IcePop rho (trainer / engine prob)": r"rho/(min|mean|max)",
    "token fractions: masked by IcePop, clipped": r"icepop/masked_fraction|clip_fraction",
}


def _checkpoint(s: ObjectStore, stage: str) -> Path | None:
    prefix = f"checkpoints/{stage}_checkpoint"
    return _local(s, prefix, prefix) if is_committed(s, prefix) else None


def _prompt_sets(s: ObjectStore, teachers: list[str], out: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Each teacher's own training prompts (train.jsonl; a prompt several teachers trained on goes to the
    latest of them, `distill.latest_owner`) and held-out prompts, written under `out`. A teacher left with no
    prompt of its own is left out."""
    tasks_dir, agentic_dir = (
        _local(s, TASKS_PREFIX, "task_suites"),
        _local(s, AGENTIC_TASKS_PREFIX, "agentic_tasks"),
    )
    agentic = read_agentic_tasks(agentic_dir)
    seen_in_sft = read_agentic_sft_tasks(agentic_dir)
    sft_ids = {t.id for t in seen_in_sft}
    reasoning_train, reasoning_heldout = tasks_dir / "train.jsonl", tasks_dir / "heldout.jsonl"
    sets = {
        # SFT trained on worked solutions of reasoning tasks and of a share of the agentic train tasks
        "sft": (read_tasks(reasoning_train) + seen_in_sft, read_tasks(reasoning_heldout)),
        "reasoning_rl": (read_tasks(reasoning_train), read_tasks(reasoning_heldout)),
        "agentic_rl": ([t for t in agentic["train"] if t.id not in sft_ids], agentic["heldout"]),
    }
    if "general_rl" in teachers:
        general = _local(s, GENERAL_PROMPTS_PREFIX, "general_prompts")
        sets["general_rl"] = (read_tasks(general / "train.jsonl"), read_tasks(general / "heldout.jsonl"))
    owned = latest_owner({name: sets[name][0] for name in teachers})
    train, heldout = {}, {}
    for name in owned:
        train[name] = str(write_tasks(owned[name], out / name / "train.jsonl"))
        heldout[name] = str(write_tasks(sets[name][1], out / name / "heldout.jsonl"))
    return train, heldout


def _distill_stage(d: Distillation):
    def stage(launch: PipesLaunch, cfg: DistillConfig, s, _, run) -> StageResult:
        return _distill(d, launch, cfg, s, run)

    return stage


def _distill(d: Distillation, launch: PipesLaunch, cfg: DistillConfig, s, run) -> StageResult:
    teachers = {stage: _checkpoint(s, stage) for stage in d.teachers}
    missing = [f"{stage}_checkpoint" for stage, path in teachers.items() if path is None]
    if missing:
        raise RuntimeError(f"{d.asset}: no committed {', '.join(missing)}; materialize it first")
    parent_stage, parent = d.parent, teachers[d.parent]
    unknown = sorted(set(cfg.proportions) - set(teachers))
    proportions = {k: v for k, v in cfg.proportions.items() if k in teachers}
    cfg = cfg.model_copy(update={"proportions": proportions})
    prompts_dir = _work(d.asset) / "prompts"
    shutil.rmtree(prompts_dir, ignore_errors=True)  # a teacher left out now must not leave its old file
    train, heldout = _prompt_sets(s, list(teachers), prompts_dir)
    idle = sorted(set(teachers) - set(train))
    teachers = {name: path for name, path in teachers.items() if name in train}
    if set(cfg.proportions) & set(idle):
        raise ValueError(
            f"distill.proportions gives a share to {sorted(set(cfg.proportions) & set(idle))}, which trained on "
            "no prompt a later teacher did not also train on; drop them from proportions"
        )
    tasks_dir = _local(s, TASKS_PREFIX, "task_suites")
    # every prompt set the job reads (General RL's when it teaches) decides the run dir with the checkpoints
    prompt_sets = [
        TASKS_PREFIX,
        AGENTIC_TASKS_PREFIX,
        *([GENERAL_PROMPTS_PREFIX] if "general_rl" in teachers else []),
    ]
    versions = [read_committed(s, p).version for p in prompt_sets]
    model_cfg, distributed = _model_cfg(parent)
    key = job_key(
        cfg.model_dump(mode="json"),
        *[tree_digest(p) for p in teachers.values()],
        *versions,
        tree_digest(prompts_dir),  # which teacher teaches which prompt
    )
    spec = distill_job_module.DistillJobSpec(
        run_dir=str(PROFILE.state_path / "runs" / d.asset / key),
        init_from=str(parent),
        model=model_cfg,
        teachers={name: str(path) for name, path in teachers.items()},
        teacher_tasks=train,
        teacher_heldout=heldout,
        heldout_tasks=str(tasks_dir / "heldout.jsonl"),
        facts=str(tasks_dir / "facts.jsonl"),
        agentic_facts=str(_local(s, AGENTIC_TASKS_PREFIX, "agentic_tasks") / "facts.json"),
        config=cfg,
        threads=distributed.threads_per_process or None,
        callbacks=[CALLBACK],
    )
    result = distill_job_module.run_distill_job(spec, PROFILE.state_path / "torch_extensions", launch)
    run_dir, hf_dir = Path(spec.run_dir), Path(result["hf_dir"])
    metrics = {k: v for k, v in result["metrics"].items() if isinstance(v, int | float)}

    def pair(kind: str, name: str) -> dict[str, str]:
        before, after = metrics.get(f"parent/{kind}/{name}"), metrics.get(f"heldout/{kind}/{name}")
        fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
        return {f"{kind} ({parent_stage})": fmt(before), f"{kind} (distilled)": fmt(after)}

    rows = [{"teacher": n, **pair("agreement", n), **pair("reverse_kl_exact", n)} for n in teachers]
    domains = sorted(k.split("/")[-1] for k in metrics if k.startswith("heldout/pass_at_1/"))
    pass_rows = [
        {
            "domain": dom,
            parent_stage: f"{metrics.get(f'parent/pass_at_1/{dom}', 0):.3f} ± {metrics.get(f'parent/pass_at_1_se/{dom}', 0):.3f}",
            "distilled": f"{metrics[f'heldout/pass_at_1/{dom}']:.3f} ± {metrics[f'heldout/pass_at_1_se/{dom}']:.3f}",
        }
        for dom in domains
    ]
    history = read_metrics(run_dir)
    title = f"On-policy distillation after {parent_stage}"
    plot = plot_history(history, DISTILL_PANELS, run_dir / "distill_curves.png", title)
    run.set_tags({"crucible.distill_parent": parent_stage, "crucible.distill_teachers": ",".join(teachers)})
    note = f"\n\nproportions ignored (no such teacher): {unknown}" if unknown else ""
    if idle:
        note += f"\n\nno prompts of their own (a later teacher trained on all of theirs): {', '.join(idle)}"
    return StageResult(
        metrics=metrics,
        outputs={"checkpoint": _publish_checkpoint(s, d.asset, hf_dir)},
        report_md=f"## On-policy distillation from {parent_stage}, teachers {', '.join(teachers)}\n\n"
        f"{cfg.steps} steps x {cfg.prompts_per_step} prompts (group size 1)\n\n"
        "### Held-out agreement with / exact reverse KL to each teacher (greedy student answers)\n\n"
        + markdown_table(rows)
        + "\n\n### Held-out pass@1 (greedy)\n\n"
        + markdown_table(pass_rows)
        + note,
        artifacts={
            "checkpoint": hf_dir,
            "samples.json": run_dir / "samples.json",
            "plots/distill_curves.png": plot,
        },
        data_version=key,
        history=history,
    )


def _distillation_asset(d: Distillation):
    teachers = ", ".join(d.teachers)
    extra = ["general_prompts"] if "general_rl" in d.teachers else []  # that teacher's own prompt set
    return tracked_asset(
        d.asset,
        f"On-policy cross-stage distillation (Eq. 2, group size 1) of the {d.parent} checkpoint from the final\n"
        f"checkpoints of {teachers} on their own training prompts.",
        config=DistillRunConfig,
        stage=Launches(_distill_stage(d)),
        code_modules=[distill, distill_job_module],
        group="post_training",
        deps=[f"{stage}_checkpoint" for stage in d.teachers] + ["task_suites", "agentic_tasks", *extra],
        register=lambda result, name=d.registered: {name: "checkpoint"},
        tags={"crucible/resource": "gpu"},
    )


distill_assets = [_distillation_asset(d) for d in DISTILLATIONS]
