"""Web crawl, partitioned by crawl snapshot: a live crawl (the tiny default crawls a local web of Debian
documentation served on 127.0.0.1) or an ingest of existing WARC files, written as gzipped WARC."""

from assets.factory import Check, tracked_asset
from assets.partitions import web_snapshots
from assets.stage_config import launchpad_config
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


def _crawl(cfg: CrawlConfig, object_store, snapshot, run):
    fn = warc_ingest.ingest_warc if cfg.source == "warc" else crawl.crawl_web
    return fn(cfg, object_store, snapshot, warc_prefix(snapshot))


web_warc = tracked_asset(
    "web_warc",
    "Gzipped WARC files of one crawl snapshot under `web/warc/<snapshot>/`.",
    config=WebCrawlConfig,
    stage=_crawl,
    code_modules=[crawl, warc_ingest],
    group="web",
    partitions=web_snapshots,
    checks=[Check("warc_not_empty", "The snapshot holds at least one fetched page")],
    evaluate=_crawl_checks,
)
