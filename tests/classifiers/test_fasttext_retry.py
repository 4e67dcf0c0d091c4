"""fastText sometimes stops with "Encountered NaN" (seen on loaded machines and on CI, not reproducible on
demand): the retry ladder keeps the settings first, then changes the seed, then lowers the learning rate with more buckets,
and gives up after that; other errors are not retried."""

from __future__ import annotations

import fasttext
import pytest

from classifiers.fasttext_train import train_supervised_with_retry


def nan_until(n: int, calls: list):
    def train(input, **kwargs):
        calls.append((input, kwargs["seed"], kwargs["lr"], kwargs["bucket"]))
        if len(calls) <= n:
            raise RuntimeError("Encountered NaN.")
        return "model"

    return train


def test_nan_retries_same_settings_then_new_seed_then_half_lr(monkeypatch):
    calls: list = []
    monkeypatch.setattr(fasttext, "train_supervised", nan_until(4, calls))
    assert train_supervised_with_retry("t.txt", lr=0.5, seed=7, bucket=100) == "model"
    assert calls == [("t.txt", 7, 0.5, 100), ("t.txt", 7, 0.5, 100), ("t.txt", 8, 0.5, 100),
                     ("t.txt", 8, 0.25, 200), ("t.txt", 8, 0.125, 400)]  # fmt: skip

    calls.clear()
    monkeypatch.setattr(fasttext, "train_supervised", nan_until(99, calls))
    with pytest.raises(RuntimeError, match="NaN"):
        train_supervised_with_retry("t.txt", lr=0.5, seed=7, bucket=100)
    assert len(calls) == 5


def test_other_errors_are_not_retried(monkeypatch):
    calls: list = []

    def broken(input, **kwargs):
        calls.append(input)
        raise ValueError("bad input file")

    monkeypatch.setattr(fasttext, "train_supervised", broken)
    with pytest.raises(ValueError, match="bad input"):
        train_supervised_with_retry("t.txt", lr=0.5, seed=7)
    assert calls == ["t.txt"]
