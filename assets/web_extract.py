"""Extract and filter, per crawl snapshot: WARC -> Trafilatura -> fastText language ID (`web_documents`),
then Gopher repetition/quality, C4 and FineWeb quality filters (`web_filtered`), with drop reasons kept."""

from pydantic import BaseModel, ConfigDict, Field

from assets.factory import Check, tracked_asset
from assets.partitions import web_snapshots
from assets.stage_config import launchpad_config
from assets.web_crawl import warc_prefix
from infra.partition_keys import partition_prefix
from infra.settings import load_profile, validate_stage
from pipelines.web import extract
from pipelines.web.extract import ExtractConfig


class WebChecks(BaseModel):
    """Bounds for the blocking checks on extracted / filtered documents (profile section `web_checks`)."""

    model_config = ConfigDict(extra="forbid")
    min_documents: int = Field(1, description="Fewer kept documents than this fails the check")
    min_target_language_share: float = Field(0.5, description="Share of documents in the kept languages")
    max_drop_rate: float = Field(0.98, description="Filters dropping more than this share look broken")
    min_drop_rate: float = Field(0.0, description="Filters dropping less than this share look disabled")


PROFILE = load_profile()
WebExtractConfig = launchpad_config("web_extract", ExtractConfig, PROFILE)
CHECKS = validate_stage(PROFILE, "web_checks", WebChecks)


def documents_prefix(snapshot: str) -> str:
    return partition_prefix("web/extract", snapshot)


def filtered_prefix(snapshot: str) -> str:
    return partition_prefix("web/filtered", snapshot)


def _extract_checks(cfg: ExtractConfig, result) -> list[tuple[str, bool, dict]]:
    docs = int(result.metrics.get("docs_out", 0))
    share = float(result.metrics.get("target_language_share", 0.0))
    return [
        ("documents_not_empty", docs >= CHECKS.min_documents, {"documents": docs}),
        ("language_mix", share >= CHECKS.min_target_language_share, {"target_language_share": share}),
    ]


def _filter_checks(cfg: ExtractConfig, result) -> list[tuple[str, bool, dict]]:
    kept = int(result.metrics.get("docs_out", 0))
    rate = float(result.metrics.get("drop_rate", 0.0))
    bounds = {"drop_rate": rate, "min": CHECKS.min_drop_rate, "max": CHECKS.max_drop_rate}
    return [
        ("kept_not_empty", kept >= CHECKS.min_documents, {"kept": kept}),
        ("drop_rate_within_bounds", CHECKS.min_drop_rate <= rate <= CHECKS.max_drop_rate, bounds),
    ]


def _extract(cfg: ExtractConfig, object_store, snapshot, run):
    return extract.extract_documents(
        cfg, object_store, snapshot, warc_prefix(snapshot), documents_prefix(snapshot)
    )


def _filter(cfg: ExtractConfig, object_store, snapshot, run):
    return extract.filter_documents(
        cfg, object_store, snapshot, documents_prefix(snapshot), filtered_prefix(snapshot)
    )


web_documents = tracked_asset(
    "web_documents",
    "Extracted text with url, snapshot and language, as JSONL.gz shards under `web/extract/<snapshot>/`.",
    config=WebExtractConfig,
    stage=_extract,
    code_modules=[extract],
    group="web",
    partitions=web_snapshots,
    deps=["web_warc"],
    checks=[
        Check("documents_not_empty"),
        Check("language_mix", "Enough documents are in the configured languages"),
    ],
    evaluate=_extract_checks,
)

web_filtered = tracked_asset(
    "web_filtered",
    "Documents that pass the quality filters (`kept/`), and the dropped ones with reasons (`dropped/`).",
    config=WebExtractConfig,
    stage=_filter,
    code_modules=[extract],
    group="web",
    partitions=web_snapshots,
    deps=["web_documents"],
    checks=[
        Check("kept_not_empty"),
        Check("drop_rate_within_bounds", "The quality filters drop a plausible share of documents"),
    ],
    evaluate=_filter_checks,
)
