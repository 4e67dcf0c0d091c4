"""Rule-based filter for synthetic, template-generated or AI-generated-looking text (RECIPE.md, Math & science).

Each rule names the reason a document is dropped; the first rule that fires wins and is counted:
- `assistant_phrases`: chat-assistant tells ("as an AI language model", "I hope this helps", "Certainly! Here").
- `llm_stock_phrases`: a high density of stock LLM prose ("delve into", "it is important to note",
  "a testament to", "in conclusion") per 1,000 words.
- `template_placeholders`: unfilled template slots ("{{name}}", "[INSERT ...]", "lorem ipsum", "{first_name}").
- `template_repetition`: most sentences share one skeleton once digits are masked ("The sum of 3 and 4 is
  7." x 50): text generated from a template, which teaches nothing the first sentence did not.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator

from pydantic import BaseModel, ConfigDict, Field

_ASSISTANT = re.compile(
    r"as an ai(?: language)? model|as a (?:large )?language model|i(?:'m| am) (?:just )?an ai\b|"
    r"i hope this helps|(?:^|\n)\s*(?:certainly|sure|absolutely)! here(?:'s| is)|i cannot fulfill|"
    r"regenerate response|my knowledge cutoff|as of my last (?:knowledge )?update",
    re.IGNORECASE,
)
_STOCK = re.compile(
    r"\bdelve(?:s|d)? into\b|it is (?:important|worth|crucial) to note|\bin conclusion,|\bin summary,|"
    r"\ba testament to\b|\brich tapestry\b|\bplays? a (?:crucial|vital|pivotal) role\b|\bin today's "
    r"(?:fast-paced|digital) world\b|\bnavigat(?:e|ing) the (?:complex|intricate)\b|\bembark on a journey\b|"
    r"\bunlock(?:ing)? the (?:power|potential|secrets)\b|\bever-evolving\b|\bseamless(?:ly)?\b|\bfurthermore,|"
    r"\bmoreover,|\bpivotal\b|\bmultifaceted\b|\bfoster(?:s|ing)? a\b",
    re.IGNORECASE,
)
_PLACEHOLDER = re.compile(
    r"\{\{\s*[A-Za-z_]\w+\s*\}\}|\[(?:insert|your|name of|placeholder)[^\]]{0,40}\]|lorem ipsum|<placeholder>|"
    r"\{(?:name|title|topic|first_name|product)\}",  # not `%s`, `{x}` or `{{c}}`: code and maxima use them
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_DIGITS = re.compile(r"\d+(?:\.\d+)?")


class SyntheticTextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stock_phrases_per_1k_words: float = Field(
        6.0,
        gt=0,
        description="Drop when stock LLM phrases per 1,000 words reach this (and >= min_stock_phrases)",
    )
    min_stock_phrases: int = Field(4, ge=1, description="Never drop on stock phrases below this count")
    template_min_sentences: int = Field(
        8, ge=2, description="Template repetition needs at least this many sentences"
    )
    template_max_skeleton_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Drop when one digit-masked sentence skeleton covers this share of sentences",
    )


def synthetic_reason(text: str, config: SyntheticTextConfig | None = None) -> str | None:
    """Why `text` looks synthetic / templated (a rule name), or None when it looks natural."""
    c = config or SyntheticTextConfig()
    if _ASSISTANT.search(text):
        return "assistant_phrases"
    words = max(1, len(text.split()))
    stock = len(_STOCK.findall(text))
    if stock >= c.min_stock_phrases and stock * 1000 / words >= c.stock_phrases_per_1k_words:
        return "llm_stock_phrases"
    if _PLACEHOLDER.search(text):
        return "template_placeholders"
    sentences = [s.strip() for s in _SENTENCE.split(text) if len(s.strip()) > 15]
    if len(sentences) >= c.template_min_sentences:
        skeletons = Counter(_DIGITS.sub("#", s.lower()) for s in sentences)
        if skeletons.most_common(1)[0][1] / len(sentences) >= c.template_max_skeleton_share:
            return "template_repetition"
    return None


def drop_synthetic(
    docs: Iterable[dict],
    stats: Counter,
    config: SyntheticTextConfig | None = None,
    dropped: list | None = None,
) -> Iterator[dict]:
    """Pipeline step: yields natural-looking docs; counts `dropped/synthetic/<reason>` in `stats` and
    appends dropped docs (with `metadata.drop_reason`) to `dropped` when given."""
    for doc in docs:
        reason = synthetic_reason(doc["text"], config)
        if reason is None:
            stats["synthetic_filter/kept"] += 1
            yield doc
            continue
        stats[f"dropped/synthetic/{reason}"] += 1
        if dropped is not None:
            doc.setdefault("metadata", {})["drop_reason"] = f"synthetic/{reason}"
            dropped.append(doc)
