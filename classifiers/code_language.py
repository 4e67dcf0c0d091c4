"""Code language identification: a fastText classifier over file *content* (no file names), combined with
Linguist-style priors (file name / extension, shebang, modeline, heuristics for ambiguous extensions).

Content features: a code-aware tokenisation that keeps operators and punctuation (`::`, `->`, `:=`, `#include`,
`@end`, `$x`), marks line starts (`NL`) and leading indentation, and maps digits to `0`; fastText then adds
word n-grams over these tokens.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from classifiers.code_language_rules import (
    AMBIGUOUS,
    EXTENSIONS,
    FILENAMES,
    Prior,
    extension_of,
    language_from_shebang,
    language_prior,
    resolve_ambiguous,
)
from classifiers.fasttext_train import FastTextParams, predict_proba, train_fasttext

MAX_CHARS = 6000
MAX_TOKENS = 1200

_OPERATORS = sorted(
    [
        "::", "->", "=>", ":=", "<-", "<=", ">=", "==", "!=", "===", "!==", "&&", "||", "++", "--", "+=", "-=",
        "*=", "/=", "<<", ">>", "..", "...", "|>", "<|", "**", "//", "/*", "*/", "#!", "#[", "#{", "${", "@{",
        "%%", ";;", "(*", "*)", "{-", "-}", "<%", "%>", "<?", "?>", "</", "/>", "<<-", ":-", "?.", "??", "!!",
        "#'", ",@", "`(", "'(", "#(", "@@", "$(", "=~", "!~", "<=>", "-->", "<!--", "''", '"""', "'''", ":::",
    ],
    key=len,
    reverse=True,
)  # fmt: skip
_TOKEN = re.compile(
    r"[#@$%]?[A-Za-z_][A-Za-z0-9_]*[?!]?"  # identifiers, with sigils (#include, @end, $var, %hash) and ruby ?/!
    r"|\d[\d_.xXa-fA-F]*"  # numbers
    r"|" + "|".join(re.escape(op) for op in _OPERATORS) + r"|[^\sA-Za-z0-9_]"
)
_DIGITS = re.compile(r"\d+")


def code_tokens(text: str, max_tokens: int = MAX_TOKENS) -> list[str]:
    """Tokens of a file's head: `NL` + an indentation marker at each line start, then code tokens."""
    out: list[str] = []
    for line in text[:MAX_CHARS].split("\n"):
        stripped = line.lstrip()
        if not stripped:
            continue
        indent = line[: len(line) - len(stripped)]
        out.append(
            "NL" if not indent else ("NLtab" if indent.startswith("\t") else f"NLsp{min(len(indent), 8)}")
        )
        out.extend(_DIGITS.sub("0", tok) for tok in _TOKEN.findall(stripped))
        if len(out) >= max_tokens:
            break
    return out[:max_tokens]


def content_line(text: str) -> str:
    """The one-line fastText input for a file's content."""
    return " ".join(code_tokens(text))


def training_label(
    path: str, text: str, use_heuristics: bool = True, use_shebang: bool = True
) -> tuple[str | None, str]:
    """The label a file gets for training, and where it came from: its name or an unambiguous extension;
    optionally a strong heuristic marker for an ambiguous extension, or a shebang for an extension-less file."""
    name = Path(path).name.lower()
    if name in FILENAMES:
        return FILENAMES[name], "filename"
    ext = extension_of(path)
    if ext in EXTENSIONS:
        return EXTENSIONS[ext], "extension"
    if ext in AMBIGUOUS:
        return (resolve_ambiguous(ext, text), "heuristic") if use_heuristics else (None, "ambiguous")
    if use_shebang and not ext and (lang := language_from_shebang(text)):
        return lang, "shebang"
    return None, "none"


def train_code_language_model(examples: Sequence[tuple[str, str]], params: FastTextParams,
                              out_path: Path | None = None, quantize: bool = False):  # fmt: skip
    """Train the content classifier on (language, file text) pairs."""
    return train_fasttext([(lang, content_line(text)) for lang, text in examples], params, out_path, quantize)


@dataclass
class LanguageDecision:
    language: str | None
    declared: str | None
    prior: Prior
    content_language: str | None
    content_prob: float
    reason: str  # prior | ambiguous_resolved | content_override | content_only | unknown


class CodeLanguageClassifier:
    """A trained content model plus the rules that combine it with the priors."""

    def __init__(self, model, override_threshold: float = 0.98, min_confidence: float = 0.5):
        self.model = model
        self.override_threshold = override_threshold
        self.min_confidence = min_confidence

    @classmethod
    def load(cls, path: str | Path, **kwargs) -> CodeLanguageClassifier:
        import fasttext

        return cls(fasttext.load_model(str(path)), **kwargs)

    @property
    def languages(self) -> list[str]:
        return sorted(lab.removeprefix("__label__").replace("_", " ") for lab in self.model.get_labels())

    def predict_content(self, texts: Sequence[str], k: int = -1) -> list[dict[str, float]]:
        """Language -> probability from content alone."""
        return predict_proba(self.model, [content_line(t) for t in texts], k=k)

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
                return LanguageDecision(top, declared, prior, top, top_p, "content_override")
            return LanguageDecision(prior.language, declared, prior, top, top_p, "prior")
        if top is not None and top_p >= self.min_confidence:
            return LanguageDecision(top, declared, prior, top, top_p, "content_only")
        return LanguageDecision(None, declared, prior, top, top_p, "unknown")
