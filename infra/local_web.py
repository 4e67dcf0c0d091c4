"""A real local web to crawl: HTML documentation from Debian packages, served on 127.0.0.1.

`serve_doc_packages(["python3.11-doc"])` downloads each package with `apt-get download` (no root), unpacks it
with `dpkg-deb -x` into a cache under the state dir (reused by later runs), finds its HTML root and serves all
of them from one ThreadingHTTPServer on a free 127.0.0.1 port, yielding one seed URL per package.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

log = logging.getLogger(__name__)

_DONE_MARKER = ".extracted"
_DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy 5.6.1: also a safe directory name
_NO_APT_HELP = (
    "set the web_crawl stage to `source: seeds` with your own `seeds: [https://...]`, or to `source: warc` "
    "with `warc_uri:` pointing at WARC files (a local path or s3:// prefix)"
)


class LocalWebUnavailable(RuntimeError):
    """The Debian documentation packages cannot be fetched here; the message says what to do instead."""


def default_cache_dir() -> Path:
    from infra.settings import load_profile

    return load_profile().state_path / "cache" / "debian-docs"


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def _apt_download(package: str, dest: Path) -> Path:
    """`apt-get download PACKAGE` into `dest`; runs `apt-get update` once if apt does not know the package."""
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise LocalWebUnavailable(
            f"apt-get/dpkg-deb not found, so the local web ({package}) cannot be built: " + _NO_APT_HELP
        )
    result = _run(["apt-get", "download", "--", package], cwd=dest)
    if result.returncode != 0:
        log.info(
            "apt-get download %s failed (%s); running apt-get update once", package, result.stderr.strip()
        )
        update = _run(["apt-get", "update", "-qq"], timeout=600)
        if update.returncode != 0:
            raise LocalWebUnavailable(
                f"apt-get download {package} failed ({result.stderr.strip()}) and apt-get update failed "
                f"({update.stderr.strip()}; it needs root or a readable package list): " + _NO_APT_HELP
            )
        result = _run(["apt-get", "download", "--", package], cwd=dest)
        if result.returncode != 0:
            raise LocalWebUnavailable(
                f"apt-get download {package} failed: {result.stderr.strip()}: " + _NO_APT_HELP
            )
    debs = sorted(dest.glob("*.deb"))
    if not debs:
        raise LocalWebUnavailable(f"apt-get download {package} produced no .deb in {dest}: " + _NO_APT_HELP)
    return debs[0]


def fetch_doc_package(package: str, cache_dir: Path | None = None) -> Path:
    """The unpacked file tree of a Debian package (downloaded and extracted once, then cached)."""
    if not _DEBIAN_PACKAGE.fullmatch(package) or ".." in package:
        raise ValueError(f"doc package {package!r} is not a Debian package name ({_DEBIAN_PACKAGE.pattern})")
    cache_dir = Path(cache_dir or default_cache_dir())
    root = cache_dir / package
    if (root / _DONE_MARKER).exists():
        return root
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f".{package}-") as tmp:
        tmp = Path(tmp)
        (tmp / "deb").mkdir()
        deb = _apt_download(package, tmp / "deb")
        tree = tmp / "tree"
        result = _run(["dpkg-deb", "-x", "--", str(deb), str(tree)])
        if result.returncode != 0:
            raise LocalWebUnavailable(f"dpkg-deb -x {deb.name} failed: {result.stderr.strip()}")
        (tree / _DONE_MARKER).write_text(deb.name + "\n")
        _publish_tree(tree, root)
    log.info("extracted %s into %s", package, root)
    return root


def _publish_tree(tree: Path, root: Path) -> None:
    """Rename `tree` to `root` (atomic: a half-extracted tree never looks cached). If another process
    published `root` meanwhile, keep theirs: replacing a tree someone may be reading would pull it away."""
    try:
        os.rename(tree, root)
    except OSError:
        if (root / _DONE_MARKER).exists():
            return
        shutil.rmtree(root, ignore_errors=True)  # not a published tree (no marker): e.g. an old layout
        os.rename(tree, root)


def doc_package_source(package: str, cache_dir: Path | None = None) -> str:
    """The Debian archive (name_version_arch.deb) `fetch_doc_package` unpacked: what a stage read, for lineage."""
    return (fetch_doc_package(package, cache_dir) / _DONE_MARKER).read_text().strip()


def find_html_root(tree: Path) -> Path:
    """The directory of the package's main `index.html`: the one above the most HTML files (then shallowest)."""
    html_dirs: dict[Path, int] = {}
    for dirpath, _, files in os.walk(tree):  # does not follow symlinked directories
        count = sum(f.endswith((".html", ".htm")) for f in files)
        if count:
            html_dirs[Path(dirpath)] = count
    best: tuple[int, int, Path] | None = None
    for directory in html_dirs:
        if not (directory / "index.html").is_file():
            continue
        below = sum(n for d, n in html_dirs.items() if d == directory or directory in d.parents)
        key = (below, -len(directory.parts), directory)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        raise LocalWebUnavailable(f"no index.html found under {tree}")
    return best[2]


