"""Human-written exemplar responses as style anchors: a reward from how close an answer's style is to the
exemplars of its prompt's category (chat, instruction, writing), read as character n-gram TF-IDF cosine.

It rewards surface style (plain sentences, ordinary words, punctuation), not content: the exemplars answer
other prompts, so the score is the best cosine to any exemplar of the category."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.metrics.pairwise import cosine_similarity

from training.rewards.rules import RuleScore, answer_text

EXEMPLARS = Path(__file__).parent / "exemplars_v1.jsonl"


@dataclass(frozen=True)
class Exemplar:
    category: str
    prompt: str
    response: str


def load_exemplars(path: Path = EXEMPLARS) -> list[Exemplar]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [Exemplar(**json.loads(line)) for line in lines if line.strip()]


class ExemplarStyle:
    """Character 2-4-gram TF-IDF (within word boundaries) fitted on the exemplars; `score` is the best cosine
    between an answer and the exemplars of a category (all exemplars for an unknown category)."""

    def __init__(self, exemplars: list[Exemplar] | None = None):
        self.exemplars = exemplars if exemplars is not None else load_exemplars()
        if not self.exemplars:
            raise ValueError("exemplar style reward needs at least one exemplar")
        self.vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True)
        matrix = self.vectorizer.fit_transform([e.response for e in self.exemplars])
        rows: dict[str, list[int]] = defaultdict(list)
        for i, e in enumerate(self.exemplars):
            rows[e.category].append(i)
        self.by_category = {c: matrix[idx] for c, idx in rows.items()}
        self.all = matrix

    def score(self, response: str, category: str) -> RuleScore:
        text = answer_text(response)
        if not text:
            return RuleScore(0.0, "empty answer")
        anchors = self.by_category.get(category, self.all)
        sims = cosine_similarity(self.vectorizer.transform([text]), anchors)[0]
        best = int(sims.argmax())
        return RuleScore(float(sims[best]), f"cosine {sims[best]:.2f} to {category} exemplar {best}")
