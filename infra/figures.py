"""Matplotlib without a display, and PNGs written atomically (a killed stage never leaves half a picture)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

# PNGs a stage draws outside any work dir of its own live here until the asset has logged them.
PLOT_ROOT = Path(tempfile.gettempdir()) / "crucible-plots"


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


def plot_dir(prefix: str = "plots-") -> Path:
    """A new directory for a stage's PNGs that outlives the stage function (the asset logs the files after
    it returns, then `discard_plot_dirs` removes it)."""
    PLOT_ROOT.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=PLOT_ROOT))


def discard_plot_dirs(paths: Iterable[Path]) -> None:
    """Remove the `plot_dir` directories holding any of `paths` (other paths are left alone)."""
    for path in paths:
        path = Path(path).resolve()
        root = PLOT_ROOT.resolve()
        if root in path.parents and path.parent != root:
            shutil.rmtree(root / path.relative_to(root).parts[0], ignore_errors=True)
