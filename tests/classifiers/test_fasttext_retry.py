"""fastText training runs in a child process (repeated trainings in one process drift from the seed) and is
retried on "Encountered NaN": same settings, another seed, then lower learning rates with more buckets."""

from __future__ import annotations

import pytest

from classifiers.fasttext_train import train_supervised_in_child, train_supervised_with_retry


def nan_until(n: int, calls: list):
    def train(input, **kwargs):  # fastText's own NaN can't be produced on demand
        calls.append((input, kwargs["seed"], kwargs["lr"], kwargs["bucket"]))
        if len(calls) <= n:
            raise RuntimeError("Encountered NaN.")
        return "model"

    return train


def test_nan_retries_same_settings_then_new_seed_then_half_lr():
    calls: list = []
    assert train_supervised_with_retry("t.txt", nan_until(4, calls), lr=0.5, seed=7, bucket=100) == "model"
    assert calls == [("t.txt", 7, 0.5, 100), ("t.txt", 7, 0.5, 100), ("t.txt", 8, 0.5, 100),
                     ("t.txt", 8, 0.25, 200), ("t.txt", 8, 0.125, 400)]  # fmt: skip

    calls.clear()
    with pytest.raises(RuntimeError, match="NaN"):
        train_supervised_with_retry("t.txt", nan_until(99, calls), lr=0.5, seed=7, bucket=100)
    assert len(calls) == 5


def test_other_errors_are_not_retried():
    calls: list = []

    def broken(input, **kwargs):
        calls.append(input)
        raise RuntimeError("bad input file")

    with pytest.raises(RuntimeError, match="bad input"):
        train_supervised_with_retry("t.txt", broken, lr=0.5, seed=7)
    assert calls == ["t.txt"]


def test_training_in_a_child_process_is_reproducible_and_reports_errors(tmp_path):
    data = tmp_path / "train.txt"
    lines = [f"__label__{'code' if i % 2 else 'prose'} {'def f ( x ) : return x' if i % 2 else 'the cat sat'} {i}"
             for i in range(200)]  # fmt: skip
    data.write_text("\n".join(lines) + "\n")
    kwargs = {"lr": 0.3, "epoch": 5, "dim": 16, "wordNgrams": 2, "minCount": 1, "bucket": 5000, "thread": 1,
              "seed": 0, "verbose": 0}  # fmt: skip
    first, second = (train_supervised_in_child(str(data), **kwargs) for _ in range(2))
    assert (first.get_input_matrix() == second.get_input_matrix()).all()
    assert first.predict("def g ( y ) : return y")[0][0] == "__label__code"
    with pytest.raises(RuntimeError, match="fastText training failed: .*"):
        train_supervised_in_child(str(tmp_path / "missing.txt"), **kwargs)
