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


# --- archive bombs --------------------------------------------------------------------------------------

MB = 1024 * 1024


class _Zeros(io.RawIOBase):
    """`size` zero bytes, produced on demand (the test never holds the bomb's payload in memory)."""

    def __init__(self, size: int):
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


def _tar_members(tf: tarfile.TarFile, members: dict[str, int]) -> None:
    for name, size in members.items():
        info = tarfile.TarInfo(f"package/{name}")
        info.size = size
        tf.addfile(info, io.BufferedReader(_Zeros(size), 1 * MB))


def _bomb(path: Path, members: dict[str, int]) -> Path:
    """A .tar.zst / .tar.gz / .tgz of zero-filled members (200 MB of zeros is a few KB of zstd)."""
    if path.name.endswith(".zst"):
        import zstandard

        with open(path, "wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as zst:
            with tarfile.open(fileobj=zst, mode="w|") as tf:
                _tar_members(tf, members)
    else:
        with tarfile.open(path, "w:gz", compresslevel=1) as tf:
            _tar_members(tf, members)
    return path


def _deb_with(data_tar: Path, path: Path) -> Path:
    """A .deb (ar archive) whose data.tar member is `data_tar`."""

    def member(name: str, data: bytes) -> bytes:
        head = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        return head + data + (b"\n" if len(data) % 2 else b"")

    suffix = data_tar.name.split(".tar", 1)[1]
    path.write_bytes(
        b"!<arch>\n" + member("debian-binary", b"2.0\n") + member(f"data.tar{suffix}", data_tar.read_bytes())
    )
    return path


_PEAK_RSS_CHILD = """
import json, resource, sys
from collections import Counter
from pathlib import Path
from infra.store import LocalStore
from pipelines.code.crawl import CodeCrawlConfig, crawl_code
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
root = Path(sys.argv[1])
result = crawl_code(CodeCrawlConfig(), LocalStore(root / "store"), "bomb", root / "manifest.yaml", cache_dir=root / "c")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kb": before, "after_kb": after, "metrics": result.metrics}))
"""


def test_archive_bombs_stream_in_bounded_memory(tmp_path):
    """On main a .tar.zst (and a .deb's data.tar.zst) was decompressed whole into memory: two 6.5 KB bombs of
    200 MB of zeros raised peak RSS by 390 MB and were kept as sources. Streamed, peak RSS does not grow."""
    import json
    import subprocess
    import sys

    from infra.settings import REPO_ROOT

    zst = _bomb(tmp_path / "bomb-1.0.tar.zst", {"index.js": 200 * MB, "small.js": 100})
    deb = _deb_with(
        _bomb(tmp_path / "data.tar.zst", {"usr/share/x.js": 200 * MB}), tmp_path / "bomb_1.0_all.deb"
    )
    assert zst.stat().st_size < 100_000 and deb.stat().st_size < 100_000
    (tmp_path / "manifest.yaml").write_text(
        f"sources:\n  - {{kind: npm, name: bomb, version: '1.0', path: {zst}}}\n"
        f"  - {{kind: debian, name: bomb, version: '1.0', path: {deb}}}\n"
    )
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS_CHILD, str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    grown_mb = (out["after_kb"] - out["before_kb"]) / 1024
    assert grown_mb < 64, f"peak RSS grew by {grown_mb:.0f} MB while crawling two 200 MB bombs"
    # the default limits refuse both (30,000x their compressed size); each 200 MB member was never read
    assert out["metrics"]["skipped/archive_ratio_too_high"] == 2 and out["metrics"]["sources/failed"] == 2
    assert out["metrics"]["dropped/too_large"] == 2


@pytest.mark.parametrize(
    ("name", "members", "limits", "reason"),
    [
        (
            "zst-total",
            {f"f{i}.js": 5 * MB for i in range(10)},
            {"archive_max_total_bytes": 20 * MB, "archive_max_ratio": 1e6},
            "archive_too_large",
        ),
        (
            "gz-member",
            {"index.js": 50 * MB},
            {"archive_max_member_bytes": 10 * MB},
            "archive_member_too_large",
        ),
        ("zst-ratio", {"index.js": 40 * MB}, {"archive_max_ratio": 100.0}, "archive_ratio_too_high"),
        (
            "gz-members",
            {f"f{i}.js": 1 for i in range(3000)},
            {"archive_max_members": 1000},
            "archive_too_many_members",
        ),
    ],
    ids=["total", "member", "ratio", "members"],
)
def test_archive_over_a_limit_is_refused_with_a_counted_reason(tmp_path, name, members, limits, reason):
    archive = _bomb(
        tmp_path / (f"{name}-1.0.tar.zst" if name.startswith("zst") else f"{name}-1.0.tgz"), members
    )
    manifest = _npm_manifest(tmp_path)
    manifest.write_text(
        manifest.read_text() + f"  - {{kind: npm, name: {name}, version: '1.0', path: {archive}}}\n"
    )
    store = LocalStore(tmp_path / "store")
    result = crawl_code(CodeCrawlConfig(**limits), store, "snap-1", manifest, cache_dir=tmp_path / "cache")
    m = result.metrics
    assert m[f"skipped/{reason}"] == 1 and m["sources/failed"] == 1 and m["sources/ok"] == 1
    (error,) = result.extra["errors"]
    assert error.startswith(f"npm:{name}@1.0") and archive.name in error
    assert {r["metadata"]["package"] for r in read_shards(store, "code/raw/snap-1")} == {"tiny"}


def test_zip_bomb_is_refused_from_its_central_directory(tmp_path):
    """A 50 MB member deflates to ~50 KB: refused (ratio) before any member is inflated."""
    import zipfile

    bomb = tmp_path / "zipbomb-1.0.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("zipbomb-1.0/setup.py", "w") as out:
        for _ in range(50):
            out.write(bytes(MB))
    manifest = _npm_manifest(tmp_path)
    manifest.write_text(
        manifest.read_text() + f"  - {{kind: pypi, name: zipbomb, version: '1.0', path: {bomb}}}\n"
    )
    result = crawl_code(
        CodeCrawlConfig(), LocalStore(tmp_path / "store"), "snap-1", manifest, cache_dir=tmp_path
    )
    assert result.metrics["skipped/archive_ratio_too_high"] == 1 and result.metrics["sources/ok"] == 1
    assert "zipbomb-1.0.zip" in result.extra["errors"][0]
