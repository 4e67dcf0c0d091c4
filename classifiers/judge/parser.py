"""Turn a judge's answer into a 0..max score, tolerating whatever the model says.

Two readings, best first:
1. log-prob weighted: when the answer's first-token alternatives include the score digits, the score is the
   expected value over the digits (probabilities renormalised over "0".."max"). Smoother than the argmax,
   and the only reading that works for small models that hedge.
2. text: `Score: 4`, `4/5`, `**4**`, `Educational score: 4`, `four`, or a lone digit. Numbers out of range
   do not count. Nothing found = a parse failure: counted, never an exception.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_WORDS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
_LABELLED = re.compile(r"(?:score|points?|rating|total)\s*(?:is|of|=|:)?\s*\**\s*(\d+(?:\.\d+)?)", re.I)
_OUT_OF = re.compile(r"(\d+(?:\.\d+)?)\s*(?:/|out of)\s*(\d+)", re.I)
_NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)(?![\d.])")
_WORD = re.compile(r"\b(zero|one|two|three|four|five)\b", re.I)


@dataclass(frozen=True)
class ParsedScore:
    score: float | None
    method: str  # "logprobs", "text" or "failed"
    digit_probs: tuple[float, ...] | None = None  # renormalised P(score = 0..max), when log-probs were read


def digit_distribution(
    top_logprobs: dict[str, float], max_score: int = 5, min_mass: float = 1e-4
) -> tuple[tuple[float, ...], float] | None:
    """P(score = k) over "0".."max" from a token -> log-prob map, and the raw mass the digits held."""
    probs = [0.0] * (max_score + 1)
    for token, logprob in top_logprobs.items():
        token = token.strip()
        if token.isdigit() and int(token) <= max_score and len(token) == 1:
            probs[int(token)] += math.exp(logprob)
    mass = sum(probs)
    if mass < min_mass:
        return None
    return tuple(p / mass for p in probs), mass


def expected_score(probs: tuple[float, ...] | list[float]) -> float:
    return float(sum(k * p for k, p in enumerate(probs)))


def parse_score_text(text: str, max_score: int = 5) -> float | None:
    """The score stated in free text, or None."""
    if not text:
        return None
    for match in _LABELLED.finditer(text):
        value = float(match.group(1))
        if 0 <= value <= max_score:
            return value
    for match in _OUT_OF.finditer(text):
        value, scale = float(match.group(1)), float(match.group(2))
        if scale == max_score and 0 <= value <= max_score:
            return value
    numbers = [float(m.group(1)) for m in _NUMBER.finditer(text)]
    in_range = [n for n in numbers if 0 <= n <= max_score]
    if len(in_range) == 1 or (in_range and len(text) < 40):  # one candidate, or a terse answer
        return in_range[0]
    word = _WORD.search(text)
    if word and not numbers:
        return float(_WORDS[word.group(1).lower()])
    return None


def parse_judge_answer(
    text: str, top_logprobs: dict[str, float] | None = None, max_score: int = 5, min_digit_mass: float = 0.5
) -> ParsedScore:
    """Best reading of one answer; `top_logprobs` are the first answer token's alternatives, if any.

    The digits' distribution is read when the answer is a digit or digits are the likely first token (mass
    >= `min_digit_mass`): a model that answers in prose ("The document ...") with a stray 2% on "1" has not
    scored the document 1, so its text is parsed instead."""
    if top_logprobs:
        dist = digit_distribution(top_logprobs, max_score, 1e-9)
        answered_digit = (text or "").strip()[:1].isdigit()
        if dist is not None and (answered_digit or dist[1] >= min_digit_mass):
            return ParsedScore(expected_score(dist[0]), "logprobs", dist[0])
    value = parse_score_text(text or "", max_score)
    if value is None:
        return ParsedScore(None, "failed")
    return ParsedScore(value, "text")
