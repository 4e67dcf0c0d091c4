"""General RL (docs/recipe.md, Stage 3): the Reasoning RL machinery (rollout engine, GRPO group advantages,
Eq. 1 with IcePop, no KL) with the hybrid reward in place of a verifier. One step = push weights to the rollout
engine, sample a group per prompt, score every response with `HybridReward` (each component logged), normalise
per group, one update. The step loop, checkpoints and resume are `training.rl.loop`'s.

Held-out evaluation: one greedy answer per held-out prompt, the mean of every reward component, dimension and
the total with its standard error over prompts."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import ConfigDict, Field
from torch import nn

from training.rewards.general_prompts import category_of
from training.rewards.hybrid import HybridReward, RewardBreakdown
from training.rl.loop import GRPOOut, OnPolicyLoop, StepTimes, grpo_loss, grpo_metrics
from training.rl.reasoning import mixed_batches
from training.rl.settings import PolicyUpdateConfig
from training.rollout.engine import LocalRolloutEngine, RolloutEngine, SamplingParams
from training.rollout.multiturn import rollout
from training.rollout.trajectory import Trajectory
from training.tasks.base import Task, Verdict

log = logging.getLogger(__name__)
Log = Callable[[dict[str, float], int], None]


class GeneralRLConfig(PolicyUpdateConfig):
    """General RL loop settings (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(40, ge=1, description="Optimizer steps (each on a fresh on-policy batch)")
    prompts_per_step: int = Field(8, ge=1, description="Prompts per batch, spread over the categories")
    group_size: int = Field(8, ge=2, description="Samples per prompt (G in Eq. 1)")
    max_new_tokens: int = Field(48, ge=1, description="Tokens generated per answer (one turn, no tools)")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the rollouts")
    eval_every: int = Field(20, ge=1, description="Held-out reward evaluation every N steps (and at the end)")
    eval_prompts: int = Field(60, ge=1, description="Held-out prompts scored per evaluation")
    seed: int = Field(0, description="Seed of prompt order and sampling")


def _unscored(task: Task, text: str) -> Verdict:
    return Verdict(0.0, "scored by the hybrid reward")  # the batch is scored at once (ORM / judge batches)


def sample_and_score(
    engine: RolloutEngine, tokenizer: Any, tasks: Sequence[Task], group_size: int, params: SamplingParams,
    reward: HybridReward, prefix: str,
) -> tuple[list[Trajectory], list[RewardBreakdown]]:  # fmt: skip
    """`group_size` one-turn answers per task, each scored by the hybrid reward (total on `traj.reward`, the
    components on `traj.reward_components`). The format rule sees the end-of-turn marker, or its absence
    on a truncated answer."""
    trajs = rollout(engine, tokenizer, tasks, group_size, params, _unscored, None, 1, prefix)
    by_id = {t.id: t for t in tasks}
    texts = [tokenizer.decode(t.response_ids) for t in trajs]
    scored = reward.score([by_id[t.prompt_id] for t in trajs], texts)
    for traj, s in zip(trajs, scored, strict=True):
        traj.reward = s.total
        traj.reward_components = {**s.components, **{f"dim/{d}": v for d, v in s.dimensions.items()}}
        traj.reason = "; ".join(f"{c}: {r}" for c, r in s.reasons.items())
    return trajs, scored


def reward_values(trajs: Sequence[Trajectory], tasks: Sequence[Task]) -> Iterator[tuple[str, str, float]]:
    """(key, prompt id, value) of every response: its total, its category's total, each component."""
    by_id = {t.id: t for t in tasks}
    for t in trajs:
        yield "total", t.prompt_id, t.reward
        yield f"category/{category_of(by_id[t.prompt_id])}", t.prompt_id, t.reward
        for c, v in t.reward_components.items():
            yield c, t.prompt_id, v


def reward_means(trajs: Sequence[Trajectory], tasks: Sequence[Task], with_se: bool) -> dict[str, float]:
    """Mean total (`reward/total`), per component and dimension, and per category; with standard errors over
    responses when `with_se` (`..._se`)."""
    values: dict[str, list[float]] = defaultdict(list)
    for key, _, v in reward_values(trajs, tasks):
        values[key].append(v)
    out = {}
    for key, v in sorted(values.items()):
        mean = sum(v) / len(v)
        out[f"reward/{key}"] = mean
        if with_se:
            var = sum((x - mean) ** 2 for x in v) / max(1, len(v) - 1)
            out[f"reward_se/{key}"] = math.sqrt(var / len(v))
            out[f"n/{key}"] = float(len(v))
    return out


def evaluate_general(
    engine: RolloutEngine, tokenizer: Any, tasks: Sequence[Task], reward: HybridReward, max_new_tokens: int
) -> dict[str, float]:
    """Greedy answers to `tasks`, scored: every component's mean with its standard error over prompts."""
    trajs, _ = sample_and_score(
        engine,
        tokenizer,
        tasks,
        1,
        SamplingParams(max_new_tokens=max_new_tokens, temperature=0),
        reward,
        "eval-",
    )
    return reward_means(trajs, tasks, with_se=True)


def heldout_subset(tasks: Sequence[Task], n: int) -> list[Task]:
    """Up to `n` prompts taken round-robin over the categories (file order within one), so a capped
    evaluation covers chat, instruction, writing and the suite prompts alike."""
    by: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by[category_of(t)].append(t)
    queues = [list(reversed(by[c])) for c in sorted(by)]
    out: list[Task] = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop())
    return out


