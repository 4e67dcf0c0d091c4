"""Code language identification: a fastText classifier over file *content* (no file names), combined with
Linguist-style priors (file name / extension, shebang, modeline, heuristics for ambiguous extensions).

Content features: a code-aware tokenisation that keeps operators and punctuation (`::`, `->`, `:=`, `#include`,
`@end`, `$x`), marks line starts (`NL`) and indentation steps (deeper / same / shallower), and maps digits to `0`; leading comment blocks
(licences, banners) shrink to their comment markers and prose comment lines to `marker PROSE`; tokens seen in
few training packages become their case shape; fastText then adds word bigrams over these tokens. The reader
sees at most `MAX_CHARS` (head + middle window) and `MAX_TOKENS`: the model is trained under these values.
Content markers that fix a language outright (an HTML doctype, an XML declaration, a parsing JSON document,
literate Haskell, a root element HTML does not have) outrank the model's probabilities; a C prediction with
C++-only constructs becomes C++, a C++ one without any becomes C, a TypeScript one without TypeScript syntax
becomes JavaScript; a file opening with YAML front matter is what the rest of it is.
Where the token model is unsure, a second model over the raw words' characters (`char_view`) is mixed in at a
weight chosen on dev. Training and evaluation labels come from `code_language_labels.py`, a rule set of their own
that nothing here uses.
Speed: the per-line tokenizer and the token->feature map (memoised) run in C (`_codetok.c`, the same output as
their Python references, which tests check); an unquantized model predicts ~3x faster.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from classifiers.code_language_protocol import UNKNOWN, fit_marker_confidence
from classifiers.code_language_rules import (
    AMBIGUOUS,
    Prior,
    correct_content_prediction,
    extension_of,
    front_matter_body,
    lacks_markdown_syntax,
    language_from_content_marker,
    language_from_script_header,
    language_prior,
)
from classifiers.fasttext_train import FastTextParams, label_name, predict_proba, train_fasttext

# 4000 chars x 800 tokens vs 3200 x 640 on a seed-1 package split: 0.9569 vs 0.9564 accuracy, ~15% slower
MAX_CHARS = 3200
MAX_TOKENS = 640
# Above this, only corrections on a construct decisive for the other language apply (JavaScript with `import type`
# is TypeScript): on a dev split of package-held-out files, where the model was this sure, those fixed 24 files
# and broke 2, the rules on a missing construct ("C++" without C++ syntax is C) fixed 12 and broke 60
CORRECT_BELOW_PROB = 0.99

# The second view (`char_view`): the raw words of a file's head, which fastText reads as character 2- to 4-grams,
# so it sees what the token view normalises away (identifier spelling, operators glued to names, rare tokens as
# their shape). Weak alone, it is mixed in only where the token model is unsure (`char_below`, `char_weight`: both
# chosen on dev), which also keeps its cost to a share of the files.
CHAR_MAX_CHARS = 2000
CHAR_MODEL = "code_language_chars.bin"  # its file, next to the token model's
CHAR_PARAMS = FastTextParams(lr=0.5, epoch=30, dim=50, word_ngrams=1, minn=2, maxn=4, min_count=50,
                             bucket=2_000_000, threads=1)  # fmt: skip
_LOG_FLOOR = float(np.log(1e-12))  # a label the character view does not rank at all
_WHITESPACE_RUN = re.compile(r"[ \t]+")

# identifiers (with sigils: #include, @end, $var, %hash; ruby ?/!), numbers, and runs of up to three
# punctuation characters (`->`, `::`, `);`, `#[`); line starts and indentation are read per line
_TOKEN = re.compile(
    r"[#@$%]?[A-Za-z_]\w*[?!]?|\d[\w.]*|[^\w\s]{1,3}", re.ASCII
)  # ASCII classes: ~1.4x faster
# one leading comment block: C-style, ML, Haskell (not a `{-#` pragma), SGML, Lua's and CMake's bracket comments
# (`--[[ ]]`, `#[==[ ]==]`), Python docstring, or a line comment (`#` but not a shebang, a `#include`-like directive
# or a Rust `#[attribute]`)
_HEADER_BLOCK = re.compile(
    r"""\s*(/\*.*?\*/|\(\*.*?\*\)|\{-(?!#).*?-\}|<!--.*?-->|(?:--|\#)\[(?P<eq>=*)\[.*?\](?P=eq)\]|\"\"\".*?\"\"\""""
    r"""|(?:#(?![!a-z]|\[[A-Za-z_])|//|--|%|;)[^\n]*)""",
    re.S,
)
_PUNCT_RUN = re.compile(r"[^\w\s]{1,3}")
# English words that are no language's keyword: two of them make a marker-less line prose (licence blocks)
_STOPWORDS = frozenset(
    "the The a A an are to of this This that it It be with by you You we We can will your which has have "
    "should would may must was were any all see file software License license Copyright".split()
)
_MAX_MEMO = 500_000  # token -> feature memo entries (identifiers repeat across files; bounded for long runs)


def marker_of(text: str) -> tuple[str, str] | None:
    """The language a content marker (`content:<language>`) or the script's own header (`script:<language>`)
    decides, with that key; None when neither does."""
    if (lang := language_from_content_marker(text)) is not None:
        return f"content:{lang}", lang
    if (lang := language_from_script_header(text)) is not None:
        return f"script:{lang}", lang
    return None


def marker_probability(confidence: dict[str, float] | None, key: str) -> float:
    """A marker's probability: its own dev estimate, else its kind's (`content:*`), else all markers' (`*`)."""
    if not confidence:
        return 1.0
    return confidence.get(key, confidence.get(f"{key.split(':', 1)[0]}:*", confidence.get("*", 1.0)))


def fit_markers(texts: Sequence[str], labels: Sequence[str]) -> dict[str, float]:
    """The probability each marker decides with (`fit_marker_confidence`), from the files of a dev set it decides."""
    return fit_marker_confidence(
        [
            (hit[0], hit[1] == y)
            for t, y in zip(texts, labels, strict=True)
            if (hit := marker_of(t)) is not None
        ]
    )


def content_window(text: str, max_chars: int | None = None) -> str:
    """What the classifier reads: the whole file if short, else its head and a window from its middle, so a
    long licence header cannot hide the code."""
    max_chars = max_chars or MAX_CHARS
    if len(text) <= max_chars:
        return text
    head = max_chars * 3 // 8
    mid = text.find("\n", len(text) // 2 - (max_chars - head) // 2) + 1
    return text[:head] + "\n" + text[mid : mid + max_chars - head]


def split_header(text: str, max_blocks: int = 400) -> tuple[str, list[str]]:
    """A file without its leading comment blocks (licence, banner, module doc), and the comment markers those
    blocks opened with (`/*`, `#`, `--`, `%`, `;`, `(*`, ...): the markers say the language, the licence
    prose only fills the window the classifier reads. Shebangs, `#include`-style directives and `{-#`
    pragmas are code and end the header."""
    pos, markers = 0, []
    for _ in range(max_blocks):
        m = _HEADER_BLOCK.match(text, pos)
        if m is None or m.end() == pos:
            break
        marker = _PUNCT_RUN.match(m.group(1)).group()
        if m.group("eq") is not None:  # a bracket comment, whatever its level: `--[`, `#[`
            marker = marker[: marker.index("[") + 1]
        if not markers or markers[-1] != marker:
            markers.append(marker)
        pos = m.end()
    return (text[pos:], markers) if pos else (text, [])


def _raw_tokens(text: str, max_tokens: int | None = None, max_chars: int | None = None) -> list[str]:
    """The header's comment markers (each as `NL marker PROSE`), then the tokens of the window's lines."""
    max_tokens = max_tokens or MAX_TOKENS
    body, markers = split_header(text)
    out: list[str] = [t for m in markers for t in ("NL", m, "PROSE")]
    if len(out) >= max_tokens:
        return out[:max_tokens]
    return out + _line_tokens(content_window(body, max_chars), max_tokens - len(out), _STOPWORDS)


def char_view(text: str, max_chars: int = CHAR_MAX_CHARS) -> str:
    """The character view's one-line input: the header's comment markers, then the window's non-blank lines
    (whitespace runs as one space) joined by a `</l>` word."""
    body, markers = split_header(text)
    window = content_window(body, max_chars)
    lines = (_WHITESPACE_RUN.sub(" ", ln).strip() for ln in window.split("\n"))
    return " ".join([*markers, " </l> ".join(ln for ln in lines if ln)])


def _line_tokens_py(text: str, max_tokens: int, stopwords: frozenset[str]) -> list[str]:
    """Per line: a line-start marker (`NL` at column 0, else `NL>` / `NL=` / `NL<` for an indent deeper than,
    equal to or shallower than the previous non-blank line's) and its tokens; comment lines of prose
    (`-- This class holds ...`, ` * Returns the ...`) keep their marker and become `PROSE`: the words of
    comments say which project, not which language. Blank lines vanish; numbers are left as they are.
    The reference for the C version (`classifiers/_codetok.c`), which gives the same list ~4x faster (40 vs 150 us/file)."""
    out: list[str] = []
    prev = 0
    for raw in text.split("\n"):
        toks = _TOKEN.findall(raw)
        if not toks:
            continue
        # indentation as a step (deeper / same / shallower than the line before), not a depth: tabs vs
        # 2 vs 4 spaces is a project's style (tab-indented Scala read as Kotlin), nesting is the language's
        ind = len(raw) - len(raw.lstrip(" \t")) if raw[0] in " \t" else 0
        out.append("NL" if ind == 0 else "NL>" if ind > prev else "NL=" if ind == prev else "NL<")
        prev = ind
        c = toks[0][0]
        if len(toks) >= 4:
            if not (c.isalpha() or c == "_"):
                words = sum(1 for t in toks if t[0].isalpha())
                if words >= 3 and words >= 0.6 * (len(toks) - 1):  # 3: `"use strict";` is code
                    out.append(toks[0])
                    out.append("PROSE")
                    continue
            # the stopword test first: it is C-speed and rules out most code lines before counting words
            elif len(stopwords.intersection(toks)) >= 2 and sum(
                1 for t in toks if t[0].isalpha()
            ) >= 0.7 * len(toks):
                out.append("PROSE")  # a comment block's continuation line, e.g. a licence
                continue
        out += toks
        if len(out) >= max_tokens:
            break
    return out[:max_tokens]


try:  # built by `pip install -e .` (setup.py); without a compiler the Python versions serve
    from classifiers._codetok import feature_line as _feature_line
    from classifiers._codetok import line_tokens as _line_tokens
except ImportError:  # pragma: no cover - exercised only where the extension failed to build
    _line_tokens, _feature_line = _line_tokens_py, None


def code_tokens(text: str, max_tokens: int | None = None, max_chars: int | None = None) -> list[str]:
    """Tokens of a file's head: `NL*` (line start + indentation step) markers, identifiers, numbers as `0`,
    operators and punctuation; comment prose collapsed to `PROSE`."""
    return [("0" if t[0].isdigit() else t) for t in _raw_tokens(text, max_tokens, max_chars)]


def token_shape(tok: str) -> str:
    """What is left of a token outside the vocabulary: `0` for a number, else its sigil and case shape (`$Aa`,
    `a_a`, `AA`, `aA`)."""
    if not tok or tok[:2] == "NL":
        return tok
    if tok[0].isdigit():
        return "0"
    sigil, core = (tok[0], tok[1:]) if tok[0] in "#@$%" and len(tok) > 1 else ("", tok)
    if not (core[:1].isalpha() or core[:1] == "_"):
        return "P"  # a rare punctuation run
    if "_" in core.strip("_"):
        shape = "A_A" if core.isupper() else "a_a"
    elif core.isupper() and len(core) > 1:
        shape = "AA"
    elif core[0].isupper():
        shape = "Aa"
    elif any(ch.isupper() for ch in core):
        shape = "aA"
    else:
        shape = "a"
    return sigil + "~" + shape


class TokenFeatures:
    """Maps raw tokens to model features: a vocabulary token stays, others become their shape (numbers `0`).
    Memoised: identifiers repeat across files, and per-token Python work is what bounds files/s."""

    def __init__(self, vocabulary: set[str] | frozenset[str] | None):
        self.vocabulary = vocabulary
        self.memo: dict[str, str] = {}

    def feature(self, tok: str) -> str:
        if self.vocabulary is None:
            out = "0" if tok[0].isdigit() else tok
        else:
            out = tok if tok in self.vocabulary and not tok[0].isdigit() else token_shape(tok)
        if len(self.memo) < _MAX_MEMO:
            self.memo[tok] = out
        return out

    def line(self, text: str, max_tokens: int | None = None, max_chars: int | None = None) -> str:
        toks = _raw_tokens(text, max_tokens, max_chars)
        if _feature_line is not None and self.vocabulary is not None:
            return _feature_line(toks, self.vocabulary, self.memo, _MAX_MEMO)
        return self.line_py(toks)

    def line_py(self, toks: list[str]) -> str:
        """The features of `toks`, space-joined: the reference for `_codetok.feature_line`."""
        feats = list(map(self.memo.get, toks))  # C-speed lookups; only unseen tokens take the Python path
        if None in feats:
            feats = [f or self.feature(t) for f, t in zip(feats, toks, strict=True)]
        return " ".join(feats)


def content_line(text: str, vocabulary: set[str] | frozenset[str] | None = None) -> str:
    """The one-line fastText input for a file's content; tokens outside `vocabulary` become their shape."""
    return TokenFeatures(vocabulary).line(text)


def build_vocabulary(texts_by_group: dict[str, list[str]], min_groups: int) -> frozenset[str]:
    """Tokens used in at least `min_groups` packages: keywords, operators and common library names. Project-
    specific identifiers fall out, so the model learns the language, not the projects it was trained on."""
    seen: dict[str, int] = {}
    for texts in texts_by_group.values():
        for tok in {t for text in texts for t in code_tokens(text)} - {"0"}:
            seen[tok] = seen.get(tok, 0) + 1
    return frozenset(t for t, n in seen.items() if n >= min_groups)


def train_code_language_model(examples: Sequence[tuple[str, str]], params: FastTextParams,
                              out_path: Path | None = None, quantize: bool = False,
                              groups: Sequence[str] | None = None, min_groups: int = 0):  # fmt: skip
    """Train the content classifier on (language, file text) pairs. With `groups` (the package of each example)
    and `min_groups` > 0, tokens seen in fewer packages are replaced by their shape; the model's own word list
    then is the vocabulary, so inference needs nothing but the model file."""
    vocabulary = None
    if groups is not None and min_groups > 0:
        by_group: dict[str, list[str]] = {}
        for (_, text), g in zip(examples, groups, strict=True):
            by_group.setdefault(g, []).append(text)
        vocabulary = build_vocabulary(by_group, min_groups)
    features = TokenFeatures(vocabulary)
    lines = [(lang, features.line(text)) for lang, text in examples]
    return train_fasttext(lines, params, out_path, quantize)


def train_char_model(examples: Sequence[tuple[str, str]], params: FastTextParams = CHAR_PARAMS,
                     out_path: Path | None = None):  # fmt: skip
    """Train the character view (`char_view`) on (language, file text) pairs."""
    return train_fasttext([(lang, char_view(text)) for lang, text in examples], params, out_path)


def fit_char_mix(clf: CodeLanguageClassifier, texts: Sequence[str], labels: Sequence[str],
                 weights: Sequence[float] = (0.2, 0.3, 0.4), below: Sequence[float] = (0.9, 0.99, 0.999),
                 ) -> dict[str, float]:  # fmt: skip
    """The character view's weight and the token-model probability below which it is mixed in, chosen on a dev
    set (`texts`, `labels`) by accuracy of the whole classifier (markers and corrections included); ties go to
    the cheaper setting (lower `below`). Weight 0 (the view off) when no setting beats it."""

    def accuracy() -> float:
        probs = clf.predict_content(texts, k=1)
        hits = sum(bool(p) and max(p, key=p.get) == y for p, y in zip(probs, labels, strict=True))
        return hits / len(labels)

    saved = clf.char_weight, clf.char_below
    clf.char_weight = 0.0
    best = (accuracy(), 0.0, 0.0)
    for w in weights:
        for b in sorted(below):
            clf.char_weight, clf.char_below = w, b
            if (acc := accuracy()) > best[0]:
                best = (acc, w, b)
    clf.char_weight, clf.char_below = saved
    return {"char_weight": best[1], "char_below": best[2], "dev_accuracy": round(best[0], 4)}


@dataclass
class LanguageDecision:
    language: str | None
    declared: str | None
    prior: Prior
    content_language: str | None
    content_prob: float
    reason: str  # prior | ambiguous_resolved | content_override | content_only | not_code | unknown


class CodeLanguageClassifier:
    """A trained content model plus the rules that combine it with the priors."""

    def __init__(self, model, override_threshold: float = 0.98, min_confidence: float = 0.5,
                 override_unambiguous: bool = True, temperature: float = 1.0,
                 marker_confidence: dict[str, float] | None = None, char_model=None, char_weight: float = 0.0,
                 char_below: float = 0.0):  # fmt: skip
        self.model = model
        # the character view, mixed in (log-linear, `char_weight`) where the token model's raw top probability
        # is below `char_below`; both fit on dev (`fit_char_mix`)
        self.char_model = char_model
        self.char_weight = char_weight
        self.char_below = char_below
        # temperature scaling fit on a dev set (`code_language_protocol.fit_temperature`): 1.0 = the raw softmax
        self.temperature = temperature
        # how often each content marker / script header was right on dev (`fit_marker_confidence`); None = 1.0
        self.marker_confidence = marker_confidence
        self.override_threshold = override_threshold
        self.override_unambiguous = override_unambiguous
        self.min_confidence = min_confidence
        # the model's words are the training vocabulary (shape tokens included)
        self.vocabulary = frozenset(model.get_words())
        self.features = TokenFeatures(self.vocabulary)

    @classmethod
    def load(cls, path: str | Path, char_path: str | Path | None = None, **kwargs) -> CodeLanguageClassifier:
        import fasttext

        char_model = fasttext.load_model(str(char_path)) if char_path is not None else None
        clf = cls(fasttext.load_model(str(path)), char_model=char_model, **kwargs)
        clf.path, clf.char_path = Path(path), (Path(char_path) if char_path is not None else None)
        return clf

    @property
    def languages(self) -> list[str]:
        return sorted(lab.removeprefix("__label__").replace("_", " ") for lab in self.model.get_labels())

    path: Path | None = None
    char_path: Path | None = None

    def predict_content(self, texts: Sequence[str], k: int = -1, workers: int = 1) -> list[dict[str, float]]:
        """Language -> probability from content alone; `workers` > 1 splits the files over processes (each
        loads the model file once), for large batches on several cores. With a temperature other than 1 the
        model's full distribution is rescaled (`p_i^(1/T)`, renormalised) and then cut to the top `k`."""
        if workers > 1 and self.path is not None and len(texts) >= 200 * workers:
            from concurrent.futures import ProcessPoolExecutor

            size = -(-len(texts) // (workers * 4))
            chunks = [list(texts[i : i + size]) for i in range(0, len(texts), size)]
            char = (str(self.char_path) if self.char_path else None, self.char_weight, self.char_below)
            with ProcessPoolExecutor(
                workers,
                initializer=_load_worker_model,
                initargs=(str(self.path), self.temperature, self.marker_confidence, char),
            ) as pool:  # each worker applies the markers and corrections to its chunk
                return [p for part in pool.map(_predict_in_worker, chunks, [k] * len(chunks)) for p in part]
        # k >= 2 inside: Markdown without Markdown syntax falls to the runner-up
        probs, raw_top = self._probabilities(
            [self.features.line(t) for t in texts], -1 if k < 0 else max(k, 2), texts
        )
        # a content marker (`<!DOCTYPE html`) or the script's own header (`#!`, modeline) outranks the model, with
        # the probability it earned on dev (a PHP page can open with an HTML doctype)
        for i, text in enumerate(texts):
            if (hit := marker_of(text)) is not None:
                probs[i] = self._marker_probs(*hit, probs[i], k)
            elif probs[i]:
                top = max(probs[i], key=probs[i].get)
                if top == "YAML" and (body := front_matter_body(text)) is not None:
                    # Markdown's front matter is YAML: the rest of the file says what it is
                    body_probs, body_raw = self._probabilities([self.features.line(body)], k, [body])
                    body_top = max(body_probs[0], key=body_probs[0].get) if body_probs[0] else "YAML"
                    if body_top != "YAML":
                        probs[i], top, raw_top[i] = body_probs[0], body_top, body_raw[0]
                if top == "Markdown" and len(probs[i]) > 1 and lacks_markdown_syntax(text):
                    runner_up = sorted(probs[i], key=probs[i].get)[-2]
                    probs[i]["Markdown"], probs[i][runner_up] = probs[i][runner_up], probs[i]["Markdown"]
                    top = runner_up
                # how sure the model is, before calibration: CORRECT_BELOW_PROB was chosen on raw probabilities
                fixed = correct_content_prediction(text, top, sure=raw_top[i] >= CORRECT_BELOW_PROB)
                if fixed != top:  # the top language's score moves to the correction
                    probs[i][fixed], probs[i][top] = probs[i][top], probs[i].get(fixed, 0.0)
        if k > 0:
            probs = [dict(sorted(p.items(), key=lambda kv: -kv[1])[:k]) for p in probs]
        return probs

    def _marker_probs(self, key: str, lang: str, model: dict[str, float], k: int) -> dict[str, float]:
        """`lang` at its marker's dev probability; the rest shared out as the model's probabilities say."""
        p = marker_probability(self.marker_confidence, key)
        rest = {lab: q for lab, q in model.items() if lab != lang}
        total = sum(rest.values())
        if p >= 1.0 or total <= 0:
            return {lang: 1.0}
        out = {lang: p, **{lab: q * (1.0 - p) / total for lab, q in rest.items()}}
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[: k if k > 0 else None])

    def _probabilities(self, lines: list[str], k: int, texts: Sequence[str] | None = None,
                       ) -> tuple[list[dict[str, float]], list[float]]:  # fmt: skip
        """The top-`k` probabilities of each file and its token model's raw (unscaled) top probability. Where that
        is below `char_below`, the character view of `texts` is mixed in (`p1^(1-w) p2^w`); the temperature
        rescales the result over all labels (`p^(1/T)`, renormalised)."""
        mix = self.char_model is not None and self.char_weight > 0 and texts is not None
        if self.temperature == 1.0 and not mix:
            probs = predict_proba(self.model, lines, k=k)
            return probs, [max(p.values(), default=0.0) for p in probs]
        labels, raw = self.model.predict(lines, k=-1)
        raw = np.asarray(raw, dtype=np.float64)
        if raw.size == 0:
            return [{} for _ in lines], [0.0] * len(lines)
        logp = np.log(np.maximum(raw, 1e-12))
        unsure = [i for i in range(len(lines)) if raw[i, 0] < self.char_below] if mix else []
        if unsure:
            labels = [list(labs) for labs in labels]
            char_labels, char_raw = self.char_model.predict([char_view(texts[i]) for i in unsure], k=-1)
            w = self.char_weight
            for i, labs2, row2 in zip(unsure, char_labels, char_raw, strict=True):
                col = {lab: j for j, lab in enumerate(labs2)}
                other = np.log(np.maximum(np.asarray(row2, dtype=np.float64), 1e-12))
                logp[i] = (1 - w) * logp[i] + w * np.array([other[col[lab]] if lab in col else _LOG_FLOOR
                                                            for lab in labels[i]])  # fmt: skip
                order = np.argsort(-logp[i], kind="stable")
                logp[i], labels[i] = logp[i][order], [labels[i][j] for j in order]
        q = np.exp((logp - logp.max(axis=1, keepdims=True)) / self.temperature)
        q /= q.sum(axis=1, keepdims=True)  # each row sorted by probability: the top k lead
        n = q.shape[1] if k == -1 else k
        probs = [{label_name(lab): float(p) for lab, p in zip(labs[:n], row[:n], strict=True)}
                 for labs, row in zip(labels, q, strict=True)]  # fmt: skip
        return probs, raw[:, 0].tolist()

    def decide(self, path: str, text: str, declared: str | None, probs: dict[str, float]) -> LanguageDecision:
        """Combine priors and content probabilities into the final language of one file."""
        prior = language_prior(path, text)
        top, top_p = max(probs.items(), key=lambda kv: kv[1]) if probs else (None, 0.0)
        ext = extension_of(path)
        if ext in AMBIGUOUS and prior.source == "heuristic":
            candidates = AMBIGUOUS[ext]
            # a strong heuristic marker counts as half a probability; content decides among the candidates
            scores = {c: probs.get(c, 0.0) + (0.5 if c == prior.language else 0.0) for c in candidates}
            best = max(scores, key=scores.get)
            return LanguageDecision(best, declared, prior, top, top_p, "ambiguous_resolved")
        if prior.language is not None:
            if top is not None and top != prior.language and top_p >= self.override_threshold:
                if self.override_unambiguous and top != UNKNOWN:  # a named file stays code: flag it
                    return LanguageDecision(top, declared, prior, top, top_p, "content_override")
                return LanguageDecision(
                    prior.language, declared, prior, top, top_p, "prior_content_disagrees"
                )
            return LanguageDecision(prior.language, declared, prior, top, top_p, "prior")
        if top == UNKNOWN:  # content that is no language (logs, prose, data): nothing to label it with
            return LanguageDecision(None, declared, prior, top, top_p, "not_code")
        if top is not None and top_p >= self.min_confidence:
            return LanguageDecision(top, declared, prior, top, top_p, "content_only")
        return LanguageDecision(None, declared, prior, top, top_p, "unknown")


_WORKER_MODEL: list[CodeLanguageClassifier] = []  # one model per worker process, loaded by the initializer


def _load_worker_model(path: str, temperature: float = 1.0, marker_confidence: dict | None = None,
                       char: tuple[str | None, float, float] = (None, 0.0, 0.0)) -> None:  # fmt: skip
    char_path, char_weight, char_below = char
    _WORKER_MODEL[:] = [
        CodeLanguageClassifier.load(
            path,
            char_path,
            temperature=temperature,
            marker_confidence=marker_confidence,
            char_weight=char_weight,
            char_below=char_below,
        )  # fmt: skip
    ]


def _predict_in_worker(texts: list[str], k: int) -> list[dict[str, float]]:
    return _WORKER_MODEL[0].predict_content(texts, k=k)
