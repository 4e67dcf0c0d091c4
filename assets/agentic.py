"""Agentic RL: the agentic task sets (terminal, code fixing, multi-hop search; their worked solutions for a share
of train go into SFT) and the Agentic RL checkpoint trained from the distilled Reasoning RL checkpoint with the asynchronous loop against
task services. The checkpoint's lineage names its parent, the task-set version and the task-service versions."""

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from assets.distill import REASONING_RL_DISTILLED
from assets.factory import Launches, tracked_asset
from assets.pipes_launch import CALLBACK, PipesLaunch
from assets.post_training import (
    AGENTIC_TASKS_PREFIX,
    _local,
    _model_cfg,
    _publish_checkpoint,
    _work,
    recorded_dictionary_facts,
)
from assets.stage_config import launchpad_config
from infra.committed import commit, read_committed
from infra.settings import load_profile
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from training.agentic import async_loop, codefix, driver, episodes, families, search, terminal
from training.agentic import job as agentic_job
from training.agentic.async_loop import AgenticRLConfig
from training.agentic.families import (
    AgenticTasksConfig,
    build_agentic_task_sets,
    rl_task_shortfalls,
    write_agentic_tasks,
)
from training.curves import plot_history
from training.job import job_key, read_metrics, tree_digest

log = logging.getLogger(__name__)
PROFILE = load_profile()
AgenticTasksRunConfig = launchpad_config("agentic_tasks", AgenticTasksConfig, PROFILE)
AgenticRLRunConfig = launchpad_config("agentic_rl", AgenticRLConfig, PROFILE)
AGENTIC_PANELS = {
    "train reward per family": r"reward/(?!mean)\w+",
    "importance ratio (trainer / rollout engine)": r"ratio/(min|mean|max)",
    "tokens masked by the IS band": r"is/masked_fraction",
    "staleness (versions behind)": r"staleness/(mean|max)",
    "dropped and padded samples": r"buffer/(stale|env_failures|padded_samples|dropped_in_groups|uniform_samples)",
    "pipeline": r"trainer/idle_fraction|throughput/trajectories_per_s",
}


