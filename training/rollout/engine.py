"""Rollout engines: `generate(prompts, params) -> generations` with the exact token ids and the engine's own
per-token log-probs, and `sync_weights` so the trainer can push new weights (the policy version is stamped
on every generation).

The local engine keeps its own copy of the policy, by default in bf16 where the hardware computes in bf16:
another precision than the fp32 trainer, so the train / inference mismatch that IcePop corrects
(docs/recipe.md, Eq. 1) is real here too. On a CPU that only emulates bf16 (2.6x slower generation, measured
on AVX2) `auto` keeps fp32; the mismatch is then the KV-cached decode vs the trainer's full forward."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from training.rollout.dsa_decode import DecodingIndexer
from training.rollout.mla_cache import ExpandedKV
from training.trainer import resolve_precision


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0
    # One seed per prompt: each row then samples from its own generator, so its tokens do not depend on
    # which other prompts share the batch (empty = one generator seeded with `seed` for the whole batch)
    row_seeds: tuple[int, ...] = ()


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]  # log π_engine(token) at temperature T (1 when greedy), without top-p truncation
    finish_reason: str  # "stop" (a stop token, included) or "length"
    policy_version: int
    stop_token: int | None = None
    timings: dict[str, float] = field(default_factory=dict)


class RolloutEngine(Protocol):
    policy_version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]: ...

    def sync_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    drop = cumulative - sorted_logits.softmax(-1) > top_p  # keep the smallest prefix reaching top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def sample_tokens(
    probs: torch.Tensor,
    gens: torch.Generator | Sequence[torch.Generator],
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token per row of `probs` [n, V] (rows need not be normalised), by inverting each row's CDF at a
    uniform draw: from one generator, or one per row (a row's token then does not depend on the others), or
    the given float64 `uniforms` [n]. A token of probability 0 is never drawn.

    The CDF is inverted in two levels, blocks of `SAMPLE_BLOCK` tokens and then the chosen block, so only
    block sums and one block per row are accumulated: a full-row float64 cumsum was 10% of a decoding step
    at V = 8k (it was itself ~14x faster than `torch.multinomial`)."""
    n, vocab = probs.shape
    if uniforms is not None:
        u = uniforms
    elif isinstance(gens, torch.Generator):
        u = torch.rand(n, generator=gens, dtype=torch.float64)
    else:
        u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gens])
    pad = -vocab % SAMPLE_BLOCK
    blocks = F.pad(probs, (0, pad)).view(n, -1, SAMPLE_BLOCK)
    block_mass = blocks.sum(-1).double()  # [n, blocks]; float32 sums: one rounding per block
    block_cdf = block_mass.cumsum(-1)
    target = u * block_cdf[:, -1]
    block = _first_above(block_cdf, target, block_mass > 0)
    rows = torch.arange(n)
    inner = blocks[rows, block].double()  # [n, SAMPLE_BLOCK]
    offset = target - (block_cdf[rows, block] - block_mass[rows, block])
    within = _first_above(inner.cumsum(-1), offset, inner > 0)
    return block * SAMPLE_BLOCK + within


SAMPLE_BLOCK = 128


