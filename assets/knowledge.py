"""Model-based selection: the world-knowledge classifier (Wikipedia + dictionaries vs crawled web, fastText
and a MiniLM linear head compared) rescues long-tail knowledge from dropped web pages per snapshot; the
LLM judge scores math & science candidates (chunk-and-aggregate), distilled into a fast classifier."""

from assets.factory import Check, tracked_asset
from assets.partitions import web_snapshots
from assets.stage_config import launchpad_config
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


def _train_classifier(cfg: WorldKnowledgeConfig, s, _, run):
    return world_knowledge.train_world_knowledge(s, cfg, _work_dir("world_knowledge"))


def _classifier_models(result) -> dict[str, str]:
    names = [k for k in result.outputs if k != "model_card"]  # one per classifier (fastText, MiniLM head)
    return {name if name.startswith("world_knowledge") else f"world_knowledge_{name}": name for name in names}


world_knowledge_classifier = tracked_asset(
    "world_knowledge_classifier",
    "fastText world-knowledge classifier (and a MiniLM head for comparison), held out by source.",
    config=WorldKnowledgeRunConfig,
    stage=_train_classifier,
    code_modules=[world_knowledge],
    group="knowledge",
    deps=["web_filtered"],
    register=_classifier_models,
    tags={"crucible/resource": "llm"},
)


def _rescue(cfg: WorldKnowledgeConfig, s, snapshot, run):
    name, model_key, threshold, version = world_knowledge.current_classifier(s, cfg)
    run.set_tags({"crucible.classifier_version": version, "crucible.classifier": name})
    result = world_knowledge.rescue_documents(s, cfg, model_key, threshold, snapshot)
    result.metrics["classifier_threshold"] = threshold
    return result


web_rescued = tracked_asset(
    "web_rescued",
    "Dropped web documents of one snapshot that the world-knowledge classifier rescues.",
    config=WorldKnowledgeRunConfig,
    stage=_rescue,
    code_modules=[world_knowledge],
    group="knowledge",
    partitions=web_snapshots,
    deps=["world_knowledge_classifier", "web_filtered"],
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


def _math_filter(cfg: MathFilterConfig, s, _, run):
    return math_filter.run_math_filter(s, cfg, _work_dir("math_filter"))


math_filtered = tracked_asset(
    "math_filtered",
    "Math & science documents the LLM judge (distilled to a fast classifier) rates educational.",
    config=MathFilterRunConfig,
    stage=_math_filter,
    code_modules=[math_filter],
    group="knowledge",
    deps=["web_filtered"],
    checks=[
        Check(
            "judge_quality_gate",
            "The judge agrees with the probe labels (AUC / Spearman); blocks in cluster, warns in tiny",
        )
    ],
    evaluate=_gate_check,
    register=lambda result: (
        {"math_distilled_classifier": "model"}
        if any(k.startswith("model/") for k in result.artifacts)
        else {}
    ),
    tags={"crucible/resource": "llm"},
)
