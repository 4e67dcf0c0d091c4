"""One Agentic RL job (the Pipes child of `agentic_rl_checkpoint`): score the parent on the held-out agentic
tasks, start the task services and their orchestrator, train with the async loop, score again on the same
tasks, export the checkpoint. `python -m training.agentic.job --spec SPEC.json`."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.agentic.async_loop import AgenticRLConfig
from training.child_job import child_command, child_main, load_policy, metrics_logger, run_child, write_result
from training.model import ModelConfig

log = logging.getLogger(__name__)
SPEC = "agentic_spec.json"


class AgenticJobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_dir: str
    init_from: str = Field(description="HF dir of the parent checkpoint (with its tokenizer files)")
    model: ModelConfig
    tasks_dir: str = Field(description="Committed agentic tasks: train.jsonl, heldout.jsonl, facts.json")
    config: AgenticRLConfig
    service_replicas: int = Field(1, ge=1, description="Task-service processes per family")
    latency_mean_s: float = Field(0.0, ge=0, description="Extra environment latency (mean, long-tailed)")
    latency_sigma: float = Field(1.0, ge=0, description="Log-normal sigma of the extra latency")
    threads: int | None = None
    callbacks: list[str] = Field(default_factory=list)


def run_job(spec: AgenticJobSpec, torch_extensions_dir: Path | None = None, launch: Any = None) -> dict:
    """Run the job as a child process (through `launch`, the asset's Pipes launcher, when given)."""
    run_dir = Path(spec.run_dir)
    cmd = child_command(spec, "training.agentic.job", run_dir, SPEC, torch_extensions_dir, spec.threads or 0)
    return run_child(cmd, run_dir, launch, "Agentic RL")


def local_environments(
    facts_json: str,
    domains: list[str],
    latency_mean_s: float = 0.0,
    latency_sigma: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """The families in the worker's own process (no task services), with extra latency: a rollout worker's
    environment factory for benchmarks and tests."""
    from training.agentic.episodes import ExtraLatency
    from training.agentic.families import agentic_suites

    facts = [tuple(f) for f in json.loads(Path(facts_json).read_text())]
    suites = agentic_suites(facts, ExtraLatency(mean_s=latency_mean_s, sigma=latency_sigma, seed=seed))
    return {d: suites[d] for d in domains}


def heldout_subset(tasks: list, per_domain: int, for_domain: dict[str, int] | None = None) -> list:
    from training.tasks.suites import eval_subset

    return eval_subset(tasks, per_domain, for_domain)


def _run(spec: AgenticJobSpec) -> dict[str, Any]:
    from infra.agentic_services import agentic_services
    from training.agentic.async_loop import (
        WorkerSpec,
        greedy_trajectories,
        rewards_by_task,
        success_by_level,
        success_of,
        train_agentic_rl,
    )
    from training.agentic.families import (
        agentic_suites,
        read_agentic_facts,
        read_agentic_sft_tasks,
        read_agentic_tasks,
    )
    from training.agentic.search import unwritten_tasks
    from training.checkpoint import export_hf
    from training.rl.reasoning import paired_gain

    run_dir, cfg = Path(spec.run_dir), spec.config
    tok, model = load_policy(spec.init_from, spec.model, spec.threads)
    tasks_dir = Path(spec.tasks_dir)
    sets = read_agentic_tasks(tasks_dir)
    facts = read_agentic_facts(tasks_dir)
    local_envs = agentic_suites(facts)  # held-out scoring in process, without extra latency
    scored = heldout_subset(sets["heldout"], cfg.eval_tasks_per_domain, cfg.eval_tasks_for)
    sft_tasks = read_agentic_sft_tasks(tasks_dir)
    seen_in_sft = {t.id for t in sft_tasks}  # RL trains on the rest
    train = [t for t in sets["train"] if t.id not in seen_in_sft]
    log_metrics = metrics_logger(run_dir, spec, spec.callbacks, resume_after=0)  # a rerun starts over
    if cfg.search_unwritten_only:
        before = sum(t.domain == "search" for t in train)
        train = unwritten_tasks(train, sft_tasks)
        after = sum(t.domain == "search" for t in train)
        log.info("agentic RL: %d of %d search train tasks write nothing SFT wrote", after, before)
        log_metrics(
            {"filter/search_unwritten": float(after), "filter/search_written": float(before - after)}, 0
        )
    train = _filtered(model, tok, train, local_envs, cfg, log_metrics)
    domains = sorted({t.domain for t in train} & {d for d, r in cfg.task_ratios.items() if r > 0})

    parent_trajs = greedy_trajectories(model, tok, scored, local_envs, cfg, tok.pad_token_id)
    parent_rates = _sampled_rates(model, tok, scored, local_envs, cfg)
    parent = (
        success_of(parent_trajs)
        | success_by_level(parent_trajs, scored)
        | sampled_success(parent_rates, scored)
    )
    log_metrics({f"parent/{k}": v for k, v in parent.items()}, 0)
    log.info("agentic RL: parent held-out %s", {k: round(v, 3) for k, v in parent.items() if "success/" in k})
    samples: dict[str, Any] = {}

    def on_batch(trajs, step: int) -> None:
        if step == 1 or step % 10 == 0 or step == cfg.steps:
            samples[str(step)] = [t.to_json() for t in trajs[:8]]

    hf_parent = Path(spec.init_from)
    with agentic_services(
        {d: cfg.task_ratios[d] for d in domains}, tasks_dir / "facts.json", spec.service_replicas,
        latency_mean_s=spec.latency_mean_s, latency_sigma=spec.latency_sigma, seed=cfg.seed,
    ) as services:  # fmt: skip
        worker = WorkerSpec(
            hf_dir=str(hf_parent), tasks=[t.to_json() for t in train if t.domain in domains],
            environments="infra.service_pool:orchestrated_environments",
            environment_kwargs={"orchestrator_url": services.url, "domains": domains},
            domain_picker="infra.service_pool:orchestrator_domain_picker",
            domain_picker_kwargs={"orchestrator_url": services.url},
            config=cfg, pad_id=tok.pad_token_id, threads=1,
        )  # fmt: skip
        final = train_agentic_rl(model, worker, run_dir, log_metrics, on_batch=on_batch)
        stats = services.stats()
        restarts = services.fleet.restarts
    service_metrics = {"services/restarts": float(restarts)}
    for d, row in stats["domains"].items():
        for k in ("started", "finished", "env_failures", "throughput"):
            service_metrics[f"services/{d}/{k}"] = float(row[k])
    versions = sorted({(s["domain"], s["version"]) for s in stats["services"]})
    after_trajs = greedy_trajectories(model, tok, scored, local_envs, cfg, tok.pad_token_id)
    after_rates = _sampled_rates(model, tok, scored, local_envs, cfg)
    after = (
        success_of(after_trajs) | success_by_level(after_trajs, scored) | sampled_success(after_rates, scored)
    )
    # paired per task with the parent: tasks both solve or both fail add no noise to the gain
    after |= paired_gain(rewards_by_task(parent_trajs), rewards_by_task(after_trajs), scored)
    gain = paired_gain(parent_rates, after_rates, scored)
    after |= {f"sampled_{k}": v for k, v in gain.items() if k.startswith("paired_gain")}
    heldout = {f"heldout/{k}": v for k, v in after.items()}
    log_metrics({**heldout, **service_metrics}, cfg.steps)
    (run_dir / "samples.json").write_text(json.dumps(samples))
    extra = {n: hf_parent / n for n in ("tokenizer.json", "tokenizer_config.json")}
    hf = export_hf(model, run_dir / "hf", extra)
    result = {
        "metrics": {**final, **heldout, **{f"parent/{k}": v for k, v in parent.items()}, **service_metrics},
        "service_versions": {d: v for d, v in versions},
        "hf_dir": str(hf),
        "step": cfg.steps,
    }
    write_result(run_dir, result)
    return result


def _sampled_rates(model, tok, tasks: list, envs, cfg) -> dict[str, float]:
    """Each held-out task's success rate over `eval_samples` rollouts at the rollout temperature (the policy
    as RL trains it; greedy success alone hides gains below the greedy choice); {} when off."""
    from training.agentic.async_loop import sampled_pass_rates

    if not cfg.eval_samples:
        return {}
    return sampled_pass_rates(model, tok, tasks, envs, cfg, tok.pad_token_id, cfg.eval_samples)


def sampled_success(rates: dict[str, float], tasks: list) -> dict[str, float]:
    """`sampled_success/<family>` and `sampled_success_se/<family>` over the tasks that have a rate."""
    from training.rl.reasoning import sampled_pass_at_1

    out = sampled_pass_at_1(rates, [t for t in tasks if t.id in rates])
    return {k.replace("sampled_pass_at_1", "sampled_success"): v for k, v in out.items()}


def _filtered(model, tok, train: list, envs, cfg, log_metrics) -> list:
    """The difficulty filter (as Reasoning RL's): the train tasks on which the parent's trained reward (success
    plus any credits) is sometimes above 0 and sometimes below 1, from a seeded sample of
    `filter_tasks_per_domain` per family (`filter_tasks_for` where given), plus `keep_solved_share` of the
    always-solved ones as anchors; a family never (or always) solved is left out."""
    from training.agentic.async_loop import sampled_pass_rates
    from training.rl.reasoning import keep_with_anchors, per_domain

    if not cfg.filter_samples:
        return train
    wanted = {d for d, r in cfg.task_ratios.items() if r > 0}
    pool = per_domain([t for t in train if t.domain in wanted], cfg.filter_pool_size, cfg.seed)
    log.info("agentic RL: difficulty filter over %d train tasks x %d rollouts", len(pool), cfg.filter_samples)
    # on the trained reward: a task never solved whose rollouts earn different credits still has a gradient
    rates = sampled_pass_rates(
        model, tok, pool, envs, cfg, tok.pad_token_id, cfg.filter_samples, trained=True
    )
    kept, metrics = keep_with_anchors(pool, rates, cfg, "agentic_rl")
    log_metrics(metrics, 0)
    log.info("agentic RL: difficulty filter kept %s", {k: v for k, v in metrics.items() if "kept/" in k})
    return kept


def main(argv: list[str] | None = None) -> int:
    return child_main(argv, AgenticJobSpec, _run, "Run one Agentic RL job from its spec")


if __name__ == "__main__":
    sys.exit(main())
