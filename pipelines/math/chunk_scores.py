"""Chunk-and-aggregate scoring of long documents (RECIPE.md, Math & science).

A judge sees at most a few thousand characters, so a long document is split into chunks at paragraph
boundaries, each chunk is scored, and the chunk scores are combined with one documented rule:

    aggregate = m + bonus * (best - m)

where m is the length-weighted mean of the chunk scores and best the highest chunk score. bonus = 0 is the
plain weighted mean (a long page is as good as its average), bonus = 1 is the max (one good section carries
the page). The default 0.5 rewards a textbook chapter with one excellent section without letting a single
math paragraph in a page of junk count as a math page. Chunks the judge could not score are left out; a
document with no scored chunk has no score (None).
"""

from __future__ import annotations

import re

_PARAGRAPHS = re.compile(r"\n\s*\n")


def split_into_chunks(text: str, chunk_chars: int = 1500, max_chunks: int = 8) -> list[str]:
    """Paragraph-aligned chunks of about `chunk_chars` (a longer paragraph is cut); when there are more than
    `max_chunks`, evenly spaced ones are kept (first and last included), so cost per document is bounded."""
    chunks: list[str] = []
    current = ""
    for para in _PARAGRAPHS.split(text.strip()):
        para = para.strip()
        while len(para) > chunk_chars:  # a huge paragraph (or no paragraphs at all) is cut in pieces
            if current:
                chunks.append(current)
                current = ""
            chunks.append(para[:chunk_chars])
            para = para[chunk_chars:]
        if current and len(current) + len(para) + 2 > chunk_chars:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current:
        chunks.append(current)
    if len(chunks) > max_chunks:
        step = (len(chunks) - 1) / (max_chunks - 1) if max_chunks > 1 else 0
        chunks = [chunks[round(i * step)] for i in range(max_chunks)]
    return chunks or [text[:chunk_chars]]


def aggregate_chunk_scores(
    scores: list[float | None], lengths: list[int], bonus: float = 0.5
) -> float | None:
    """`m + bonus * (best - m)` over the scored chunks, m weighted by chunk length (see module doc)."""
    if len(scores) != len(lengths):
        raise ValueError("one length per chunk score")
    if not 0 <= bonus <= 1:
        raise ValueError("bonus must be in [0, 1]")
    pairs = [(s, max(1, n)) for s, n in zip(scores, lengths, strict=True) if s is not None]
    if not pairs:
        return None
    mean = sum(s * n for s, n in pairs) / sum(n for _, n in pairs)
    best = max(s for s, _ in pairs)
    return mean + bonus * (best - mean)