def _first_above(cdf: torch.Tensor, target: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cdf exceeds target (its own mass is then > 0); past the end by
    rounding, the last index of positive mass."""
    index = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
    last = positive.shape[1] - 1 - positive.flip(-1).int().argmax(-1)
    return torch.minimum(index, last)


def next_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    gens: torch.Generator | Sequence[torch.Generator],
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of each row of `logits` [n, V] and its log-prob at the temperature (without top-p
    truncation): greedy when the temperature is 0."""
    if params.temperature == 0:
        token = logits.argmax(-1)
        scaled = logits
    else:
        scaled = logits / params.temperature
        token = sample_tokens(_top_p_filter(scaled, params.top_p).softmax(-1), gens, uniforms)
    chosen = scaled.gather(1, token.unsqueeze(1)).squeeze(1)
    return token, chosen - torch.logsumexp(scaled, dim=-1)


def engine_dtype(name: str, device: torch.device) -> torch.dtype:
    """`bfloat16` / `float32` as named; `auto` = bf16 where `device` has native bf16 arithmetic, as the
    trainer's `precision: auto`."""
    if name == "auto":
        name = "bfloat16" if resolve_precision("auto", device) == "bf16" else "float32"
    if name not in ("bfloat16", "float32"):
        raise ValueError(f"engine_dtype {name!r}: use auto, bfloat16 or float32")
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def _contiguous_input(module: nn.Module, args: tuple) -> tuple:
    return (args[0].contiguous(), *args[1:])


class LocalRolloutEngine:
    """Batched sampling with a KV cache on an in-process copy of the policy held in `dtype`."""

    # Finished rows leave the batch (and its caches) once this share of it has finished; None: they stay. A
    # finished row costs its share of every step: 64 SFT rows sampling to a stop, 1.2-1.3x faster in bf16.
    leave_share: float | None = 0.25

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16, pad_id: int = 1):
        self.dtype, self.pad_id = dtype, pad_id
        self.model = copy.deepcopy(model).to(dtype).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.expanded_kv = ExpandedKV(self.model)
        self.indexer = DecodingIndexer(self.model)
        # transformers slices the prefill's last position out of the hidden states (a strided view); a bf16
        # linear on a strided input copies its weight once per row: ~0.2 s per 64-row prefill (LM head).
        self.model.get_output_embeddings().register_forward_pre_hook(_contiguous_input)
        self.policy_version = 0

    def sync_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """In-process weight sync: copy (and cast) the trainer's weights into the engine's copy."""
        with torch.no_grad():
            own = self.model.state_dict()
            missing = set(own) - set(state_dict)
            if missing:
                raise KeyError(f"weight sync is missing {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
            wrong = [n for n, t in own.items() if tuple(state_dict[n].shape) != tuple(t.shape)]
            if wrong:
                raise ValueError(f"weight sync: {len(wrong)} tensors have another shape, e.g. {wrong[:3]}")
            for name, tensor in own.items():
                tensor.copy_(state_dict[name].to(tensor.dtype))
        self.policy_version = version

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if not prompts or any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token is at the same column
            ids[i, width - len(p) :] = torch.tensor(p)
            attention[i, width - len(p) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp_min(0)
        if params.row_seeds and len(params.row_seeds) != n:
            raise ValueError(
                f"{len(params.row_seeds)} row_seeds for {n} prompts: give one per prompt or none"
            )
        gen = torch.Generator().manual_seed(params.seed)
        row_gens = [torch.Generator().manual_seed(r) for r in params.row_seeds]
        stops = torch.tensor(params.stop_token_ids or [-1])
        out_ids = torch.full((n, params.max_new_tokens), self.pad_id, dtype=torch.long)
        out_lp = torch.zeros((n, params.max_new_tokens))
        done = torch.zeros(n, dtype=torch.bool)
        lengths = torch.zeros(n, dtype=torch.long)
        rows = torch.arange(n)  # the rows still in the batch (finished ones leave it, see below)
        past, step_ids, step_pos = None, ids, positions
        with self.expanded_kv.decoding(), self.indexer.within(width + params.max_new_tokens):
            for t in range(params.max_new_tokens):
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=attention,
                    position_ids=step_pos,
                    past_key_values=past,
                    use_cache=True,
                    logits_to_keep=1,  # the next token's logits only, as transformers' generate computes them
                )
                past = out.past_key_values
                gens: torch.Generator | list[torch.Generator] = (
                    [row_gens[i] for i in rows.tolist()] if row_gens else gen
                )
                # one shared generator draws for all n rows, as if none had left: the same samples either way
                u = (
                    torch.rand(n, generator=gen, dtype=torch.float64)[rows]
                    if params.temperature and not row_gens
                    else None
                )
                token, logprob = next_tokens(out.logits[:, -1].float(), params, gens, u)
                token = torch.where(done[rows], torch.full_like(token, self.pad_id), token)
                out_ids[rows, t] = token
                out_lp[rows, t] = logprob
                lengths[rows] += (~done[rows]).long()
                done[rows] |= torch.isin(token, stops)
                if bool(done.all()):
                    break
                attention = torch.cat([attention, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
                step_ids, step_pos = token.unsqueeze(1), step_pos[:, -1:] + 1
                finished = done[rows]
                if self.leave_share is not None and int(finished.sum()) >= max(
                    1, self.leave_share * len(rows)
                ):
                    keep = (~finished).nonzero().squeeze(1)
                    past.batch_select_indices(keep)
                    self.expanded_kv.select_rows(keep)
                    attention, step_ids, step_pos, rows = (
                        attention[keep],
                        step_ids[keep],
                        step_pos[keep],
                        rows[keep],
                    )
        results = []
        for i in range(n):
            k = int(lengths[i])
            toks = out_ids[i, :k].tolist()
            stopped = bool(k) and toks[-1] in params.stop_token_ids
            results.append(
                Generation(
                    token_ids=toks,
                    logprobs=out_lp[i, :k].tolist(),
                    finish_reason="stop" if stopped else "length",
                    policy_version=self.policy_version,
                    stop_token=toks[-1] if stopped else None,
                )
            )
        return results


@torch.no_grad()
def sequence_logprobs(
    model: nn.Module, prompt: list[int], completion: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """log π(completion_t | prompt, completion_<t) under `model`, one forward pass (the trainer's view)."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / max(temperature, 1e-6), dim=-1)
    return logp.gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)
