"""Metrics for binary text classifiers and for agreement between scorers (numpy only, no sklearn)."""

from __future__ import annotations

import numpy as np


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (1-based), ties share their mean rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=float)
    sorted_vals = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_vals[j + 1] == sorted_vals[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def roc_auc(labels, scores) -> float:
    """Area under the ROC curve (Mann-Whitney U); NaN when only one class is present."""
    y = np.asarray(labels, dtype=bool)
    s = np.asarray(scores, dtype=float)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _ranks(s)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def spearman(a, b) -> float:
    """Spearman rank correlation; NaN when either side is constant."""
    ra, rb = _ranks(np.asarray(a, dtype=float)), _ranks(np.asarray(b, dtype=float))
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def precision_recall_f1(labels, scores, threshold: float) -> dict[str, float]:
    """Precision, recall, F1 and accuracy of `score >= threshold` against boolean labels."""
    y = np.asarray(labels, dtype=bool)
    pred = np.asarray(scores, dtype=float) >= threshold
    tp = int((pred & y).sum())
    fp = int((pred & ~y).sum())
    fn = int((~pred & y).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    accuracy = float((pred == y).mean()) if len(y) else float("nan")
    return {"precision": precision, "recall": recall, "f1": f1, "accuracy": accuracy}


def best_f1_threshold(labels, scores) -> float:
    """The score threshold that maximises F1 (chosen on validation data, then applied to test data)."""
    s = np.asarray(scores, dtype=float)
    candidates = np.unique(s)
    if len(candidates) > 200:
        candidates = np.quantile(s, np.linspace(0, 1, 201))
    best = max(candidates, key=lambda t: (precision_recall_f1(labels, s, t)["f1"], -t))
    return float(best)


def binary_report(labels, scores, threshold: float) -> dict[str, float]:
    """AUC plus precision / recall / F1 / accuracy at `threshold`, and the class counts."""
    y = np.asarray(labels, dtype=bool)
    out = {"auc": roc_auc(y, scores), **precision_recall_f1(y, scores, threshold), "threshold": threshold}
    out["n_positive"] = float(y.sum())
    out["n_negative"] = float((~y).sum())
    return out


def best_balanced_threshold(labels, scores) -> float:
    """The threshold that maximises balanced accuracy (TPR - FPR, Youden's J): unlike F1 it does not drift
    to 'keep everything' when most labels are positive."""
    y = np.asarray(labels, dtype=bool)
    s = np.asarray(scores, dtype=float)
    if y.all() or not y.any():
        return best_f1_threshold(y, s)
    candidates = np.unique(s)
    if len(candidates) > 200:
        candidates = np.quantile(s, np.linspace(0, 1, 201))

    def youden(t: float) -> float:
        pred = s >= t
        return pred[y].mean() - pred[~y].mean()

    return float(max(candidates, key=lambda t: (youden(t), t)))
