"""Chunk-and-aggregate rule and the synthetic-text filter of the math pipeline."""

from __future__ import annotations

from collections import Counter

import pytest

from pipelines.math.chunk_scores import aggregate_chunk_scores, split_into_chunks
from pipelines.math.synthetic_text import drop_synthetic, synthetic_reason


def test_chunks_follow_paragraphs_and_cover_the_text():
    paras = [(f"Paragraph {i} " + "word " * 60).strip() for i in range(10)]  # 311 chars each
    text = "\n\n".join(paras)
    chunks = split_into_chunks(text, chunk_chars=1000, max_chunks=50)
    assert all(len(c) <= 1000 for c in chunks)
    assert [c.count("Paragraph") for c in chunks] == [3, 3, 3, 1]  # 3 x 311 + 2 separators < 1000
    assert "\n\n".join(chunks) == text.strip()


def test_long_documents_keep_evenly_spaced_chunks_with_first_and_last():
    text = "\n\n".join(f"p{i} " + "x" * 500 for i in range(20))
    chunks = split_into_chunks(text, chunk_chars=600, max_chunks=4)
    assert len(chunks) == 4
    assert chunks[0].startswith("p0 ") and chunks[-1].startswith("p19 ")


def test_a_paragraph_longer_than_a_chunk_is_cut():
    chunks = split_into_chunks("y" * 2500, chunk_chars=1000, max_chunks=10)
    assert [len(c) for c in chunks] == [1000, 1000, 500]


def test_aggregate_is_weighted_mean_plus_half_the_gap_to_the_best_chunk():
    # weighted mean = (1*100 + 5*300) / 400 = 4.0; best = 5; bonus 0.5 -> 4.5
    assert aggregate_chunk_scores([1.0, 5.0], [100, 300], bonus=0.5) == pytest.approx(4.5)
    assert aggregate_chunk_scores([1.0, 5.0], [100, 300], bonus=0.0) == pytest.approx(4.0)
    assert aggregate_chunk_scores([1.0, 5.0], [100, 300], bonus=1.0) == pytest.approx(5.0)
    # one good paragraph in a long junk page does not make it a math page
    assert aggregate_chunk_scores([0.0, 0.0, 0.0, 5.0], [1000, 1000, 1000, 200], bonus=0.5) < 3.0


def test_aggregate_ignores_unscored_chunks_and_returns_none_without_any():
    assert aggregate_chunk_scores([None, 2.0], [500, 100]) == pytest.approx(2.0)
    assert aggregate_chunk_scores([None, None], [1, 1]) is None
    with pytest.raises(ValueError):
        aggregate_chunk_scores([1.0], [1, 2])


NATURAL = (
    "Let f(x) = x^2. The derivative is f'(x) = 2x, which we find from the limit of the difference "
    "quotient. For example, at x = 3 the slope of the tangent is 6. Integrating back gives x^2 + C."
)


@pytest.mark.parametrize(
    "text, reason",
    [
        (NATURAL, None),
        (
            "(%i1) flatten ({a, {b}, {{c}}});\n(%o1) {a, b, c}\n" + NATURAL,
            None,
        ),  # maxima sets, not a template
        (
            "As an AI language model, I cannot solve this, but here is an idea. " + NATURAL,
            "assistant_phrases",
        ),
        (
            "In this essay we delve into algebra. It is important to note that algebra plays a crucial role. "
            "Moreover, it is a testament to human ingenuity. In conclusion, algebra is multifaceted.",
            "llm_stock_phrases",
        ),
        (
            "Dear {first_name}, your score on the [INSERT QUIZ NAME] quiz is ready. " + NATURAL,
            "template_placeholders",
        ),
        (" ".join(f"The sum of {i} and {i + 1} is {2 * i + 1}." for i in range(30)), "template_repetition"),
    ],
)
def test_synthetic_rules(text, reason):
    assert synthetic_reason(text) == reason


def test_drop_synthetic_counts_each_reason_and_keeps_dropped_docs():
    docs = [
        {"id": "a", "text": NATURAL, "metadata": {}},
        {"id": "b", "text": "I hope this helps! " + NATURAL, "metadata": {}},
        {
            "id": "c",
            "text": " ".join(f"Question {i}: what is {i} times 2? Answer: {2 * i}." for i in range(20)),
            "metadata": {},
        },
    ]
    stats, dropped = Counter(), []
    kept = list(drop_synthetic(docs, stats, dropped=dropped))
    assert [d["id"] for d in kept] == ["a"]
    assert stats == Counter(
        {
            "synthetic_filter/kept": 1,
            "dropped/synthetic/assistant_phrases": 1,
            "dropped/synthetic/template_repetition": 1,
        }
    )
    assert [d["metadata"]["drop_reason"] for d in dropped] == [
        "synthetic/assistant_phrases",
        "synthetic/template_repetition",
    ]
