"""Debian binary packages as offline text sources: `apt-get download` + `dpkg-deb -x` into a local cache.

Needs no root. The cache is keyed by package name; a package already extracted is never fetched again.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


class DebianPackageError(RuntimeError):
    """A package could not be fetched or extracted; the message says what to try."""


def default_debian_cache() -> Path:
    """`$CRUCIBLE_DEBIAN_CACHE`, else `.crucible/debian` in the repo."""
    from infra.settings import REPO_ROOT

    env = os.environ.get("CRUCIBLE_DEBIAN_CACHE")
    return Path(env) if env else REPO_ROOT / ".crucible" / "debian"


def debian_package_root(package: str, cache_dir: Path | None = None, timeout_s: float = 600) -> Path:
    """Directory holding the extracted file tree of `package` (fetched on first use)."""
    cache_dir = Path(cache_dir or default_debian_cache())
    dest = cache_dir / package
    if (dest / ".complete").exists():
        return dest
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crucible-deb-", dir=cache_dir) as tmp:
        log.info("fetching Debian package %s", package)
        proc = _run(["apt-get", "download", package], cwd=tmp, timeout_s=timeout_s)
        debs = list(Path(tmp).glob("*.deb"))
        if proc.returncode != 0 and "Unable to locate" in proc.stderr:
            _run(["apt-get", "update"], cwd=tmp, timeout_s=timeout_s)  # a fresh machine has no package lists
            proc = _run(["apt-get", "download", package], cwd=tmp, timeout_s=timeout_s)
            debs = list(Path(tmp).glob("*.deb"))
        if not debs:
            raise DebianPackageError(
                f"apt-get download {package} failed ({proc.stderr.strip()[-300:]}); run `apt-get update` "
                f"or extract the package yourself with `dpkg-deb -x {package}_*.deb {dest}`"
            )
        tree = Path(tmp) / "tree"
        proc = _run(["dpkg-deb", "-x", str(debs[0]), str(tree)], cwd=tmp, timeout_s=timeout_s)
        if proc.returncode != 0:
            raise DebianPackageError(f"dpkg-deb -x {debs[0].name} failed: {proc.stderr.strip()[-300:]}")
        (tree / ".complete").write_text(debs[0].name + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tree, dest)
    return dest


def debian_package_version(package: str, cache_dir: Path | None = None) -> str:
    """The .deb file name the cached tree came from (name_version_arch.deb), for data lineage."""
    return (debian_package_root(package, cache_dir) / ".complete").read_text().strip()


def _run(cmd: list[str], cwd: str, timeout_s: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DebianPackageError(f"{' '.join(cmd)}: {exc}") from exc
