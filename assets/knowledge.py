"""Model-based selection: the world-knowledge classifier (Wikipedia + dictionaries vs crawled web, fastText
and a MiniLM linear head compared) rescues long-tail knowledge from dropped web pages per snapshot; the
LLM judge scores math & science candidates (chunk-and-aggregate), distilled into a fast classifier."""

import dagster as dg

from assets.partitions import single_run, web_snapshots
from assets.resources import MlflowResource, ObjectStoreResource
from assets.stage_config import launchpad_config
from assets.tracked import code_version, run_stage
from infra.settings import load_profile
from pipelines.knowledge import world_knowledge
from pipelines.knowledge.world_knowledge import WorldKnowledgeConfig
from pipelines.math import math_filter
from pipelines.math.math_filter import MathFilterConfig

PROFILE = load_profile()
WorldKnowledgeRunConfig = launchpad_config("world_knowledge", WorldKnowledgeConfig, PROFILE)
MathFilterRunConfig = launchpad_config("math_filter", MathFilterConfig, PROFILE)


def _work_dir(name: str):
    path = PROFILE.state_path / "runs" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@dg.asset(
    group_name="knowledge",
    deps=["web_filtered"],
    kinds={"python"},
    tags={"crucible/resource": "llm"},
    code_version=code_version(world_knowledge),
)
def world_knowledge_classifier(
    context: dg.AssetExecutionContext,
    config: WorldKnowledgeRunConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """fastText world-knowledge classifier (and a MiniLM head for comparison), held out by source."""

    def stage(cfg: WorldKnowledgeConfig, s, _, run):
        return world_knowledge.train_world_knowledge(s, cfg, _work_dir("world_knowledge"))

    def models(result) -> dict[str, str]:
        names = [k for k in result.outputs if k != "model_card"]  # one per classifier (fastText, MiniLM head)
        return {
            name if name.startswith("world_knowledge") else f"world_knowledge_{name}": name for name in names
        }

    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=stage,
        upstream=[dg.AssetKey("web_filtered")],
        register=models,
    )


@dg.asset(
    partitions_def=web_snapshots,
    group_name="knowledge",
    deps=["world_knowledge_classifier", "web_filtered"],
    backfill_policy=single_run,
    kinds={"python"},
    code_version=code_version(world_knowledge),
)
def web_rescued(
    context: dg.AssetExecutionContext,
    config: WorldKnowledgeRunConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """Dropped web documents of one snapshot that the world-knowledge classifier rescues."""

    def stage(cfg: WorldKnowledgeConfig, s, snapshot, run):
        name, model_key, threshold, version = world_knowledge.current_classifier(s, cfg)
        run.set_tags({"crucible.classifier_version": version, "crucible.classifier": name})
        result = world_knowledge.rescue_documents(s, cfg, model_key, threshold, snapshot)
        result.metrics["classifier_threshold"] = threshold
        return result

    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=stage,
        upstream=[dg.AssetKey("world_knowledge_classifier"), dg.AssetKey("web_filtered")],
    )


def _gate_check(cfg: MathFilterConfig, result) -> list[tuple[str, bool, dict]]:
    gate = result.extra.get("judge_gate", {})
    passed = bool(gate.get("passed", False))
    meta = {
        "auc": gate.get("auc"),
        "spearman": gate.get("spearman"),
        "message": gate.get("message", ""),
        "warn_only": not gate.get("blocking", False),
    }
    return [("judge_quality_gate", passed, meta)]


@dg.asset(
    group_name="knowledge",
    deps=["web_filtered"],
    kinds={"python"},
    tags={"crucible/resource": "llm"},
    code_version=code_version(math_filter),
    check_specs=[
        dg.AssetCheckSpec(
            "judge_quality_gate",
            asset="math_filtered",
            blocking=True,
            description="The judge agrees with the probe labels (AUC / Spearman); "
            "blocks in cluster, warns in tiny",
        )
    ],
)
def math_filtered(
    context: dg.AssetExecutionContext,
    config: MathFilterRunConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """Math & science documents the LLM judge (distilled to a fast classifier) rates educational."""

    def stage(cfg: MathFilterConfig, s, _, run):
        return math_filter.run_math_filter(s, cfg, _work_dir("math_filter"))

    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=stage,
        upstream=[dg.AssetKey("web_filtered")],
        checks=_gate_check,
        register=lambda result: (
            {"math_distilled_classifier": "model"}
            if any(k.startswith("model/") for k in result.artifacts)
            else {}
        ),
    )
