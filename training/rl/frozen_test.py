"""The frozen test set, scored once per Reasoning RL model version: the trained policy and its parent on the
same test tasks, greedy and sampled, with the gain paired per task. Nothing reads these numbers to choose a
setting; they are written once, when training has finished."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from training.rl.reasoning import (
    ReasoningRLConfig,
    greedy_trajectories,
    paired_gain,
    pass_at_1_of,
    sampled_pass_at_1,
    sampled_pass_rates,
    task_rewards,
)
from training.rollout.engine import RolloutEngine
from training.tasks.base import Task, TaskSuite

TEST_SAMPLING_SEED_OFFSET = (
    13  # sampling seeds of test scoring, apart from the filter's (7) and held-out evals' (11)
)


def _scores(engine: RolloutEngine, tok: Any, tasks: Sequence[Task], suites, cfg: ReasoningRLConfig, who: str):
    rewards = task_rewards(greedy_trajectories(engine, tok, tasks, suites, cfg.max_new_tokens, cfg.max_turns))
    rates = (
        sampled_pass_rates(
            engine, tok, tasks, suites, cfg, cfg.eval_samples, TEST_SAMPLING_SEED_OFFSET, f"test set, {who}"
        )
        if cfg.eval_samples
        else {}
    )
    return rewards, rates


def score_test_set(
    policy: RolloutEngine,
    parent: RolloutEngine,
    tokenizer: Any,
    tasks: Sequence[Task],
    suites: dict[str, TaskSuite],
    cfg: ReasoningRLConfig,
) -> dict[str, float]:
    """`test/<metric>/<domain>` for the policy, `test/parent/<metric>/<domain>` for its parent, and the paired
    gains `test/paired_gain/<domain>` (greedy) and `test/sampled_paired_gain/<domain>`, each with `_se`."""
    if not tasks:
        return {}
    mine, mine_rates = _scores(policy, tokenizer, tasks, suites, cfg, "policy")
    theirs, their_rates = _scores(parent, tokenizer, tasks, suites, cfg, "parent")
    out = {f"test/{k}": v for k, v in pass_at_1_of(mine, tasks).items()}
    out |= {f"test/parent/{k}": v for k, v in pass_at_1_of(theirs, tasks).items() if not k.startswith("n/")}
    out |= {f"test/{k}": v for k, v in paired_gain(theirs, mine, tasks).items()}
    if mine_rates:
        out |= {f"test/{k}": v for k, v in sampled_pass_at_1(mine_rates, tasks).items()}
        out |= {f"test/parent/{k}": v for k, v in sampled_pass_at_1(their_rates, tasks).items()}
        gain = paired_gain(their_rates, mine_rates, tasks)
        out |= {f"test/sampled_{k}": v for k, v in gain.items() if k.startswith("paired_gain")}
    return out
