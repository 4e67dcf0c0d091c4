"""The local web: Debian doc packages unpacked without root and served on 127.0.0.1."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import requests

from infra import local_web
from infra.local_web import (
    LocalWebUnavailable,
    docs_robots_txt,
    fetch_doc_package,
    find_html_root,
    serve_doc_packages,
    serve_tree,
)


@pytest.fixture
def doc_tree(tmp_path):
    """A package-like tree: the real docs under usr/share/doc/pkg/html, plus a stray index.html elsewhere."""
    html = tmp_path / "pkg" / "usr/share/doc/pkg/html"
    (html / "library").mkdir(parents=True)
    (html / "_sources").mkdir()
    (html / "index.html").write_text('<a href="library/index.html">lib</a><a href="about.html">about</a>')
    (html / "about.html").write_text("<p>about</p>")
    (html / "library/index.html").write_text('<a href="../index.html">up</a>')
    (html / "library/os.html").write_text("<p>os</p>")
    (html / "_sources/index.rst.txt").write_text("source")
    other = tmp_path / "pkg" / "usr/share/doc/pkg/examples"
    other.mkdir(parents=True)
    (other / "index.html").write_text("<p>examples</p>")
    (tmp_path / "secret.txt").write_text("outside the mount")
    (html / "escape.txt").symlink_to(tmp_path / "secret.txt")
    return tmp_path / "pkg"


def test_serve_tree_keeps_a_fixed_port_and_falls_back_to_a_free_one_when_it_is_taken(doc_tree, caplog):
    import socket

    mounts = {"pkg": find_html_root(doc_tree)}
    with socket.socket() as probe:  # a port that is free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with serve_tree(mounts, port=port) as base:
        assert base == f"http://127.0.0.1:{port}"
        assert requests.get(f"{base}/pkg/about.html", timeout=5).status_code == 200
        with serve_tree(mounts, port=port) as other:  # taken by the first: served elsewhere, with a warning
            assert other != base and requests.get(f"{other}/pkg/about.html", timeout=5).status_code == 200
    assert f"port {port} is not free" in caplog.text


def test_find_html_root_prefers_the_directory_above_most_pages(doc_tree):
    assert find_html_root(doc_tree) == doc_tree / "usr/share/doc/pkg/html"


def test_serve_tree_serves_pages_robots_and_nothing_outside(doc_tree):
    root = find_html_root(doc_tree)
    mounts = {"pkg": root}
    robots = docs_robots_txt(mounts)
    assert "Disallow: /pkg/_sources/" in robots and "_static" not in robots
    with serve_tree(mounts, robots) as base:
        assert base.startswith("http://127.0.0.1:")
        resp = requests.get(f"{base}/pkg/library/index.html", timeout=5)
        assert resp.status_code == 200 and "up" in resp.text
        assert resp.headers["Content-Type"].startswith("text/html")
        assert requests.get(f"{base}/robots.txt", timeout=5).text == robots
        assert (
            requests.get(f"{base}/pkg/escape.txt", timeout=5).status_code == 404
        )  # symlink out of the mount
        assert requests.get(f"{base}/pkg/../../secret.txt", timeout=5).status_code == 404
        assert requests.get(f"{base}/pkg/%2e%2e/%2e%2e/secret.txt", timeout=5).status_code == 404
        assert requests.get(f"{base}/nope/index.html", timeout=5).status_code == 404
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/pkg/index.html", timeout=2)  # stopped with the context


def test_crawl_of_the_served_tree_counts_every_disallowed_url_once(tmp_path):
    """A robots.txt the test writes: 4 distinct URLs are disallowed for us (one linked twice), a group for
    another bot does not apply, and nothing disallowed is ever requested."""
    from infra.store import LocalStore
    from pipelines.web.crawl import CrawlConfig, crawl_seeds

    site = tmp_path / "site"
    (site / "private").mkdir(parents=True)
    (site / "_sources").mkdir()
    links = {
        "index.html": ["a.html", "b.html", "private/x.html", "private/y.html", "_sources/index.rst.txt"],
        "a.html": ["private/x.html", "private/z.html", "index.html"],
        "b.html": ["a.html"],
    }
    for page, targets in links.items():
        (site / page).write_text("".join(f'<a href="{t}">{t}</a>' for t in targets))
    for page in ("private/x.html", "private/y.html", "private/z.html"):
        (site / page).write_text("<p>private</p>")
    (site / "_sources/index.rst.txt").write_text("source")
    robots = (
        "User-agent: OtherBot\nDisallow: /\n\n"
        "User-agent: *\nDisallow: /site/private/\nDisallow: /site/_sources/\nAllow: /\n"
    )
    with serve_tree({"site": site}, robots) as base:
        config = CrawlConfig(max_pages=50, requests_per_second_per_host=200.0)
        result = crawl_seeds(
            config, LocalStore(tmp_path / "store"), "s", "web/warc/s", [f"{base}/site/index.html"]
        )
    m = result.metrics
    assert m["robots_disallowed"] == 4  # private/x, private/y, private/z, _sources/index.rst.txt
    assert m["pages_fetched"] == 3 and m["duplicate_url"] == 3  # a.html, private/x.html, index.html again
    assert m["requests"] == 1 + 3  # robots.txt and the three allowed pages; no disallowed URL was fetched
    assert m["robots_fetched"] == 1 and m["bad_content_type"] == 0


def test_cached_package_is_not_downloaded_again(tmp_path, doc_tree, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copytree(doc_tree, cache / "pkg", symlinks=True)
    (cache / "pkg" / ".extracted").write_text("pkg.deb\n")

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded although cached")

    monkeypatch.setattr(local_web, "_apt_download", no_download)
    with serve_doc_packages(["pkg"], cache_dir=cache) as seeds:
        assert len(seeds) == 1 and seeds[0].endswith("/pkg/index.html")
        assert "about" in requests.get(seeds[0], timeout=5).text


def test_without_apt_the_error_says_how_to_crawl_instead(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get, no dpkg-deb
    with pytest.raises(LocalWebUnavailable, match="source: seeds.*source: warc"):
        fetch_doc_package("python3.11-doc", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "python3.11-doc").exists()


def test_default_cache_is_under_the_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CRUCIBLE_STATE_DIR", str(tmp_path / "state"))
    assert local_web.default_cache_dir() == tmp_path / "state" / "cache" / "debian-docs"


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("apt-get"), reason="needs apt-get (Debian)")
def test_real_python_docs_are_fetched_served_and_crawled(tmp_path):
    from infra.store import LocalStore
    from pipelines.web.crawl import CrawlConfig, crawl_seeds

    started = time.monotonic()
    with serve_doc_packages(["python3.11-doc"], cache_dir=tmp_path / "cache") as seeds:
        assert requests.get(seeds[0], timeout=10).status_code == 200
        config = CrawlConfig(max_pages=30, requests_per_second_per_host=100.0)
        result = crawl_seeds(config, LocalStore(tmp_path / "store"), "py", "web/warc/py", seeds)
    assert result.metrics["pages_fetched"] == 30
    # docs_robots_txt disallows _sources/, _static/ and _images/; Debian's Python docs link those only from
    # <link>/<script>/<img> (no <a href> into them in any of the 530 pages), so exactly 0 URLs are dropped
    # by robots.txt: a rule matching too much (e.g. the whole mount) would drop pages here.
    assert result.metrics["robots_disallowed"] == 0 and result.metrics["bad_content_type"] == 0
    assert result.metrics["fetch_error"] == 0
    assert (tmp_path / "cache/python3.11-doc/.extracted").exists()
    assert time.monotonic() - started < 60


@pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="needs dpkg-deb (Debian)")
def test_a_tree_another_process_published_meanwhile_is_kept(tmp_path, doc_tree, monkeypatch):
    """Two runs extracting one package at once: the later one must not delete the tree the earlier one
    published (its readers are using it); before, it removed it and renamed its own copy in place."""
    import subprocess

    package = tmp_path / "build"
    shutil.copytree(doc_tree, package, symlinks=True)
    (package / "DEBIAN").mkdir()
    (package / "DEBIAN" / "control").write_text(
        "Package: pkg\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
    )
    deb = tmp_path / "pkg_1.0_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(package), str(deb)], check=True,
                   capture_output=True)  # fmt: skip
    cache = tmp_path / "cache"
    theirs = cache / "pkg" / "usr/share/doc/pkg/html/index.html"

    def download(name, dest):
        return Path(shutil.copy(deb, dest))

    def download_while_another_run_publishes(name, dest):
        monkeypatch.setattr(local_web, "_apt_download", download)
        fetch_doc_package("pkg", cache_dir=cache)  # the other run, which finishes first
        theirs.write_text("their copy")
        return download(name, dest)

    monkeypatch.setattr(local_web, "_apt_download", download_while_another_run_publishes)
    root = fetch_doc_package("pkg", cache_dir=cache)
    assert root == cache / "pkg" and theirs.read_text() == "their copy"
    assert [p.name for p in cache.iterdir()] == ["pkg"]  # our temp tree is gone
