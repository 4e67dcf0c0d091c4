"""Deduplication per partition: exact + MinHash LSH near-dedup against every snapshot already in the
persistent index (`dedup/<kind>/index/`), for web documents and code files. Runs of one kind are serialised
through a Dagster concurrency pool: each run appends to the shared index."""

import dagster as dg

from assets.partitions import code_snapshots, single_run, web_snapshots
from assets.resources import MlflowResource, ObjectStoreResource
from assets.stage_config import launchpad_config
from assets.tracked import code_version, run_stage
from infra.settings import load_profile
from pipelines.dedup import stage as dedup_stage
from pipelines.dedup.config import DedupConfig

PROFILE = load_profile()
WebDedupConfig = launchpad_config("dedup_web", DedupConfig, PROFILE)
CodeDedupConfig = launchpad_config("dedup_code", DedupConfig, PROFILE)


def _checks(cfg: DedupConfig, result) -> list[tuple[str, bool, dict]]:
    check = dedup_stage.check_dedup_rate(result.metrics, cfg)
    return [("dedup_rate_plausible", check.passed, {"detail": check.description})]


def _stage(kind: str):
    def stage(cfg: DedupConfig, object_store, snapshot, run):
        if cfg.kind != kind:
            raise ValueError(f"dedup_{kind}: config 'kind' must be {kind!r}, got {cfg.kind!r}")
        return dedup_stage.dedup_partition(cfg, object_store, snapshot)

    return stage


_CHECK_DOC = "The share of removed documents is within the configured plausible range"


@dg.asset(
    partitions_def=web_snapshots,
    group_name="dedup",
    deps=["web_filtered"],
    backfill_policy=single_run,
    code_version=code_version(dedup_stage),
    pool="dedup_web",
    kinds={"python"},
    check_specs=[
        dg.AssetCheckSpec("dedup_rate_plausible", asset="web_deduped", blocking=True, description=_CHECK_DOC)
    ],
)
def web_deduped(
    context: dg.AssetExecutionContext,
    config: WebDedupConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """Web documents of one snapshot that survive exact, URL and near dedup across all snapshots."""
    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=_stage("web"),
        upstream=[dg.AssetKey("web_filtered")],
        checks=_checks,
    )


@dg.asset(
    partitions_def=code_snapshots,
    group_name="dedup",
    deps=["code_files"],
    backfill_policy=single_run,
    code_version=code_version(dedup_stage),
    pool="dedup_code",
    kinds={"python"},
    check_specs=[
        dg.AssetCheckSpec("dedup_rate_plausible", asset="code_deduped", blocking=True, description=_CHECK_DOC)
    ],
)
def code_deduped(
    context: dg.AssetExecutionContext,
    config: CodeDedupConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """Code files of one source snapshot that survive exact and near dedup (Jaccard ~0.7) across snapshots."""
    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=_stage("code"),
        upstream=[dg.AssetKey("code_files")],
        checks=_checks,
    )
