"""The agentic task families (terminal, codefix, search) together: their registry, the versioned train /
held-out sets and the config that says which levels, how many tasks and how much extra latency."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from training.agentic.codefix import CodefixSuite
from training.agentic.episodes import ExtraLatency
from training.agentic.protocol import AGENTIC_DOMAINS, check_family_sizes
from training.agentic.search import SearchSuite
from training.agentic.terminal import TerminalSuite
from training.tasks.base import Split, Task
from training.tasks.suites import read_tasks, suite_version, write_tasks


class AgenticTasksConfig(BaseModel):
    """Which agentic tasks the Agentic RL stage (and SFT's worked trajectories) use; defaults are `tiny`'s."""

    model_config = ConfigDict(extra="forbid")
    seed: int = Field(0, description="Seed of the train stream; the held-out stream uses its own seed")
    levels: dict[str, list[int]] = Field(
        default_factory=lambda: {"terminal": [1, 2, 3], "codefix": [1, 2, 3], "search": [1, 2, 3]},
        description="Difficulty levels (1..3) generated per family (terminal, codefix, search)",
    )
    train_per_level: int = Field(2000, ge=1, description="Train tasks per family and level")
    heldout_per_level: int = Field(50, ge=1, description="Held-out tasks per family and level")
    # Search: 150 held-out tasks gave SE 0.015-0.022 on gains of 0.02-0.05 that 595 fresh ones did not repeat
    # (docs/post_training_results.md, 2026-12-06 noon). Its held-out split is by answer term, so more held-out
    # tasks take none from train (terminal's and codefix's would: their train drops held-out prompts).
    heldout_for: dict[str, int] = Field(
        default_factory=lambda: {"search": 200},
        description="Per-family exceptions to heldout_per_level (a family whose gains are small needs more "
        "held-out tasks to resolve them)",
    )
    # With 100 rows per level the policy memorised what to copy instead of learning to copy. On tiny, held-out
    # success after Reasoning RL's distillation (dev scores): 100 -> 400 rows (SFT 1,600 -> 3,000 steps) codefix
    # 0.54 -> 0.78, terminal 0.25 -> 0.87, search 0 -> 0.05 (2026-12-02); 400 -> 1,000 rows, with 12,000 facts
    # and 2,000 train tasks so RL keeps fresh ones, search 0.03 -> 0.29, codefix 0.79 -> 0.82 (2026-12-04).
    sft_per_level: int = Field(
        1000, ge=0, description="Train tasks per family and level whose worked solution is an SFT trajectory"
    )
    # Off on tiny: {terminal: [3], codefix: [3]} gave Agentic RL a held-out rise in one chain of two and a weaker
    # final model in both (docs/post_training_results.md, 2026-12-04 late night).
    rl_only_levels: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Levels per family that SFT sees only `rl_level_rows` worked solutions of, left to Agentic "
        "RL to teach (as sft_data's rl_only_families are for Reasoning RL); a level not generated is ignored",
    )
    rl_level_rows: int = Field(
        16,
        ge=0,
        description="SFT worked solutions per rl_only_levels level: a foothold, so RL samples reward",
    )
    # 2,000 facts gave only 534 / 367 / 218 search tasks at levels 1 / 2 / 3 (fewer than SFT takes).
    max_facts: int = Field(
        12000, ge=0, description="Dictionary facts the search family's documents are built from"
    )
    latency: ExtraLatency = Field(
        default_factory=ExtraLatency,
        description="Extra seeded long-tail latency on every tool call and finish",
    )

    def sft_rows_field(self, family: str, level: int) -> str:
        """The setting that says how many of a family's level's train tasks go to SFT."""
        return "rl_level_rows" if level in self.rl_only_levels.get(family, ()) else "sft_per_level"

    def sft_rows(self, family: str, level: int) -> int:
        """How many of a family's level's train tasks go to SFT as worked solutions."""
        return getattr(self, self.sft_rows_field(family, level))


def agentic_suites(
    facts: Sequence[tuple[str, str]] = (), latency: ExtraLatency | None = None
) -> dict[str, TerminalSuite | CodefixSuite | SearchSuite]:
    """domain -> the family's suite, which is also its in-process `Environment` (protocol.py)."""
    return {
        "terminal": TerminalSuite(latency),
        "codefix": CodefixSuite(latency),
        "search": SearchSuite(facts, latency),
    }


def build_agentic_task_sets(
    config: AgenticTasksConfig, facts: Sequence[tuple[str, str]] = ()
) -> dict[Split, list[Task]]:
    """Train and held-out tasks of every configured family and level; no train prompt is a held-out prompt."""
    unknown = sorted(set(config.levels) - set(AGENTIC_DOMAINS))
    if unknown:
        raise ValueError(
            f"agentic_tasks.levels: unknown family {unknown}; families are {list(AGENTIC_DOMAINS)}"
        )
    bad = sorted({lvl for levels in config.levels.values() for lvl in levels} - {1, 2, 3})
    if bad:
        raise ValueError(
            f"agentic_tasks.levels: level(s) {bad} do not exist; every family has levels 1, 2, 3"
        )
    check_family_sizes(config.heldout_for, "agentic_tasks.heldout_for")
    for family, levels in sorted(config.rl_only_levels.items()):
        if family not in AGENTIC_DOMAINS or not set(levels) <= {1, 2, 3}:
            raise ValueError(
                f"agentic_tasks.rl_only_levels: {family}: {levels} is not a family's levels; families are "
                f"{list(AGENTIC_DOMAINS)}, each with levels 1, 2, 3"
            )
    registry = agentic_suites(facts[: config.max_facts], config.latency)
    out: dict[Split, list[Task]] = {"train": [], "heldout": []}
    for domain, levels in config.levels.items():
        for level in levels:
            held = config.heldout_for.get(domain, config.heldout_per_level)
            for split, n in (("train", config.train_per_level), ("heldout", held)):
                out[split] += registry[domain].generate(split, n, config.seed, level)
    heldout_prompts = {t.prompt for t in out["heldout"]}
    out["train"] = [t for t in out["train"] if t.prompt not in heldout_prompts]
    return out


def agentic_version(tasks: dict[Split, list[Task]]) -> str:
    """Content hash of both splits and of the families' versions (what an Agentic RL checkpoint names)."""
    families = ",".join(f"{d}={s.version}" for d, s in sorted(agentic_suites().items()))
    return hashlib.sha256(f"{suite_version(tasks)}\t{families}".encode()).hexdigest()[:16]


def write_agentic_tasks(
    tasks: dict[Split, list[Task]],
    out_dir: Path,
    facts: Sequence[tuple[str, str]] = (),
    sft_per_level: int | Callable[[str, int], int] = 0,
) -> str:
    """Under `out_dir`: train.jsonl, heldout.jsonl, sft.jsonl (the train tasks whose worked solutions go into
    SFT, `sft_tasks`), facts.json (the facts the search tasks were built from: a task service must load the
    same) and meta.json (version, counts per split / family / level). Returns the version."""
    out_dir = Path(out_dir)
    for split in ("train", "heldout"):
        write_tasks(tasks[split], out_dir / f"{split}.jsonl")
    write_tasks(sft_tasks(tasks["train"], sft_per_level), out_dir / "sft.jsonl")
    counts: dict[str, int] = {}
    for split, rows in tasks.items():
        for t in rows:
            key = f"{split}/{t.domain}/level{t.difficulty}"
            counts[key] = counts.get(key, 0) + 1
    version = agentic_version(tasks)
    (out_dir / "meta.json").write_text(json.dumps({"version": version, "counts": counts}, sort_keys=True))
    (out_dir / "facts.json").write_text(json.dumps([list(f) for f in facts]))
    return version


def sft_tasks(train: Sequence[Task], per_level: int | Callable[[str, int], int]) -> list[Task]:
    """The first `per_level` train tasks of each family and level (file order; a callable gives the count per
    family and level, `AgenticTasksConfig.sft_rows`): their worked solutions go into SFT, the rest of train is
    left for Agentic RL."""
    rows = per_level if callable(per_level) else (lambda family, level: per_level)
    taken: dict[tuple[str, int], int] = {}
    out = []
    for t in train:
        key = (t.domain, t.difficulty)
        if taken.get(key, 0) < rows(*key):
            taken[key] = taken.get(key, 0) + 1
            out.append(t)
    return out


def rl_task_shortfalls(counts: dict[str, int], config: AgenticTasksConfig) -> list[str]:
    """One message per family and level where SFT's share leaves Agentic RL fewer than half the fresh train tasks
    asked for (`counts` as meta.json's). Search makes fewer tasks than asked when its facts run short."""
    out = []
    for family, levels in sorted(config.levels.items()):
        for level in levels:
            taken = config.sft_rows(family, level)
            wanted = config.train_per_level - taken
            made = counts.get(f"train/{family}/level{level}", 0)
            field = config.sft_rows_field(family, level)
            fresh = max(made - taken, 0)
            if wanted > 0 and fresh < wanted / 2:
                out.append(
                    f"agentic_tasks: {family} level {level} has {made} train tasks and SFT takes "
                    f"{field}={taken}, which leaves Agentic RL {fresh} fresh tasks of the "
                    f"{wanted} asked for; raise max_facts (search) or train_per_level, or lower {field}"
                )
    return out


def read_agentic_tasks(out_dir: Path) -> dict[Split, list[Task]]:
    return {split: read_tasks(Path(out_dir) / f"{split}.jsonl") for split in ("train", "heldout")}


def read_agentic_sft_tasks(out_dir: Path) -> list[Task]:
    """The train tasks `write_agentic_tasks` picked for SFT."""
    return read_tasks(Path(out_dir) / "sft.jsonl")


def read_agentic_facts(out_dir: Path) -> list[tuple[str, str]]:
    return [(term, definition) for term, definition in json.loads((Path(out_dir) / "facts.json").read_text())]
