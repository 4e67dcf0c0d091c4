"""Fetch code the way Software Heritage archives it: Debian binary and source packages, npm tarballs, PyPI
sdists and git repositories, each cached on local disk so a re-run does not touch the network.

Every fetcher returns a `FetchedSource` (the archive files or checkout directory, the resolved version or
commit, whether it came from the cache). Debian source packages need a deb-src list: we keep a private apt
configuration (sources list, package lists, archive cache) under the cache directory, so the system's apt
state is neither needed nor modified.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SUITE = "bookworm"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
APT_LISTS_MAX_AGE_S = 7 * 24 * 3600
# Transports git may use: no `ext::` (runs a command), no `fd::`, no remote helpers. Every subprocess below
# also puts `--` before its manifest-derived positionals, so a name can never be read as an option.
GIT_URL_SCHEMES = ("https", "http", "git", "file")
_GIT_SAFETY = ["-c", "protocol.ext.allow=never", "-c", "protocol.fd.allow=never"]
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class SourceFetchError(RuntimeError):
    """A source could not be fetched; the message names the source and the command that failed."""


class FetchTimeout(SourceFetchError):
    """The fetch command ran past its timeout and was killed: what it left behind may be cut short."""


@dataclass
class FetchedSource:
    kind: str  # debian | debian_source | npm | pypi | git
    name: str
    version: str  # package version, or the git commit
    files: list[Path] = field(default_factory=list)  # archives (or one checkout directory for git)
    cached: bool = False
    seconds: float = 0.0


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name)


def _run(
    cmd: list[str], what: str, cwd: Path | None = None, timeout: float = 900, env: dict | None = None
) -> str:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        raise SourceFetchError(
            f"{what}: command {cmd[0]!r} not found; install it or drop this source"
        ) from None
    except subprocess.TimeoutExpired:
        raise FetchTimeout(f"{what}: {' '.join(cmd[:4])} timed out after {timeout:.0f}s") from None
    if proc.returncode != 0:
        lines = [
            x for x in (proc.stderr or proc.stdout).splitlines() if x.strip() and not x.startswith("W: ")
        ]
        # apt/npm put the reason on their error lines: keep those, not the whole invocation
        errors = [x for x in lines if x.startswith(("E:", "npm error", "ERROR", "fatal"))] or lines
        detail = " | ".join(errors[-3:])[:500]
        raise SourceFetchError(f"{what}: `{cmd[0]} ... {cmd[-1]}` failed (exit {proc.returncode}): {detail}")
    return proc.stdout


def _publish_dir(tmp: Path, dest: Path) -> None:
    """Move a finished download directory into place (atomic rename; a half-done fetch never looks cached)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        return
    os.replace(tmp, dest)


# --- Debian ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AptConfig:
    """A private apt configuration (deb + deb-src lists) living under `root`."""

    root: Path
    mirror: str = DEBIAN_MIRROR
    suite: str = DEBIAN_SUITE

    def options(self) -> list[str]:
        return [
            "-o", f"Dir::Etc::SourceList={self.root / 'sources.list'}",
            "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={self.root / 'lists'}",
            "-o", f"Dir::Cache={self.root / 'cache'}",
            "-o", "APT::Get::AllowUnauthenticated=false",
            "-o", "Debug::NoLocking=1",
            # the machine's dpkg status would make an installed security update (not on the mirror's suite)
            # the candidate version, and `apt-get download` of it fails
            "-o", "Dir::State::status=/dev/null",
        ]  # fmt: skip

    def ensure(self) -> None:
        """Write the sources list and run `apt-get update` into the private lists dir when they are stale."""
        (self.root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (self.root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        signed = f"[signed-by={DEBIAN_KEYRING}] " if Path(DEBIAN_KEYRING).exists() else ""
        sources = (
            f"deb {signed}{self.mirror} {self.suite} main\ndeb-src {signed}{self.mirror} {self.suite} main\n"
        )
        src_file = self.root / "sources.list"
        if not src_file.exists() or src_file.read_text() != sources:
            src_file.write_text(sources)
            (self.root / "updated").unlink(missing_ok=True)
        stamp = self.root / "updated"
        if stamp.exists() and time.time() - stamp.stat().st_mtime < APT_LISTS_MAX_AGE_S:
            return
        log.info("apt-get update (private deb + deb-src lists in %s)", self.root)
        _run(["apt-get", "-q", *self.options(), "update"], "apt-get update", timeout=600)
        stamp.write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))


