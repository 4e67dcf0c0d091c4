"""What the trainer reads: a resumable iterator of token batches, and a synthetic one for tests and benchmarks.

A batch is a dict with `input_ids` [B, S] (int64) and optionally `labels` [B, S] aligned with `input_ids`
(the loss shifts them; -100 marks positions without loss, e.g. SFT prompts) and `position_ids` [B, S]
(document-relative positions of packed sequences). A source is resumable: `state_dict()` after a batch
is the position to restart from, `load_state_dict()` restores it (the trainer checkpoints it each save).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch


@runtime_checkable
class BatchSource(Protocol):
    def __iter__(self) -> BatchSource: ...

    def __next__(self) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SyntheticBatches:
    """Deterministic random batches: batch i depends only on (seed, rank, i), so resuming is exact.

    Patterns: `markov`, walks on a fixed random Markov chain (`chain_seed`) with `branching` successors per
    token (the loss falls from ln V towards ln branching in a few dozen steps); `repeat`, a random segment of
    `period` tokens repeated along the row (a copy task that needs attention `period` tokens back, learned
    in ~100 steps with a small `alphabet`); `uniform`, i.i.d. tokens (nothing to learn). `alphabet` limits
    the token ids used; `prompt_fraction` > 0 sets the first part of each row's labels to -100 (SFT-style).
    """

    def __init__(
        self,
        vocab_size: int,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        pattern: str = "markov",
        period: int = 24,
        prompt_fraction: float = 0.0,
        branching: int = 4,
        chain_seed: int = 0,
        alphabet: int | None = None,
        first_token: int = 2,
    ):
        if pattern not in ("repeat", "uniform", "markov"):
            raise ValueError(f"unknown pattern {pattern!r}")
        self.vocab_size, self.batch_size, self.seq_len = vocab_size, batch_size, seq_len
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.pattern, self.period, self.prompt_fraction = pattern, period, prompt_fraction
        self.branching, self.chain_seed = branching, chain_seed
        self.high = min(first_token + alphabet, vocab_size) if alphabet else vocab_size  # token ids < high
        self._table: np.ndarray | None = None
        self.first_token = first_token  # ids below are reserved for special tokens
        self.index = 0

    def __iter__(self) -> SyntheticBatches:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = self.batch_at(self.index)
        self.index += 1
        return batch

    def batch_at(self, index: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, self.rank, index])
        shape = (self.batch_size, self.seq_len)
        if self.pattern == "uniform":
            tokens = rng.integers(self.first_token, self.high, size=shape)
        elif self.pattern == "markov":
            successors = self._successors()
            tokens = np.empty(shape, dtype=np.int64)
            tokens[:, 0] = rng.integers(self.first_token, self.high, size=self.batch_size)
            choice = rng.integers(0, successors.shape[1], size=shape)
            for t in range(1, self.seq_len):
                tokens[:, t] = successors[tokens[:, t - 1], choice[:, t]]
        else:
            segment = rng.integers(self.first_token, self.high, size=(self.batch_size, self.period))
            reps = -(-self.seq_len // self.period)
            tokens = np.tile(segment, (1, reps))[:, : self.seq_len]
        input_ids = torch.from_numpy(tokens.astype(np.int64))
        labels = input_ids.clone()
        if self.prompt_fraction > 0:
            labels[:, : int(self.seq_len * self.prompt_fraction)] = -100
        return {"input_ids": input_ids, "labels": labels}

    def _successors(self) -> np.ndarray:
        """The fixed Markov chain of `markov`: each token has `branching` possible next tokens (same on all ranks)."""
        if self._table is None:
            rng = np.random.default_rng([self.chain_seed, 7])
            self._table = rng.integers(self.first_token, self.high, size=(self.vocab_size, self.branching))
        return self._table

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])


def synthetic_batches(rank: int = 0, world_size: int = 1, **kwargs: Any) -> SyntheticBatches:
    """Factory for launch specs (`training.batch_source:synthetic_batches`)."""
    return SyntheticBatches(rank=rank, world_size=world_size, **kwargs)


def synthetic_eval_batches(rank: int = 0, world_size: int = 1, n_batches: int = 2, **kwargs: Any) -> list:
    """Held-out synthetic batches (a seed the training stream never uses) for launch specs."""
    source = SyntheticBatches(
        rank=rank, world_size=world_size, **{**kwargs, "seed": kwargs.get("seed", 0) + 10_000}
    )
    return [next(source) for _ in range(n_batches)]
