"""Deduplication per partition: exact + MinHash LSH near-dedup against every snapshot already in the
persistent index (`dedup/<kind>/index/`), for web documents and code files. Runs of one kind are serialised
through a Dagster concurrency pool: each run appends to the shared index."""

import dagster as dg

from assets.factory import Check, tracked_asset
from assets.partitions import code_snapshots, web_snapshots
from assets.stage_config import launchpad_config
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


_CHECK = Check(
    "dedup_rate_plausible", "The share of removed documents is within the configured plausible range"
)


def _dedup_asset(
    kind: str, config: type[dg.Config], partitions: dg.PartitionsDefinition, upstream: str, doc: str
):
    return tracked_asset(
        f"{kind}_deduped",
        doc,
        config=config,
        stage=_stage(kind),
        code_modules=[dedup_stage],
        group="dedup",
        partitions=partitions,
        deps=[upstream],
        checks=[_CHECK],
        evaluate=_checks,
        pool=f"dedup_{kind}",  # one run of a kind at a time: each appends to the shared index
    )


web_deduped = _dedup_asset(
    "web",
    WebDedupConfig,
    web_snapshots,
    "web_filtered",
    "Web documents of one snapshot that survive exact, URL and near dedup across all snapshots.",
)
code_deduped = _dedup_asset(
    "code",
    CodeDedupConfig,
    code_snapshots,
    "code_files",
    "Code files of one source snapshot that survive exact and near dedup (Jaccard ~0.7) across snapshots.",
)
