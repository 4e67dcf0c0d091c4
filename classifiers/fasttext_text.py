"""Train / evaluate / apply a fastText classifier on natural-language text (binary or multi-class).

fastText wants one example per line, `__label__X tokens...`; `fasttext_line` normalises text the same way
at training and prediction time (lowercase, punctuation split off, newlines removed, length capped).
Training runs single-threaded with a seed so a model is reproducible bit for bit.
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


class FastTextParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epoch: int = Field(10, ge=1, description="Training epochs")
    lr: float = Field(0.3, gt=0, description="Learning rate")
    dim: int = Field(64, ge=2, description="Embedding size")
    word_ngrams: int = Field(2, ge=1, description="Word n-gram order")
    min_count: int = Field(2, ge=1, description="Minimum word count")
    minn: int = Field(0, ge=0, description="Min char n-gram (0 = off)")
    maxn: int = Field(0, ge=0, description="Max char n-gram (0 = off)")
    bucket: int = Field(
        200_000, ge=0, description="Hash buckets for n-grams (default 2M makes ~400 MB models)"
    )
    loss: str = Field("softmax", description="softmax | ova | hs | ns")
    max_tokens: int = Field(400, ge=10, description="Tokens per example kept (rest cut)")
    quantize: bool = Field(
        False, description="Quantize the saved model (.ftz), smaller and a bit less accurate"
    )


def fasttext_line(text: str, max_tokens: int = 400) -> str:
    """Lowercased tokens on one line."""
    return " ".join(_TOKEN.findall(text.lower())[:max_tokens])


def train_fasttext(
    texts: list[str], labels: list[str], out_path: Path, params: FastTextParams | None = None, seed: int = 0
) -> Path:
    """Train a supervised model on (text, label) pairs and save it to `out_path` (.bin or .ftz)."""
    from classifiers.fasttext_train import train_supervised_with_retry

    params = params or FastTextParams()
    if len(texts) != len(labels) or not texts:
        raise ValueError(f"need as many labels as texts (got {len(texts)} texts, {len(labels)} labels)")
    order = np.random.default_rng(seed).permutation(len(texts))  # fastText learns in file order
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as fh:
        for i in order:
            fh.write(f"__label__{labels[i]} {fasttext_line(texts[i], params.max_tokens)}\n")
        train_file = fh.name
    try:
        model = train_supervised_with_retry(
            train_file,
            epoch=params.epoch,
            lr=params.lr,
            dim=params.dim,
            wordNgrams=params.word_ngrams,
            minCount=params.min_count,
            minn=params.minn,
            maxn=params.maxn,
            bucket=params.bucket,
            loss=params.loss,
            thread=1,
            seed=seed,
            verbose=0,
        )
        if params.quantize:
            model.quantize(input=train_file, retrain=False, cutoff=100_000)
        model.save_model(str(out_path))
    finally:
        Path(train_file).unlink(missing_ok=True)
    log.info("fastText model %s: %d examples, %d words", out_path.name, len(texts), len(model.words))
    return out_path


class FastTextTextClassifier:
    """A trained fastText model; `probabilities` returns P(label) for every text."""

    def __init__(self, path: Path, max_tokens: int = 400):
        import fasttext

        self.path = Path(path)
        self.model = fasttext.load_model(str(path))
        self.labels = [label.removeprefix("__label__") for label in self.model.labels]
        self.max_tokens = max_tokens

    def probabilities(self, texts: list[str]) -> np.ndarray:
        """Array [n_texts, n_labels] in `self.labels` order."""
        if not texts:
            return np.zeros((0, len(self.labels)))
        lines = [fasttext_line(t, self.max_tokens) for t in texts]
        pred_labels, pred_probs = self.model.predict(lines, k=len(self.labels))
        index = {f"__label__{name}": j for j, name in enumerate(self.labels)}
        out = np.zeros((len(texts), len(self.labels)))
        for i, (labs, probs) in enumerate(zip(pred_labels, pred_probs, strict=True)):
            for lab, p in zip(labs, probs, strict=True):
                out[i, index[lab]] = p
        return np.clip(out, 0.0, 1.0)

    def probability(self, texts: list[str], label: str) -> np.ndarray:
        """P(label) per text."""
        return self.probabilities(texts)[:, self.labels.index(label)]

    def expected_value(self, texts: list[str]) -> np.ndarray:
        """For numeric labels ("0".."5"): the probability-weighted label, a regression-like score."""
        values = np.array([float(label) for label in self.labels])
        return self.probabilities(texts) @ values
