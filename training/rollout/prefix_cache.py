"""A rollout engine with a prefix cache: the KV cache of recent sequences is kept (LRU, bounded by the total
number of cached tokens) and a new request reuses the longest cached prefix of its prompt, running only the
new tokens. In a multi-turn rollout the next turn's prompt is the previous prompt + generation + observation,
so with affinity routing (training/agentic/routing.py) almost the whole prompt is a hit; the samples of one
group share their prompt too.

Causal attention makes the KV of positions < m a function of tokens < m only, so any cached sequence that
shares m leading tokens with the prompt serves them (cropped to m). Outputs equal `LocalRolloutEngine`'s on
the same prompt and seed up to float rounding (chunked vs one-shot prefill). Each prompt runs as a batch of
one: row i samples with `row_seed(seed, i)` (row 0 with `seed` itself, so a single request is exactly the
local engine's at the same seed). A weight sync changes every KV: it empties the cache.

Sparse attention: once a sequence is longer than DSA's `index_topk`, transformers' cached path selects keys
a little differently from a one-shot pass (the local engine's own decode differs from a full forward by
~1e-2 in log-prob there); chunked prefill from the cache stays within that, not within 1e-4.
"""

from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from training.rollout.engine import (
    Generation,
    LocalRolloutEngine,
    SamplingParams,
    next_tokens,
)


def row_seed(seed: int, row: int) -> int:
    """The sampling seed of row `row` of a batch: `seed` for row 0, a stable mix for the others (the samples
    of one group must differ although they share the prompt and the request's seed)."""
    if row == 0:
        return seed
    return int.from_bytes(hashlib.blake2b(f"{seed}/{row}".encode(), digest_size=4).digest(), "big")


@dataclass
class _Entry:
    tokens: torch.Tensor  # the token ids whose KV the cache holds, 1-D long
    cache: object  # transformers Cache after exactly those tokens


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


class PrefixCachingEngine(LocalRolloutEngine):
    """`LocalRolloutEngine` that keeps up to `max_cached_tokens` tokens of KV cache across calls.

    `cache_stats()` counts prompt tokens, hit tokens (prompt tokens whose KV came from the cache), computed
    tokens (forwarded: prompt misses + generated tokens), entries and evictions."""

    def __init__(
        self,
        model: nn.Module,
        dtype: torch.dtype = torch.bfloat16,
        pad_id: int = 1,
        max_cached_tokens: int = 0,
    ):
        super().__init__(model, dtype=dtype, pad_id=pad_id)
        if max_cached_tokens < 0:
            raise ValueError(f"max_cached_tokens must be >= 0, got {max_cached_tokens}")
        self.max_cached_tokens = max_cached_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU order, oldest first
        self._next_key = 0
        self._cached_tokens = 0  # kept as a number, so cache_stats() never iterates the entries
        self.counters = {
            "requests": 0,
            "prompt_tokens": 0,
            "hit_tokens": 0,
            "computed_tokens": 0,
            "evictions": 0,
            "clears": 0,
        }

    # --- cache ----------------------------------------------------------------------------------------
    @property
    def cached_tokens(self) -> int:
        return self._cached_tokens

    def clear_cache(self) -> None:
        self._entries.clear()
        self._cached_tokens = 0
        self.counters["clears"] += 1

    def cache_stats(self) -> dict[str, float]:
        """Counters and the hit rate; safe to call while another thread generates (no iteration)."""
        c = dict(self.counters)
        c["hit_rate"] = c["hit_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0
        c["entries"], c["cached_tokens"] = len(self._entries), self.cached_tokens
        c["policy_version"] = self.policy_version
        return c

    def _lookup(self, prompt: torch.Tensor) -> tuple[int, object | None]:
        """The longest cached prefix of `prompt` (at most len - 1 tokens: the last prompt token must run to
        give the next token's logits) and a private copy of its KV cropped to that length."""
        best, best_key = 0, None
        for key, entry in self._entries.items():
            m = common_prefix(entry.tokens, prompt)
            if m > best:
                best, best_key = m, key
        best = min(best, len(prompt) - 1)
        if best_key is None or best == 0:
            return 0, None
        self._entries.move_to_end(best_key)
        entry = self._entries[best_key]
        cache = copy.deepcopy(entry.cache)  # decoding appends to it: never touch the entry
        if len(entry.tokens) > best:
            cache.crop(best - len(entry.tokens))  # transformers' crop takes minus the tokens to drop
        return best, cache

    def _store(self, tokens: torch.Tensor, cache: object) -> None:
        if self.max_cached_tokens == 0 or len(tokens) > self.max_cached_tokens:
            return
        for key in [k for k, e in self._entries.items() if common_prefix(e.tokens, tokens) == len(e.tokens)]:
            self._cached_tokens -= len(self._entries.pop(key).tokens)  # the new entry serves all it served
        self._entries[self._next_key] = _Entry(tokens, cache)
        self._next_key += 1
        self._cached_tokens += len(tokens)
        while self._cached_tokens > self.max_cached_tokens:
            self._cached_tokens -= len(self._entries.popitem(last=False)[1].tokens)
            self.counters["evictions"] += 1

    # --- engine ---------------------------------------------------------------------------------------
    def sync_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        super().sync_weights(state_dict, version)
        self.clear_cache()  # KV computed by the old weights is wrong for the new ones

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts or any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        seeds = params.row_seeds or [row_seed(params.seed, i) for i in range(len(prompts))]
        return [self._generate_one(p, params, seed) for p, seed in zip(prompts, seeds, strict=True)]

    def _generate_one(self, prompt_ids: list[int], params: SamplingParams, seed: int) -> Generation:
        """The local engine's sampling loop for one sequence, started from the cached prefix."""
        prompt = torch.tensor(prompt_ids, dtype=torch.long)
        hit, past = self._lookup(prompt) if self.max_cached_tokens else (0, None)
        self.counters["requests"] += 1
        self.counters["prompt_tokens"] += len(prompt)
        self.counters["hit_tokens"] += hit
        gen = torch.Generator().manual_seed(seed)
        stops = torch.tensor(params.stop_token_ids or [-1])
        step_ids = prompt[hit:].unsqueeze(0)
        step_pos = torch.arange(hit, len(prompt)).unsqueeze(0)
        seen = len(prompt)  # tokens whose KV will be in `past` after the next forward
        tokens: list[int] = []
        logprobs: list[float] = []
        stopped = False
        with self.expanded_kv.decoding():
            for _ in range(params.max_new_tokens):
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=torch.ones((1, seen), dtype=torch.long),
                    position_ids=step_pos,
                    past_key_values=past,
                    use_cache=True,
                    logits_to_keep=1,
                )
                past = out.past_key_values
                self.counters["computed_tokens"] += step_ids.shape[1]
                token, logprob = next_tokens(out.logits[:, -1].float(), params, gen)
                tokens.append(int(token))
                logprobs.append(float(logprob))
                if bool(torch.isin(token, stops)):
                    stopped = True
                    break
                step_ids, step_pos = token.view(1, 1), step_pos[:, -1:] + 1
                seen += 1
        if past is not None and tokens:  # the KV holds the prompt and every generated token but the last
            self._store(torch.tensor(prompt_ids + tokens[:-1], dtype=torch.long), past)
        return Generation(
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason="stop" if stopped else "length",
            policy_version=self.policy_version,
            stop_token=tokens[-1] if stopped else None,
        )
