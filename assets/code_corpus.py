"""Code corpus, partitioned by code-source snapshot: crawl registries and git (`code_raw_files`), train the
content language classifier on held-out packages (`code_language_classifier`), fix metadata with it
(`code_files`), and score quality per low-resource language (`code_quality`)."""

from assets.factory import Check, tracked_asset
from assets.partitions import code_snapshots
from assets.stage_config import launchpad_config
from infra.settings import load_profile
from pipelines.code import crawl, language_id, language_protocol, metadata_fix, quality
from pipelines.code.crawl import CodeCrawlConfig
from pipelines.code.language_id import CodeLanguageIdConfig
from pipelines.code.metadata_fix import MetadataFixConfig
from pipelines.code.quality import CodeQualityConfig

PROFILE = load_profile()
CrawlCodeConfig = launchpad_config("code_crawl", CodeCrawlConfig, PROFILE)
LanguageIdConfig = launchpad_config("code_language_id", CodeLanguageIdConfig, PROFILE)
FixConfig = launchpad_config("code_metadata_fix", MetadataFixConfig, PROFILE)
QualityConfig = launchpad_config("code_quality", CodeQualityConfig, PROFILE)


def _not_empty(name: str, metric: str):
    def check(cfg, result) -> list[tuple[str, bool, dict]]:
        n = int(result.metrics.get(metric, 0))
        return [(name, n > 0, {metric: n})]

    return check


code_raw_files = tracked_asset(
    "code_raw_files",
    "Every file of the manifest's git repos and Debian/npm/PyPI packages as a record (`code/raw/<snapshot>/`).",
    config=CrawlCodeConfig,
    stage=lambda cfg, s, snapshot, run: crawl.crawl_code(cfg, s, snapshot),
    code_modules=[crawl],
    group="code",
    partitions=code_snapshots,
    checks=[Check("files_not_empty")],
    evaluate=_not_empty("files_not_empty", "files/kept"),
)

code_language_classifier = tracked_asset(
    "code_language_classifier",
    "fastText content classifier trained on unambiguous extensions, evaluated on held-out packages.",
    config=LanguageIdConfig,
    stage=lambda cfg, s, snapshot, run: language_id.train_code_language_classifier(cfg, s, snapshot),
    code_modules=[language_id, language_protocol],
    group="code",
    partitions=code_snapshots,
    deps=["code_raw_files"],
    register=lambda result: {"code_language_classifier": "model"},
)

code_files = tracked_asset(
    "code_files",
    "Code records with corrected language / path / repo metadata (`code/files/<snapshot>/`).",
    config=FixConfig,
    stage=lambda cfg, s, snapshot, run: metadata_fix.fix_metadata(cfg, s, snapshot),
    code_modules=[metadata_fix],
    group="code",
    partitions=code_snapshots,
    deps=["code_raw_files", "code_language_classifier"],
    checks=[Check("files_not_empty")],
    evaluate=_not_empty("files_not_empty", "kept"),
)

code_quality = tracked_asset(
    "code_quality",
    "Per-language quality classifiers (Scala, Swift, Lua, ...), a score per file and sampling weights.",
    config=QualityConfig,
    stage=lambda cfg, s, snapshot, run: quality.train_code_quality(cfg, s, snapshot),
    code_modules=[quality],
    group="code",
    partitions=code_snapshots,
    deps=["code_files"],
    register=lambda result: (
        {"code_quality_classifiers": "models"}
        if any(k.startswith("models/") for k in result.artifacts)
        else {}
    ),
)
