"""Multi-hop search over the project's own documents: one document per dictionary fact (term: definition, the
facts the knowledge suite uses), a BM25 index over the definitions, and a `search` tool returning the top two
documents. Questions link two documents: document A's definition names term B.

Level 1: one hop: 'which term is defined with "<clue>"' (two words of B's definition that together find B;
         search the clue, answer B).
Level 2: two hops: 'which term's entry names the term defined with "<clue>"' (search the clue -> B, search
         B -> A, answer A). Document A names B in its "See B." reference or in its definition.
Level 3: two hops from a clue of three words.
Answer terms are at most 14 characters (a tiny policy copies them from an observation).
Everything the policy copies is quoted where it is read and where it is written (the clue in the prompt, the
terms in the results, the answer): after a quote a word has no leading space, so both places tokenize it alike.
Unquoted, "with: will old" gives the token " will" and the query "will old" gives "w" "ill", and a tiny policy
does not learn that mapping (0 of 150 held-out search tasks at search-v1).
Only questions the worked solution answers with this index are kept (the top hit of each hop is right)."""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from training.agentic.episodes import Delay, ExtraLatency, clip, parse_tool_call, replay_verify, similarity
from training.agentic.protocol import EnvironmentCrash
from training.tasks.base import (
    Split,
    Task,
    Verdict,
    extract_answer,
    normalise_text,
    split_seed,
    task_id,
)
from training.tasks.knowledge import clean_definition

TOOLS = {"search": ("query",)}
STOPWORDS = frozenset(
    "a an the of to in on for and or is are be by as at with from that this which it its".split()
)
MAX_QUERY_CHARS, TOP_K, SNIPPET_CHARS, CLUE_CHARS = 80, 2, 40, 40
CLUE_WORDS = {1: 2, 2: 2, 3: 3}  # level -> fewest words in the clue
MIN_CLUE_DF = 10  # clue words appear in at least this many documents (seen in many other questions' clues)
MAX_TERM_CHARS = 14  # answers are copied from an observation by a tiny policy: short terms only
_WORD = re.compile(r"[a-z0-9]+")
_CLUE_WORD = re.compile(r"[A-Za-z]+(?:-[A-Za-z]+)*")


def terms_of(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


class BM25Index:
    """Okapi BM25 (k1=1.2, b=0.75) over documents' text; `search` returns document indices, best first (ties
    by index)."""

    def __init__(self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        docs = [Counter(terms_of(t)) for t in texts]
        self.lengths = [sum(d.values()) for d in docs]
        self.avg_length = sum(self.lengths) / max(len(docs), 1)
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for i, doc in enumerate(docs):
            for term, tf in doc.items():
                self.postings.setdefault(term, []).append((i, tf))
        n = len(docs)
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()}

    def search(self, query: str, k: int = TOP_K) -> list[int]:
        scores: dict[int, float] = {}
        for w in sorted(set(terms_of(query))):  # a fixed order: the same float sums in every process
            for i, tf in self.postings.get(w, ()):
                norm = tf + self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg_length)
                scores[i] = scores.get(i, 0.0) + self.idf[w] * tf * (self.k1 + 1) / norm
        return [i for i, _ in sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]]


def documents(facts: Sequence[tuple[str, str]], seed: int = 0) -> list[tuple[str, str]]:
    """(term, text) per fact: its cleaned definition and a "See <term>." reference to one other fact, along
    one seeded cycle over all facts, so every term is referred to by exactly one other document."""
    order = list(range(len(facts)))
    random.Random(seed).shuffle(order)
    see = {order[i]: order[(i + 1) % len(order)] for i in range(len(order))} if len(order) > 1 else {}
    out = []
    for i, (term, definition) in enumerate(facts):
        text = clean_definition(definition)
        out.append((term, f"{text}. See {facts[see[i]][0]}." if i in see else f"{text}."))
    return out


