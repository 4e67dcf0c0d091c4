"""SFT trajectories built from the task suites' worked solutions and the corpus: reasoning (math), code,
tool use (with failed calls kept but masked) and chat about the corpus's knowledge (term definitions)."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from training.sft import error_correction_trajectory, failed_tool_call_trajectory
from training.tasks.base import Task, TaskSuite
from training.tasks.code import FAMILIES
from training.tasks.knowledge import KnowledgeSuite
from training.tasks.math import column_steps
from training.tasks.suites import check_domain_counts

# Code families SFT sees only `rl_family_rows` (2) worked solutions of, so Reasoning RL has skills left to learn:
# compositions of skills the other families teach (// ; minus then plus ; square then plus ; count with a
# comparison ; three-term sums ; scale then add ; divisibility ; max with a constant). With no row at all the tiny
# model never solves most of them (sampled pass rate 0: no reward to learn from); with two each, RL took code on all
# 200 held-out tasks from 0.755 to 0.890 (docs/post_training_results.md, 2026-12-01 afternoon). With four rows of
# the first four only, SFT alone solved 0.97 and left RL no room.
RL_ONLY_FAMILIES = (
    "floor_div", "sub2_const", "square_const", "count_above", "add2_const", "scale_add", "divisible", "max_or_const",
)  # fmt: skip
GLOSSARY_PROMPT = "Recite a glossary entry."
DRILL_SEED_OFFSET = 3_000_017  # the math drill's own stream, beside train / held-out / test (tasks/base.py)


class SftDataConfig(BaseModel):
    """What the SFT set is made of (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    error_share: float = Field(
        0.15, ge=0, le=1, description="Share of math / tool trajectories that carry a masked error segment"
    )
    definition_chats: int = Field(300, ge=0, description="Chats asking what a corpus term means")
    repeats: int = Field(1, ge=1, description="Copies of each task's worked solution")
    domain_repeats: dict[str, int] = Field(
        default_factory=dict,
        description="Further copies of each worked solution per task domain (e.g. {tool: 3}), times `repeats`: "
        "the knowledge glossary took held-out tool from 1.00 to 0.45 on tiny (docs/post_training_results.md)",
    )
    knowledge_rows_per_level: int | None = Field(
        None,
        ge=0,
        description="Knowledge worked solutions SFT keeps per level (None: all): with knowledge-v4 a foothold, "
        "so RL's knowledge prompts are about read facts never asked, as held-out ones are",
    )
    glossary_copies: int = Field(
        3,
        ge=0,
        description="Copies of each glossary entry (two per knowledge fact) when the knowledge tasks are "
        "knowledge-v4 (task_suites.knowledge_glossary); a tiny model recalls a read fact after ~8 readings",
    )
    seed: int = Field(0, description="Seed of error injection and order")
    rl_only_families: list[str] = Field(
        default_factory=lambda: list(RL_ONLY_FAMILIES),
        description="Code families (training/tasks/code.py) SFT sees only `rl_family_rows` of, left to RL",
    )
    rl_family_rows: int = Field(
        2,
        ge=0,
        description="SFT rows kept per rl_only_families family: a foothold, so RL samples some reward",
    )
    math_column_steps: bool = Field(
        False,
        description="Math worked solutions of multi-digit sums, differences and products by one digit go one "
        "digit column at a time (training/tasks/math.py: column_steps) instead of the whole result at once",
    )
    # 0.5: SFT shows both ways and Reasoning RL learns which pays. The tiny model cannot do one-digit sums in
    # its reasoning (held-out math 0.07 after SFT) but copies numbers into the calculator well. On tiny, from
    # midtrain_stage3 (dev scores, 2026-12-02): 0.5 -> SFT math 0.18 (the greedy policy calls the calculator
    # on 31 of 200 held-out tasks), Reasoning RL 0.80 (calls it on all 200); 1.0 -> SFT 0.85, RL 0.88.
    math_calculator_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Share of math worked solutions that set the problem up as one calculator call "
        "(tool-integrated reasoning: training/tasks/math.py calculator_expression) instead of working the "
        "arithmetic in the reasoning",
    )
    math_drill_per_level: int = Field(
        0,
        ge=0,
        description="Extra math worked solutions per level the train tasks have, from a seed stream of their "
        "own (no held-out or test prompt, none already in train); Reasoning RL trains on the train tasks only",
    )
    knowledge_drill_per_level: int = Field(
        0,
        ge=0,
        description="Extra knowledge worked solutions per level, as math_drill_per_level: questions about more "
        "distinct train terms, so that SFT teaches picking a listed term (knowledge_choices) rather than "
        "a memorised answer per question",
    )

    copy_drill_rows: int = Field(
        0,
        ge=0,
        description="Chats that ask to repeat a quoted phrase of one to three words from the corpus's "
        "definitions: copying an unseen word token by token is what the search tasks need. Off: on tiny, 4,000 "
        "rows copied 14 of 40 fresh phrases (0 without) but held-out search rose only to 1 of 150; 20,000 "
        "crowded out the agentic rows",
    )

    @field_validator("domain_repeats")
    @classmethod
    def _known_domains(cls, value: dict[str, int]) -> dict[str, int]:
        return check_domain_counts(value, "domain_repeats")

    @field_validator("rl_only_families")
    @classmethod
    def _known_families(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(FAMILIES))
        if unknown:
            raise ValueError(f"unknown code famil(ies) {unknown}; the families are {sorted(FAMILIES)}")
        return value


