"""The hybrid reward of General RL (docs/recipe.md, Stage 3): rule-based rewards, the task suites' verifiers,
the outcome reward model, the generative reward model and the exemplar style anchors, each in [0, 1],
combined per objective dimension with weights from config:

    dimension_d = Σ_c w_dc · s_c / Σ_c w_dc        over the components c that scored this answer
    total       = Σ_d W_d · dimension_d / Σ_d W_d  over the dimensions with at least one such component

A component that does not apply (no checkable constraint, no verifier for a chat prompt, no ORM configured,
the judge over budget) drops out of its dimension instead of counting as 0. Every component is returned
separately so the loop logs each."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from training.rewards.exemplars import ExemplarStyle
from training.rewards.general_prompts import category_of, constraints_of
from training.rewards.grm import GenerativeRewardModel
from training.rewards.orm import ORM
from training.rewards.rules import (
    LanguageId,
    RuleScore,
    constraint_reward,
    forbidden_reward,
    format_reward,
    language_reward,
    length_reward,
)
from training.tasks.base import Task, TaskSuite

COMPONENTS = (
    "format",
    "length",
    "language",
    "forbidden",
    "constraints",
    "verifier",
    "orm",
    "grm",
    "exemplar",
)
DIMENSIONS = ("correctness", "instruction_style", "task_quality")


class HybridRewardConfig(BaseModel):
    """Per-component weights per objective dimension (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    weights: dict[str, dict[str, float]] = Field(
        default_factory=lambda: {
            "correctness": {"verifier": 1.0, "orm": 0.5, "grm": 0.5},
            "instruction_style": {
                "constraints": 1.0,
                "format": 0.5,
                "length": 0.5,
                "language": 0.5,
                "forbidden": 0.5,
                "exemplar": 0.25,
            },  # fmt: skip
            "task_quality": {"grm": 1.0, "orm": 1.0},
        },
        description="dimension -> component -> weight (components: format, length, language, forbidden, "
        "constraints, verifier, orm, grm, exemplar)",
    )
    dimension_weights: dict[str, float] = Field(
        default_factory=lambda: {"correctness": 1.0, "instruction_style": 1.0, "task_quality": 1.0},
        description="dimension -> its weight in the total",
    )

    @model_validator(mode="after")
    def _known_names(self) -> HybridRewardConfig:
        for dim, comps in self.weights.items():
            if dim not in DIMENSIONS:
                raise ValueError(
                    f"hybrid reward weights: unknown dimension {dim!r}; dimensions are {DIMENSIONS}"
                )
            unknown = sorted(set(comps) - set(COMPONENTS))
            if unknown:
                raise ValueError(
                    f"hybrid reward weights.{dim}: unknown component(s) {unknown}; use {COMPONENTS}"
                )
            if any(w < 0 for w in comps.values()):
                raise ValueError(f"hybrid reward weights.{dim}: weights must be >= 0, got {comps}")
        unknown = sorted(set(self.dimension_weights) - set(DIMENSIONS))
        if unknown:
            raise ValueError(
                f"hybrid reward dimension_weights: unknown {unknown}; dimensions are {DIMENSIONS}"
            )
        return self

    def used_components(self) -> set[str]:
        return {c for comps in self.weights.values() for c, w in comps.items() if w > 0}


@dataclass
class RewardBreakdown:
    total: float
    components: dict[str, float] = field(default_factory=dict)
    dimensions: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)


class HybridReward:
    """Scores (prompt, response) batches. Models are optional: a component whose model is missing (no `lid`,
    `orm`, `grm`, `exemplars`, or no suite for a prompt's domain) does not score, and a weighted component
    without its model is an error at construction (a config asking for a reward it cannot compute)."""

    def __init__(
        self,
        config: HybridRewardConfig,
        lid: LanguageId | None = None,
        orm: ORM | None = None,
        grm: GenerativeRewardModel | None = None,
        exemplars: ExemplarStyle | None = None,
        suites: Mapping[str, TaskSuite] | None = None,
    ):
        self.config, self.lid, self.orm, self.grm, self.exemplars = config, lid, orm, grm, exemplars
        self.suites = dict(suites or {})
        models = {"language": lid, "orm": orm, "grm": grm, "exemplar": exemplars}
        missing = sorted(c for c, m in models.items() if m is None and c in config.used_components())
        if missing:
            raise ValueError(
                f"hybrid reward: weighted component(s) {missing} have no model; pass them to HybridReward or "
                "set their weights to 0"
            )

    def score(self, tasks: Sequence[Task], responses: Sequence[str]) -> list[RewardBreakdown]:
        used = self.config.used_components()
        rows: list[dict[str, RuleScore]] = [{} for _ in tasks]
        for row, task, response in zip(rows, tasks, responses, strict=True):
            constraints = constraints_of(task)
            row["format"] = format_reward(response)
            row["length"] = length_reward(response, constraints)
            row["forbidden"] = forbidden_reward(response)
            checked = constraint_reward(response, constraints)
            if checked is not None:
                row["constraints"] = checked
            if "language" in used:
                row["language"] = language_reward(response, constraints, self.lid)
            if "exemplar" in used:
                row["exemplar"] = self.exemplars.score(response, category_of(task))
            if task.domain in self.suites:
                verdict = self.suites[task.domain].verify(task, response)
                row["verifier"] = RuleScore(verdict.reward, verdict.reason)
        prompts = [t.prompt for t in tasks]
        if "orm" in used and tasks:
            for row, s in zip(rows, self.orm.score(prompts, list(responses)), strict=True):
                row["orm"] = RuleScore(s, "sigmoid(r)")
        if "grm" in used and tasks:
            for row, s in zip(rows, self.grm.score(prompts, list(responses)), strict=True):
                if s is not None:
                    row["grm"] = RuleScore(s, "judge score / max")
        return [self.combine(row) for row in rows]

    def combine(self, row: Mapping[str, RuleScore]) -> RewardBreakdown:
        dims: dict[str, float] = {}
        for dim, comps in self.config.weights.items():
            present = {c: w for c, w in comps.items() if c in row and w > 0}
            if present:
                dims[dim] = sum(w * row[c].score for c, w in present.items()) / sum(present.values())
        weights = {d: self.config.dimension_weights.get(d, 1.0) for d in dims}
        norm = sum(weights.values())
        total = sum(weights[d] * v for d, v in dims.items()) / norm if norm > 0 else 0.0
        return RewardBreakdown(
            total, {c: s.score for c, s in row.items()}, dims, {c: s.reason for c, s in row.items()}
        )