def _cached_unpinned(root: Path, package: str) -> Path | None:
    """A cached download of `package` at any version, if fresher than the apt lists' max age."""
    if not root.exists():
        return None
    dirs = sorted(
        (d for d in root.glob(f"{_safe(package)}_*") if d.is_dir()), key=lambda d: d.stat().st_mtime
    )
    if dirs and time.time() - dirs[-1].stat().st_mtime < APT_LISTS_MAX_AGE_S:
        return dirs[-1]
    return None


def _deb_version(deb: Path) -> str:
    # pool file names are NAME_VERSION_ARCH.deb with the epoch colon url-encoded
    return deb.name.split("_")[1].replace("%3a", ":")


def _listed(root: Path, kind: str, package: str, version: str | None) -> list[Path]:
    """The cached files of one Debian package (binary .deb, or source .dsc first), [] when not cached."""
    dest = root / f"{_safe(package)}_{_safe(version)}" if version else _cached_unpinned(root, package)
    if dest is None or not dest.exists():
        return []
    return sorted(dest.glob("*.deb")) if kind == "debian" else _source_files(dest)


def fetch_debian_binary(apt: AptConfig, package: str, version: str | None, cache_dir: Path) -> FetchedSource:
    """`apt-get download PACKAGE[=VERSION]` into the cache; returns the .deb (version read from its name)."""
    t0 = time.time()
    root = cache_dir / "debian"
    if debs := _listed(root, "debian", package, version):
        return FetchedSource("debian", package, version or _deb_version(debs[0]), debs, cached=True)
    apt.ensure()
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    target = f"{package}={version}" if version else package
    _run(["apt-get", "-q", *apt.options(), "download", "--", target], f"debian {package}", cwd=tmp)
    debs = sorted(tmp.glob("*.deb"))
    if not debs:
        raise SourceFetchError(f"debian {package}: apt-get download produced no .deb")
    version = version or _deb_version(debs[0])
    dest = root / f"{_safe(package)}_{_safe(version)}"
    _publish_dir(tmp, dest)
    return FetchedSource("debian", package, version, sorted(dest.glob("*.deb")), seconds=time.time() - t0)


def _source_files(dest: Path) -> list[Path]:
    dscs = sorted(dest.glob("*.dsc")) if dest.exists() else []
    return dscs + sorted(p for p in dest.iterdir() if p.suffix != ".dsc") if dscs else []


def _dsc_version(dsc: Path) -> str:
    m = re.search(r"^Version:\s*(\S+)", dsc.read_text(errors="replace"), re.M)
    if not m:
        raise SourceFetchError(f"{dsc.name}: no Version field")
    return m.group(1)


UPSTREAM_ONLY_MARKER = "upstream-only.txt"  # in a Debian source download whose debian/ tarball is missing
_DSC_ENTRY = re.compile(r"^ [0-9a-f]{32} (\d+) (\S+)$", re.M)  # the md5 `Files:` lines of a .dsc


def _upstream_tarballs_complete(tmp: Path) -> bool:
    """A .dsc was fetched and every upstream tarball it lists is there at its listed size (only the
    `.debian.tar.*` packaging tarball may be missing)."""
    dscs = sorted(tmp.glob("*.dsc"))
    if not dscs:
        return False
    entries = [(int(n), name) for n, name in _DSC_ENTRY.findall(dscs[0].read_text(errors="replace"))]
    upstream = [(n, name) for n, name in entries if ".tar" in name and ".debian.tar." not in name
                and not name.endswith(".asc")]  # fmt: skip
    return bool(upstream) and all((tmp / name).exists() and (tmp / name).stat().st_size == n
                                  for n, name in upstream)  # fmt: skip


