"""All task suites together: build the versioned train / held-out sets and filter prompts by difficulty."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from training.tasks.base import Split, Task, TaskSuite, Verdict
from training.tasks.code import CodeSuite
from training.tasks.knowledge import KnowledgeSuite
from training.tasks.math import MathSuite
from training.tasks.tools import ToolSuite

DOMAINS = ("math", "code", "tool", "knowledge")
# Knowledge has no test split: its held-out questions already name terms no train question names, and a third
# partition of the facts would take terms out of train (and change every checkpoint trained on it).
TEST_DOMAINS = ("math", "code", "tool")


def check_domain_counts(value: dict[str, int], field: str) -> dict[str, int]:
    """A per-domain count setting (`sft_data.domain_repeats`, `reasoning_rl.domain_weights`): keys are task
    domains and values at least 1, or a ValueError naming the field."""
    unknown = sorted(set(value) - set(DOMAINS))
    if unknown or any(n < 1 for n in value.values()):
        raise ValueError(
            f"{field} {value}: keys must be task domains {sorted(DOMAINS)} (unknown: {unknown}) and values at least 1"
        )
    return value


FROZEN_TEST = Path(__file__).with_name("frozen_test.json")
RL_POOL_SEED_OFFSET = 4_000_037  # the RL pool's own stream, beside train / held-out / test (tasks/base.py)


class TaskSuitesConfig(BaseModel):
    """Which tasks the post-training stages train and evaluate on (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, description="Seed of the train stream; the held-out stream uses its own seed")
    levels: dict[str, list[int]] = Field(
        default_factory=lambda: {
            "math": [1, 2, 3, 4],
            "code": [1, 2, 3, 4],
            "tool": [1, 2],
            "knowledge": [1, 2],
        },
        description="Difficulty levels generated per domain (math, code, tool, knowledge)",
    )
    train_per_level: int = Field(200, ge=1, description="Train tasks per domain and level")
    heldout_per_level: int = Field(50, ge=1, description="Held-out tasks per domain and level")
    test_per_level: int = Field(
        25,
        ge=0,
        description="Test tasks per domain and level (math, code, tool): scored once per model version, never "
        "used to choose anything; the tiny set's hash is frozen in training/tasks/frozen_test.json",
    )
    max_facts: int = Field(
        2000, ge=0, description="Dictionary / rescued-knowledge facts used for knowledge tasks"
    )
    knowledge_choices: int = Field(
        0,
        ge=0,
        description="Candidate terms listed in each knowledge question, the answer among them (0: an open "
        "question, knowledge-v1; 4: pick the defined term of four, knowledge-v2)",
    )
    knowledge_labels: bool = Field(
        False,
        description="With knowledge_choices: letter the listed terms and answer with the letter (knowledge-v3), "
        "so picking a term does not hinge on copying it token by token",
    )
    knowledge_glossary: bool = Field(
        False,
        description="Knowledge questions about facts the model reads in SFT as a glossary (knowledge-v4; "
        "sft_data.glossary_copies): held-out questions ask about read facts no question named; without it the "
        "facts are in no training text",
    )
    knowledge_recite: bool = Field(
        False,
        description="With knowledge_glossary: worked solutions recite the fact's glossary entry, then answer "
        "(knowledge-v5); only facts with definitions of at most 80 characters",
    )
    rl_pool_per_level: int = Field(
        1000,
        ge=0,
        description="Extra prompts per domain and level that only RL's difficulty filter draws from (never SFT "
        "rows, never a train, held-out or test prompt): with train's 200 alone, the kept prompts recur every few "
        "RL steps and the policy learns their answers, not the skill",
    )


def suites(
    facts: Sequence[tuple[str, str]] = (),
    knowledge_choices: int = 0,
    knowledge_labels: bool = False,
    knowledge_glossary: bool = False,
    knowledge_recite: bool = False,
) -> dict[str, TaskSuite]:
    """Every domain's suite; the knowledge options only shape generated questions and the glossary SFT reads
    (a task carries its choices, so any registry verifies and solves it)."""
    return {
        "math": MathSuite(),
        "code": CodeSuite(),
        "tool": ToolSuite(),
        "knowledge": KnowledgeSuite(
            facts, knowledge_choices, knowledge_labels, knowledge_glossary, knowledge_recite
        ),
    }


def knowledge_format_of(tasks: Sequence[Task]) -> tuple[int, bool, bool, bool]:
    """The (`knowledge_choices`, `knowledge_labels`, `knowledge_glossary`, `knowledge_recite`) the knowledge tasks
    among `tasks` were made with ((0, False, False, False): open questions), read from the tasks themselves, so
    a later stage generates more of the same kind (and the same glossary) without the task suites' config."""
    knowledge = [t for t in tasks if t.domain == "knowledge"]
    choices = max((len(t.meta.get("choices", ())) for t in knowledge), default=0)
    labels = any(t.meta.get("labels") for t in knowledge)
    glossary, recite = (any(t.meta.get(k) for t in knowledge) for k in ("glossary", "recite"))
    return choices, labels, glossary, recite


def _configured_suites(config: TaskSuitesConfig, facts: Sequence[tuple[str, str]]) -> dict[str, TaskSuite]:
    knowledge = (
        config.knowledge_choices, config.knowledge_labels, config.knowledge_glossary, config.knowledge_recite
    )  # fmt: skip
    return suites(facts[: config.max_facts], *knowledge)


