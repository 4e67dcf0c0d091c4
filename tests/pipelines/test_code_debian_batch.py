"""Many Debian packages in one `apt-get` call (`code_sources.prefetch_debian`): what arrives whole is cached
exactly where the one-package fetchers look, the rest is left to them. `apt-get` is replaced by a stub that
behaves as the real one does (checked by hand against deb.debian.org): an unknown name refuses the whole
call before any download; a 404 fails the call after the other files arrived."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from infra import code_sources

SOURCES = {  # name -> (version, {file: bytes}); `gone` lists a tarball the mirror 404s
    "hello": (
        "2.10-3",
        {"hello_2.10.orig.tar.gz": b"upstream" * 50, "hello_2.10-3.debian.tar.xz": b"deb" * 9},
    ),
    "sed": ("4.9-1", {"sed_4.9.orig.tar.xz": b"sed" * 70, "sed_4.9-1.debian.tar.xz": b"pkg" * 5}),
    "gone": ("1.0-1", {"gone_1.0.orig.tar.gz": b"x" * 40, "gone_1.0-1.debian.tar.xz": b"y" * 3}),
}
MISSING = {"gone_1.0-1.debian.tar.xz"}


def _dsc(name: str, version: str, files: dict[str, bytes]) -> str:
    lines = [f" {hashlib.md5(data).hexdigest()} {len(data)} {f}" for f, data in files.items()]
    return f"Format: 3.0 (quilt)\nSource: {name}\nVersion: {version}\nFiles:\n" + "\n".join(lines) + "\n"


class _Apt:
    def ensure(self) -> None:
        pass

    def options(self) -> list[str]:
        return []


def _fake_apt_get(calls: list[list[str]]):
    def run(cmd, what, cwd=None, **kwargs):
        calls.append(cmd)
        names = [t.split("=")[0] for t in cmd[cmd.index("--") + 1 :]]
        unknown = [n for n in names if n not in SOURCES]
        if unknown:
            raise code_sources.SourceFetchError(
                f"{what}: failed (exit 100): "
                + " | ".join(f"E: Unable to find a source package for {n}" for n in unknown)
            )
        for n in names:
            version, files = SOURCES[n]
            (cwd / f"{n}_{version}.dsc").write_text(_dsc(n, version, files))
            for f, data in files.items():
                if f not in MISSING:
                    (cwd / f).write_bytes(data)
        if any(f in MISSING for n in names for f in SOURCES[n][1]):
            raise code_sources.SourceFetchError(
                f"{what}: failed (exit 100): E: Failed to fetch 404 Not Found"
            )
        return ""

    return run


def test_one_call_caches_what_arrived_whole_and_leaves_the_rest(tmp_path, monkeypatch):
    calls: list[list[str]] = []
    monkeypatch.setattr(code_sources, "_run", _fake_apt_get(calls))
    targets = [("hello", None), ("nosuch", None), ("sed", "4.9-1"), ("gone", None)]
    published = code_sources.prefetch_debian(_Apt(), "debian_source", targets, tmp_path)
    assert published == {"hello", "sed"}
    # the unknown name was dropped and the call repeated once; nothing else was asked
    assert [c[c.index("--") + 1 :] for c in calls] == [
        ["hello", "nosuch", "sed=4.9-1", "gone"],
        ["hello", "sed=4.9-1", "gone"],
    ]
    for name in ("hello", "sed"):
        version, files = SOURCES[name]
        dest = tmp_path / "debian_source" / f"{name}_{version}"
        assert sorted(p.name for p in dest.iterdir()) == sorted([f"{name}_{version}.dsc", *files])
        # the one-package fetcher finds it in its cache and never calls apt
        before = len(calls)
        fetched = code_sources.fetch_debian_source(
            _Apt(), name, None if name == "hello" else version, tmp_path
        )
        assert fetched.cached and fetched.version == version and len(calls) == before
        assert fetched.files[0].name.endswith(".dsc")
        assert {f.name: f.read_bytes() for f in fetched.files[1:]} == files
    # the 404'd package is not cached, nothing half-written is left behind
    assert not list((tmp_path / "debian_source").glob("gone_*"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    # cached packages are not asked again
    calls.clear()
    assert code_sources.prefetch_debian(_Apt(), "debian_source", targets, tmp_path) == set()
    assert [c[c.index("--") + 1 :] for c in calls] == [["nosuch", "gone"], ["gone"]]


def test_a_dsc_naming_a_path_outside_the_batch_is_not_published(tmp_path, monkeypatch):
    def run(cmd, what, cwd=None, **kwargs):
        for n in ("hello", "sed"):
            version, files = SOURCES[n]
            names = {("../" + f if n == "sed" else f): data for f, data in files.items()}
            (cwd / f"{n}_{version}.dsc").write_text(_dsc(n, version, names))
            for f, data in files.items():
                (cwd / f).write_bytes(data)
                (cwd.parent / f).write_bytes(data)  # where `../f` points: it exists, and must stay put
        return ""

    monkeypatch.setattr(code_sources, "_run", run)
    published = code_sources.prefetch_debian(
        _Apt(), "debian_source", [("hello", None), ("sed", None)], tmp_path
    )
    assert published == {"hello"}
    assert (tmp_path / "sed_4.9.orig.tar.xz").read_bytes() == SOURCES["sed"][1]["sed_4.9.orig.tar.xz"]


@pytest.mark.parametrize("kind", ["debian", "debian_source"])
def test_fewer_than_two_packages_to_fetch_make_no_batch(tmp_path, monkeypatch, kind):
    calls: list = []
    monkeypatch.setattr(code_sources, "_run", lambda *a, **k: calls.append(a))
    assert code_sources.prefetch_debian(_Apt(), kind, [("hello", None)], tmp_path) == set()
    # a name listed twice (two versions) is left to the one-package fetcher
    assert code_sources.prefetch_debian(_Apt(), kind, [("a", "1"), ("a", "2")], tmp_path) == set()
    assert calls == []


def test_binary_debs_are_cached_by_package_and_version(tmp_path, monkeypatch):
    def run(cmd, what, cwd=None, **kwargs):
        for t in cmd[cmd.index("--") + 1 :]:
            name = t.split("=")[0]
            Path(cwd, f"{name}_1.2-3_amd64.deb").write_bytes(name.encode())
        return ""

    monkeypatch.setattr(code_sources, "_run", run)
    assert code_sources.prefetch_debian(_Apt(), "debian", [("grep", None), ("zsh", "9:1.2-3")], tmp_path) == {
        "grep",
        "zsh",
    }
    grep = code_sources.fetch_debian_binary(_Apt(), "grep", None, tmp_path)
    zsh = code_sources.fetch_debian_binary(_Apt(), "zsh", "9:1.2-3", tmp_path)
    assert grep.cached and grep.version == "1.2-3" and grep.files[0].read_bytes() == b"grep"
    assert zsh.cached and zsh.version == "9:1.2-3" and zsh.files[0].name == "zsh_1.2-3_amd64.deb"


def test_a_batch_that_timed_out_publishes_nothing(tmp_path, monkeypatch):
    def run(cmd, what, cwd=None, **kwargs):  # files written, then apt killed: one may be cut short
        for n in ("hello", "sed"):
            version, files = SOURCES[n]
            (cwd / f"{n}_{version}.dsc").write_text(_dsc(n, version, files))
            for f, data in files.items():
                (cwd / f).write_bytes(data)
        raise code_sources.FetchTimeout(f"{what}: apt-get -q source timed out after 910s")

    monkeypatch.setattr(code_sources, "_run", run)
    assert (
        code_sources.prefetch_debian(_Apt(), "debian_source", [("hello", None), ("sed", None)], tmp_path)
        == set()
    )
    assert not (tmp_path / "debian_source").exists()