def fetch_debian_source(apt: AptConfig, package: str, version: str | None, cache_dir: Path) -> FetchedSource:
    """`apt-get source --download-only PACKAGE[=VERSION]` (needs the deb-src list); returns the .dsc first."""
    t0 = time.time()
    root = cache_dir / "debian_source"
    if files := _listed(root, "debian_source", package, version):
        return FetchedSource("debian_source", package, version or _dsc_version(files[0]), files, cached=True)
    apt.ensure()
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    target = f"{package}={version}" if version else package
    # --only-source: the name is a source package, even if a binary package has the same name
    cmd = ["apt-get", "-q", *apt.options(), "source", "--download-only", "--only-source", "--", target]
    try:
        _run(cmd, f"debian source {package}", cwd=tmp)
    except SourceFetchError as exc:
        # a mirror may serve the upstream tarball but 404 the debian/ packaging one: the code is upstream's
        if not _upstream_tarballs_complete(tmp):
            raise
        log.warning("debian source %s: keeping the upstream tarball(s) only (%s)", package, str(exc)[-200:])
        (tmp / UPSTREAM_ONLY_MARKER).write_text(f"debian/ tarball not fetched: {exc}\n")
    files = _source_files(tmp)
    if not files:
        raise SourceFetchError(f"debian source {package}: apt-get source produced no .dsc")
    version = version or _dsc_version(files[0])
    dest = root / f"{_safe(package)}_{_safe(version)}"
    _publish_dir(tmp, dest)
    return FetchedSource("debian_source", package, version, _source_files(dest), seconds=time.time() - t0)


_APT_UNKNOWN = re.compile(
    r"Unable to find a source package for (\S+)|Unable to locate package (\S+)"
    r"|Version '[^']*' for '([^']+)' was not found|Can not find version '[^']*' of package '([^']+)'"
    r"|Package '([^']+)' has no installation candidate|Can't select candidate version from package (\S+)"
)


def _arrived(batch: Path, kind: str, package: str) -> list[Path] | None:
    """`package`'s files in a batch download when all arrived whole (.dsc first), else None."""
    if kind == "debian":
        debs = [p for p in batch.glob("*.deb") if p.name.split("_")[0] == package]
        return debs if len(debs) == 1 else None
    dscs = [p for p in batch.glob("*.dsc") if p.name.split("_")[0] == package]
    if len(dscs) != 1:
        return None
    entries = _DSC_ENTRY.findall(dscs[0].read_text(errors="replace"))
    if any(name != Path(name).name or name.startswith(".") for _, name in entries):
        return None  # a file name is a path here: never one that leaves the batch directory
    listed = [(int(n), batch / name) for n, name in entries]
    if not listed or not all(f.is_file() and f.stat().st_size == n for n, f in listed):
        return None
    return [dscs[0], *(f for _, f in listed)]


def prefetch_debian(
    apt: AptConfig, kind: str, targets: list[tuple[str, str | None]], cache_dir: Path
) -> set[str]:
    """Download many Debian packages (`kind` debian: binaries, debian_source: sources) with one `apt-get`
    call into the cache where `fetch_debian_binary` / `fetch_debian_source` look first: apt reads its package
    lists once per call (~0.6 s of CPU, most of what a one-package fetch costs). A package is published only
    when all its files arrived whole (apt checks their hashes); a 404, an unknown name or a name listed twice
    is left to the one-package fetcher, which reports it. Returns the names published."""
    root = cache_dir / kind
    names = [name for name, _ in targets]
    todo = {n: v for n, v in targets if names.count(n) == 1 and not _listed(root, kind, n, v)}
    if len(todo) < 2:
        return set()
    apt.ensure()
    verb = ["download"] if kind == "debian" else ["source", "--download-only", "--only-source"]
    batch = Path(tempfile.mkdtemp(prefix=".batch-", dir=cache_dir))
    published: set[str] = set()
    try:
        asked = dict(todo)
        for _ in range(8):  # apt refuses the whole call over one unknown name: drop the names it reports
            cmd = [
                "apt-get",
                "-q",
                *apt.options(),
                *verb,
                "--",
                *(f"{n}={v}" if v else n for n, v in asked.items()),
            ]
            try:
                _run(cmd, f"debian batch of {len(asked)} {kind}", cwd=batch, timeout=900 + 5 * len(asked))
                break
            except FetchTimeout:  # killed mid-download: no file in the batch is trusted
                asked = {}
                break
            except SourceFetchError as exc:  # a 404 leaves the other files in place
                unknown = {g for m in _APT_UNKNOWN.finditer(str(exc)) for g in m.groups() if g} & set(asked)
                if not unknown:
                    break
                asked = {n: v for n, v in asked.items() if n not in unknown}
        for name, version in asked.items():
            files = _arrived(batch, kind, name)
            if files is None:
                continue
            try:
                version = version or (_deb_version(files[0]) if kind == "debian" else _dsc_version(files[0]))
            except (SourceFetchError, IndexError):
                continue  # an odd file name or .dsc: the one-package fetch says what is wrong
            tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
            for f in files:
                os.replace(f, tmp / f.name)
            _publish_dir(tmp, root / f"{_safe(name)}_{_safe(version)}")
            published.add(name)
    finally:
        shutil.rmtree(batch, ignore_errors=True)
    log.info("debian %s: %d of %d fetched in one apt-get call", kind, len(published), len(todo))
    return published


