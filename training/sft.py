"""Supervised fine-tuning data: chat trajectories rendered with the tokenizer's chat template into token ids
and a loss mask (docs/recipe.md "SFT").

Loss falls only on assistant tokens (what the template marks as generation: the assistant's reasoning,
content, tool calls and end-of-turn token). Erroneous segments stay in the context but carry no loss:
- an assistant turn with `"train": false` (e.g. a malformed tool call answered by an error observation);
- `"error_spans"`: substrings of an assistant turn's `reasoning_content` / `content` that are wrong steps
  later corrected in the same turn.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

IGNORE = -100
ASSISTANT_HEADER = "<|assistant|>\n"


@dataclass
class RenderedChat:
    input_ids: list[int]
    loss_mask: list[int]  # 1 = the token is a training target

    def labels(self) -> list[int]:
        return [t if m else IGNORE for t, m in zip(self.input_ids, self.loss_mask, strict=True)]


def _render(tokenizer: Any, messages: Sequence[dict]) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False)


def _char_ranges(
    tokenizer: Any, messages: Sequence[dict]
) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
    """(text, trainable char ranges, masked char ranges). The template appends one message at a time, so
    message k's text is the difference between the renders of messages[:k] and messages[:k+1]."""
    text = _render(tokenizer, messages)
    trainable, masked = [], []
    start = 0
    for k, message in enumerate(messages):
        end = len(_render(tokenizer, messages[: k + 1]))
        if message["role"] == "assistant":
            if not text[start:end].startswith(ASSISTANT_HEADER):
                raise ValueError(f"message {k}: the chat template did not render an assistant header")
            gen_start, gen_end = start + len(ASSISTANT_HEADER), end - 1  # the template ends a turn with "\n"
            (trainable if message.get("train", True) else masked).append((gen_start, gen_end))
            for span in message.get("error_spans", []):
                at = text.find(span, gen_start, gen_end)
                if at < 0 or not span:
                    raise ValueError(f"message {k}: error span {span!r} is not in the assistant turn")
                masked.append((at, at + len(span)))
        start = end
    return text, trainable, masked


def render_chat(tokenizer: Any, messages: Sequence[dict]) -> RenderedChat:
    """Token ids of the chat template's rendering and the loss mask (1 = assistant token outside errors)."""
    text, trainable, masked = _char_ranges(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = []
    for s, e in enc["offset_mapping"]:
        inside = any(a <= s and e <= b for a, b in trainable)
        touches_error = any(s < b and a < e for a, b in masked)  # a token straddling an error is masked
        mask.append(int(inside and not touches_error and e > s))
    return RenderedChat(list(enc["input_ids"]), mask)


def error_correction_trajectory(
    task_prompt: str, solution: list[dict], wrong_step: str, rng: random.Random
) -> list[dict]:
    """A worked solution whose reasoning first makes `wrong_step`, then corrects itself: the wrong step is an
    error span (kept in context, no loss)."""
    final = dict(solution[-1])
    reasoning = final.get("reasoning_content") or ""
    final["reasoning_content"] = f"{wrong_step} Wait, that is wrong. {reasoning}".strip()
    final["error_spans"] = [wrong_step]
    return [{"role": "user", "content": task_prompt}, *solution[:-1], final]


def failed_tool_call_trajectory(task_prompt: str, solution: list[dict]) -> list[dict]:
    """A tool solution that first sends a malformed call (answered by an error) and then the right one; the
    failed call is a turn without loss."""
    bad = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"name": "calculator", "arguments": {}}],
        "train": False,
    }
    error = {"role": "tool", "content": "error: bad tool call (TypeError)"}
    return [{"role": "user", "content": task_prompt}, bad, error, *solution]


def pack_rows(rows: Sequence[RenderedChat], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """One batch's rows (each cut to `seq_len`) packed first-fit-decreasing into as few rows of at most
    `seq_len` tokens as hold them. A block-diagonal causal mask lets each chat attend only to its own earlier
    tokens, and its position ids restart at 0, so every chat is computed as in a row of its own: the loss and
    gradients of the padded batch, without computing the padding (tiny SFT batches were 53% padding)."""
    order = sorted(range(len(rows)), key=lambda i: -min(seq_len, len(rows[i].input_ids)))
    bins: list[list[int]] = []
    fill: list[int] = []
    for i in order:
        n = min(seq_len, len(rows[i].input_ids))
        at = next((b for b, used in enumerate(fill) if used + n <= seq_len), len(bins))
        if at == len(bins):
            bins.append([])
            fill.append(0)
        bins[at].append(i)
        fill[at] += n
    width = max(fill)
    ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    labels = torch.full((len(bins), width), IGNORE, dtype=torch.long)
    positions = torch.zeros((len(bins), width), dtype=torch.long)
    mask = torch.eye(width, dtype=torch.bool).repeat(len(bins), 1, 1)  # padding sees itself: no empty row
    for b, members in enumerate(bins):
        start = 0
        for i in members:
            n = min(seq_len, len(rows[i].input_ids))
            ids[b, start : start + n] = torch.tensor(rows[i].input_ids[:n])
            labels[b, start : start + n] = torch.tensor(rows[i].labels()[:n])
            positions[b, start : start + n] = torch.arange(n)
            mask[b, start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool).tril()
            start += n
    return {"input_ids": ids, "labels": labels, "position_ids": positions, "attention_mask": mask[:, None]}


class SftBatches:
    """Resumable batches of rendered chats: rows shuffled per epoch by seed; each batch packed into as few
    rows as hold it (`pack_rows`), or (pack=False) right-padded to its longest row (at most `seq_len`);
    labels -100 outside the loss mask and on padding."""

    def __init__(
        self,
        rows: list[RenderedChat],
        batch_size: int,
        seq_len: int,
        pad_id: int,
        seed: int = 0,
        pack: bool = True,
    ):
        if not rows:
            raise ValueError("no SFT rows to train on")
        self.rows, self.batch_size, self.seq_len, self.pad_id, self.seed = (
            rows,
            batch_size,
            seq_len,
            pad_id,
            seed,
        )
        self.pack = pack
        self.index = 0

    def __iter__(self) -> SftBatches:
        return self

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + epoch).permutation(len(self.rows))

    def __next__(self) -> dict[str, torch.Tensor]:
        picked = []
        for _ in range(self.batch_size):
            epoch, pos = divmod(self.index, len(self.rows))
            picked.append(self.rows[int(self._order(epoch)[pos])])
            self.index += 1
        if self.pack:
            return pack_rows(picked, self.seq_len, self.pad_id)
        width = min(self.seq_len, max(len(r.input_ids) for r in picked))
        ids = torch.full((len(picked), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(picked), width), IGNORE, dtype=torch.long)
        for i, row in enumerate(picked):
            n = min(width, len(row.input_ids))
            ids[i, :n] = torch.tensor(row.input_ids[:n])
            labels[i, :n] = torch.tensor(row.labels()[:n])
        return {"input_ids": ids, "labels": labels}

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])


def sft_batches_from_file(
    rank: int,
    world_size: int,
    rows_path: str,
    tokenizer_dir: str,
    batch_size: int,
    seq_len: int,
    seed: int = 0,
    pack: bool = True,
) -> SftBatches:
    """The SFT job's data factory (training/job.py DataSpec): this rank's share of the rows file, rendered."""
    from training.sft_data import read_rows
    from training.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    rows = read_rows(rows_path)[rank::world_size]
    return SftBatches(
        [render_chat(tok, r["messages"]) for r in rows], batch_size, seq_len, tok.pad_token_id, seed, pack
    )
