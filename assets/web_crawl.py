"""Web crawl, partitioned by crawl snapshot: a live crawl (the tiny default crawls a local web of Debian
documentation served on 127.0.0.1) or an ingest of existing WARC files, written as gzipped WARC."""

import dagster as dg

from assets.partitions import single_run, web_snapshots
from assets.resources import MlflowResource, ObjectStoreResource
from assets.stage_config import launchpad_config
from assets.tracked import code_version, run_stage
from infra.partition_keys import partition_prefix
from infra.settings import load_profile
from pipelines.web import crawl, warc_ingest
from pipelines.web.crawl import CrawlConfig

WebCrawlConfig = launchpad_config("web_crawl", CrawlConfig, load_profile())


def warc_prefix(snapshot: str) -> str:
    return partition_prefix("web/warc", snapshot)


def _crawl_checks(cfg: CrawlConfig, result) -> list[tuple[str, bool, dict]]:
    pages = int(result.metrics.get("pages_written", result.metrics.get("pages_fetched", 0)))
    return [("warc_not_empty", pages > 0, {"pages": pages})]


@dg.asset(
    partitions_def=web_snapshots,
    group_name="web",
    backfill_policy=single_run,
    code_version=code_version(crawl, warc_ingest),
    kinds={"python"},
    check_specs=[
        dg.AssetCheckSpec(
            "warc_not_empty",
            asset="web_warc",
            blocking=True,
            description="The snapshot holds at least one fetched page",
        )
    ],
)
def web_warc(
    context: dg.AssetExecutionContext,
    config: WebCrawlConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """Gzipped WARC files of one crawl snapshot under `web/warc/<snapshot>/`."""

    def stage(cfg: CrawlConfig, object_store, snapshot, run):
        fn = warc_ingest.ingest_warc if cfg.source == "warc" else crawl.crawl_web
        return fn(cfg, object_store, snapshot, warc_prefix(snapshot))

    return run_stage(context, store=store, mlflow=mlflow, config=config, fn=stage, checks=_crawl_checks)
