"""General RL: the prompt set (chat, instruction following with checkable constraints, writing, from the corpus's
dictionary facts, plus verifiable suite tasks), the outcome reward model trained on preference pairs from it
(registered with its held-out pair accuracy), and the General RL checkpoint trained from Agentic RL with the
hybrid reward (rules + ORM + GRM + exemplar anchors), every reward component logged."""

from pathlib import Path

from assets.distill import AGENTIC_RL_DISTILLED
from assets.factory import Launches, tracked_asset
from assets.pipes_launch import CALLBACK, PipesLaunch
from assets.post_training import TASKS_PREFIX, _local, _model_cfg, _publish_checkpoint, _work
from assets.pretraining import local_tokenizer
from assets.stage_config import launchpad_config
from infra.committed import commit, read_committed
from infra.packaged import LID_176, packaged_file
from infra.settings import load_profile
from infra.stage import StageResult, markdown_table
from training.curves import plot_history
from training.job import job_key, read_metrics, tree_digest
from training.rewards import general_prompts as general_prompts_module
from training.rewards import hybrid, orm
from training.rewards.general_prompts import VERSION, GeneralPromptsConfig, general_prompts
from training.rewards.orm import ORMConfig
from training.rl import general, general_job
from training.rl.general_job import GeneralRLJobSpec, GeneralRLStageConfig, ORMJobSpec
from training.tasks.suites import read_facts, read_tasks, write_tasks

PROFILE = load_profile()
GeneralPromptsRunConfig = launchpad_config("general_prompts", GeneralPromptsConfig, PROFILE)
ORMRunConfig = launchpad_config("outcome_reward_model", ORMConfig, PROFILE)
GeneralRLRunConfig = launchpad_config("general_rl", GeneralRLStageConfig, PROFILE)
GENERAL_PROMPTS_PREFIX = "post_training/general_prompts"  # assets/distill.py reads the teacher's prompts here
ORM_PREFIX = "post_training/outcome_reward_model"
GENERAL_PANELS = {
    "train reward: total and dimensions": r"reward/(total|dim/\w+)",
    "train reward components": r"reward/(format|length|language|forbidden|constraints|verifier|orm|grm|exemplar)",
    "held-out reward components (greedy)": r"heldout/reward/(total|orm|grm|constraints|language|exemplar)",
    "IcePop rho (trainer / engine prob)": r"rho/(min|mean|max)",
}


