"""Matplotlib without a display, and PNGs written atomically (a killed stage never leaves half a picture)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

# Files a stage returns as artifacts (plots, models, reports) live here until the asset has logged them.
ARTIFACT_ROOT = Path(tempfile.gettempdir()) / "crucible-artifacts"


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display on servers and in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, title: str = "", dpi: int = 90) -> Path:
    """Title, tight layout, a 256-colour palette PNG (plots have few colours: a third of the RGBA size, so a
    many-panel figure still fits inline in Dagster's metadata), then temp file + rename; the figure is closed."""
    from PIL import Image

    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()) if title else None)  # room for the title
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=dpi)
    pyplot().close(fig)
    with Image.open(tmp) as image:
        palette = image.convert("RGB").quantize(colors=256)
    palette.save(tmp, format="PNG", optimize=True)
    tmp.replace(path)
    return path


def artifact_dir(prefix: str = "artifacts-") -> Path:
    """A new directory for files a stage returns as artifacts, which outlives the stage function (the asset
    logs the files after it returns, then `discard_artifact_dirs` removes the directory with all it holds)."""
    ARTIFACT_ROOT.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=ARTIFACT_ROOT))


def discard_artifact_dirs(paths: Iterable[Path]) -> None:
    """Remove the `artifact_dir` directories holding any of `paths` (other paths are left alone)."""
    for path in paths:
        path = Path(path).resolve()
        root = ARTIFACT_ROOT.resolve()
        if root in path.parents and path.parent != root:
            shutil.rmtree(root / path.relative_to(root).parts[0], ignore_errors=True)
