"""Judge building blocks: the tolerant answer parser, versioned prompt files, the store cache, calibration
and the probe-set quality gate arithmetic."""

from __future__ import annotations

import math

import pytest

from classifiers.judge.cache import CachedAnswer, JudgeCache, document_hash
from classifiers.judge.client import calibrate
from classifiers.judge.parser import parse_judge_answer, parse_score_text
from classifiers.judge.prompt_files import load_prompt, parse_prompt_file
from classifiers.judge.quality_gate import GateConfig, evaluate_gate, interleave_kinds, load_probe_set
from infra.store import LocalStore


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4", 4.0),
        ("Score: 3", 3.0),
        ("Educational score: 2\nThe text is fine.", 2.0),
        ("I would give it 4/5 because it explains sums.", 4.0),
        ("**5**", 5.0),
        ("The total is four points.", 4.0),
        ("Points: 7", None),  # out of range
        ("It has 3 examples and 2 exercises, overall decent.", None),  # ambiguous numbers
        ("I like turtles.", None),
        ("", None),
    ],
)
def test_score_text_parser(text, expected):
    assert parse_score_text(text) == expected


def test_logprob_weighted_reading_beats_the_text():
    lp = {"3": math.log(0.5), "4": math.log(0.3), " 5": math.log(0.1), "The": math.log(0.1)}
    parsed = parse_judge_answer("3", lp)
    assert parsed.method == "logprobs"
    assert parsed.score == pytest.approx((3 * 0.5 + 4 * 0.3 + 5 * 0.1) / 0.9)
    assert parse_judge_answer("garbage", {"The": -0.1}).method == "failed"
    assert parse_judge_answer("Score: 2", {"The": -0.1}).score == 2.0


def test_calibration_divides_out_the_prior():
    prior = (0.1, 0.6, 0.1, 0.1, 0.05, 0.05)
    assert calibrate(prior, prior) == pytest.approx([1 / 6] * 6)
    shifted = calibrate([0.1, 0.3, 0.1, 0.1, 0.2, 0.2], prior)
    assert shifted.index(max(shifted)) in (4, 5)


def test_prompt_files_are_versioned_by_content():
    rubric = load_prompt("edu_math_v1")
    assert (
        rubric.kind == "rubric"
        and rubric.prompt_id.startswith("edu_math_v1-")
        and len(rubric.prompt_id) == 20
    )
    msgs = rubric.messages("THE DOC")
    assert msgs[0]["role"] == "system" and "<document>THE DOC</document>" in msgs[-1]["content"]
    levels = load_prompt("edu_math_levels_v1")
    assert levels.kind == "levels" and [s for s, _ in levels.levels][0] == 0 and levels.max_score == 5
    text = "### user\nRate <document>{document}</document>\n### example score=4\nx = 2 + 2\n"
    a, b = parse_prompt_file(text, "p_v1"), parse_prompt_file(text + "Answer briefly.\n", "p_v1")
    assert a.examples == (("x = 2 + 2", 4),) and a.prompt_id != b.prompt_id
    with pytest.raises(ValueError):
        parse_prompt_file("### user\nno placeholder\n", "bad_v1")
    with pytest.raises(ValueError):
        parse_prompt_file("### level score=0\nonly one level\n", "bad_v2")


def test_cache_is_keyed_by_model_prompt_and_document(tmp_path):
    store = LocalStore(tmp_path)
    cache = JudgeCache(store, "judge/cache", "openai:m1", "edu_math_v1-abc")
    cache.put(CachedAnswer(document_hash("doc"), "4", 4.0, "text", None, 10, 1))
    key = cache.flush()
    assert key.startswith("judge/cache/openai_m1/edu_math_v1-abc/part-") and cache.flush() is None
    assert (
        JudgeCache(store, "judge/cache", "openai:m1", "edu_math_v1-abc").get(document_hash("doc")).score
        == 4.0
    )
    assert JudgeCache(store, "judge/cache", "openai:m2", "edu_math_v1-abc").get(document_hash("doc")) is None
    assert JudgeCache(store, "judge/cache", "openai:m1", "edu_math_v2-abc").get(document_hash("doc")) is None


def test_damaged_cache_part_is_skipped_not_fatal(tmp_path):
    """On 98a639e one truncated part (a damaged object) made every judge run fail to load its cache."""
    store = LocalStore(tmp_path)
    cache = JudgeCache(store, "judge/cache", "openai:m1", "p-1")
    for doc in ("a", "b"):
        cache.put(CachedAnswer(document_hash(doc), "3", 3.0, "text", None, 10, 1))
        key = cache.flush()
    store.put_bytes(key, store.get_bytes(key)[:-6])  # the part with "b" loses its gzip trailer
    again = JudgeCache(store, "judge/cache", "openai:m1", "p-1")
    assert (again.parts_read, again.parts_skipped, len(again)) == (1, 1, 1)
    assert again.get(document_hash("a")).score == 3.0 and again.get(document_hash("b")) is None


def test_probe_set_and_gate_arithmetic():
    probes = load_probe_set()
    kinds = {p["kind"] for p in probes}
    assert len(probes) == 94 and kinds == {
        "champ_solution",
        "sympy_doc",
        "champ_problem",
        "jargon_entry",
        "fortune",
        "recipe",
        "navigation",
    }
    assert all(p["license"] in {"MIT", "BSD-3-Clause", "BSD", "public-domain"} for p in probes)
    assert {p["kind"] for p in interleave_kinds(probes)[:7]} == kinds
    perfect = evaluate_gate(probes, [float(p["grade"]) for p in probes], GateConfig())
    assert perfect.passed and perfect.auc == 1.0 and perfect.spearman == pytest.approx(1.0)
    flat = evaluate_gate(
        probes, [2.0 if i % 2 else None for i in range(len(probes))], GateConfig(blocking=True)
    )
    assert not flat.passed and flat.blocking and flat.unscored == 47 and "blocking" in flat.message
    inverted = evaluate_gate(probes, [-float(p["grade"]) for p in probes], GateConfig())
    assert inverted.auc == 0.0 and not inverted.passed


def test_a_prose_answer_with_a_stray_digit_is_not_read_as_a_score():
    from classifiers.judge.parser import parse_judge_answer

    prose = {"The": math.log(0.6), "This": math.log(0.3), "1": math.log(0.02)}
    parsed = parse_judge_answer("The document contains a short story.", prose)
    assert parsed.method == "failed" and parsed.score is None  # was 1.0 read from the 2% digit
    digits = {"3": math.log(0.7), "4": math.log(0.2), "The": math.log(0.05)}
    parsed = parse_judge_answer("3", digits)
    assert parsed.method == "logprobs" and abs(parsed.score - (3 * 0.7 + 4 * 0.2) / 0.9) < 1e-9
    assert parse_judge_answer("Score: 4", prose).score == 4.0  # prose with a stated score: read from the text