def _build_general_prompts(cfg: GeneralPromptsConfig, s, _, run) -> StageResult:
    tasks_dir = _local(s, TASKS_PREFIX, "task_suites")
    facts = read_facts(tasks_dir / "facts.jsonl")
    suite = read_tasks(tasks_dir / "train.jsonl") + read_tasks(tasks_dir / "heldout.jsonl")
    sets = general_prompts(facts, cfg, suite)
    out = _work("general_prompts") / "out"
    counts: dict[str, int] = {}
    for split, tasks in sets.items():
        write_tasks(tasks, out / f"{split}.jsonl")
        for t in tasks:
            counts[f"{split}/{t.domain}"] = counts.get(f"{split}/{t.domain}", 0) + 1
    version = commit(s, GENERAL_PROMPTS_PREFIX, out, meta={"counts": counts, "prompts": VERSION}).version
    rows = [{"split/category": k, "prompts": v} for k, v in sorted(counts.items())]
    return StageResult(
        metrics={f"prompts/{k}": float(v) for k, v in counts.items()} | {"facts": float(len(facts))},
        outputs={"general_prompts": s.uri(GENERAL_PROMPTS_PREFIX)},
        report_md=f"## General RL prompts ({VERSION})\n\n{markdown_table(rows)}",
        sample=[t.to_json() for t in sets["heldout"][:: max(1, len(sets["heldout"]) // 8)]],
        data_version=version,
    )


general_prompts_set = tracked_asset(
    "general_prompts",
    "Chat, instruction-following (word limits, keywords, JSON) and writing prompts from the dictionary facts,\n"
    "plus verifiable math / knowledge suite tasks; train / held-out prompts name different terms.",
    config=GeneralPromptsRunConfig,
    stage=_build_general_prompts,
    code_modules=[general_prompts_module],
    group="post_training",
    deps=["task_suites"],
)


def _outcome_reward_model(launch: PipesLaunch, cfg: ORMConfig, s, _, run) -> StageResult:
    prompts_dir = _local(s, GENERAL_PROMPTS_PREFIX, "general_prompts")
    tok = local_tokenizer(s)
    _, distributed = _model_cfg(tok)
    key = job_key(
        cfg.model_dump(mode="json"), tree_digest(tok), read_committed(s, GENERAL_PROMPTS_PREFIX).version
    )
    spec = ORMJobSpec(
        run_dir=str(PROFILE.state_path / "runs" / "outcome_reward_model" / key),
        tokenizer_dir=str(tok),
        train_prompts=str(prompts_dir / "train.jsonl"),
        heldout_prompts=str(prompts_dir / "heldout.jsonl"),
        config=cfg,
        threads=distributed.threads_per_process or None,
        callbacks=[CALLBACK],
    )
    result = general_job.run_orm_job(spec, PROFILE.state_path / "torch_extensions", launch)
    orm_dir = Path(result["orm_dir"])
    metrics = {k: v for k, v in result["metrics"].items() if isinstance(v, int | float)}
    commit(s, ORM_PREFIX, orm_dir)
    kinds = sorted(
        k.removeprefix("heldout/pair_accuracy/") for k in metrics if k.startswith("heldout/pair_accuracy/")
    )
    rows = [
        {
            "rejected answer": kind,
            "pair accuracy": f"{metrics[f'heldout/pair_accuracy/{kind}']:.3f} ± "
            f"{metrics[f'heldout/pair_accuracy_se/{kind}']:.3f}",
            "pairs": int(metrics[f"heldout/pairs/{kind}"]),
        }
        for kind in kinds
    ]
    acc, se = metrics["heldout/pair_accuracy"], metrics["heldout/pair_accuracy_se"]
    return StageResult(
        metrics=metrics,
        outputs={"outcome_reward_model": s.uri(ORM_PREFIX)},
        report_md=f"## Outcome reward model: held-out pair accuracy {acc:.3f} ± {se:.3f} "
        f"({int(metrics['heldout/pairs'])} pairs of held-out prompts)\n\n" + markdown_table(rows),
        artifacts={"orm": orm_dir},
        data_version=key,
        history=read_metrics(Path(spec.run_dir)),
    )


outcome_reward_model = tracked_asset(
    "outcome_reward_model",
    "A small scalar reward model (GLM-5 backbone + head) trained with Bradley-Terry on preference pairs from\n"
    "the General RL prompts (correct / constraint-satisfying vs wrong / violating answers).",
    config=ORMRunConfig,
    stage=Launches(_outcome_reward_model),
    code_modules=[orm],
    group="post_training",
    deps=["general_prompts", "corpus_tokenizer"],
    register=lambda result: {"crucible-outcome_reward_model": "orm"},
    tags={"crucible/resource": "gpu"},
)


def _general_rl(launch: PipesLaunch, cfg: GeneralRLStageConfig, s, _, run) -> StageResult:
    parent = _local(s, AGENTIC_RL_DISTILLED, AGENTIC_RL_DISTILLED)
    prompts_dir = _local(s, GENERAL_PROMPTS_PREFIX, "general_prompts")
    orm_dir = _local(s, ORM_PREFIX, "outcome_reward_model")
    tasks_dir = _local(s, TASKS_PREFIX, "task_suites")
    model_cfg, distributed = _model_cfg(parent)
    versions = [read_committed(s, p).version for p in (GENERAL_PROMPTS_PREFIX, ORM_PREFIX, TASKS_PREFIX)]
    key = job_key(cfg.model_dump(mode="json"), tree_digest(parent), *versions)
    spec = GeneralRLJobSpec(
        run_dir=str(PROFILE.state_path / "runs" / "general_rl" / key),
        init_from=str(parent),
        model=model_cfg,
        train_prompts=str(prompts_dir / "train.jsonl"),
        heldout_prompts=str(prompts_dir / "heldout.jsonl"),
        facts=str(tasks_dir / "facts.jsonl"),
        config=cfg.loop_config(),
        reward=cfg.reward,
        orm_dir=str(orm_dir),
        judge=cfg.judge,
        judge_cache_dir=str(PROFILE.state_path / "cache" / "judge_general"),
        lid_model=str(packaged_file(LID_176)),
        threads=distributed.threads_per_process or None,
        compare={"agentic_rl_distilled": str(parent)},
        callbacks=[CALLBACK],
    )
    result = general_job.run_general_rl_job(spec, PROFILE.state_path / "torch_extensions", launch)
    run_dir, hf_dir = Path(spec.run_dir), Path(result["hf_dir"])
    metrics = {k: v for k, v in result["metrics"].items() if isinstance(v, int | float)}
    names = sorted(k.removeprefix("heldout/reward/") for k in metrics if k.startswith("heldout/reward/"))

    def cell(prefix: str, name: str) -> str:
        return f"{metrics[f'{prefix}reward/{name}']:.3f} ± {metrics[f'{prefix}reward_se/{name}']:.3f}"

    rows = [
        {
            "reward": name,
            "parent (agentic_rl_distilled)": cell("compare/agentic_rl_distilled/", name),
            "general RL": cell("heldout/", name),
            "n": int(metrics[f"heldout/n/{name}"]),
        }
        for name in names
        if f"compare/agentic_rl_distilled/reward/{name}" in metrics
    ]
    history = read_metrics(run_dir)
    plot = plot_history(history, GENERAL_PANELS, run_dir / "general_rl_curves.png", "General RL")
    run.set_tags({"crucible.general_prompts": versions[0], "crucible.outcome_reward_model": versions[1]})
    return StageResult(
        metrics=metrics,
        outputs={"checkpoint": _publish_checkpoint(s, "general_rl_checkpoint", hf_dir)},
        report_md="## General RL: held-out hybrid reward per component (greedy), from the distilled Agentic RL checkpoint\n\n"
        + markdown_table(rows),
        artifacts={
            "checkpoint": hf_dir,
            "samples.json": run_dir / "samples.json",
            "plots/general_rl_curves.png": plot,
        },
        data_version=key,
        history=history,
    )


general_rl_checkpoint = tracked_asset(
    "general_rl_checkpoint",
    "General RL (GRPO + IcePop) from the distilled Agentic RL checkpoint with the hybrid reward: rules, the outcome\n"
    "reward model, the LLM judge with a versioned rubric, exemplar style anchors.",
    config=GeneralRLRunConfig,
    stage=Launches(_general_rl),
    code_modules=[general, general_job, hybrid],
    group="post_training",
    deps=["agentic_rl_distilled", "general_prompts", "outcome_reward_model", "task_suites"],
    register=lambda result: {"crucible-general_rl": "checkpoint"},
    tags={"crucible/resource": "gpu"},
)

general_assets = [general_prompts_set, outcome_reward_model, general_rl_checkpoint]
