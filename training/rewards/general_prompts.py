"""General RL prompts: chat, instruction following (with constraints code can check) and writing, built from
the corpus's dictionary facts, plus verifiable task-suite prompts for the correctness dimension.

Each prompt is a `Task` (the rollout loop's record) whose `meta` holds its `category` (chat / instruction /
writing / the suite domain), its `Constraints` and, for fact prompts, the `reference` definition. Held-out
prompts use terms no train prompt uses (the facts are split once by a seeded shuffle)."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from training.rewards.rules import Constraints
from training.tasks.base import Split, Task, task_id
from training.tasks.suites import eval_subset

VERSION = "general_prompts_v1"
CATEGORIES = ("chat", "instruction", "writing")
_STOP = {
    "a",
    "an",
    "the",
    "of",
    "or",
    "and",
    "to",
    "in",
    "on",
    "for",
    "by",
    "with",
    "is",
    "that",
    "which",
    "as",
}


class GeneralPromptsConfig(BaseModel):
    """How many General RL prompts to build (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, description="Seed of the fact split and of the prompt templates")
    heldout_fraction: float = Field(0.2, gt=0, lt=1, description="Share of facts whose prompts are held out")
    per_category: int = Field(200, ge=1, description="Train prompts per category (held-out: the same share)")
    max_suite_tasks: int = Field(
        100, ge=0, description="Verifiable task-suite prompts (knowledge, math) added per split"
    )


def _keyword(definition: str, rng: random.Random) -> str | None:
    words = [w.lower() for w in re.findall(r"[A-Za-z]{4,}", definition) if w.lower() not in _STOP]
    return rng.choice(words) if words else None


def _chat(term: str, definition: str, rng: random.Random) -> tuple[str, Constraints]:
    template = rng.choice(
        ["What does the word '{t}' mean?", "What is '{t}'?", "Can you explain what '{t}' is?"]
    )
    return template.format(t=term), Constraints(length=(4, 40))


def _instruction(term: str, definition: str, rng: random.Random) -> tuple[str, Constraints]:
    kind = rng.choice(["max_words", "min_words", "keyword", "json"])
    kw = _keyword(definition, rng)
    if kind == "keyword" and kw:
        return f"What does '{term}' mean? Use the word '{kw}' in your answer.", Constraints(keywords=[kw])
    if kind == "json":
        return (
            f"Give the meaning of '{term}' as JSON with keys term and definition.",
            Constraints(json_keys=["term", "definition"], length=(3, 50)),
        )
    if kind == "min_words":
        n = rng.choice([10, 15, 20])
        return f"Explain '{term}' in at least {n} words.", Constraints(min_words=n, length=(n, 3 * n))
    n = rng.choice([5, 8, 12, 20])
    return f"Explain '{term}' in at most {n} words.", Constraints(max_words=n, length=(2, n))


def _writing(term: str, definition: str, rng: random.Random) -> tuple[str, Constraints]:
    template = rng.choice(
        [
            "Write two sentences about {t}.",
            "Write a short note to a friend about {t}.",
            "Write one sentence describing {t} to a child.",
        ]
    )
    return template.format(t=term), Constraints(length=(8, 60))


BUILDERS = {"chat": _chat, "instruction": _instruction, "writing": _writing}


SUITE_DOMAINS = ("knowledge", "math")


def general_prompts(
    facts: Sequence[tuple[str, str]], config: GeneralPromptsConfig, suite_tasks: Sequence[Task] = ()
) -> dict[Split, list[Task]]:
    """Train and held-out prompts of every category, plus up to `max_suite_tasks` suite tasks per split (they
    keep their split and domain, so their suite's verifier scores correctness)."""
    if not facts:
        raise ValueError(
            "general prompts need dictionary facts (pipelines/knowledge/facts.py dictionary_facts)"
        )
    rng = random.Random(config.seed)
    shuffled = sorted(facts)
    rng.shuffle(shuffled)
    n_held = max(1, round(len(shuffled) * config.heldout_fraction))
    pools: dict[Split, list[tuple[str, str]]] = {"heldout": shuffled[:n_held], "train": shuffled[n_held:]}
    if not pools["train"]:
        raise ValueError(
            f"{len(facts)} facts leave none for train with heldout_fraction={config.heldout_fraction}"
        )
    out: dict[Split, list[Task]] = {"train": [], "heldout": []}
    for split, pool in pools.items():
        n = (
            config.per_category
            if split == "train"
            else max(1, round(config.per_category * config.heldout_fraction))
        )
        for category in CATEGORIES:
            for i in range(n):
                term, definition = pool[i % len(pool)]
                prompt, constraints = BUILDERS[category](term, definition, rng)
                meta = {
                    "category": category,
                    "constraints": constraints.model_dump(),
                    "reference": definition,
                    "term": term,
                }
                out[split].append(
                    Task(task_id(category, prompt), category, prompt, definition, 1, split, meta)
                )
        candidates = [t for t in suite_tasks if t.split == split and t.domain in SUITE_DOMAINS]
        # every domain and difficulty level, not the first ones in file order (the suite file is math first)
        per_domain = -(-config.max_suite_tasks // len(SUITE_DOMAINS))
        for t in eval_subset(candidates, per_domain)[: config.max_suite_tasks]:
            meta = {**t.meta, "category": t.domain, "constraints": Constraints(length=(1, 60)).model_dump()}
            out[split].append(Task(t.id, t.domain, t.prompt, t.answer, t.difficulty, t.split, meta))
    for split in out:  # the same prompt twice (a fact drawn twice with one template) trains once
        out[split] = list({t.id: t for t in out[split]}.values())
    held = {t.prompt for t in out["heldout"]}
    out["train"] = [t for t in out["train"] if t.prompt not in held]
    return out


def constraints_of(task: Task) -> Constraints:
    return Constraints.model_validate(task.meta.get("constraints", {}))


def category_of(task: Task) -> str:
    return str(task.meta.get("category", task.domain))
