"""Post-training: verifiable task suites, the SFT set, SFT from the last midtraining checkpoint, and Reasoning
RL (GRPO + IcePop) from SFT. Each checkpoint is a registered model version with lineage to its parent
checkpoint and to the task-suite version it trained on (both read through committed outputs)."""

import logging
from pathlib import Path

from assets.factory import Launches, tracked_asset
from assets.midtraining import CHECKPOINTS, local_checkpoint
from assets.pipes_launch import CALLBACK, PipesLaunch
from assets.pretraining import local_tokenizer
from assets.stage_config import launchpad_config
from infra.committed import commit, fetch_committed, read_committed
from infra.local_web import doc_package_source
from infra.settings import load_profile, validate_stage
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from infra.tracking import SOURCES_TAG
from pipelines.knowledge.facts import dictionary_facts
from pipelines.knowledge.world_knowledge import WorldKnowledgeConfig
from training import post_train, sft_data
from training.agentic.families import agentic_suites, read_agentic_facts, read_agentic_sft_tasks
from training.curves import RL_PANELS, SFT_PANELS, plot_history
from training.job import job_key, read_metrics, tree_digest
from training.model import with_checkpoint_rope
from training.post_train import RLJobSpec, SftConfig
from training.pretrain import PretrainConfig
from training.rl import reasoning
from training.rl.by_family import family_rows
from training.rl.reasoning import ReasoningRLConfig
from training.sft_data import SftDataConfig
from training.tasks import suites as task_suites_module
from training.tasks.suites import (
    TaskSuitesConfig,
    build_rl_pool,
    build_task_sets,
    frozen_test_sha256,
    knowledge_format_of,
    read_facts,
    read_tasks,
    sha256_of_test_set,
    suite_version,
    suites,
    write_facts,
    write_tasks,
)
from training.tokenizer import load_tokenizer

PROFILE = load_profile()
log = logging.getLogger(__name__)
TaskSuitesRunConfig = launchpad_config("task_suites", TaskSuitesConfig, PROFILE)
SftDataRunConfig = launchpad_config("sft_data", SftDataConfig, PROFILE)
SftRunConfig = launchpad_config("sft", SftConfig, PROFILE)
ReasoningRLRunConfig = launchpad_config("reasoning_rl", ReasoningRLConfig, PROFILE)
TASKS_PREFIX = "post_training/task_suites"
SFT_DATA_PREFIX = "post_training/sft_data"
AGENTIC_TASKS_PREFIX = "post_training/agentic_tasks"
PARENT = CHECKPOINTS[-1]


def _work(name: str) -> Path:
    path = PROFILE.state_path / "runs" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _local(store: ObjectStore, prefix: str, name: str) -> Path:
    version = read_committed(store, prefix).version
    return fetch_committed(store, prefix, PROFILE.state_path / "cache" / name / version)[1]


def _model_cfg(tok_dir: Path):
    """The profile's model config for a stage reading `tok_dir`; when that is a checkpoint (it has a
    config.json), with the checkpoint's RoPE (e.g. the context-extended base of SFT)."""
    pre = validate_stage(PROFILE, "pretrain", PretrainConfig)
    update = {
        "vocab_size": len(load_tokenizer(tok_dir)),
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 1,
    }
    cfg = pre.model.model_copy(update=update)
    if (Path(tok_dir) / "config.json").exists():
        cfg = with_checkpoint_rope(cfg, tok_dir)
    return cfg, pre.distributed


def recorded_dictionary_facts(run, limit: int, seed: int) -> list[tuple[str, str]]:
    """Facts from the profile's dictd packages; the archives read are tagged on the run (lineage leaves)."""
    wk = validate_stage(PROFILE, "world_knowledge", WorldKnowledgeConfig)
    run.set_tags({SOURCES_TAG: ",".join(doc_package_source(p) for p in wk.dictionaries)})
    return dictionary_facts(wk.dictionaries, limit, seed)


