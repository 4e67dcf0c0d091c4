"""save_figure writes a palette PNG: a many-panel figure (the post-training report's size) stays small enough
to be inlined in Dagster's metadata, and looks the same as the full-colour render."""

from __future__ import annotations

import numpy as np
from PIL import Image

from assets.tracked import PLOT_METADATA_BYTES
from infra.figures import pyplot, save_figure


def _report_like_figure():
    rng = np.random.default_rng(0)
    fig, axes = pyplot().subplots(9, 4, figsize=(14.4, 27.0), squeeze=False)
    names = [f"checkpoint_{i}" for i in range(8)]
    for k, ax in enumerate(axes.flat):
        ax.bar(
            range(8),
            rng.random(8),
            yerr=0.1 * rng.random(8),
            capsize=3,
            color="tab:orange" if k < 3 else "tab:blue",
        )
        ax.set_xticks(range(8), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"metric/{k}", fontsize=8)
    return fig


def test_a_36_panel_figure_is_a_palette_png_under_the_inline_limit_and_looks_the_same(tmp_path):
    path = save_figure(_report_like_figure(), tmp_path / "report.png", "36 panels")
    full = tmp_path / "full.png"
    fig = _report_like_figure()
    fig.suptitle("36 panels")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(full, dpi=90)
    with Image.open(path) as saved, Image.open(full) as reference:
        assert saved.mode == "P" and saved.size == reference.size
        diff = np.abs(np.asarray(saved.convert("RGB"), float) - np.asarray(reference.convert("RGB"), float))
    assert diff.mean() < 2.0 and np.percentile(diff, 99.9) < 40  # the same picture, to the eye
    assert path.stat().st_size < PLOT_METADATA_BYTES < full.stat().st_size  # inlined only after the palette
    assert not list(tmp_path.glob("*.tmp.png"))
