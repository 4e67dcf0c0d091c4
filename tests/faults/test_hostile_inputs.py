"""Hostile inputs: partition keys that are paths, manifests that smuggle options or transports into git, and
archive bombs. Each case was reproduced on the tree before the fix (see the issue 18 closing note)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from infra.partition_keys import PARTITION_KEY_PATTERN, InvalidPartitionKey
from infra.store import LocalStore
from pipelines.code.crawl import CodeCrawlConfig, crawl_code
from pipelines.code.records import read_shards

HOSTILE_KEYS = ["a/b", "..", ".", "", "-x", "x/../y", "x" * 65]


def _tgz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _npm_manifest(tmp_path: Path) -> Path:
    tgz = _tgz(tmp_path / "tiny-1.0.0.tgz", {"index.js": b"module.exports = function add(a, b) {\n  return a + b;\n};\n",
                                             "lib/util.py": b"def add(a, b):\n    return a + b\n"})  # fmt: skip
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(f"sources:\n  - {{kind: npm, name: tiny, version: '1.0.0', path: {tgz}}}\n")
    return manifest


# --- partition keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", HOSTILE_KEYS)
@pytest.mark.parametrize("option", ["--snapshot", "--code-snapshot"])
def test_cli_refuses_hostile_partition_keys(key, option, capsys):
    from assets.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", f"{option}={key}", "--only", "no-such-job"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"invalid partition key {key!r}" in err and PARTITION_KEY_PATTERN in err


def test_slash_partition_key_cannot_reach_another_partitions_output(tmp_path):
    """On main, code snapshot `a/b` wrote inside snapshot `a`'s prefix, so reading `a` also read `a/b`."""
    store = LocalStore(tmp_path / "store")
    manifest = _npm_manifest(tmp_path)
    crawl_code(CodeCrawlConfig(), store, "a", manifest, cache_dir=tmp_path / "cache")
    with pytest.raises(InvalidPartitionKey, match=r"'a/b'"):
        crawl_code(CodeCrawlConfig(), store, "a/b", manifest, cache_dir=tmp_path / "cache")
    assert {r["metadata"]["snapshot"] for r in read_shards(store, "code/raw/a")} == {"a"}
    assert not [k for k in store.list("code/raw/") if k.startswith("code/raw/a/b/")]


def test_partition_added_by_hand_fails_in_its_first_second(tmp_path):
    """The Dagster UI can add any dynamic partition key: the asset refuses it before doing any work."""
    import dagster as dg

    from assets.code_corpus import code_raw_files
    from assets.resources import resources_for
    from infra.settings import load_profile

    profile = load_profile()
    manifest = _npm_manifest(tmp_path)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("code_snapshot", ["a/b"])  # what the UI's "add partition" does
        result = dg.materialize(
            [code_raw_files],
            partition_key="a/b",
            instance=instance,
            resources=resources_for(profile),
            run_config={"ops": {"code_raw_files": {"config": {"manifest": str(manifest)}}}},
            raise_on_error=False,
        )
        assert not result.success
        (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.event_specific_data.error.to_string()  # the cause is the stage's own error
        assert "invalid partition key 'a/b'" in message and PARTITION_KEY_PATTERN in message
        records = instance.get_records_for_run(result.run_id).records
        stamps = {r.event_log_entry.dagster_event.event_type_value: r.event_log_entry.timestamp for r in records
                  if r.event_log_entry.dagster_event}  # fmt: skip
        assert stamps["STEP_FAILURE"] - stamps["STEP_START"] < 1.0
    store = resources_for(profile)["store"].open()
    assert store.list("code/raw/") == []
