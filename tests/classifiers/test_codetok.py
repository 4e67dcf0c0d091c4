"""The C tokenizer (classifiers/_codetok.c) against its Python reference: the same token lists, so a model
trained with one reads the same features with the other."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import pytest
from code_snippets import corpus

from classifiers import code_language
from classifiers.code_language import (
    _STOPWORDS,
    TokenFeatures,
    _line_tokens_py,
    code_tokens,
    content_window,
    token_shape,
)

codetok = pytest.importorskip(
    "classifiers._codetok", reason="the C tokenizer was not built (pip install -e .)"
)

# characters where the two could part ways: ASCII vs Unicode whitespace and letters, sigils, `?`/`!`
# suffixes, the `.` inside numbers, long punctuation runs, astral code points
ALPHABET = list(" \t\n\r\x0b\x0c\x1c\x1f\x85\xa0_.?!#@$%abcXYZ019(){};:'\"-=><*/\\éß٣中\u2028\U0001f600") + [
    "the ", "This ", "License ", "Copyright ", "you ", "    ", "\t\t", "-- ", " * ", "// ",
]  # fmt: skip


def test_the_package_uses_the_c_tokenizer():
    assert code_language._line_tokens is codetok.line_tokens
    assert code_language._feature_line is codetok.feature_line


def test_known_lines():
    text = "int main() {\n\treturn a->b :: c?;\n  $x @end %h #if 3.5e+1\n}\n"
    assert codetok.line_tokens(text, 640, _STOPWORDS) == [
        "NL", "int", "main", "()", "{",
        "NL>", "return", "a", "->", "b", "::", "c?", ";",
        "NL>", "$x", "@end", "%h", "#if", "3.5e", "+", "1",
        "NL", "}",
    ]  # fmt: skip
    prose = "int x;\n   This is the file that you see here\n// Returns the value of x\n"
    assert codetok.line_tokens(prose, 640, _STOPWORDS) == [
        "NL",
        "int",
        "x",
        ";",
        "NL>",
        "PROSE",
        "NL",
        "//",
        "PROSE",
    ]


def test_max_tokens_cuts_the_list():
    text = "a b c\nd e f\n"
    assert codetok.line_tokens(text, 5, _STOPWORDS) == ["NL", "a", "b", "c", "NL"]
    assert codetok.line_tokens(text, 0, _STOPWORDS) == []


def test_random_text_matches_the_python_reference():
    rng = random.Random(7)
    for _ in range(5000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 120)))
        for max_tokens in (1, 4, 640):
            assert codetok.line_tokens(text, max_tokens, _STOPWORDS) == _line_tokens_py(
                text, max_tokens, _STOPWORDS
            ), repr(text)


def _real_sources(limit: int) -> list[str]:
    """Source files that are on every machine: the project's own, the standard library's, C headers."""
    project = Path(__file__).parents[2]
    paths = sorted(
        p for d in ("classifiers", "pipelines", "training", "infra") for p in (project / d).rglob("*.*")
    )
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths += sorted(stdlib.glob("*.py")) + sorted((stdlib / "email").rglob("*.py"))
    paths += sorted(Path(sysconfig.get_paths()["include"]).rglob("*.h"))
    texts = [p.read_text(errors="replace") for p in paths if p.suffix not in (".so", ".pyc", ".bin")]
    return random.Random(0).sample(texts, min(limit, len(texts)))


def test_real_and_generated_sources_match_the_python_reference():
    texts = _real_sources(600) + [t for _, _, t in corpus(20, seed=3)]
    assert len(texts) > 300
    for text in texts:
        window = content_window(text)
        for max_tokens in (7, 640):
            assert codetok.line_tokens(window, max_tokens, _STOPWORDS) == _line_tokens_py(
                window, max_tokens, _STOPWORDS
            )


def _c_and_python_features(token_lists: list[list[str]], vocabulary: frozenset[str]) -> tuple[list, list]:
    c_side, py_side = TokenFeatures(vocabulary), TokenFeatures(vocabulary)
    c = [codetok.feature_line(toks, vocabulary, c_side.memo, 10_000) for toks in token_lists]
    py = [py_side.line_py(toks) for toks in token_lists]
    assert c_side.memo == py_side.memo  # both memos learn the same token -> feature pairs
    return c, py


def test_features_match_the_python_reference():
    tokens = ["NL", "NL>", "NLS", "x", "_", "__init__", "get_x", "GET_X", "_Private", "X", "XY", "Xy", "xY", "A1",
              "$x", "$X_Y", "@end", "#include", "%h", "$", "#", "()", "->", "42", "3.5e", "é", "É", "éa", "Éa",
              "ǅa", "٣", "中", "$é", "x?", "\U0001f600", "_1", "a_", "_A_B_", "__", "ß", "ßA"]  # fmt: skip
    vocabulary = frozenset({"x", "return", "->", "42", "#include", "NLS"})
    c, py = _c_and_python_features([tokens, tokens[::-1]], vocabulary)
    assert c == py
    assert c[0].split() == [t if t in vocabulary and not t[0].isdigit() else token_shape(t) for t in tokens]
    rng = random.Random(11)
    fuzz = [
        ["".join(rng.choice(ALPHABET).strip() or "_" for _ in range(rng.randint(1, 4)))] for _ in range(3000)
    ]
    assert _c_and_python_features(fuzz, vocabulary)[0] == _c_and_python_features(fuzz, vocabulary)[1]
    real = [code_tokens(t) for t in _real_sources(200)]
    vocabulary = frozenset(t for toks in real[:100] for t in toks[::3])
    c, py = _c_and_python_features(real, vocabulary)
    assert c == py


def test_the_memo_is_bounded():
    memo: dict[str, str] = {}
    codetok.feature_line(["a", "b", "c"], frozenset(), memo, 2)
    assert memo == {"a": "~a", "b": "~a"}


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="stopwords"):
        codetok.line_tokens("x", 5, ["the"])
    with pytest.raises(TypeError):
        codetok.line_tokens(b"x", 5, _STOPWORDS)
    with pytest.raises(TypeError, match="tokens must be str"):
        codetok.feature_line(["x", 1], frozenset(), {}, 10)
    with pytest.raises(TypeError, match="vocabulary"):
        codetok.feature_line(["x"], ["x"], {}, 10)
