"""Code-crawl sources that fail (issue 25 item 6): a damaged archive or a fetch that fails is counted under
`sources/failed/<reason>` and the crawl goes on with the other sources; a bug in our archive reader is no
bad source, it fails the crawl with its own exception. Archives are written here, fetches go to 127.0.0.1."""

from __future__ import annotations

import io
import random
import socket
import tarfile
import zipfile
from pathlib import Path

import pytest
from web_site import Reply  # tests/pipelines is on sys.path (prepend import mode)

from infra.store import LocalStore
from pipelines.code import archives
from pipelines.code.crawl import CodeCrawlConfig, crawl_code, failure_reason
from pipelines.code.records import read_shards

INDEX_JS = b"module.exports = function add(a, b) {\n  return a + b;\n};\n"
UTIL_PY = b"def add(a, b):\n    return a + b\n"


def _tar(path: Path, files: dict[str, bytes], mode: str = "w:gz", pax: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            info.pax_headers = dict(pax or {})
            tf.addfile(info, io.BytesIO(data))
    return path


def _noise(n: int) -> bytes:
    """`n` bytes of hex text that compress only ~2x: a cut in the archive lands inside this member."""
    return random.Random(0).randbytes(n // 2).hex().encode()


def _truncated_tgz(tmp_path: Path) -> Path:
    whole = _tar(tmp_path / "whole.tgz", {"index.js": INDEX_JS, "blob.js": _noise(200_000)})
    cut = tmp_path / "cut-1.0.tgz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    return cut


def _truncated_txz(tmp_path: Path) -> Path:
    whole = _tar(tmp_path / "whole.tar.xz", {"index.js": INDEX_JS, "blob.js": _noise(200_000)}, "w:xz")
    cut = tmp_path / "cut-1.0.tar.xz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 2 // 3])
    return cut


def _garbled_tgz(tmp_path: Path) -> Path:
    whole = _tar(tmp_path / "whole.tgz", {"index.js": INDEX_JS, "blob.js": _noise(200_000)}).read_bytes()
    middle = len(whole) // 2
    garbled = tmp_path / "garbled-1.0.tgz"
    garbled.write_bytes(
        whole[:middle] + bytes(b ^ 0xFF for b in whole[middle : middle + 64]) + whole[middle + 64 :]
    )
    return garbled


def _bad_pax_header(tmp_path: Path) -> Path:
    # tarfile reads GNU.sparse.map with int(): a hostile header is a ValueError raised inside tarfile
    return _tar(tmp_path / "pax-1.0.tgz", {"index.js": INDEX_JS}, pax={"GNU.sparse.map": "x,y"})


def _bad_crc_zip(tmp_path: Path) -> Path:
    path = tmp_path / "crc-1.0.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("crc-1.0/crc.py", UTIL_PY)
    data = path.read_bytes()
    at = data.index(UTIL_PY)
    path.write_bytes(data[:at] + b"D" + data[at + 1 :])  # same length, wrong CRC-32
    return path


def _manifest(tmp_path: Path, *entries: str) -> Path:
    """The given entries, then a good npm package (`tiny`): it must be crawled whatever failed before it."""
    good = _tar(tmp_path / "tiny-1.0.0.tgz", {"index.js": INDEX_JS, "lib/util.py": UTIL_PY})
    manifest = tmp_path / "manifest.yaml"
    lines = [*entries, f"{{kind: npm, name: tiny, version: '1.0.0', path: {good}}}"]
    manifest.write_text("sources:\n" + "".join(f"  - {line}\n" for line in lines))
    return manifest


def _crawl(tmp_path: Path, manifest: Path):
    store = LocalStore(tmp_path / "store")
    result = crawl_code(CodeCrawlConfig(), store, "snap-1", manifest, cache_dir=tmp_path / "cache")
    return result, store


@pytest.mark.parametrize(
    ("kind", "make"),
    [
        ("npm", _truncated_tgz),
        ("npm", _truncated_txz),
        ("npm", _garbled_tgz),
        ("npm", _bad_pax_header),
        ("pypi", _bad_crc_zip),
    ],
    ids=["truncated_tgz", "truncated_txz", "garbled_tgz", "bad_pax_header", "bad_crc_zip"],
)
def test_a_corrupt_archive_is_counted_by_reason_and_the_crawl_goes_on(tmp_path, kind, make):
    archive = make(tmp_path)
    manifest = _manifest(tmp_path, f"{{kind: {kind}, name: broken, version: '1.0', path: {archive}}}")
    result, store = _crawl(tmp_path, manifest)
    m = result.metrics
    assert m["sources/failed/archive_corrupt"] == 1  # the reason, not only the total
    assert m["sources/failed"] == 1 and m["sources/ok"] == 1
    (error,) = result.extra["errors"]
    assert error.startswith(f"{kind}:broken@1.0") and archive.name in error and "corrupt" in error
    assert "1 failed (archive_corrupt: 1)" in result.report_md
    # the source after the broken one is crawled, and nothing of the broken one is kept
    assert {r["metadata"]["package"] for r in read_shards(store, "code/raw/snap-1")} == {"tiny"}


@pytest.mark.parametrize(
    ("target", "name", "error"),
    [
        (tarfile.TarFile, "extractfile", TypeError),  # a member being read
        (archives, "_strip_top", ValueError),  # the member list being walked
    ],
    ids=["member_read_TypeError", "member_walk_ValueError"],
)
def test_a_bug_in_the_archive_reader_fails_the_crawl(tmp_path, monkeypatch, target, name, error):
    def bug(*args, **kwargs):
        raise error("a bug in our archive reader, not a corrupt archive")

    manifest = _manifest(tmp_path)
    monkeypatch.setattr(target, name, bug)
    store = LocalStore(tmp_path / "store")
    with pytest.raises(error, match="a bug in our archive reader"):
        crawl_code(CodeCrawlConfig(), store, "snap-1", manifest, cache_dir=tmp_path / "cache")
    assert store.list("code/raw/") == []  # nothing published


def test_failed_fetches_are_counted_by_reason(tmp_path, make_site):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/dead.git"
    # git's smart-HTTP discovery request: a 503 from a server that is up, a 404 for any other path
    site = make_site({"/busy.git/info/refs?service=git-upload-pack": Reply(status=503, body=b"busy")})
    manifest = _manifest(
        tmp_path,
        f"{{kind: git, name: '{dead}'}}",
        f"{{kind: git, name: '{site.url('/busy.git')}'}}",
        f"{{kind: git, name: '{site.url('/gone.git')}'}}",
    )
    result, store = _crawl(tmp_path, manifest)
    m = result.metrics
    assert (m["sources/failed/network"], m["sources/failed/http_503"], m["sources/failed/not_found"]) == (
        1,
        1,
        1,
    )
    assert m["sources/failed"] == 3 and m["sources/ok"] == 1
    assert "3 failed (http_503: 1, network: 1, not_found: 1)" in result.report_md
    assert {r["metadata"]["package"] for r in read_shards(store, "code/raw/snap-1")} == {"tiny"}


# Error lines as apt-get, npm and pip print them (what `code_sources._run` keeps of their stderr).
@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("npm x@1.0: `npm ... x@1.0` failed (exit 1): npm error code E404 | npm error 404 Not Found - GET "
         "https://registry.npmjs.org/x - Not found", "http_404"),
        ("debian x: `apt-get ... x` failed (exit 100): E: Failed to fetch http://deb.debian.org/debian/pool/"
         "main/x/x_1_all.deb  404  Not Found [IP: 151.101.2.132 80]", "http_404"),
        ("debian x: `apt-get ... x` failed (exit 100): E: Failed to fetch http://deb.debian.org/debian/pool/"
         "main/x/x_1_all.deb  Temporary failure resolving 'deb.debian.org'", "network"),
        ("debian x: `apt-get ... x` failed (exit 100): E: Unable to locate package x", "not_found"),
        ("pypi x==1.0: `python ... x==1.0` failed (exit 1): ERROR: Could not find a version that satisfies the "
         "requirement x==1.0 (from versions: none) | ERROR: No matching distribution found for x==1.0", "not_found"),
        ("npm x@1.0: `npm ... x@1.0` failed (exit 1): npm error code ECONNREFUSED | npm error errno "
         "ECONNREFUSED", "network"),
        ("npm x@1.0: `npm ... x@1.0` timed out after 900s", "timeout"),
        ("npm x@1.0: command 'npm' not found; install it or drop this source", "command_missing"),
        ("pypi:x: pypi sources need a version", "bad_manifest"),
        ("git x: `git ... HEAD` failed (exit 1): something new", "fetch_failed"),
    ],
)  # fmt: skip
def test_fetch_failure_reasons_from_tool_output(message, reason):
    from infra.code_sources import SourceFetchError

    assert failure_reason(SourceFetchError(message)) == reason
