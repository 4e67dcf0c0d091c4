"""Code stage configs validate in every profile; the micro manifest crawls this repository without network."""

from __future__ import annotations

import pytest

from infra.settings import REPO_ROOT, load_profile, validate_stage
from infra.store import LocalStore
from pipelines.code.crawl import CodeCrawlConfig, crawl_code
from pipelines.code.language_id import CodeLanguageIdConfig
from pipelines.code.manifest import load_manifest
from pipelines.code.metadata_fix import MetadataFixConfig
from pipelines.code.quality import CodeQualityConfig

STAGES = {"code_crawl": CodeCrawlConfig, "code_language_id": CodeLanguageIdConfig,
          "code_metadata_fix": MetadataFixConfig, "code_quality": CodeQualityConfig}  # fmt: skip


@pytest.mark.parametrize("profile", ["micro", "tiny", "cluster"])
def test_code_stage_configs_validate_in_every_profile(profile):
    p = load_profile(profile)
    for stage, model in STAGES.items():
        cfg = validate_stage(p, stage, model)
        assert isinstance(cfg, model)
    crawl = validate_stage(p, "code_crawl", CodeCrawlConfig)
    assert load_manifest(REPO_ROOT / crawl.manifest).sources


def test_tiny_defaults_are_the_model_defaults():
    p = load_profile("tiny")
    assert validate_stage(p, "code_crawl", CodeCrawlConfig) == CodeCrawlConfig()
    assert validate_stage(p, "code_language_id", CodeLanguageIdConfig) == CodeLanguageIdConfig()


def test_micro_manifest_crawls_this_repository_offline(tmp_path):
    cfg = validate_stage(load_profile("micro"), "code_crawl", CodeCrawlConfig)
    res = crawl_code(cfg, LocalStore(tmp_path / "store"), "micro", cache_dir=tmp_path / "cache")
    assert res.metrics["sources/ok"] == 1 and "sources/failed" not in res.metrics
    assert res.metrics["language_files/Python"] >= 20
    assert len(res.extra["errors"]) == 0


def test_rewriting_a_snapshot_removes_its_stale_shards(tmp_path):
    from infra.committed import read_committed
    from pipelines.code.records import commit_records, read_shards

    store = LocalStore(tmp_path / "store")
    recs = [{"text": str(i), "id": str(i), "metadata": {}} for i in range(25)]
    first = commit_records(store, "code/raw/s", recs, 10, extra={"crawl_stats.json": b"{}"})
    assert first.names() == ["crawl_stats.json", *(f"part-{i:05d}.jsonl.gz" for i in range(3))]
    second = commit_records(store, "code/raw/s", recs[:5], 10, extra={"crawl_stats.json": b"{}"})
    assert read_committed(store, "code/raw/s").names() == ["crawl_stats.json", "part-00000.jsonl.gz"]
    assert [r["id"] for r in read_shards(store, "code/raw/s")] == ["0", "1", "2", "3", "4"]
    assert second.version != first.version and store.list_prefixes("code/raw/s") == [
        f"v-{v}" for v in sorted([first.version, second.version])
    ]