# --- npm / PyPI -----------------------------------------------------------------------------------------


def fetch_npm(package: str, version: str, cache_dir: Path) -> FetchedSource:
    """`npm pack NAME@VERSION` into the cache; returns the .tgz."""
    t0 = time.time()
    dest = cache_dir / "npm" / f"{_safe(package)}_{_safe(version)}"
    tgzs = sorted(dest.glob("*.tgz")) if dest.exists() else []
    if tgzs:
        return FetchedSource("npm", package, version, tgzs, cached=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    npm_cache = cache_dir / "npm-cache"
    cmd = [
        "npm",
        "pack",
        "--silent",
        "--cache",
        str(npm_cache),
        "--pack-destination",
        str(tmp),
        "--",
        f"{package}@{version}",
    ]
    _run(cmd, f"npm {package}@{version}", cwd=tmp)
    _publish_dir(tmp, dest)
    return FetchedSource("npm", package, version, sorted(dest.glob("*.tgz")), seconds=time.time() - t0)


def fetch_pypi_sdist(package: str, version: str, cache_dir: Path) -> FetchedSource:
    """`pip download --no-binary NAME --no-deps NAME==VERSION`; returns the sdist.

    Only the package itself is forced to an sdist: pip prepares its metadata in an isolated build env, and
    `:all:` would build every build backend (setuptools, hatchling, poetry-core) from source too (~70 s)."""
    t0 = time.time()
    dest = cache_dir / "pypi" / f"{_safe(package)}_{_safe(version)}"
    if dest.exists() and (files := sorted(dest.iterdir())):
        return FetchedSource("pypi", package, version, files, cached=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", f"--no-binary={package}", "--no-deps",
           "-d", str(tmp), "--", f"{package}=={version}"]  # fmt: skip
    _run(cmd, f"pypi {package}=={version}")
    _publish_dir(tmp, dest)
    return FetchedSource("pypi", package, version, sorted(dest.iterdir()), seconds=time.time() - t0)


# --- git ------------------------------------------------------------------------------------------------


def _git_env() -> dict[str, str]:
    # GIT_ALLOW_PROTOCOL overrides any protocol.*.allow config, including the user's
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": ":".join(GIT_URL_SCHEMES)}


def _commit_sha(out: str, what: str) -> str:
    sha = out.split()[0] if out.strip() else ""
    if not _SHA.fullmatch(sha):
        raise SourceFetchError(f"{what}: expected a commit sha, got {out.strip()[:80]!r}")
    return sha


def resolve_git_commit(url: str, ref: str) -> str:
    """The commit a ref (branch, tag, HEAD or a sha) names in a repository."""
    if _SHA.fullmatch(ref):
        return ref
    local = Path(url)
    what = f"git {url}: rev-parse {ref}"
    if local.exists():
        cmd = ["git", *_GIT_SAFETY, "-C", str(local.resolve()), "rev-parse", "--verify", "--end-of-options",
               f"{ref}^{{commit}}"]  # fmt: skip
        return _commit_sha(_run(cmd, what, env=_git_env()), what)
    what = f"git {url}: ls-remote {ref}"
    out = _run(["git", *_GIT_SAFETY, "ls-remote", "--", url, ref], what, timeout=120, env=_git_env())
    if not out.strip():
        raise SourceFetchError(f"git {url}: no ref {ref!r}")
    return _commit_sha(out, what)


def fetch_git(url: str, ref: str, cache_dir: Path) -> FetchedSource:
    """A checkout of `url` at `ref`, fetched with depth 1; the version is the resolved commit."""
    t0 = time.time()
    commit = resolve_git_commit(url, ref)  # always a validated sha
    dest = cache_dir / "git" / f"{_safe(Path(url.rstrip('/')).name)}_{commit[:12]}"
    if dest.exists():
        return FetchedSource("git", url, commit, [dest], cached=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir))
    remote = Path(url).resolve().as_uri() if Path(url).exists() else url
    env = _git_env()
    git = ["git", "-C", str(tmp), *_GIT_SAFETY, "-c", "protocol.file.allow=always",
           "-c", "uploadpack.allowAnySHA1InWant=true"]  # fmt: skip
    _run(["git", "init", "-q", "--", str(tmp)], f"git {url}: init", env=env)
    try:
        _run(
            [*git, "fetch", "-q", "--depth", "1", "--", remote, commit], f"git {url}: fetch {commit}", env=env
        )
    except SourceFetchError:
        # a server that refuses to serve a bare sha: fetch everything, then check the commit out
        refspec = "+refs/heads/*:refs/remotes/origin/*"
        _run([*git, "fetch", "-q", "--", remote, refspec], f"git {url}: fetch", env=env)
    _run([*git, "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", commit],
         f"git {url}: checkout {commit}", env=env)  # fmt: skip
    shutil.rmtree(tmp / ".git")
    _publish_dir(tmp, dest)
    return FetchedSource("git", url, commit, [dest], seconds=time.time() - t0)


