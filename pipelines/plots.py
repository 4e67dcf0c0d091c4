"""The PNGs the data stages log (`StageResult.artifacts["plots/<name>.png"]`, shown inline in Dagster).

Three kinds of figure, each drawn from numbers the stage computed and returned with the numbers behind it
(`PlotData`, put in `StageResult.extra["plots"]` so tests and notebooks can check them):
- `score_histograms`: one panel per score, stacked by outcome (e.g. kept / dropped), the stage's threshold as
  a vertical line;
- `funnel_chart`: documents left after each step, and the documents each step dropped by reason;
- `bar_panels`: horizontal bars per category (files and bytes per language, dropped vs rescued per reason).

matplotlib with the Agg backend; files are written to a temp name and renamed (a reader never sees half a PNG).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from infra.figures import pyplot, save_figure

PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


@dataclass
class ScorePanel:
    """One histogram: `series` = {outcome: scores}, stacked in that order; `threshold` drawn as a line."""

    title: str
    series: dict[str, list[float]]
    xlabel: str = "score"
    threshold: float | None = None
    threshold_label: str = "threshold"
    value_range: tuple[float, float] = (0.0, 1.0)
    bins: int = 20
    ylabel: str = "documents"


@dataclass
class BarPanel:
    """Horizontal bars, one group per category; `series` = {label: one value per category}."""

    title: str
    categories: list[str]
    series: dict[str, list[float]]
    xlabel: str = ""
    log: bool = False


@dataclass
class PlotData:
    """What a figure shows, in numbers: {panel title: {series: counts or values}}; histogram bin edges."""

    path: Path
    panels: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    edges: dict[str, list[float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path.name, "panels": self.panels, "edges": self.edges}


def bin_edges(
    values: list[float], value_range: tuple[float, float], bins: int, threshold: float | None = None
) -> tuple[list[float], tuple[float, float]]:
    """(edges, shown x range) of a panel's histogram: `bins` bins over `value_range`, zoomed in on the data
    (and threshold) when they fill less than a quarter of it (a classifier whose scores all sit near 0.5
    would otherwise be one bar), and shifted so the threshold is a bin edge (a bar is never half kept, half
    dropped)."""
    lo, hi = value_range
    data = np.clip(np.asarray(values, dtype=float), lo, hi)
    if data.size:
        span = [float(data.min()), float(data.max())] + ([threshold] if threshold is not None else [])
        a, b = min(span), max(span)
        if b - a < (hi - lo) / 4:
            pad = max(0.1 * (b - a), (hi - lo) / 200)
            lo, hi = max(lo, a - pad), min(hi, b + pad)
    width = (hi - lo) / bins
    if threshold is not None and lo < threshold < hi:
        first, last = int(np.floor((lo - threshold) / width)), int(np.ceil((hi - threshold) / width))
        edges = threshold + width * np.arange(first, last + 1)
    else:
        edges = np.linspace(lo, hi, bins + 1)
    return [float(e) for e in edges], (lo, hi)


def histogram_counts(values: list[float], edges: list[float]) -> list[int]:
    """Counts per bin; values outside the edges go to the end bins, so the counts sum to len(values)."""
    clipped = np.clip(np.asarray(values, dtype=float), edges[0], edges[-1])
    return [int(c) for c in np.histogram(clipped, bins=np.asarray(edges))[0]]


def score_histograms(path: Path, panels: list[ScorePanel], title: str = "") -> PlotData:
    """One stacked histogram per panel, with its threshold line; panels without scores say so."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    data = PlotData(path)
    for ax, panel in zip(axes[0], panels, strict=True):
        bottom = None
        counts_by_series: dict[str, list[float]] = {}
        every = [v for values in panel.series.values() for v in values]
        edges, shown = bin_edges(every, panel.value_range, panel.bins, panel.threshold)
        for i, (label, values) in enumerate(panel.series.items()):
            counts = histogram_counts(values, edges)
            counts_by_series[label] = counts
            if not values:
                continue
            widths = np.diff(edges)
            ax.bar(edges[:-1], counts, width=widths, bottom=bottom, align="edge", color=PALETTE[i % 8],
                   edgecolor="white", linewidth=0.5, label=f"{label} ({len(values)})")  # fmt: skip
            bottom = counts if bottom is None else [a + b for a, b in zip(bottom, counts, strict=True)]
        data.panels[panel.title] = counts_by_series
        data.edges[panel.title] = [round(e, 6) for e in edges]
        if panel.threshold is not None:
            ax.axvline(panel.threshold, color="black", linestyle="--", linewidth=1.2,
                       label=f"{panel.threshold_label} = {panel.threshold:.3g}")  # fmt: skip
        if bottom is None:
            ax.text(0.5, 0.5, "nothing scored", ha="center", va="center", transform=ax.transAxes)
        zoomed = " (zoomed in)" if shown != tuple(panel.value_range) else ""
        ax.set(xlabel=panel.xlabel + zoomed, ylabel=panel.ylabel, title=panel.title, xlim=shown)
        ax.yaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    save_figure(fig, path, title)
    return data


def funnel_chart(path: Path, steps: list[dict[str, Any]], title: str = "") -> PlotData:
    """`steps`: [{"name", "docs_in", "docs_out", "reasons": {reason: dropped}}] in pipeline order.

    Left: documents in, then left after each step. Right: documents dropped, one bar per step and reason."""
    left_labels = ["input"] + [f"after {s['name']}" for s in steps]
    left_values = [float(steps[0]["docs_in"]) if steps else 0.0] + [float(s["docs_out"]) for s in steps]
    drops = [(f"{s['name']}: {r}", float(n)) for s in steps for r, n in s["reasons"].items() if n]
    left = BarPanel("documents left after each step", left_labels, {"documents": left_values}, "documents")
    right = BarPanel(
        "documents dropped, by step and reason",
        [d for d, _ in drops],
        {"dropped": [n for _, n in drops]},
        "documents",
    )
    return bar_panels(path, [left, right], title)


def bar_panels(path: Path, panels: list[BarPanel], title: str = "") -> PlotData:
    """Horizontal (grouped) bars, first category on top, each bar labelled with its value."""
    plt = pyplot()
    rows = max((len(p.categories) for p in panels), default=1)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.6 * len(panels), 1.2 + 0.32 * max(rows, 4)), squeeze=False
    )
    data = PlotData(path)
    for ax, panel in zip(axes[0], panels, strict=True):
        data.panels[panel.title] = {k: [float(v) for v in vs] for k, vs in panel.series.items()}
        if not panel.categories:
            ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes)
            ax.set(title=panel.title, yticks=[])
            continue
        n = len(panel.series)
        height = 0.8 / n
        y = np.arange(len(panel.categories))
        peak = max((v for vs in panel.series.values() for v in vs), default=0) or 1
        for i, (label, values) in enumerate(panel.series.items()):
            offset = (i - (n - 1) / 2) * height
            bars = ax.barh(y + offset, values, height=height, color=PALETTE[i % 8], label=label)
            ax.bar_label(bars, labels=[_fmt(v) for v in values], fontsize=7, padding=2)
        ax.set_yticks(y, panel.categories, fontsize=8)
        ax.invert_yaxis()
        if panel.log:
            ax.set_xscale("log")
        else:
            ax.set_xlim(0, peak * 1.18)  # room for the value labels
            if all(float(v).is_integer() for vs in panel.series.values() for v in vs):
                ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set(xlabel=panel.xlabel, title=panel.title)
        if n > 1:
            ax.legend(fontsize=7)
    save_figure(fig, path, title)
    return data


def _fmt(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.1f}M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:g}"