def _clue(text: str, index: BM25Index, n_words: int) -> str:
    """The `n_words` rarest words of a document's definition among the corpus's common words (3 to 10
    letters, in at least MIN_CLUE_DF documents), in the order they appear: a query made of words the policy
    has seen in other questions, so a held-out question asks it to copy, not to spell an unseen word."""
    words = []
    for w in _CLUE_WORD.findall(text.split(". See ")[0]):
        common = len(index.postings.get(w.lower(), ())) >= MIN_CLUE_DF
        if (
            3 <= len(w) <= 10
            and common
            and w.lower() not in STOPWORDS
            and w.lower() not in {x.lower() for x in words}
        ):
            words.append(w)
    rarest = set(sorted(words, key=lambda w: (-index.idf[w.lower()], w.lower()))[:n_words])
    return " ".join(w for w in words if w in rarest)


class SearchEpisode:
    def __init__(self, suite: SearchSuite, task: Task, latency: ExtraLatency):
        self.suite, self.task, self.delay, self.closed = suite, task, Delay(latency, task.id), False
        self.found: set[str] = set()  # the terms of every result returned, normalised

    def tool(self, payload: str) -> str:
        if self.closed:
            raise EnvironmentCrash("search: episode already closed")
        self.delay.wait()
        parsed = parse_tool_call(payload, TOOLS)
        if isinstance(parsed, str):
            return parsed
        query = parsed[1].get("query", "").strip()
        if not query or len(query) > MAX_QUERY_CHARS:
            return f"error: query must be 1 to {MAX_QUERY_CHARS} characters"
        hits = self.suite.index.search(query)
        self.found |= {normalise_text(self.suite.docs[i][0]) for i in hits}
        return self.suite.results_text(hits)

    def finish(self, response: str) -> Verdict:
        if self.closed:
            raise EnvironmentCrash("search: episode already closed")
        self.delay.wait()
        accepted = {normalise_text(a) for a in self.task.meta.get("accepted") or [self.task.answer]}
        found = float(bool(self.found & accepted))
        answer = extract_answer(response)
        if answer is None:
            return Verdict(0.0, "no_answer", found=found)
        got = normalise_text(answer)
        if got in accepted:
            return Verdict(1.0, "correct", found=found)
        # a search that returned the answer and a different term written is a copying failure, not a search one
        kind = "wrong_answer_found" if found else "wrong_answer"
        return Verdict(0.0, kind, partial=max(similarity(got, a) for a in accepted), found=found)

    def close(self) -> None:
        self.closed = True


