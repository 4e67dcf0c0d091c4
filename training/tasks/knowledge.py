"""Knowledge: questions built from the curated corpus (a term and its definition from the dictionary and
rescued-knowledge documents), checked by normalised exact match of the term."""

from __future__ import annotations

import random
from collections.abc import Sequence

from training.tasks.base import Split, Task, Verdict, extract_answer, normalise_text, split_seed, task_id


class KnowledgeSuite:
    """`facts` are (term, definition) pairs; difficulty is how much of the definition the question shows
    (1: 160 characters, 4: 40)."""

    domain = "knowledge"
    version = "knowledge-v1"
    CLUE_CHARS = {1: 160, 2: 120, 3: 80, 4: 40}

    def __init__(self, facts: Sequence[tuple[str, str]]):
        self.facts = sorted({(t.strip(), d.strip()) for t, d in facts if t.strip() and d.strip()})

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]:
        if not self.facts:
            return []
        rng = random.Random(split_seed(split, seed) * 7 + difficulty)
        # Split the facts themselves: a held-out question is about a term no train question names.
        heldout = {i for i in range(len(self.facts)) if (i * 2654435761) % 5 == 0}
        pool = [f for i, f in enumerate(self.facts) if (i in heldout) == (split == "heldout")]
        rng.shuffle(pool)
        tasks = []
        for term, definition in pool[:n]:
            clue = definition[: self.CLUE_CHARS.get(difficulty, 80)].rsplit(" ", 1)[0]
            prompt = f"Which term is defined as: {clue}?"
            tasks.append(Task(task_id(self.domain, prompt), self.domain, prompt, term, difficulty, split))
        return tasks

    def verify(self, task: Task, response: str) -> Verdict:
        answer = extract_answer(response)
        if answer is None:
            return Verdict(0.0, "no_answer")
        ok = normalise_text(answer) == normalise_text(task.answer)
        return Verdict(1.0, "correct") if ok else Verdict(0.0, "wrong_answer")

    def solution(self, task: Task) -> list[dict]:
        return [{"role": "assistant", "content": f"Answer: {task.answer}"}]