def _build_agentic_tasks(cfg: AgenticTasksConfig, s, _, run) -> StageResult:
    facts = recorded_dictionary_facts(run, cfg.max_facts, cfg.seed)
    sets = build_agentic_task_sets(cfg, facts)
    out = _work("agentic_tasks") / "out"
    version = write_agentic_tasks(sets, out, facts[: cfg.max_facts], cfg.sft_rows)
    counts = json.loads((out / "meta.json").read_text())["counts"]
    shortfalls = rl_task_shortfalls(counts, cfg)
    for message in shortfalls:
        log.warning("%s", message)
    commit(s, AGENTIC_TASKS_PREFIX, out, meta={"agentic_version": version, "counts": counts})
    rows = [{"split/family/level": k, "tasks": v} for k, v in sorted(counts.items())]
    return StageResult(
        metrics={f"tasks/{k}": float(v) for k, v in counts.items()} | {"facts": float(len(facts))},
        outputs={"agentic_tasks": s.uri(AGENTIC_TASKS_PREFIX)},
        report_md=f"## Agentic tasks {version}\n\n{markdown_table(rows)}"
        + "".join(f"\n\n**Warning**: {m}" for m in shortfalls),
        sample=[t.to_json() for t in sets["heldout"][:: max(1, len(sets["heldout"]) // 6)]],
        data_version=version,
    )


agentic_tasks = tracked_asset(
    "agentic_tasks",
    "Terminal, code-fixing and multi-hop search tasks (tools, multi-turn episodes, sandboxed checks) with\n"
    "train / held-out splits; a share of train becomes SFT trajectories.",
    config=AgenticTasksRunConfig,
    stage=_build_agentic_tasks,
    code_modules=[families, terminal, codefix, search, episodes],
    group="post_training",  # its facts come from Debian dictd archives, recorded as the run's sources
)


def agentic_tasks_dir(s: ObjectStore) -> Path:
    return _local(s, AGENTIC_TASKS_PREFIX, "agentic_tasks")


def held_out_families(metrics: Mapping[str, float]) -> list[str]:
    """The families with a held-out score, `heldout/success/<family>` (not its per-level breakdown)."""
    return sorted(
        parts[2]
        for parts in (k.split("/") for k in metrics)
        if parts[:2] == ["heldout", "success"] and len(parts) == 3
    )


def _agentic_rl(launch: PipesLaunch, cfg: AgenticRLConfig, s, _, run) -> StageResult:
    parent = _local(s, REASONING_RL_DISTILLED, REASONING_RL_DISTILLED)
    tasks_dir = agentic_tasks_dir(s)
    tasks_version = read_committed(s, AGENTIC_TASKS_PREFIX).version
    model_cfg, distributed = _model_cfg(parent)
    key = job_key(cfg.model_dump(mode="json"), tree_digest(parent), tasks_version)
    spec = agentic_job.AgenticJobSpec(
        run_dir=str(PROFILE.state_path / "runs" / "agentic_rl" / key),
        init_from=str(parent),
        model=model_cfg,
        tasks_dir=str(tasks_dir),
        config=cfg,
        threads=distributed.threads_per_process or None,
        callbacks=[CALLBACK],
    )
    result = agentic_job.run_job(spec, PROFILE.state_path / "torch_extensions", launch)
    run_dir, hf_dir = Path(spec.run_dir), Path(result["hf_dir"])
    metrics = {k: v for k, v in result["metrics"].items() if isinstance(v, int | float)}
    rows = [
        {
            "family": d,
            "parent (reasoning_rl_distilled)": f"{metrics[f'parent/success/{d}']:.3f} ± {metrics[f'parent/success_se/{d}']:.3f}",
            "agentic RL": f"{metrics[f'heldout/success/{d}']:.3f} ± {metrics[f'heldout/success_se/{d}']:.3f}",
            "n": int(metrics[f"heldout/n/{d}"]),
            "gain (paired)": f"{metrics.get(f'heldout/paired_gain/{d}', float('nan')):+.3f} ± "
            f"{metrics.get(f'heldout/paired_gain_se/{d}', float('nan')):.3f}",
            "fixed / broken": f"{metrics.get(f'heldout/fixed/{d}', 0):.0f} / {metrics.get(f'heldout/broken/{d}', 0):.0f}",
            **_sampled_columns(metrics, d),
            "failures: parent -> agentic RL": failure_changes(metrics, d),
        }
        for d in held_out_families(metrics)
    ]
    history = read_metrics(run_dir)
    plot = plot_history(history, AGENTIC_PANELS, run_dir / "agentic_rl_curves.png", "Agentic RL")
    services = ", ".join(f"{d} {v}" for d, v in sorted(result["service_versions"].items()))
    run.set_tags({"crucible.task_services": services, "crucible.agentic_tasks": tasks_version})
    return StageResult(
        metrics=metrics,
        outputs={"checkpoint": _publish_checkpoint(s, "agentic_rl_checkpoint", hf_dir)},
        report_md="## Agentic RL: held-out success (greedy, and sampled at the rollout temperature) from the "
        "distilled Reasoning RL checkpoint\n\n" + markdown_table(rows) + f"\n\ntask services: {services}",
        artifacts={
            "checkpoint": hf_dir,
            "samples.json": run_dir / "samples.json",
            "plots/agentic_rl_curves.png": plot,
        },
        data_version=key,
        history=history,
    )


def failure_changes(metrics: Mapping[str, float], d: str) -> str:
    """Held-out failures of family `d` by kind, parent -> trained ("wrong_answer_found 26 -> 20, ...")."""
    kinds = sorted(
        {
            k.split("/")[3]
            for k in metrics
            if k.startswith(f"heldout/failures/{d}/") or k.startswith(f"parent/failures/{d}/")
        }
    )
    return ", ".join(
        f"{k} {metrics.get(f'parent/failures/{d}/{k}', 0):.0f} -> {metrics.get(f'heldout/failures/{d}/{k}', 0):.0f}"
        for k in kinds
    )


def _sampled_columns(metrics: dict[str, float], d: str) -> dict[str, str]:
    """Sampled success (T = the rollout temperature) before / after and its paired gain, when measured."""
    if f"heldout/sampled_success/{d}" not in metrics:
        return {}
    parent, after = (
        metrics.get(f"parent/sampled_success/{d}", float("nan")),
        metrics[f"heldout/sampled_success/{d}"],
    )
    return {
        "sampled: parent / agentic RL": f"{parent:.3f} / {after:.3f}",
        "sampled gain (paired)": f"{metrics.get(f'heldout/sampled_paired_gain/{d}', float('nan')):+.3f} ± "
        f"{metrics.get(f'heldout/sampled_paired_gain_se/{d}', float('nan')):.3f}",
    }


agentic_rl_checkpoint = tracked_asset(
    "agentic_rl_checkpoint",
    "Agentic RL (asynchronous, direct double-sided IS) against task services, from the Reasoning RL checkpoint\n"
    "after its on-policy distillation (reasoning_rl_distilled).",
    config=AgenticRLRunConfig,
    stage=Launches(_agentic_rl),
    code_modules=[async_loop, driver, agentic_job],
    group="post_training",
    deps=["reasoning_rl_distilled", "agentic_tasks"],
    register=lambda result: {"crucible-agentic_rl": "checkpoint"},
    tags={"crucible/resource": "gpu"},
)

agentic_assets = [agentic_tasks, agentic_rl_checkpoint]
