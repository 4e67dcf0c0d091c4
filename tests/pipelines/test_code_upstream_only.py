"""Debian source packages whose debian/ tarball the mirror 404s: the fetcher keeps the upstream tarball(s)
(only when a .dsc and every upstream tarball it lists arrived whole), and the reader skips the missing
packaging tarball only for such a download. No network: `apt-get` is replaced by a stub."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from infra import code_sources
from pipelines.code.archives import ArchiveError, iter_source_files

SCALA = 'object Hello {\n  def main(args: Array[String]): Unit = println("hi")\n}\n'


def _orig_tarball(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, text in {"hello-1.0/src/Hello.scala": SCALA, "hello-1.0/README.md": "# hello\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _dsc(path: Path, orig: bytes, orig_size: int | None = None) -> None:
    md5 = hashlib.md5(orig).hexdigest()
    path.write_text(
        "Format: 3.0 (quilt)\nSource: hello\nVersion: 1.0-2\nFiles:\n"
        f" {md5} {orig_size if orig_size is not None else len(orig)} hello_1.0.orig.tar.gz\n"
        f" {'0' * 32} 1234 hello_1.0-2.debian.tar.xz\n"
    )


class _Apt:
    def ensure(self) -> None:
        pass

    def options(self) -> list[str]:
        return []


def _fake_apt_get(orig_size: int | None = None):
    """An `apt-get source` that downloads the .dsc and the orig tarball, then fails on the debian/ tarball."""

    def run(cmd, what, cwd=None, **kwargs):
        orig = _orig_tarball(cwd / "hello_1.0.orig.tar.gz")
        _dsc(cwd / "hello_1.0-2.dsc", orig, orig_size)
        raise code_sources.SourceFetchError(
            f"{what}: Failed to fetch hello_1.0-2.debian.tar.xz 404 Not Found"
        )

    return run


def test_upstream_tarball_kept_when_only_the_debian_tarball_404s(tmp_path, monkeypatch):
    monkeypatch.setattr(code_sources, "_run", _fake_apt_get())
    fetched = code_sources.fetch_debian_source(_Apt(), "hello", None, tmp_path)
    assert fetched.version == "1.0-2"
    names = [f.name for f in fetched.files]
    assert names[0] == "hello_1.0-2.dsc" and code_sources.UPSTREAM_ONLY_MARKER in names
    members = {m.path: m.read().decode() for m in iter_source_files("debian_source", fetched.files)}
    assert members == {"src/Hello.scala": SCALA, "README.md": "# hello\n"}
    # served from the cache the second time, still readable
    again = code_sources.fetch_debian_source(_Apt(), "hello", None, tmp_path)
    assert again.cached and [f.name for f in again.files] == names


def test_truncated_upstream_tarball_still_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(code_sources, "_run", _fake_apt_get(orig_size=10**6))  # .dsc size != file size
    with pytest.raises(code_sources.SourceFetchError, match="404"):
        code_sources.fetch_debian_source(_Apt(), "hello", None, tmp_path)
    assert not (tmp_path / "debian_source").exists()


def test_missing_debian_tarball_without_marker_is_an_error(tmp_path):
    orig = _orig_tarball(tmp_path / "hello_1.0.orig.tar.gz")
    _dsc(tmp_path / "hello_1.0-2.dsc", orig)
    files = [tmp_path / "hello_1.0-2.dsc", tmp_path / "hello_1.0.orig.tar.gz"]
    with pytest.raises(ArchiveError, match="debian.tar.xz, which was not downloaded"):
        list(iter_source_files("debian_source", files))
    (tmp_path / code_sources.UPSTREAM_ONLY_MARKER).write_text("404\n")
    assert sorted(m.path for m in iter_source_files("debian_source", files)) == [
        "README.md",
        "src/Hello.scala",
    ]
