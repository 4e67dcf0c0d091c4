"""Knowledge: questions built from the curated corpus (a term and its definition from the dictionary and
rescued-knowledge documents), checked by normalised exact match of the term.

With `choices` (knowledge-v2) the question also lists that many terms of its own split, the answer among them
in a seeded place: the policy has to tell which term the corpus defines that way, not spell a term it may never
have generated; the worked solution quotes the chosen term as it is quoted in the prompt (tools.py: a copied
word is then the same tokens in both). With `labels` as well (knowledge-v3) each listed term has a letter
(`A) "salad", B) ...`) and the answer is the letter: one token to copy, where a tiny policy copying a listed
multi-token term writes a blend of the terms ("saggageugh" for "baggage master").

With `glossary` (knowledge-v4) the suite's facts are also a glossary the model reads in SFT (every fact, train
and held-out, definition first and term first: `glossary_entries`), with dictionary markup removed from the
definitions. A held-out question then asks about a fact the model has read but was never asked about: the
report's premise that RL draws out knowledge from the corpus rather than adding it. In v1-v3 the facts are in
no training text, and a held-out question asks for a term the model never saw (0 on tiny in every format).
Questions and glossary use the same cleaned definition, so a clue is a prefix of what the model read.

With `recite` as well (knowledge-v5) the worked solution first recites the fact's glossary entry, definition
first ("<definition>: <term>."), then answers with the term it just wrote: the question becomes the entry the
model read, continued past the clue, instead of a jump from a question to a term it only ever read after the
definition. Only facts whose definition fits `RECITE_CHARS` are kept, so the recitation fits a turn."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from training.tasks.base import Split, Task, Verdict, extract_answer, normalise_text, split_seed, task_id

_SENSE = re.compile(r"^(?:(?:n|v|adj|adv)\s+)?\d+\s*:\s*|^(?:n|v|adj|adv)\s*:\s*")
_PRONUNCIATION = re.compile(r"/[^/\s][^/]{0,40}/|\\[^\\]{1,80}\\")


def clean_definition(definition: str) -> str:
    """The definition without dictionary markup: sense labels ("n 1:"), pronunciations (/.../, \\...\\)."""
    text = _SENSE.sub("", definition.strip())
    text = _PRONUNCIATION.sub(" ", text)
    return " ".join(text.split()).rstrip(".")


_WORD = re.compile(r"[A-Za-z]{2,}")
_MARKUP = re.compile(r"\[[a-z=.^~`*-]{1,3}\]|^\W")  # Webster's pronunciation letters ("[a^]"); a leading ","


def _readable(definition: str) -> bool:
    return len(_WORD.findall(definition)) >= 4 and not _MARKUP.search(definition)


class KnowledgeSuite:
    """`facts` are (term, definition) pairs; difficulty is how much of the definition the question shows
    (1: 160 characters, 4: 40); `choices` > 1 lists that many candidate terms (0: an open question)."""

    domain = "knowledge"
    CLUE_CHARS = {1: 160, 2: 120, 3: 80, 4: 40}

    LABELS = "ABCDEFGHIJ"
    RECITE_CHARS = 80  # an entry and its answer line in about 45 tokens, within a 48-token turn

    def __init__(
        self,
        facts: Sequence[tuple[str, str]],
        choices: int = 0,
        labels: bool = False,
        glossary: bool = False,
        recite: bool = False,
    ):
        if choices == 1 or choices < 0:
            raise ValueError(
                f"knowledge choices: {choices} (task_suites.knowledge_choices); use 0 (an open question) or 2 or more"
            )
        if labels and not 2 <= choices <= len(self.LABELS):
            raise ValueError(
                f"task_suites.knowledge_labels needs knowledge_choices between 2 and {len(self.LABELS)}, "
                f"not {choices}: letters label listed choices"
            )
        if glossary and choices:
            raise ValueError(
                "task_suites.knowledge_glossary asks open questions about facts the model read; set "
                f"knowledge_choices to 0 (it is {choices})"
            )
        if recite and not glossary:
            raise ValueError(
                "task_suites.knowledge_recite recites the glossary entry of a fact; set knowledge_glossary to true"
            )
        if glossary:
            # entries the markup cleaning leaves unreadable (", Adipsy ([a^]d"[i^]p*s[y^]), n") are left out
            facts = [(t, c) for t, d in facts if _readable(c := clean_definition(d))]
        if recite:
            facts = [(t, d) for t, d in facts if len(d) <= self.RECITE_CHARS]
        self.facts = sorted({(t.strip(), d.strip()) for t, d in facts if t.strip() and d.strip()})
        self.choices = choices
        self.labels = labels
        self.glossary = glossary
        self.recite = recite
        if recite:
            self.version = "knowledge-v5-recite"
        elif glossary:
            self.version = "knowledge-v4-glossary"
        elif labels:
            self.version = f"knowledge-v3-labelled{choices}"
        else:
            self.version = f"knowledge-v2-choices{choices}" if choices else "knowledge-v1"

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]:
        if not self.facts:
            return []
        rng = random.Random(split_seed(split, seed) * 7 + difficulty)
        # Split the facts themselves: a held-out question is about a term no train question names.
        heldout = {i for i in range(len(self.facts)) if (i * 2654435761) % 5 == 0}
        pool = [f for i, f in enumerate(self.facts) if (i in heldout) == (split == "heldout")]
        rng.shuffle(pool)
        terms = [term for term, _ in pool]
        if self.choices > len(terms):  # no silent open questions under a v2 version
            raise ValueError(
                f"task_suites.knowledge_choices: {self.choices} choices, but the {split} split has only "
                f"{len(terms)} facts; raise task_suites.max_facts or lower knowledge_choices"
            )
        tasks = []
        for term, definition in pool[:n]:
            chars = self.CLUE_CHARS.get(difficulty, 80)
            if self.glossary and len(definition) <= chars:  # the whole definition, as the glossary has it
                clue = definition
            else:
                clue = definition[:chars].rsplit(" ", 1)[0]
            prompt, meta = f"Which term is defined as: {clue}?", {"glossary": True} if self.glossary else {}
            if self.recite:
                meta["recite"] = definition
            if self.choices:
                listed = rng.sample([t for t in terms if t.lower() != term.lower()], self.choices - 1)
                listed.insert(rng.randrange(self.choices), term)
                if self.labels:
                    shown = ", ".join(f'{self.LABELS[i]}) "{t}"' for i, t in enumerate(listed))
                    prompt += f" Choose one of: {shown}. Answer with the letter."
                    meta = {"choices": listed, "labels": True}
                else:
                    prompt += " Choose one of: " + ", ".join(f'"{t}"' for t in listed) + "."
                    meta = {"choices": listed}
            tasks.append(
                Task(task_id(self.domain, prompt), self.domain, prompt, term, difficulty, split, meta)
            )
        return tasks

    def glossary_entries(self) -> list[str]:
        """What SFT reads of every fact (knowledge-v4): definition first, as a question's clue starts, and term
        first, as a dictionary lists it."""
        if not self.glossary:
            return []
        return [entry for t, d in self.facts for entry in (f"{d}: {t}.", f"{t}: {d}.")]

    def verify(self, task: Task, response: str) -> Verdict:
        answer = extract_answer(response)
        if answer is None:
            return Verdict(0.0, "no_answer")
        if task.meta.get("labels"):  # the right letter ("B", "B)", "(b)"), or the term itself
            letter = answer.strip().strip("()").strip().upper()
            if letter == self._label(task):
                return Verdict(1.0, "correct")
        ok = normalise_text(answer) == normalise_text(task.answer)
        return Verdict(1.0, "correct") if ok else Verdict(0.0, "wrong_answer")

    def solution(self, task: Task) -> list[dict]:
        if task.meta.get("recite"):
            entry = f"{task.meta['recite']}: {task.answer}."
            return [{"role": "assistant", "content": f"{entry}\nAnswer: {task.answer}"}]
        if task.meta.get("labels"):
            answer = self._label(task)
        else:
            answer = f'"{task.answer}"' if task.meta.get("choices") else task.answer
        return [{"role": "assistant", "content": f"Answer: {answer}"}]

    def _label(self, task: Task) -> str:
        return self.LABELS[task.meta["choices"].index(task.answer)]