def _wrong_step(task: Task, rng: random.Random) -> str:
    steps = task.meta.get("steps", "")
    if "=" in steps:
        lhs, _, rhs = steps.rpartition("=")
        try:
            return f"{lhs.strip()} = {int(rhs.strip()) + rng.choice([-2, -1, 1, 2])}."
        except ValueError:
            pass
    return "I am not sure."


def _code_family(task: Task) -> str | None:
    return task.meta.get("family") if task.domain == "code" else None


def _knowledge_level(task: Task) -> int | None:
    return task.difficulty if task.domain == "knowledge" else None


def _keep_first(tasks: Sequence[Task], group: Callable[[Task], object], keep: int | None) -> list[Task]:
    """`tasks` with at most `keep` of each group (the first ones, in order); tasks whose group is None, and all
    tasks when `keep` is None, are kept."""
    kept: Counter = Counter()
    out = []
    for t in tasks:
        g = group(t)
        if g is not None and keep is not None:
            if kept[g] >= keep:
                continue
            kept[g] += 1
        out.append(t)
    return out


def drill(
    tasks: Sequence[Task], suite: TaskSuite, per_level: int, seed: int, excluded: Collection[str]
) -> list[Task]:
    """`per_level` tasks of `suite`'s domain per level of `tasks`' levels in it, none of whose prompts is in
    `excluded` (the held-out and test prompts) or in `tasks`; a level with a small prompt space (one-digit
    sums, few facts) gives fewer."""
    seen = set(excluded) | {t.prompt for t in tasks}
    # a knowledge question's listed choices change with the seed: the same term would pass as a new prompt
    terms = {t.answer for t in tasks if t.domain == "knowledge"} if suite.domain == "knowledge" else set()
    out: list[Task] = []
    for level in sorted({t.difficulty for t in tasks if t.domain == suite.domain}):
        fresh = suite.generate("train", 4 * per_level, DRILL_SEED_OFFSET + seed, level)
        out += [t for t in fresh if t.prompt not in seen and t.answer not in terms][:per_level]
    return out