class SearchSuite:
    """Task suite and in-process environment of multi-hop search; `facts` are (term, definition) pairs."""

    domain = "search"
    version = "search-v2"

    def __init__(self, facts: Sequence[tuple[str, str]], latency: ExtraLatency | None = None):
        facts = sorted({(t.strip(), d.strip()) for t, d in facts if t.strip() and d.strip()})
        self.docs = documents(facts)
        self.index = BM25Index([text for _, text in self.docs])
        self.latency = latency or ExtraLatency()
        self._links: dict[int, list[int]] | None = None

    def search_text(self, query: str) -> str:
        return self.results_text(self.index.search(query))

    def results_text(self, hits: Sequence[int]) -> str:
        if not hits:
            return "no results"
        return clip("\n".join(clip(f'"{self.docs[i][0]}": {self.docs[i][1]}', SNIPPET_CHARS) for i in hits))

    def top_term(self, query: str) -> str | None:
        hits = self.index.search(query, 1)
        return self.docs[hits[0]][0] if hits else None

    def links(self) -> dict[int, list[int]]:
        """{b: [a, ...]}: the documents whose text names document b's term (its "See" reference and any
        definition that uses the term)."""
        if self._links is None:
            words = [" ".join(_WORD.findall(d.lower())) for _, d in self.docs]
            docs_by_word: dict[str, set[int]] = {}
            for i, text in enumerate(words):
                for w in text.split():
                    docs_by_word.setdefault(w, set()).add(i)
            self._links = {}
            for b, (term, _) in enumerate(self.docs):
                phrase = _WORD.findall(term.lower())
                users = set.intersection(*(docs_by_word.get(w, set()) for w in phrase)) if phrase else set()
                users = [a for a in sorted(users - {b}) if f" {' '.join(phrase)} " in f" {words[a]} "]
                if users:
                    self._links[b] = users
        return self._links

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]:
        if difficulty not in (1, 2, 3):
            raise ValueError(f"search: difficulty {difficulty} is not one of 1, 2, 3")
        rng = random.Random(split_seed(split, seed) * 41 + difficulty)
        if difficulty == 1:
            candidates = [(None, b) for b in range(len(self.docs))]
        else:
            candidates = [(a, b) for b, users in self.links().items() for a in users]
        rng.shuffle(candidates)
        tasks: dict[str, Task] = {}
        for a, b in candidates:
            if len(tasks) >= n:
                break
            answer = self.docs[b if a is None else a][0]
            if max(len(answer), len(self.docs[b][0])) > MAX_TERM_CHARS:
                continue
            # split by the answer term: a held-out question never has a train question's answer
            if (_stable_hash(answer.lower()) % 5 == 0) != (split == "heldout"):
                continue
            task = self._make(a, b, difficulty, split)
            if task is not None:
                tasks.setdefault(task.id, task)
        return list(tasks.values())

    def _shortest_clue(self, term: str, text: str, n_words: int) -> str | None:
        """The rarest-words clue of at least `n_words` words (more when a small corpus needs them, up to
        CLUE_CHARS) whose top search hit is `term`; None if there is none."""
        for n in range(n_words, n_words + 4):
            clue = _clue(text, self.index, n)
            if len(clue.split()) < n or len(clue) > CLUE_CHARS:
                return None
            if self.top_term(clue) == term:
                return clue
        return None

    def _make(self, a: int | None, b: int, level: int, split: Split) -> Task | None:
        term_b, definition_b = self.docs[b]
        clue = self._shortest_clue(term_b, definition_b, CLUE_WORDS[level])
        if clue is None:
            return None
        steps = [(clue, self.search_text(clue))]
        if a is None:
            prompt, answer = f'Search: which term is defined with "{clue}"?', term_b
        else:
            answer = self.docs[a][0]
            if self.top_term(term_b) != answer:
                return None
            steps.append((term_b, self.search_text(term_b)))
            prompt = f'Search: which term\'s entry names the term defined with "{clue}"?'
        accepted = [answer] if a is None else [self.docs[u][0] for u in self.links()[b]]
        meta = {
            "steps": steps,
            "linked": [self.docs[i][0] for i in (a, b) if i is not None],
            "accepted": accepted,
        }
        return Task(task_id(self.domain, prompt), self.domain, prompt, answer, level, split, meta)

    def open(self, task: Task) -> SearchEpisode:
        return SearchEpisode(self, task, self.latency)

    def verify(self, task: Task, response: str) -> Verdict:
        return replay_verify(self, task, response)

    def solution(self, task: Task) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for query, result in task.meta["steps"]:
            call = {"name": "search", "arguments": {"query": query}}
            messages += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": result},
            ]
        return [*messages, {"role": "assistant", "content": f'Answer: "{task.answer}"'}]


def written_strings(task: Task) -> set[str]:
    """What the worked solution of a search task writes: its queries and its answer (normalised)."""
    return {normalise_text(q) for q, _ in task.meta["steps"]} | {normalise_text(task.answer)}


def unwritten_tasks(tasks: Sequence[Task], sft_tasks: Sequence[Task]) -> list[Task]:
    """The search tasks none of whose queries or answer an SFT worked solution wrote (other families pass):
    a held-out answer is never written in SFT, so these ask RL to copy a term, as held-out tasks do."""
    written = set().union(*(written_strings(t) for t in sft_tasks if t.domain == SearchSuite.domain))
    return [t for t in tasks if t.domain != SearchSuite.domain or not written_strings(t) & written]


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
