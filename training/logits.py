"""The LM head only where its output is used.

On the tiny model the LM head (vocab x hidden) is the largest matmul of a forward pass, and its log-softmax
the largest tensor. SFT, the recall curriculum and RL need logits at a few positions per row (the answer, the
response); `logits_at` runs the head on those positions only. `transformers`' own `logits_to_keep` selects
the same columns in every row, which fits one row (or a shared suffix) but not ragged rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def logits_at(model: nn.Module, index: torch.Tensor | tuple[torch.Tensor, ...]) -> Iterator[None]:
    """Within the block, `model`'s LM head reads `hidden[index]` instead of the [B, S, H] hidden states, so
    the forward's `.logits` are `logits[index]`: [N, V] for a [B, S] bool mask (row-major order), [B, T, V]
    for a pair of [B, T] (row, column) index tensors. Gradients flow as through the full head."""
    head = model.get_output_embeddings()
    if head is None:
        raise TypeError(f"{type(model).__name__} has no output embeddings to select positions for")

    def select(_module: nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        shape = index.shape if isinstance(index, torch.Tensor) else index[0].shape
        if hidden.dim() != 3 or (isinstance(index, torch.Tensor) and hidden.shape[:2] != shape):
            raise ValueError(
                f"logits_at: hidden states {tuple(hidden.shape)} do not match index {tuple(shape)}"
            )
        return (hidden[index], *args[1:])

    handle = head.register_forward_pre_hook(select)
    try:
        yield
    finally:
        handle.remove()


def predicting_positions(labels: torch.Tensor) -> torch.Tensor:
    """[B, S] bool: the positions whose next token carries a loss (position p predicts labels[:, p + 1])."""
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != -100
    return keep
