"""Code corpus, partitioned by code-source snapshot: crawl registries and git (`code_raw_files`), train the
content language classifier on held-out packages (`code_language_classifier`), fix metadata with it
(`code_files`), and score quality per low-resource language (`code_quality`)."""

import dagster as dg

from assets.partitions import code_snapshots, single_run
from assets.resources import MlflowResource, ObjectStoreResource
from assets.stage_config import launchpad_config
from assets.tracked import code_version, run_stage
from infra.settings import load_profile
from pipelines.code import crawl, language_id, metadata_fix, quality
from pipelines.code.crawl import CodeCrawlConfig
from pipelines.code.language_id import CodeLanguageIdConfig
from pipelines.code.metadata_fix import MetadataFixConfig
from pipelines.code.quality import CodeQualityConfig

PROFILE = load_profile()
CrawlCodeConfig = launchpad_config("code_crawl", CodeCrawlConfig, PROFILE)
LanguageIdConfig = launchpad_config("code_language_id", CodeLanguageIdConfig, PROFILE)
FixConfig = launchpad_config("code_metadata_fix", MetadataFixConfig, PROFILE)
QualityConfig = launchpad_config("code_quality", CodeQualityConfig, PROFILE)

_common = {
    "partitions_def": code_snapshots,
    "group_name": "code",
    "backfill_policy": single_run,
    "kinds": {"python"},
}


def _not_empty(name: str, metric: str):
    def check(cfg, result) -> list[tuple[str, bool, dict]]:
        n = int(result.metrics.get(metric, 0))
        return [(name, n > 0, {metric: n})]

    return check


@dg.asset(
    **_common,
    code_version=code_version(crawl),
    check_specs=[dg.AssetCheckSpec("files_not_empty", asset="code_raw_files", blocking=True)],
)
def code_raw_files(
    context: dg.AssetExecutionContext,
    config: CrawlCodeConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """Every file of the manifest's git repos and Debian/npm/PyPI packages as a record (`code/raw/<snapshot>/`)."""
    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=lambda cfg, s, snapshot, run: crawl.crawl_code(cfg, s, snapshot),
        checks=_not_empty("files_not_empty", "files/kept"),
    )


@dg.asset(**_common, deps=["code_raw_files"], code_version=code_version(language_id))
def code_language_classifier(
    context: dg.AssetExecutionContext,
    config: LanguageIdConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """fastText content classifier trained on unambiguous extensions, evaluated on held-out packages."""
    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=lambda cfg, s, snapshot, run: language_id.train_code_language_classifier(cfg, s, snapshot),
        upstream=[dg.AssetKey("code_raw_files")],
        register=lambda result: {"code_language_classifier": "model"},
    )


@dg.asset(
    **_common,
    deps=["code_raw_files", "code_language_classifier"],
    code_version=code_version(metadata_fix),
    check_specs=[dg.AssetCheckSpec("files_not_empty", asset="code_files", blocking=True)],
)
def code_files(
    context: dg.AssetExecutionContext, config: FixConfig, store: ObjectStoreResource, mlflow: MlflowResource
) -> dg.MaterializeResult:
    """Code records with corrected language / path / repo metadata (`code/files/<snapshot>/`)."""
    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=lambda cfg, s, snapshot, run: metadata_fix.fix_metadata(cfg, s, snapshot),
        upstream=[dg.AssetKey("code_raw_files"), dg.AssetKey("code_language_classifier")],
        checks=_not_empty("files_not_empty", "kept"),
    )


@dg.asset(**_common, deps=["code_files"], code_version=code_version(quality))
def code_quality(
    context: dg.AssetExecutionContext,
    config: QualityConfig,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
) -> dg.MaterializeResult:
    """Per-language quality classifiers (Scala, Swift, Lua, ...), a score per file and sampling weights."""
    return run_stage(
        context,
        store=store,
        mlflow=mlflow,
        config=config,
        fn=lambda cfg, s, snapshot, run: quality.train_code_quality(cfg, s, snapshot),
        upstream=[dg.AssetKey("code_files")],
        register=lambda result: (
            {"code_quality_classifiers": "models"}
            if any(k.startswith("models/") for k in result.artifacts)
            else {}
        ),
    )
