"""MLA decoding without re-expanding the whole KV cache at every step.

`transformers`' GLM-5 attention caches the compressed latents (MLA's point: a small cache) and, at every
forward, runs `kv_b_proj` over *all* cached positions to get the per-head keys and values again: O(T) work
per decoded token, 18% of a tiny-model decode step at 60 tokens and growing with the context. A rollout
engine holds its own copy of the policy and decodes append-only, so here each layer keeps the keys and values
it already expanded and projects only the new positions.

Only inside `ExpandedKV.decoding()` (one generation: the cache grows from its prefill and is never cropped);
outside it, and in other threads, `expand_kv` is the original. The buffers are per thread and dropped on exit.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaAttention

Expand = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class _Buffers:
    """One layer's expanded keys / values [B, H, capacity, D] and how many positions they hold."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0

    def append(self, keys: torch.Tensor, values: torch.Tensor, total: int) -> None:
        if self.keys is None or total > self.keys.shape[2]:
            capacity = max(total + 64, 2 * total)
            self.keys = self._grown(self.keys, keys, capacity)
            self.values = self._grown(self.values, values, capacity)
        self.keys[:, :, self.length : total] = keys
        self.values[:, :, self.length : total] = values
        self.length = total

    def _grown(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
        new = like.new_empty(*like.shape[:2], capacity, like.shape[3])
        if old is not None:
            new[:, :, : self.length] = old[:, :, : self.length]
        return new


class ExpandedKV:
    """Installed once on a model the caller owns (a rollout engine's private copy)."""

    def __init__(self, model: nn.Module):
        self._local = threading.local()
        layers = [m for m in model.modules() if isinstance(m, GlmMoeDsaAttention)]
        for index, attn in enumerate(layers):
            # An instance attribute shadows the class's method for this module only.
            attn.expand_kv = functools.partial(self._expand, index, attn.expand_kv)
        self.layers = len(layers)

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Within: forwards extend one KV cache append-only (prefill, then one step per token)."""
        self._local.buffers = [_Buffers() for _ in range(self.layers)]
        try:
            yield
        finally:
            self._local.buffers = None

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows` of this thread's buffers (the engine dropped the other rows from its batch)."""
        for layer in getattr(self._local, "buffers", None) or []:
            if layer.keys is not None:
                layer.keys, layer.values = layer.keys[rows], layer.values[rows]

    def _expand(self, index: int, expand: Expand, latent: torch.Tensor, k_rot: torch.Tensor):
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            return expand(latent, k_rot)
        layer, total = buffers[index], latent.shape[2]
        if layer.keys is not None and (total < layer.length or layer.keys.shape[0] != latent.shape[0]):
            raise RuntimeError(
                f"ExpandedKV: layer {index} got {total} cached positions after {layer.length} (batch "
                f"{latent.shape[0]}): the KV cache was cropped or swapped inside decoding(); leave the block first"
            )
        # Contiguous: a slice of the cache is strided, and a bf16 linear on a strided input copies its
        # weight once per row (torch's broadcast bmm): 40% of a 64-row bf16 decode step before.
        new_latent, new_rot = (
            latent[:, :, layer.length :].contiguous(),
            k_rot[:, :, layer.length :].contiguous(),
        )
        keys, values = expand(new_latent, new_rot)
        layer.append(keys, values, total)
        return layer.keys[:, :, :total], layer.values[:, :, :total]
