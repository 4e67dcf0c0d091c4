"""World-knowledge classifier (RECIPE.md, Web): fastText, encyclopedic text (Wikipedia, dictionaries,
judge-labelled web samples) vs crawled web and low-value text. Used to rescue long-tail knowledge from web
documents the heuristic filters dropped.

Training data assembly lives in `pipelines/knowledge/`; this module trains, evaluates and applies.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from classifiers.binary_metrics import best_f1_threshold
from classifiers.fasttext_text import FastTextParams, FastTextTextClassifier, train_fasttext
from classifiers.labelled_text import LabelledText, TrainedClassifier, held_out_report

log = logging.getLogger(__name__)

POSITIVE = "knowledge"
NEGATIVE = "other"


class WorldKnowledgeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    fasttext: FastTextParams = Field(
        default_factory=lambda: FastTextParams(
            epoch=25, lr=0.5, dim=64, word_ngrams=2, min_count=1, minn=3, maxn=5, bucket=200_000
        ),
        description="fastText hyper-parameters",
    )
    threshold: float | None = Field(
        None, ge=0, le=1, description="Fixed decision threshold on P(knowledge); None = best F1 on validation"
    )


def train_world_knowledge_classifier(
    splits: dict[str, list[LabelledText]],
    out_dir: Path,
    params: WorldKnowledgeParams | None = None,
    seed: int = 0,
) -> TrainedClassifier:
    """Train on splits['train'], pick the threshold on splits['valid'], report on splits['test']."""
    params = params or WorldKnowledgeParams()
    train = splits["train"]
    path = train_fasttext(
        [e.text for e in train],
        [POSITIVE if e.label else NEGATIVE for e in train],
        Path(out_dir) / "world_knowledge.bin",
        params.fasttext,
        seed=seed,
    )
    clf = WorldKnowledgeClassifier(path, threshold=0.5, max_tokens=params.fasttext.max_tokens)
    threshold = params.threshold
    if threshold is None:
        valid = splits.get("valid") or train
        threshold = best_f1_threshold([e.label for e in valid], clf.score([e.text for e in valid]))
    clf.threshold = threshold
    metrics, per_source = held_out_report(
        splits["test"], clf.score([e.text for e in splits["test"]]), threshold
    )
    log.info(
        "world knowledge fastText: held-out AUC %.4f F1 %.3f at %.3f",
        metrics["auc"],
        metrics["f1"],
        threshold,
    )
    return TrainedClassifier(
        "world_knowledge_fasttext", path, threshold, metrics, per_source, {"model": path}
    )


class WorldKnowledgeClassifier:
    """P(knowledge) per text; `is_knowledge` applies the threshold."""

    def __init__(self, model_path: Path, threshold: float = 0.5, max_tokens: int = 400):
        self.model = FastTextTextClassifier(model_path, max_tokens=max_tokens)
        self.threshold = threshold

    def score(self, texts: list[str]) -> np.ndarray:
        return self.model.probability(texts, POSITIVE)

    def is_knowledge(self, texts: list[str]) -> np.ndarray:
        return self.score(texts) >= self.threshold
