"""Hostile inputs: partition keys that are paths, manifests that smuggle options or transports into git, and
archive bombs. Each case was reproduced on the tree before the fix (see the issue 18 closing note)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from infra import code_sources
from infra.partition_keys import PARTITION_KEY_PATTERN, InvalidPartitionKey
from infra.store import LocalStore
from pipelines.code.crawl import CodeCrawlConfig, crawl_code
from pipelines.code.manifest import ManifestError, load_manifest
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


# --- hostile manifests ----------------------------------------------------------------------------------

# (entry template, the offending value); {marker} is a file that must never be created
HOSTILE_SOURCES = [
    ("{{kind: git, name: '--upload-pack=touch {marker}', commit: HEAD}}", "--upload-pack=touch {marker}"),
    ("{{kind: git, name: 'ext::sh -c touch% {marker}', commit: HEAD}}", "ext::sh -c touch% {marker}"),
    ("{{kind: git, name: 'fd::3', commit: HEAD}}", "fd::3"),
    ("{{kind: git, name: 'ssh://h/r.git', commit: HEAD}}", "ssh://h/r.git"),
    ("{{kind: git, name: 'https://example.org/r.git', commit: '--output={marker}'}}", "--output={marker}"),
    ("{{kind: git, name: '../../outside/repo', commit: HEAD}}", "../../outside/repo"),
    ("{{kind: npm, name: '../../etc', version: '1.0.0'}}", "../../etc"),
    ("{{kind: npm, name: left-pad, version: 'file:../x'}}", "file:../x"),
    ("{{kind: pypi, name: '-r{marker}', version: '1.0'}}", "-r{marker}"),
    ("{{kind: debian, name: hello, version: '2.10 -o Dir=/'}}", "2.10 -o Dir=/"),
    ('{{kind: debian_source, name: "bash\\tx"}}', "bash\tx"),
]


@pytest.mark.parametrize(("entry", "value"), HOSTILE_SOURCES, ids=[v for _, v in HOSTILE_SOURCES])
def test_hostile_manifest_is_refused_naming_file_entry_and_value(tmp_path, entry, value):
    marker = tmp_path / "pwned"
    manifest = tmp_path / "hostile.yaml"
    good = "  - {kind: npm, name: tiny, version: '1.0.0', path: tiny-1.0.0.tgz}\n"  # local: no network
    manifest.write_text("sources:\n" + good + "  - " + entry.format(marker=marker) + "\n")
    with pytest.raises(ManifestError) as err:
        crawl_code(CodeCrawlConfig(), LocalStore(tmp_path / "store"), "snap-1", manifest, cache_dir=tmp_path)
    message = str(err.value)
    assert str(manifest) in message and "sources[1]" in message
    assert repr(value.format(marker=marker)) in message
    assert not marker.exists()


def test_shipped_manifests_pass_validation():
    from infra.settings import REPO_ROOT

    for name in ("micro.yaml", "tiny.yaml", "heldout.yaml"):
        assert load_manifest(REPO_ROOT / "pipelines/code/manifests" / name).sources


def test_low_level_git_fetch_never_takes_a_url_as_an_option(tmp_path):
    """Past the manifest check, `--` before every positional keeps `--upload-pack=...` a (missing) repository."""
    marker = tmp_path / "pwned"
    hostile = f"--upload-pack=touch {marker}"
    sha = "0" * 40
    (tmp_path / "cache").mkdir()
    with pytest.raises(code_sources.SourceFetchError):
        code_sources.resolve_git_commit(hostile, "HEAD")
    with pytest.raises(code_sources.SourceFetchError):
        code_sources.fetch_git(hostile, sha, tmp_path / "cache")  # a sha skips ls-remote: straight to fetch
    with pytest.raises(code_sources.SourceFetchError):
        code_sources.fetch_git(f"ext::sh -c touch% {marker}", sha, tmp_path / "cache")
    assert not marker.exists()
