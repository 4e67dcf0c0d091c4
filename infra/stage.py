"""What every stage function returns to its asset: counts, a report, a sample and files to track."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StageResult:
    """The outcome of one stage call.

    metrics: numbers for MLflow and Dagster metadata (counts, timings, scores).
    outputs: store URIs/prefixes the stage wrote (the asset's data), by name.
    report_md: a short Markdown report (funnel table, eval summary) shown in Dagster and logged to MLflow.
    sample: a few output records (dicts) logged as a JSON artifact.
    artifacts: local files (plots, eval reports, models) to log to MLflow, by artifact sub-path.
    data_version: a content hash of the output, so downstream runs can record exactly what they read.
    history: per-step rows ({"step": n, metric: value, ...}, e.g. a trainer's metrics.jsonl), logged to MLflow
        at their steps so its UI draws the curves.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    report_md: str = ""
    sample: list[dict[str, Any]] = field(default_factory=list)
    artifacts: dict[str, Path] = field(default_factory=dict)
    data_version: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Render rows of dicts (same keys) as a Markdown table."""
    if not rows:
        return "_(empty)_"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)
