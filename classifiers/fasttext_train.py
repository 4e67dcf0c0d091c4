"""Train and evaluate a supervised fastText classifier (shared by the code-language and code-quality
classifiers): train from (label, text) pairs, predict, per-class precision/recall/F1, confusion-matrix plot."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

LABEL_PREFIX = "__label__"


def label_token(label: str) -> str:
    """A label as one fastText token (`Emacs Lisp` -> `__label__Emacs_Lisp`)."""
    return LABEL_PREFIX + label.replace(" ", "_")


def label_name(token: str) -> str:
    return token.removeprefix(LABEL_PREFIX).replace("_", " ")


@dataclass
class FastTextParams:
    """Hyper-parameters passed to `fasttext.train_supervised` (bucket kept small: model files stay small)."""

    lr: float = 0.5
    epoch: int = 25
    dim: int = 64
    word_ngrams: int = 2
    minn: int = 0
    maxn: int = 0
    min_count: int = 2
    bucket: int = 200_000
    loss: str = "softmax"
    threads: int = 2
    seed: int = 0

    def kwargs(self) -> dict[str, Any]:
        return {
            "lr": self.lr, "epoch": self.epoch, "dim": self.dim, "wordNgrams": self.word_ngrams,
            "minn": self.minn, "maxn": self.maxn, "minCount": self.min_count, "bucket": self.bucket,
            "loss": self.loss, "thread": self.threads, "seed": self.seed, "verbose": 0,
        }  # fmt: skip


# Trains in a child process: repeated trainings in one process give different models from the same seed
# (and sometimes "Encountered NaN"), while every fresh process gives the same model.
_TRAIN_CHILD = (
    "import json, sys, fasttext; "
    "fasttext.train_supervised(input=sys.argv[1], **json.loads(sys.argv[2])).save_model(sys.argv[3])"
)


def train_supervised_in_child(input_file: str, **kwargs):
    """`fasttext.train_supervised` run in a fresh Python process; returns the loaded model."""
    import fasttext

    with tempfile.TemporaryDirectory(prefix="crucible-ft-") as tmp:
        out = os.path.join(tmp, "model.bin")
        proc = subprocess.run([sys.executable, "-c", _TRAIN_CHILD, input_file, json.dumps(kwargs), out],
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            raise RuntimeError(
                f"fastText training failed: {lines[-1] if lines else f'exit {proc.returncode}'}"
            )
        return fasttext.load_model(out)


def train_supervised_with_retry(input_file: str, train=train_supervised_in_child, **kwargs):
    """`train` (fastText supervised training), retried when it stops with "Encountered NaN": first with the
    same settings, then another seed, then lower learning rates with more buckets (some inputs diverge at
    one bucket count whatever the lr and train fine with more)."""
    seed, lr, bucket = kwargs["seed"], kwargs["lr"], kwargs.get("bucket", 2_000_000)
    retries = [{}, {"seed": seed + 1}] + [
        {"seed": seed + 1, "lr": lr / f, "bucket": bucket * f} for f in (2, 4)
    ]
    for attempt in range(len(retries) + 1):
        try:
            return train(input_file, **kwargs)
        except RuntimeError as exc:
            if "NaN" not in str(exc) or attempt == len(retries):
                raise
            log.warning("fastText stopped on NaN (lr=%g seed=%d); retry %d with %s",
                        kwargs["lr"], kwargs["seed"], attempt + 1, retries[attempt] or "the same settings")  # fmt: skip
            kwargs.update(retries[attempt])
    raise AssertionError("unreachable")


def train_fasttext(examples: Sequence[tuple[str, str]], params: FastTextParams, out_path: Path | None = None,
                   quantize: bool = False):  # fmt: skip
    """Train on (label, preprocessed one-line text) pairs; saves to `out_path` if given; returns the model."""

    fd, tmp = tempfile.mkstemp(prefix="crucible-ft-", suffix=".txt")
    try:
        with os.fdopen(fd, "w") as fh:
            for label, text in examples:
                fh.write(f"{label_token(label)} {text}\n")
        model = train_supervised_with_retry(tmp, **params.kwargs())
    finally:
        os.unlink(tmp)
    if quantize:
        model.quantize(input=None, qnorm=True, retrain=False, cutoff=0)
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        model.save_model(str(out_path))
    return model


def predict_proba(model, texts: Sequence[str], k: int = -1) -> list[dict[str, float]]:
    """Label -> probability for each (preprocessed one-line) text."""
    labels, probs = model.predict(list(texts), k=k)
    return [
        {label_name(lab): float(p) for lab, p in zip(labs, ps, strict=True)}
        for labs, ps in zip(labels, probs, strict=True)
    ]


@dataclass
class ClassificationReport:
    accuracy: float
    macro_f1: float
    per_class: dict[str, dict[str, float]]  # label -> precision, recall, f1, support
    labels: list[str]
    confusion: np.ndarray  # rows = true, cols = predicted, in `labels` order
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "macro_f1": self.macro_f1, "per_class": self.per_class,
                "labels": self.labels, "confusion": self.confusion.tolist(), **self.extra}  # fmt: skip


def classification_report(
    y_true: Sequence[str], y_pred: Sequence[str], labels: Sequence[str] | None = None
) -> ClassificationReport:
    """Accuracy, macro-F1 (over the true classes) and per-class P/R/F1; predictions outside `labels` count as
    errors and are binned in an `other` column."""
    labels = sorted(set(y_true)) if labels is None else list(labels)
    index = {lab: i for i, lab in enumerate(labels)}
    n = len(labels)
    cm = np.zeros((n, n + 1), dtype=np.int64)
    for t, p in zip(y_true, y_pred, strict=True):
        cm[index[t], index.get(p, n)] += 1
    per_class = {}
    for lab, i in index.items():
        tp = int(cm[i, i])
        support = int(cm[i].sum())
        predicted = int(cm[:, i].sum())
        prec = tp / predicted if predicted else 0.0
        rec = tp / support if support else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        per_class[lab] = {"precision": prec, "recall": rec, "f1": f1, "support": support}
    scored = [v["f1"] for v in per_class.values() if v["support"]]
    total = int(cm.sum())
    return ClassificationReport(
        accuracy=float(np.trace(cm[:, :n]) / total) if total else 0.0,
        macro_f1=float(np.mean(scored)) if scored else 0.0,
        per_class=per_class,
        labels=labels,
        confusion=cm,
        extra={"n": total, "predicted_other": dict(Counter(p for p in y_pred if p not in index))},
    )


def plot_confusion(report: ClassificationReport, path: Path, title: str) -> Path:
    """Row-normalised confusion matrix as a PNG (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cm = report.confusion.astype(float)
    norm = cm / np.maximum(cm.sum(axis=1, keepdims=True), 1)
    labels = report.labels
    cols = labels + (["other"] if cm.shape[1] > len(labels) else [])
    size = max(6.0, 0.32 * len(cols) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(
        f"{title}\naccuracy {report.accuracy:.4f}, macro-F1 {report.macro_f1:.4f}, n={int(cm.sum())}"
    )
    for i in range(len(labels)):
        for j in range(len(cols)):
            if cm[i, j] and (i != j or norm[i, j] < 0.995):
                ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=5,
                        color="white" if norm[i, j] > 0.5 else "black")  # fmt: skip
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