def build_task_sets(
    config: TaskSuitesConfig, facts: Sequence[tuple[str, str]] = ()
) -> dict[Split, list[Task]]:
    """Train, held-out and test tasks of every configured domain and level; no train prompt is a held-out
    prompt, and no test prompt is a train or held-out one (train and held-out do not depend on the test set)."""
    unknown = sorted(set(config.levels) - set(DOMAINS))
    if unknown:
        raise ValueError(f"task_suites.levels: unknown domain(s) {unknown}; domains are {list(DOMAINS)}")
    registry = _configured_suites(config, facts)
    out: dict[Split, list[Task]] = {"train": [], "heldout": [], "test": []}
    for domain, levels in config.levels.items():
        for level in levels:
            for split, n in (("train", config.train_per_level), ("heldout", config.heldout_per_level)):
                out[split] += registry[domain].generate(split, n, config.seed, level)
    heldout_prompts = {t.prompt for t in out["heldout"]}
    out["train"] = [t for t in out["train"] if t.prompt not in heldout_prompts]
    seen = heldout_prompts | {t.prompt for t in out["train"]}
    for domain, levels in config.levels.items():
        for level in levels if domain in TEST_DOMAINS and config.test_per_level else []:
            # over-generate: small prompt spaces (one-digit sums) collide with train and held-out often
            fresh = registry[domain].generate("test", 8 * config.test_per_level, config.seed, level)
            out["test"] += [t for t in fresh if t.prompt not in seen][: config.test_per_level]
    return out


def build_rl_pool(
    config: TaskSuitesConfig, sets: dict[Split, list[Task]], facts: Sequence[tuple[str, str]] = ()
) -> list[Task]:
    """`rl_pool_per_level` train-kind tasks per domain and level from a seed stream of their own, sharing no
    prompt with `sets` (train, held-out, test) or each other; fewer where the prompt space runs out (one-digit
    sums are all train or held-out already)."""
    registry = _configured_suites(config, facts)
    seen = {t.prompt for tasks in sets.values() for t in tasks}
    out: list[Task] = []
    for domain, levels in config.levels.items():
        for level in levels if config.rl_pool_per_level else []:
            fresh = registry[domain].generate(
                "train", 2 * config.rl_pool_per_level, RL_POOL_SEED_OFFSET + config.seed, level
            )
            kept = 0
            for t in fresh:
                if kept < config.rl_pool_per_level and t.prompt not in seen:
                    seen.add(t.prompt)
                    out.append(t)
                    kept += 1
    return out


def suite_version(tasks: dict[str, list[Task]]) -> str:
    """Content hash of the train and held-out splits and the RL pool (what a checkpoint's lineage names); the
    test split has its own, `sha256_of_test_set`."""
    h = hashlib.sha256()
    for split in ("train", "heldout", "rl_pool"):
        for t in tasks.get(split, []):
            h.update(f"{split}\t{t.id}\t{t.answer}\n".encode())
    return h.hexdigest()[:16]


def sha256_of_test_set(tasks: Sequence[Task]) -> str:
    """Content hash of a test set: every task's id, reference answer and verifier data, in order."""
    h = hashlib.sha256()
    for t in tasks:
        h.update(json.dumps([t.id, t.answer, t.meta], sort_keys=True).encode() + b"\n")
    return h.hexdigest()


def frozen_test_sha256() -> str:
    """The committed hash of the tiny profile's test set (`TaskSuitesConfig()`'s)."""
    return json.loads(FROZEN_TEST.read_text())["sha256"]


def verify(task: Task, response: str, registry: dict[str, TaskSuite]) -> Verdict:
    return registry[task.domain].verify(task, response)


def difficulty_filter(tasks: list[Task], pass_rates: dict[str, float]) -> list[Task]:
    """Keep the prompts the current policy solves sometimes: pass rate over k samples strictly in (0, 1)."""
    return [t for t in tasks if 0.0 < pass_rates.get(t.id, 0.0) < 1.0]


def eval_subset(
    tasks: Sequence[Task], per_domain: int, for_domain: Mapping[str, int] | None = None
) -> list[Task]:
    """Up to `per_domain` tasks of each domain (`for_domain[domain]` where given), taken round-robin over its
    difficulty levels (file order within a level), so a capped eval covers every level instead of the first
    levels in file order."""
    levels: dict[str, dict[int, list[Task]]] = {}
    for t in tasks:
        levels.setdefault(t.domain, {}).setdefault(t.difficulty, []).append(t)
    out: list[Task] = []
    for domain in sorted(levels):
        queues = [list(reversed(q)) for _, q in sorted(levels[domain].items())]
        picked, cap = 0, (for_domain or {}).get(domain, per_domain)
        while picked < cap and any(queues):
            for q in queues:
                if q and picked < cap:
                    out.append(q.pop())
                    picked += 1
    return out


def write_tasks(tasks: list[Task], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(t.to_json(), sort_keys=True) + "\n" for t in tasks))
    return path


def read_tasks(path: Path) -> list[Task]:
    return [Task.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def write_facts(facts: Sequence[tuple[str, str]], path: Path) -> Path:
    """The (term, definition) facts the knowledge questions and the search documents are built from, one JSON
    pair per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps([term, definition]) + "\n" for term, definition in facts))
    return path


def read_facts(path: Path | str | None) -> list[tuple[str, str]]:
    """What `write_facts` wrote (no path: no facts); a line that is not a [term, definition] pair of strings
    is an error naming the file and line."""
    if not path:
        return []
    facts = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            pair = json.loads(line)
        except ValueError:
            pair = None
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ValueError(
                f"{path}:{n}: a fact must be a [term, definition] pair of strings, got {line[:80]!r}"
            )
        facts.append((pair[0], pair[1]))
    return facts