class _GeneralStage:
    """General RL's part of the shared loop: category-mixed batches, one-turn answers scored by the hybrid
    reward, GRPO + IcePop; its per-run state is the GRM judge's counts (its call budget)."""

    def __init__(self, loop: OnPolicyLoop, tokenizer: Any, train_prompts: Sequence[Task],
                 heldout: Sequence[Task], reward: HybridReward, cfg: GeneralRLConfig):  # fmt: skip
        self.engine, self.tokenizer, self.reward, self.cfg, self.heldout = (
            loop.engine,
            tokenizer,
            reward,
            cfg,
            heldout,
        )
        # categories play the part of the reasoning loop's domains: every batch mixes chat, instruction, writing
        self.batches = mixed_batches(train_prompts, cfg.prompts_per_step, cfg.seed)
        self.tasks: list[Task] = []

    def evaluate(self, step: int) -> dict[str, float]:
        return evaluate_general(
            self.engine, self.tokenizer, self.heldout, self.reward, self.cfg.max_new_tokens
        )

    def prepare(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"grm": self.reward.grm.state_dict()} if self.reward.grm is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.reward.grm is not None and "grm" in state:
            self.reward.grm.load_state_dict(state["grm"])

    def skip(self, steps: int) -> None:
        for _ in range(steps):
            next(self.batches)

    def sample(self, step: int) -> list[Trajectory]:
        cfg = self.cfg
        sampling = SamplingParams(
            cfg.max_new_tokens, cfg.temperature, cfg.top_p, seed=cfg.seed * 100_003 + step
        )
        self.tasks = next(self.batches)
        trajs, _ = sample_and_score(
            self.engine, self.tokenizer, self.tasks, cfg.group_size, sampling, self.reward, f"s{step}-"
        )
        return trajs

    def loss(self, model: nn.Module, trajs: list[Trajectory], batch: dict[str, torch.Tensor]):
        return grpo_loss(model, trajs, batch, self.cfg.group_size, self.cfg)

    def metrics(
        self, trajs, batch, out: GRPOOut, loss, grad_norm: float, times: StepTimes
    ) -> dict[str, float]:
        metrics = {
            **reward_means(trajs, self.tasks, with_se=False),
            "loss": float(loss.detach()),
            "grad_norm": grad_norm,
            **grpo_metrics(out, batch["mask"]),
            "response_length": sum(len(t.response_ids) for t in trajs) / len(trajs),
            "truncated_fraction": sum(t.status == "truncated" for t in trajs) / len(trajs),
            "time/rollout_and_reward_s": times.rollout_s,
            "time/train_s": times.train_s,
            "step_s": times.step_s(),
        }
        if self.reward.grm is not None:
            metrics.update(self.reward.grm.metrics())
        return metrics


def train_general_rl(
    model: nn.Module,
    tokenizer: Any,
    train_prompts: Sequence[Task],
    heldout_prompts: Sequence[Task],
    reward: HybridReward,
    cfg: GeneralRLConfig,
    log_metrics: Log,
    engine: RolloutEngine | None = None,
    on_sample: Callable[[list[Trajectory], int], None] | None = None,
    checkpoint_dir: Path | None = None,
    job: str | None = None,
) -> dict[str, float]:
    """Train `model` in place; returns the last step's metrics and the final held-out evaluation
    (`heldout/reward/<component>`, `heldout/reward_se/<component>`). With `checkpoint_dir`, state is saved
    every `cfg.checkpoint_every` steps and a rerun of the same `job` resumes there (training/rl/loop.py)."""
    loop = OnPolicyLoop(model, tokenizer, cfg, engine, checkpoint_dir, job, "general RL")
    heldout = heldout_subset(heldout_prompts, cfg.eval_prompts)
    log.info("general RL: %d indexer tensors frozen, %d train / %d held-out prompts", loop.frozen,
             len(train_prompts), len(heldout))  # fmt: skip
    stage = _GeneralStage(loop, tokenizer, train_prompts, heldout, reward, cfg)
    return loop.run(stage, log_metrics, on_sample, cfg.group_size)


def general_scorer(
    reward: HybridReward, prompts: Sequence[Task], max_new_tokens: int
) -> Callable[[nn.Module, Any], dict[str, dict[str, float]]]:
    """A scorer for the results table (training/report.py `score_general`): greedy answers of a checkpoint to
    `prompts`, each reward component's value per prompt, e.g. {"total": {"g1": 0.61, ...}, "orm": ...}."""

    def score(model: nn.Module, tokenizer: Any) -> dict[str, dict[str, float]]:
        engine = LocalRolloutEngine(model, pad_id=tokenizer.pad_token_id)
        greedy = SamplingParams(max_new_tokens=max_new_tokens, temperature=0)
        trajs, _ = sample_and_score(engine, tokenizer, prompts, 1, greedy, reward, "eval-")
        out: dict[str, dict[str, float]] = defaultdict(dict)
        for key, prompt_id, v in reward_values(trajs, prompts):
            out[key][prompt_id] = v
        return dict(out)

    return score
