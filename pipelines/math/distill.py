"""Distil a sample of judge scores into a fast classifier applied to every candidate (FineWeb-Edu style).

Labels: judge score >= keep_threshold (FineWeb-Edu kept >= 3). The judged sample is split by document id
into train / valid / test; the classifier's probability threshold maximises balanced accuracy on valid, and its
agreement with the judge (AUC, Spearman with the judge's score, F1 at the threshold) is measured on test.
Two students are trained on the same split: fastText on words, and a linear head on MiniLM embeddings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from classifiers.binary_metrics import best_balanced_threshold, binary_report, spearman
from classifiers.fasttext_text import FastTextParams, FastTextTextClassifier, train_fasttext
from classifiers.labelled_text import group_split

log = logging.getLogger(__name__)


@dataclass
class DistilledClassifier:
    name: str
    model_path: Path
    threshold: float
    agreement: dict[str, float]  # test split vs the judge: auc, spearman, precision, recall, f1
    predict: object = field(repr=False, default=None)  # texts -> P(keep)


def judge_labels(
    scores: np.ndarray, keep_threshold: float, min_per_class: int, fallback_top_fraction: float
) -> tuple[np.ndarray, str]:
    """Binary labels from judge scores; when the absolute threshold leaves a class nearly empty (a weak
    judge that never says 3), the top `fallback_top_fraction` of scores become the positives instead."""
    labels = scores >= keep_threshold
    if labels.sum() >= min_per_class and (~labels).sum() >= min_per_class:
        return labels, "absolute"
    cut = np.quantile(scores, 1 - fallback_top_fraction)
    log.warning(
        "judge threshold %.2f gives %d/%d positives; using the top %.0f%% (score >= %.3f) instead",
        keep_threshold,
        int(labels.sum()),
        len(labels),
        100 * fallback_top_fraction,
        cut,
    )
    return scores >= cut, "top_fraction"


def _agreement(probs: np.ndarray, labels: np.ndarray, judge_scores: np.ndarray, threshold: float) -> dict:
    report = binary_report(labels, probs, threshold)
    return {
        "auc": report["auc"],
        "spearman": spearman(probs, judge_scores),
        "precision": report["precision"],
        "recall": report["recall"],
        "f1": report["f1"],
        "n_test": float(len(labels)),
    }


def distill_judge(
    ids: list[str],
    texts: list[str],
    judge_scores: list[float],
    keep_threshold: float,
    out_dir: Path,
    seed: int = 0,
    fasttext_params: FastTextParams | None = None,
    embedder=None,
    min_per_class: int = 5,
    fallback_top_fraction: float = 0.3,
) -> tuple[list[DistilledClassifier], dict[str, float]]:
    """Train the students on judged documents; returns them (fastText first) and label statistics."""
    scores = np.asarray(judge_scores, dtype=float)
    labels, rule = judge_labels(scores, keep_threshold, min_per_class, fallback_top_fraction)
    split = np.array([group_split(i, seed, {"train": 0.6, "valid": 0.2, "test": 0.2}) for i in ids])
    parts = {name: np.flatnonzero(split == name) for name in ("train", "valid", "test")}
    stats = {
        "distill/judged_docs": float(len(ids)),
        "distill/positives": float(labels.sum()),
        "distill/label_rule_absolute": float(rule == "absolute"),
    }
    if min(labels[parts["train"]].sum(), (~labels[parts["train"]]).sum()) < 1 or not len(parts["test"]):
        log.warning("not enough judged documents of both classes to distil a classifier")
        return [], stats
    texts_arr = np.array(texts, dtype=object)
    students: list[DistilledClassifier] = []

    params = fasttext_params or FastTextParams(epoch=25, lr=0.5, dim=32, word_ngrams=2, min_count=1)
    path = train_fasttext(
        list(texts_arr[parts["train"]]),
        ["keep" if y else "drop" for y in labels[parts["train"]]],
        Path(out_dir) / "math_judge_distilled.bin",
        params,
        seed=seed,
    )
    ft = FastTextTextClassifier(path, max_tokens=params.max_tokens)

    def ft_predict(batch: list[str]) -> np.ndarray:
        return ft.probability(batch, "keep")

    students.append(_fit_threshold("fasttext", path, ft_predict, texts_arr, labels, scores, parts))

    if embedder is not None:
        from classifiers.embedding_quality import train_linear_head

        feats = embedder.embed(list(texts_arr))
        head = train_linear_head(feats[parts["train"]], labels[parts["train"]].astype(float))
        head_path = head.save(
            Path(out_dir) / "math_judge_distilled_head.npz",
            meta={"embedder": "all-MiniLM-L6-v2", "weights_sha256": embedder.weights_sha256},
        )

        def head_predict(batch: list[str]) -> np.ndarray:
            return head.predict_proba(embedder.embed(batch))

        students.append(
            _fit_threshold("minilm_linear", head_path, head_predict, texts_arr, labels, scores, parts)
        )
    return students, stats


def _fit_threshold(name, path, predict, texts_arr, labels, scores, parts) -> DistilledClassifier:
    valid = (
        parts["valid"] if len(parts["valid"]) and len(set(labels[parts["valid"]])) == 2 else parts["train"]
    )
    threshold = best_balanced_threshold(labels[valid], predict(list(texts_arr[valid])))
    test = parts["test"]
    agreement = _agreement(predict(list(texts_arr[test])), labels[test], scores[test], threshold)
    log.info("distilled %s: agreement with judge on %d test docs: %s", name, len(test), agreement)
    return DistilledClassifier(name, path, threshold, agreement, predict)