def _build_task_suites(cfg: TaskSuitesConfig, s, _, run) -> StageResult:
    facts = recorded_dictionary_facts(run, cfg.max_facts, cfg.seed)
    sets = build_task_sets(cfg, facts)
    sets = {**sets, "rl_pool": build_rl_pool(cfg, sets, facts)}
    out = _work("task_suites") / "out"
    for split, tasks in sets.items():
        write_tasks(tasks, out / f"{split}.jsonl")
    write_facts(facts, out / "facts.jsonl")
    version = suite_version(sets)
    test_sha = sha256_of_test_set(sets["test"])
    frozen = test_sha == frozen_test_sha256()
    run.set_tags({"crucible.test_sha256": test_sha, "crucible.test_frozen": frozen})
    if not frozen:  # other levels or counts than tiny's: fine for a run, but say its test scores are its own
        log.warning("task_suites: the test set (%d tasks, sha256 %s) is not the frozen one of "
                    "training/tasks/frozen_test.json; its scores compare only with runs on the same test set",
                    len(sets["test"]), test_sha[:12])  # fmt: skip
    counts = {}
    for split, tasks in sets.items():
        for t in tasks:
            key = f"{split}/{t.domain}/level{t.difficulty}"
            counts[key] = counts.get(key, 0) + 1
    meta = {"suite_version": version, "counts": counts, "test_sha256": test_sha, "test_frozen": frozen}
    commit(s, TASKS_PREFIX, out, meta=meta)
    rows = [{"split/domain/level": k, "tasks": v} for k, v in sorted(counts.items())]
    return StageResult(
        metrics={f"tasks/{k}": float(v) for k, v in counts.items()}
        | {"facts": float(len(facts)), "test_frozen": float(frozen)},
        outputs={"task_suites": s.uri(TASKS_PREFIX)},
        report_md=f"## Task suites {version}\n\ntest set sha256 `{test_sha}`"
        f"{' (frozen)' if frozen else ' (NOT the frozen tiny test set)'}\n\n{markdown_table(rows)}",
        sample=[t.to_json() for t in sets["heldout"][:: max(1, len(sets["heldout"]) // 8)]],
        data_version=version,
    )


task_suites = tracked_asset(
    "task_suites",
    "Math, code, tool and knowledge tasks with verifiers; train / held-out splits by seed (no shared prompt).",
    config=TaskSuitesRunConfig,
    stage=_build_task_suites,
    code_modules=[task_suites_module],
    group="post_training",  # its facts come from Debian dictd archives, recorded as the run's sources
)


def _tasks_dir(s: ObjectStore) -> Path:
    return _local(s, TASKS_PREFIX, "task_suites")


def _read_split(tasks_dir: Path, split: str) -> list:
    path = tasks_dir / f"{split}.jsonl"
    return read_tasks(path) if path.exists() else []  # a test split is optional (test_per_level 0)


def _build_sft_data(cfg: SftDataConfig, s, _, run) -> StageResult:
    tasks_dir = _tasks_dir(s)
    facts = read_facts(tasks_dir / "facts.jsonl")
    train = read_tasks(tasks_dir / "train.jsonl")
    agentic_dir = _local(s, AGENTIC_TASKS_PREFIX, "agentic_tasks")  # agent trajectories: a share of its train
    # the knowledge suite as task_suites made it, so knowledge_drill rows are questions of the same kind
    registry = suites(facts, *knowledge_format_of(train)) | agentic_suites(read_agentic_facts(agentic_dir))
    train += read_agentic_sft_tasks(agentic_dir)
    excluded = {t.prompt for split in ("heldout", "test") for t in _read_split(tasks_dir, split)}
    rows, kinds = sft_data.build_sft_trajectories(train, registry, facts, cfg, excluded)
    out = _work("sft_data") / "out"
    sft_data.write_rows(rows, out / "rows.jsonl")
    version = commit(s, SFT_DATA_PREFIX, out, meta={"kinds": dict(kinds)}).version
    return StageResult(
        metrics={f"rows/{k}": float(v) for k, v in kinds.items()} | {"rows": float(len(rows))},
        outputs={"sft_data": s.uri(SFT_DATA_PREFIX)},
        report_md="## SFT data\n\n"
        + markdown_table([{"kind": k, "rows": v} for k, v in sorted(kinds.items())]),
        sample=rows[:6],
        data_version=version,
    )


sft_data_set = tracked_asset(
    "sft_data_set",
    "Chat trajectories for SFT: worked solutions (reasoning and agentic tasks), corrected wrong steps and\n"
    "failed tool calls (kept in context, masked from the loss), and definition chats from the corpus's dictionaries\n"
    "(with knowledge-v4 tasks, every knowledge fact as a glossary entry too).",
    config=SftDataRunConfig,
    stage=_build_sft_data,
    code_modules=[sft_data],
    group="post_training",
    deps=["task_suites", "agentic_tasks"],
)


def _publish_checkpoint(s: ObjectStore, name: str, hf_dir: Path) -> str:
    return s.uri(commit(s, f"checkpoints/{name}", hf_dir).version_prefix)


def _sft(launch: PipesLaunch, cfg: SftConfig, s, _, run) -> StageResult:
    tok = local_tokenizer(s)
    parent = local_checkpoint(s, PARENT)
    rows = _local(s, SFT_DATA_PREFIX, "sft_data") / "rows.jsonl"
    model_cfg, distributed = _model_cfg(parent)  # the parent's RoPE: SFT continues the extended model
    data_version = read_committed(s, SFT_DATA_PREFIX).version
    key = job_key(
        cfg.model_dump(mode="json"), tree_digest(parent), data_version, model_cfg.model_dump(mode="json")
    )
    run_dir = PROFILE.state_path / "runs" / "sft" / key
    spec = post_train.sft_spec(cfg, parent, model_cfg, rows, tok, run_dir, distributed, [CALLBACK])
    result = post_train.run_sft(spec, PROFILE.state_path / "torch_extensions", launch)
    hf_dir = Path(result["hf_dir"])
    metrics = {f"final/{k}": v for k, v in result.get("metrics", {}).items() if isinstance(v, int | float)}
    history = read_metrics(run_dir)
    plot = plot_history(history, SFT_PANELS, run_dir / "sft_curves.png", f"SFT from {PARENT}")
    return StageResult(
        metrics=metrics,
        outputs={"checkpoint": _publish_checkpoint(s, "sft_checkpoint", hf_dir)},
        report_md=f"## SFT from {PARENT}\n\nsteps {result['step']}, final loss {metrics.get('final/loss', 0):.3f}",
        artifacts={"checkpoint": hf_dir, "plots/sft_curves.png": plot},
        data_version=result["weights_digest"][:16],
        history=history,
    )


sft_checkpoint = tracked_asset(
    "sft_checkpoint",
    "Supervised fine-tuning of the last midtraining checkpoint on `sft_data_set` (loss on assistant tokens).",
    config=SftRunConfig,
    stage=Launches(_sft),
    code_modules=[post_train],
    group="post_training",
    deps=[PARENT, "sft_data_set", "corpus_tokenizer"],
    upstream=[PARENT, "sft_data_set"],
    register=lambda result: {"crucible-sft": "checkpoint"},
    tags={"crucible/resource": "gpu"},
)


def _reasoning_rl(launch: PipesLaunch, cfg: ReasoningRLConfig, s, _, run) -> StageResult:
    parent = _local(s, "checkpoints/sft_checkpoint", "checkpoints/sft_checkpoint")
    tasks_dir = _tasks_dir(s)
    model_cfg, distributed = _model_cfg(parent)
    key = job_key(cfg.model_dump(mode="json"), tree_digest(parent), read_committed(s, TASKS_PREFIX).version)
    spec = RLJobSpec(
        run_dir=str(PROFILE.state_path / "runs" / "reasoning_rl" / key),
        init_from=str(parent),
        model=model_cfg,
        train_tasks=str(tasks_dir / "train.jsonl"),
        heldout_tasks=str(tasks_dir / "heldout.jsonl"),
        test_tasks=str(tasks_dir / "test.jsonl") if (tasks_dir / "test.jsonl").exists() else None,
        rl_pool_tasks=str(tasks_dir / "rl_pool.jsonl") if (tasks_dir / "rl_pool.jsonl").exists() else None,
        facts=str(tasks_dir / "facts.jsonl"),
        config=cfg,
        threads=distributed.threads_per_process or None,
        compare={PARENT: str(local_checkpoint(s, PARENT))},
        callbacks=[CALLBACK],
    )
    result = post_train.run_rl_job(spec, PROFILE.state_path / "torch_extensions", launch)
    hf_dir = Path(result["hf_dir"])
    # per-family scores stay in the MLflow history and the report's table: 60 metadata entries would cut them
    metrics = {
        k: v for k, v in result["metrics"].items() if isinstance(v, int | float) and "/family" not in k
    }
    rows = [
        {
            "domain": d,
            PARENT: round(metrics.get(f"compare/{PARENT}/pass_at_1/{d}", float("nan")), 3),
            "pass_at_1": round(v, 3),
            "se": round(metrics.get(f"heldout/pass_at_1_se/{d}", 0), 3),
            "gain vs SFT (paired)": f"{metrics.get(f'heldout/paired_gain/{d}', float('nan')):+.3f} +- "
            f"{metrics.get(f'heldout/paired_gain_se/{d}', float('nan')):.3f}",
            "fixed / broken": f"{metrics.get(f'heldout/fixed/{d}', 0):.0f} / {metrics.get(f'heldout/broken/{d}', 0):.0f}",
            "sampled pass_at_1": round(metrics.get(f"heldout/sampled_pass_at_1/{d}", float("nan")), 3),
            "sampled gain (paired)": f"{metrics.get(f'heldout/sampled_paired_gain/{d}', float('nan')):+.3f} +- "
            f"{metrics.get(f'heldout/sampled_paired_gain_se/{d}', float('nan')):.3f}",
        }
        for k, v in sorted(metrics.items())
        if k.startswith("heldout/pass_at_1/") and (d := k.split("/")[-1])
    ]
    suites_meta = read_committed(s, TASKS_PREFIX).meta
    run.set_tags({"crucible.test_sha256": suites_meta.get("test_sha256", ""),
                  "crucible.test_frozen": suites_meta.get("test_frozen", False)})  # fmt: skip
    history = read_metrics(Path(spec.run_dir))
    plot = plot_history(history, RL_PANELS, Path(spec.run_dir) / "reasoning_rl_curves.png", "Reasoning RL")
    return StageResult(
        metrics=metrics,
        outputs={"checkpoint": _publish_checkpoint(s, "reasoning_rl_checkpoint", hf_dir)},
        report_md="## Reasoning RL: held-out pass_at_1 (greedy, and sampled at the rollout temperature)\n\n"
        + markdown_table(rows)
        + _family_table(history)
        + _test_table(metrics, suites_meta),
        artifacts={
            "checkpoint": hf_dir,
            "samples.json": Path(spec.run_dir) / "samples.json",
            "plots/reasoning_rl_curves.png": plot,
        },
        data_version=key,
        history=history,
    )


def _family_table(history: list[dict]) -> str:
    """Held-out pass@1 per task family (code's), SFT vs Reasoning RL, with the difficulty filter's view of it."""
    rows = family_rows(history, "SFT", "Reasoning RL")
    if not rows:
        return ""
    return (
        "\n\n## Held-out pass_at_1 per family (greedy, and sampled)\n\nA family the filter kept no prompt of "
        "(its train pass rate 0) gives RL no reward to learn from.\n\n" + markdown_table(rows)
    )


def _test_table(metrics: dict[str, float], suites_meta: dict) -> str:
    """The test set's scores (taken once, after training), parent (SFT) vs Reasoning RL, paired per task."""

    def gain(key: str, d: str) -> str:
        return f"{metrics.get(f'test/{key}/{d}', float('nan')):+.3f} +- {metrics.get(f'test/{key}_se/{d}', float('nan')):.3f}"

    rows = [
        {
            "domain": d,
            "SFT": round(metrics.get(f"test/parent/pass_at_1/{d}", float("nan")), 3),
            "Reasoning RL": round(metrics[k], 3),
            "gain (paired)": gain("paired_gain", d),
            "SFT sampled": round(metrics.get(f"test/parent/sampled_pass_at_1/{d}", float("nan")), 3),
            "RL sampled": round(metrics.get(f"test/sampled_pass_at_1/{d}", float("nan")), 3),
            "sampled gain (paired)": gain("sampled_paired_gain", d),
        }
        for k in sorted(metrics)
        if k.startswith("test/pass_at_1/") and (d := k.split("/")[-1])
    ]
    if not rows:
        return ""
    sha = suites_meta.get("test_sha256", "")
    frozen = "the frozen tiny test set" if suites_meta.get("test_frozen") else "not the frozen tiny test set"
    return (
        f"\n\n## Test set (sha256 `{sha[:12]}`, {frozen}), scored once after training\n\n"
        + markdown_table(rows)
    )


reasoning_rl_checkpoint = tracked_asset(
    "reasoning_rl_checkpoint",
    "Reasoning RL (GRPO + IcePop, no KL) from the SFT checkpoint on mixed-domain verifiable tasks.",
    config=ReasoningRLRunConfig,
    stage=Launches(_reasoning_rl),
    code_modules=[reasoning],
    group="post_training",
    deps=["sft_checkpoint", "task_suites"],
    register=lambda result: {"crucible-reasoning_rl": "checkpoint"},
    tags={"crucible/resource": "gpu"},
)


post_training_assets = [task_suites, sft_data_set, sft_checkpoint, reasoning_rl_checkpoint]
