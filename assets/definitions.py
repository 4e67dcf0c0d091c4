"""The Crucible asset graph: `dagster dev -m assets.definitions` (or `make ui`)."""

import dagster as dg

from assets import (
    agentic,
    code_corpus,
    dedup,
    distill,
    general,
    knowledge,
    midtraining,
    post_training,
    pretraining,
    report,
    web_crawl,
    web_extract,
)
from assets.resources import resources_for
from assets.sensors import web_snapshot_sensor
from infra.k8s_run_config import k8s_run_tags
from infra.settings import Profile, load_profile

PROFILE = load_profile()

web_assets = [web_crawl.web_warc, web_extract.web_documents, web_extract.web_filtered, dedup.web_deduped]
code_assets = [
    code_corpus.code_raw_files,
    code_corpus.code_language_classifier,
    code_corpus.code_files,
    code_corpus.code_quality,
    dedup.code_deduped,
]
knowledge_assets = [knowledge.world_knowledge_classifier, knowledge.math_filtered]
rescue_assets = [knowledge.web_rescued]
training_assets = [
    pretraining.corpus_tokenizer,
    pretraining.token_shards,
    pretraining.base_checkpoint,
    *midtraining.midtrain_assets,
    midtraining.checkpoint_evals,
]


def job_resources(profile: Profile) -> dict[str, str]:
    """Each job's `crucible/resource` run tag, which the run queue limits (dagster.yaml, infra/deploy):
    the corpus jobs hold a Spark session when the profile dedups with Spark, else CPU cores."""

    def corpus(stage: str) -> str:
        return "spark" if profile.stage(stage).get("engine") == "spark" else "cpu"

    return {
        "web_corpus": corpus("dedup_web"),
        "code_corpus": corpus("dedup_code"),
        "knowledge": "llm",
        "web_rescue": "cpu",
        "training": "gpu",
        "post_training": "gpu",
    }


RESOURCES = job_resources(PROFILE)


def _job(name: str, assets: list, description: str):
    return dg.define_asset_job(
        name,
        selection=dg.AssetSelection.assets(*assets),
        description=description,
        # the run-queue class, and the pod it gets from the K8sRunLauncher (infra/deploy/run_resources.yaml)
        tags={"crucible/resource": RESOURCES[name], **k8s_run_tags(RESOURCES[name])},
    )


POST_TRAINING = [
    *post_training.post_training_assets,
    *agentic.agentic_assets,
    *general.general_assets,
    *distill.distill_assets,
    *report.report_assets,
]

# In graph order; `crucible run` materializes them one after the other.
JOBS = [
    _job("web_corpus", web_assets, "Crawl, extract, filter and dedup one web snapshot"),
    _job("code_corpus", code_assets, "Crawl, language-ID, fix, score and dedup one code snapshot"),
    _job("knowledge", knowledge_assets, "World-knowledge classifier and LLM-judge math filter"),
    _job("web_rescue", rescue_assets, "Rescue long-tail knowledge from one snapshot's dropped pages"),
    _job("training", training_assets, "Tokenizer, token shards, pretraining, midtraining, evals"),
    _job(
        "post_training",
        POST_TRAINING,
        "Task suites, SFT data, SFT, Reasoning RL, Agentic RL, General RL, distillation, results table",
    ),
]


def definitions(profile: Profile) -> dg.Definitions:
    """The graph with `profile`'s store and MLflow resources. `defs` is the one for the profile loaded at
    import; a process that switches state dirs later (the tests) builds its own, or its runs would write to
    the first one's MLflow database and store."""
    return dg.Definitions(
        assets=[
            *web_assets,
            *code_assets,
            *knowledge_assets,
            *rescue_assets,
            *training_assets,
            *POST_TRAINING,
        ],
        jobs=JOBS,
        sensors=[web_snapshot_sensor],
        resources={**resources_for(profile), "pipes": dg.PipesSubprocessClient()},
        executor=dg.in_process_executor,
    )


defs = definitions(PROFILE)
