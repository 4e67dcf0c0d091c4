"""Labelled training text for binary classifiers, and splits that keep every source group on one side.

A *group* is the unit that must not leak between train and held-out data: a Wikipedia article (its
passages are near-duplicates in topic), a dictionary headword, a web page. Splits hash the group id with a
seed, so they are stable when the data grows.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class LabelledText:
    text: str
    label: int  # 1 = positive, 0 = negative
    source: str  # e.g. wikipedia, dict-foldoc, web/kept, fortunes, judge/web
    group: str  # split unit: article title, headword, URL


def group_split(group: str, seed: int, fractions: dict[str, float]) -> str:
    """Deterministic split name for a group: the same group always lands in the same split."""
    h = int(hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()[:12], 16) / 16**12
    acc = 0.0
    for name, frac in fractions.items():
        acc += frac
        if h < acc:
            return name
    return list(fractions)[-1]


def split_by_group(
    examples: list[LabelledText], seed: int = 0, fractions: dict[str, float] | None = None
) -> dict[str, list[LabelledText]]:
    """{'train', 'valid', 'test'} (or the given fractions' names) with no group in two splits."""
    fractions = fractions or {"train": 0.7, "valid": 0.1, "test": 0.2}
    out: dict[str, list[LabelledText]] = {name: [] for name in fractions}
    for ex in examples:
        out[group_split(f"{ex.source}|{ex.group}", seed, fractions)].append(ex)
    return out


def source_counts(examples: list[LabelledText]) -> dict[str, int]:
    """Examples per `source:label`, for reports."""
    return dict(sorted(Counter(f"{e.source}:{e.label}" for e in examples).items()))


@dataclass
class TrainedClassifier:
    """What a training function hands to the asset layer: the model file(s), threshold and held-out metrics."""

    name: str
    model_path: Path
    threshold: float
    metrics: dict[str, float]  # held-out test: auc, precision, recall, f1, accuracy, counts
    per_source: list[dict]  # held-out rows per source: n, label, mean score, share above threshold
    files: dict[str, Path] = field(default_factory=dict)  # every file to log (model, extra metadata)


def held_out_report(
    test: list[LabelledText], scores, threshold: float
) -> tuple[dict[str, float], list[dict]]:
    """Binary metrics on the held-out split, plus one row per source (how each source is scored)."""
    import numpy as np

    from classifiers.binary_metrics import binary_report

    scores = np.asarray(scores, dtype=float)
    labels = np.array([e.label for e in test], dtype=bool)
    metrics = binary_report(labels, scores, threshold)
    rows = []
    for source in sorted({e.source for e in test}):
        idx = np.array([e.source == source for e in test])
        rows.append(
            {
                "source": source,
                "label": int(labels[idx][0]),
                "n": int(idx.sum()),
                "mean_score": round(float(scores[idx].mean()), 3),
                "above_threshold": round(float((scores[idx] >= threshold).mean()), 3),
            }
        )
    return metrics, rows