def build_sft_trajectories(
    tasks: Sequence[Task],
    suites: dict[str, TaskSuite],
    facts: Sequence[tuple[str, str]],
    cfg: SftDataConfig,
    excluded_prompts: Collection[str] = (),
) -> tuple[list[dict[str, Any]], Counter]:
    """Rows {"kind", "task_id", "messages"}; returns them shuffled and their counts per kind.
    `excluded_prompts` (held-out and test prompts) never become math drill rows."""
    rng = random.Random(cfg.seed)
    rows: list[dict[str, Any]] = []
    families = set(cfg.rl_only_families)
    tasks = _keep_first(
        tasks, lambda t: _code_family(t) if _code_family(t) in families else None, cfg.rl_family_rows
    )
    tasks = _keep_first(tasks, _knowledge_level, cfg.knowledge_rows_per_level)
    drilled: list[Task] = []
    for domain, per_level in (
        ("math", cfg.math_drill_per_level),
        ("knowledge", cfg.knowledge_drill_per_level),
    ):
        if per_level:  # a registry without the domain (agentic tasks only) needs no drill
            drilled += drill(tasks, suites[domain], per_level, cfg.seed, excluded_prompts)
    drill_ids = {t.id for t in drilled}
    tasks = [*tasks, *drilled]
    for _ in range(cfg.repeats):
        for task in (t for t in tasks for _ in range(cfg.domain_repeats.get(t.domain, 1))):
            solution = suites[task.domain].solution(task)
            if task.domain == "math" and cfg.math_column_steps and (steps := column_steps(task.prompt)):
                solution = [{**solution[0], "reasoning_content": steps}, *solution[1:]]
            kind = f"{task.domain}_drill" if task.id in drill_ids else task.domain
            # no draw when off, so the default rows stay those of earlier versions
            with_tool = task.domain == "math" and cfg.math_calculator_share > 0
            if (
                with_tool
                and rng.random() < cfg.math_calculator_share
                and (tool_solution := suites["math"].calculator_solution(task))
            ):
                if rng.random() < cfg.error_share:
                    messages, kind = (
                        failed_tool_call_trajectory(task.prompt, tool_solution),
                        "math_tool_failed",
                    )
                else:
                    messages, kind = [{"role": "user", "content": task.prompt}, *tool_solution], "math_tool"
            elif task.domain == "math" and rng.random() < cfg.error_share:
                messages, kind = (
                    error_correction_trajectory(task.prompt, solution, _wrong_step(task, rng), rng),
                    "math_corrected",
                )
            elif task.domain == "tool" and rng.random() < cfg.error_share:
                messages, kind = failed_tool_call_trajectory(task.prompt, solution), "tool_failed_call"
            else:
                messages = [{"role": "user", "content": task.prompt}, *solution]
            rows.append({"kind": kind, "task_id": task.id, "messages": messages})
    for term, definition in rng.sample(list(facts), min(cfg.definition_chats, len(facts))):
        first = definition.split(". ")[0].strip().rstrip(".")[:300]
        messages = [
            {"role": "user", "content": f"What does {term} mean?"},
            {"role": "assistant", "content": f"{term}: {first}."},
        ]
        rows.append({"kind": "chat_definition", "task_id": "", "messages": messages})
    rows += copy_drill(facts, cfg.copy_drill_rows, rng)
    rows += glossary_rows(suites.get("knowledge"), cfg.glossary_copies)
    rng.shuffle(rows)
    return rows, Counter(r["kind"] for r in rows)


def glossary_rows(knowledge: TaskSuite | None, copies: int) -> list[dict[str, Any]]:
    """The knowledge suite's glossary (empty unless knowledge-v4) as chats, `copies` times each entry."""
    entries = knowledge.glossary_entries() if isinstance(knowledge, KnowledgeSuite) else []
    return [
        {"kind": "glossary", "task_id": "", "messages": [
            {"role": "user", "content": GLOSSARY_PROMPT}, {"role": "assistant", "content": entry}]}
        for entry in entries for _ in range(copies)
    ]  # fmt: skip


def copy_drill(facts: Sequence[tuple[str, str]], n: int, rng: random.Random) -> list[dict[str, Any]]:
    """`n` chats: 'Repeat "<phrase>"' answered with the quoted phrase, its words drawn from the definitions."""
    if n == 0:  # the default: no pass over every definition
        return []
    words = sorted({w for _, d in facts for w in re.findall(r"[A-Za-z]{3,12}", d)})
    rows = []
    for _ in range(n if words else 0):
        phrase = " ".join(rng.choice(words) for _ in range(rng.randint(1, 3)))
        messages = [
            {"role": "user", "content": f'Repeat "{phrase}"'},
            {"role": "assistant", "content": f'"{phrase}"'},
        ]
        rows.append({"kind": "copy_drill", "task_id": "", "messages": messages})
    return rows


def write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
