"""Synthetic long-range recall sequences (RULER-style passkey, MRCR-like multi-key recall) built from filler text.

Evals use them as multiple-choice items scored by log-likelihood; midtraining mixes whole sequences into its
data so a small model gets a reason to look far back. Both work on token ids: `encode(text) -> list[int]`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Encode = Callable[[str], list[int]]

PASSKEY_INTRO = (
    "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it.\n"
)
PASSKEY_NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"
# MRCR-like: several named keys in the context, then questions about some of them.
NAMED_NEEDLE = " The secret code of {name} is {key}. "
NAMED_QUESTION = "\nWhat is the secret code of {name}? The secret code of {name} is"
NAMES = [
    "Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jonas", "Kemal", "Lena",
    "Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Vera", "Wim", "Yusuf",
]  # fmt: skip


def random_key(rng: np.random.Generator, digits: int) -> str:
    return str(int(rng.integers(10 ** (digits - 1), 10**digits)))


def distinct_keys(rng: np.random.Generator, n: int, digits: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < n:
        key = random_key(rng, digits)
        if key not in keys:
            keys.append(key)
    return keys


class FillerText:
    """Random windows of natural text (token ids of documents, EOS removed) to hide needles in."""

    def __init__(self, docs: Sequence[np.ndarray], eos_id: int | None = None):
        parts = [np.asarray(d, dtype=np.int64) for d in docs if len(d)]
        stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.tokens = stream[stream != eos_id] if eos_id is not None else stream
        if len(self.tokens) == 0:
            raise ValueError("filler text is empty: give at least one non-empty document")

    def window(self, rng: np.random.Generator, length: int) -> np.ndarray:
        if length <= 0:
            return np.zeros(0, dtype=np.int64)
        n = len(self.tokens)
        start = int(rng.integers(0, max(n - length, 0) + 1))
        out = self.tokens[start : start + length]
        while len(out) < length:  # short filler: repeat it
            out = np.concatenate([out, self.tokens[: length - len(out)]])
        return out


@dataclass
class PasskeyItem:
    """One multiple-choice retrieval item: the prompt, the candidate continuations and the right one."""

    prompt: np.ndarray
    choices: list[list[int]]
    answer: int
    length: int
    depth: float
    key: str


def _insert(filler: np.ndarray, piece: list[int], at: int) -> np.ndarray:
    return np.concatenate([filler[:at], np.asarray(piece, dtype=np.int64), filler[at:]])


def passkey_item(
    encode: Encode,
    filler: FillerText,
    rng: np.random.Generator,
    length: int,
    depth: float,
    num_choices: int = 4,
    key_digits: int = 5,
) -> PasskeyItem:
    """A passkey prompt of exactly `length` tokens (answer included) with the needle at `depth` in [0, 1]."""
    keys = distinct_keys(rng, num_choices, key_digits)
    answer = int(rng.integers(0, num_choices))
    key = keys[answer]
    intro, question = encode(PASSKEY_INTRO), encode(PASSKEY_QUESTION)
    needle = encode(PASSKEY_NEEDLE.format(key=key))
    choices = [encode(" " + k) for k in keys]
    n_fill = length - len(intro) - len(needle) - len(question) - len(choices[answer])
    if n_fill < 0:
        raise ValueError(f"length {length} is too short for the passkey template ({length - n_fill} tokens)")
    fill = _insert(filler.window(rng, n_fill), needle, round(depth * n_fill))
    prompt = np.concatenate([np.asarray(intro, dtype=np.int64), fill, np.asarray(question, dtype=np.int64)])
    return PasskeyItem(prompt=prompt, choices=choices, answer=answer, length=length, depth=depth, key=key)


def passkey_items(
    encode: Encode,
    filler: FillerText,
    lengths: Sequence[int],
    depths: Sequence[float],
    per_cell: int,
    num_choices: int,
    seed: int,
    key_digits: int = 5,
) -> list[PasskeyItem]:
    """`per_cell` items for every (length, depth): a RULER-style grid."""
    rng = np.random.default_rng(seed)
    return [
        passkey_item(encode, filler, rng, length, depth, num_choices, key_digits)
        for length in lengths
        for depth in depths
        for _ in range(per_cell)
    ]


def passkey_sequence(
    encode: Encode,
    filler: FillerText,
    rng: np.random.Generator,
    seq_len: int,
    eos_id: int,
    key_digits: int = 5,
) -> tuple[np.ndarray, np.ndarray]:
    """A training row of `seq_len` tokens (a passkey prompt with the answer and EOS, filler before it) and
    its answer mask (True on the answer's tokens)."""
    body_len = seq_len - 1
    item = passkey_item(encode, filler, rng, body_len, float(rng.random()), 1, key_digits)
    answer = np.asarray(item.choices[0], dtype=np.int64)
    row = np.concatenate([item.prompt, answer, [eos_id]])
    targets = np.zeros(len(row), dtype=bool)
    targets[len(item.prompt) : len(item.prompt) + len(answer)] = True
    return row[:seq_len], targets[:seq_len]


def multikey_sequence(
    encode: Encode,
    filler: FillerText,
    rng: np.random.Generator,
    seq_len: int,
    eos_id: int,
    num_keys: int = 4,
    num_questions: int = 2,
    key_digits: int = 5,
) -> np.ndarray:
    """A training row of `seq_len` tokens (`num_keys` named keys spread through filler, then questions about
    `num_questions` of them, each followed by its key: MRCR-like multi-key recall) and its answer mask (True
    on the asked keys' tokens after the questions)."""
    names = list(rng.choice(NAMES, size=num_keys, replace=False))
    keys = distinct_keys(rng, num_keys, key_digits)
    asked = rng.choice(num_keys, size=min(num_questions, num_keys), replace=False)
    tail: list[int] = []
    tail_targets: list[bool] = []
    for i in asked:
        question, piece = encode(NAMED_QUESTION.format(name=names[i])), encode(" " + keys[i] + ".")
        answer = encode(" " + keys[i])
        n_answer = len(answer) if piece[: len(answer)] == answer else len(piece)  # "." merged into the key
        tail += question + piece
        tail_targets += [False] * len(question) + [True] * n_answer + [False] * (len(piece) - n_answer)
    tail.append(eos_id)
    tail_targets.append(False)
    needles = [encode(NAMED_NEEDLE.format(name=n, key=k)) for n, k in zip(names, keys, strict=True)]
    n_fill = seq_len - len(tail) - sum(len(n) for n in needles)
    if n_fill < 0:
        raise ValueError(f"seq_len {seq_len} is too short for {num_keys} keys and {num_questions} questions")
    fill = filler.window(rng, n_fill)
    # Insert from the back so earlier positions stay valid.
    for at, needle in sorted(
        zip(rng.integers(0, n_fill + 1, size=num_keys), needles, strict=True), reverse=True
    ):
        fill = _insert(fill, needle, int(at))
    row = np.concatenate([fill, np.asarray(tail, dtype=np.int64)])
    targets = np.concatenate([np.zeros(len(fill), dtype=bool), np.asarray(tail_targets, dtype=bool)])
    return row[:seq_len], targets[:seq_len]


def repeat_sequence(
    filler: FillerText, rng: np.random.Generator, seq_len: int, eos_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """A training row of `seq_len` tokens (a passage, unrelated text, then the same passage again) and its
    answer mask (True on the second copy).

    Every token of the second copy is predictable by looking back to the first (dense copy targets, the
    data that grows induction heads, on which passkey and key-value retrieval are built)."""
    passage_len = int(rng.integers(seq_len // 8, seq_len // 3 + 1))
    gap_len = seq_len - 2 * passage_len - 1
    passage = filler.window(rng, passage_len)
    row = np.concatenate([passage, filler.window(rng, gap_len), passage, [eos_id]])
    targets = np.zeros(len(row), dtype=bool)
    targets[passage_len + gap_len : 2 * passage_len + gap_len] = True
    return row[:seq_len], targets[:seq_len]


def synthetic_recall_examples(
    encode: Encode,
    filler: FillerText,
    n_rows: int,
    seq_len: int,
    eos_id: int,
    seed: int,
    multikey_share: float = 0.5,
    max_keys: int = 16,
    repeat_share: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """`n_rows` synthetic recall rows [n_rows, seq_len] (repeated-passage rows (`repeat_share`), multi-key rows
    (`multikey_share`) and passkey rows (the rest)) and their answer masks [n_rows, seq_len] (bool: the tokens
    that can only be predicted by looking back: the asked keys, the repeated passage).

    Multi-key rows hold 2..`max_keys` keys and ask about half to all of them, so one row carries many
    long-range copy targets (fewer keys when the row is too short for the template).
    """
    rng = np.random.default_rng(seed)
    rows, targets = [], []
    for _ in range(n_rows):
        example = None
        draw = rng.random()
        if draw < repeat_share:
            example = repeat_sequence(filler, rng, seq_len, eos_id)
        elif draw < repeat_share + multikey_share:
            num_keys = int(rng.integers(2, max(max_keys, 2) + 1))
            num_questions = int(rng.integers(max(1, num_keys // 2), num_keys + 1))
            while example is None and num_keys >= 2:
                try:
                    example = multikey_sequence(encode, filler, rng, seq_len, eos_id, num_keys, num_questions)
                except ValueError:
                    num_keys -= 1
                    num_questions = min(num_questions, num_keys)
        row, mask = example if example is not None else passkey_sequence(encode, filler, rng, seq_len, eos_id)
        rows.append(row)
        targets.append(mask)
    if not rows:
        return np.zeros((0, seq_len), dtype=np.int64), np.zeros((0, seq_len), dtype=bool)
    return np.stack(rows), np.stack(targets)