# --- local text that is no language (the classifier's `unknown` label) ----------------------------------


@dataclass
class LocalText:
    group: str  # the project / package the text belongs to (held out together)
    path: str
    kind: str  # prose | log | csv | minified | encoded
    text: str


def _chunks(text: str, lines_per_chunk: int, max_chunks: int) -> list[str]:
    lines = text.splitlines()
    return ["\n".join(lines[i : i + lines_per_chunk]) for i in range(0, len(lines), lines_per_chunk)][
        :max_chunks
    ]


def site_packages_dir() -> Path:
    """This interpreter's site-packages (where `local_unknown_texts` finds CSV, bundles and libraries)."""
    import sys

    return (
        Path(sys.prefix)
        / "lib"
        / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / "site-packages"
    )


def local_unknown_texts(site_packages: Path, log_files: list[Path], doc_root: Path = Path("/usr/share/doc"),
                        max_per_group: int = 20, seed: int = 0) -> list[LocalText]:  # fmt: skip
    """Text that is none of the code labels, from this machine's installed packages: Debian copyright files and
    changelogs (prose), log files cut into 60-line pieces, CSV data files and minified JS bundles shipped in
    Python packages, and base64 / hex dumps of shared libraries (encoded blobs). Each text is grouped by the
    package it comes from, so a split by group never puts one package's texts on two sides."""
    import base64
    import gzip as _gzip
    import random

    rng = random.Random(seed)
    out: list[LocalText] = []
    for pkg in sorted(p for p in doc_root.iterdir() if p.is_dir()) if doc_root.exists() else []:
        for name in ("copyright", "changelog.Debian.gz", "README", "NEWS.gz", "README.Debian"):
            f = pkg / name
            if not f.is_file() or f.stat().st_size > 2_000_000:
                continue
            raw = _gzip.decompress(f.read_bytes()) if name.endswith(".gz") else f.read_bytes()
            text = raw.decode("utf-8", "replace")[:6000]
            if len(text) > 200:
                out.append(LocalText(f"doc:{pkg.name}", str(f), "prose", text))
    for f in log_files:
        if f.is_file():
            for i, chunk in enumerate(_chunks(f.read_text(errors="replace"), 60, max_per_group)):
                if len(chunk) > 200:
                    out.append(LocalText(f"log:{f.name}", f"{f}#{i}", "log", chunk))
    by_pkg: dict[str, list[Path]] = {}
    for pattern, kind in (("*.csv", "csv"), ("*.min.js", "minified"), ("*.chunk.js", "minified")):
        for f in sorted(site_packages.rglob(pattern)):
            by_pkg.setdefault(f"{kind}:{f.relative_to(site_packages).parts[0]}", []).append(f)
    for group, files in sorted(by_pkg.items()):
        kind = group.split(":", 1)[0]
        for f in rng.sample(files, min(len(files), max_per_group)):
            text = f.read_text(errors="replace")
            if kind == "minified":  # a window of the bundle, the size of a source file
                start = rng.randrange(max(len(text) - 4000, 1))
                text = text[start : start + 4000]
            if len(text) > 200:
                out.append(LocalText(group, str(f), kind, text[:8000]))
    libs = sorted(site_packages.rglob("*.so"))
    for f in rng.sample(libs, min(len(libs), 60)):
        data = f.read_bytes()[:6000]
        encoded = base64.encodebytes(data).decode() if rng.random() < 0.5 else data.hex(" ", 2)
        out.append(
            LocalText(f"encoded:{f.relative_to(site_packages).parts[0]}", str(f), "encoded", encoded[:6000])
        )
    return out