class _DocsHandler(SimpleHTTPRequestHandler):
    """Serves `/<mount>/...` from the mounted directories and `/robots.txt`; never outside a mount."""

    def __init__(self, *args, mounts: dict[str, Path], robots_txt: str, **kwargs):
        self.mounts, self.robots_txt = mounts, robots_txt
        super().__init__(*args, directory=str(next(iter(mounts.values()))), **kwargs)

    def do_GET(self):  # noqa: N802
        if urlsplit(self.path).path == "/robots.txt":
            body = self.robots_txt.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

    def translate_path(self, path: str) -> str:
        parts = unquote(urlsplit(path).path).lstrip("/").split("/", 1)
        base = self.mounts.get(parts[0])
        if base is None:
            return str(Path(os.devnull) / "missing")  # -> 404
        target = (base / (parts[1] if len(parts) > 1 else "")).resolve()
        if target != base and base not in target.parents:
            return str(Path(os.devnull) / "missing")  # a symlink or '..' escaping the mount -> 404
        return str(target)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        log.debug("local web: " + format, *args)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A crawler closing the connection early (an oversize page) is normal, not a server error.
        log.debug("local web: client %s went away", client_address, exc_info=True)


@contextmanager
def serve_tree(
    mounts: dict[str, Path], robots_txt: str = "User-agent: *\nAllow: /\n", port: int = 0
) -> Iterator[str]:
    """Serve directories under `/<name>/` on 127.0.0.1:`port` (0, or `port` in use: a free one); yields the
    base URL `http://127.0.0.1:P`. A fixed port keeps the pages' URLs, and all that is keyed by them, the
    same from run to run."""
    mounts = {name: Path(path).resolve() for name, path in mounts.items()}
    handler = partial(_DocsHandler, mounts=mounts, robots_txt=robots_txt)
    try:
        server = _QuietServer(("127.0.0.1", port), handler)
    except OSError as exc:
        if not port:
            raise
        server = _QuietServer(("127.0.0.1", 0), handler)
        log.warning("local web: port %d is not free (%s): serving on %d instead, so page URLs differ from a "
                    "run on port %d", port, exc, server.server_port, port)  # fmt: skip
    thread = threading.Thread(target=server.serve_forever, name="local-web", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def docs_robots_txt(mounts: dict[str, Path]) -> str:
    """Keep crawlers out of Sphinx source and static dirs, so the page budget goes to documentation pages."""
    lines = ["User-agent: *"]
    for name, path in mounts.items():
        lines += [
            f"Disallow: /{name}/{sub}/" for sub in ("_sources", "_static", "_images") if (path / sub).is_dir()
        ]
    return "\n".join(lines + ["Allow: /", ""])


@contextmanager
def serve_doc_packages(
    packages: list[str], cache_dir: Path | None = None, port: int = 0
) -> Iterator[list[str]]:
    """Serve the HTML docs of Debian `packages` on 127.0.0.1:`port` (`serve_tree`); yields one seed URL
    (index.html) per package."""
    if not packages:
        raise LocalWebUnavailable(
            "doc_packages is empty: name at least one Debian doc package, or " + _NO_APT_HELP
        )
    mounts = {package: find_html_root(fetch_doc_package(package, cache_dir)) for package in packages}
    with serve_tree(mounts, docs_robots_txt(mounts), port) as base:
        yield [f"{base}/{package}/index.html" for package in packages]
