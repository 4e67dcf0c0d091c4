"""Reasoning RL (docs/recipe.md, Stage 1): GRPO with IcePop, no KL, fully on-policy, mixed domains in every
batch, the DSA indexer frozen. One step = push weights to the rollout engine, sample a group per prompt,
verify, normalise rewards per group, one update on Eq. 1.

The step loop, checkpoints and resume are `training.rl.loop`'s (shared with General RL and distillation):
`train_reasoning_rl(...)` takes a model, a tokenizer, task lists and a
`log(metrics, step)` callback, and returns the final metrics."""

from __future__ import annotations

import logging
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import ConfigDict, Field, ValidationInfo, field_validator
from torch import nn

from training.rl.by_family import family_counts, family_means, family_of
from training.rl.loop import GRPOOut, OnPolicyLoop, StepTimes, grpo_loss, grpo_metrics
from training.rl.loop import resume_step as resume_step  # re-exported: jobs and tests ask the stage module
from training.rl.settings import PolicyUpdateConfig
from training.rollout.engine import LocalRolloutEngine, RolloutEngine, SamplingParams
from training.rollout.multiturn import rollout
from training.rollout.sharded import ShardedRolloutEngine, close_engine, eval_workers
from training.rollout.trajectory import Trajectory, failure_kind
from training.tasks.base import Task, TaskSuite
from training.tasks.suites import check_domain_counts
from training.tasks.tools import call_tool
from training.worker_pool import Workers

log = logging.getLogger(__name__)


class ReasoningRLConfig(PolicyUpdateConfig):
    """Reasoning RL settings (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    learning_rate: float = Field(
        1e-4, gt=0, description="AdamW learning rate (3e-5 moved no held-out score in 60 steps on tiny)"
    )
    steps: int = Field(240, ge=1, description="Optimizer steps (each on a fresh on-policy batch)")
    prompts_per_step: int = Field(8, ge=1, description="Prompts per batch, spread over the domains")
    group_size: int = Field(8, ge=2, description="Samples per prompt (G in Eq. 1)")
    max_new_tokens: int = Field(48, ge=1, description="Tokens generated per turn")
    max_turns: int = Field(3, ge=1, description="Assistant turns (tool calls) per trajectory")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the rollouts")
    eval_every: int = Field(20, ge=1, description="Held-out pass_at_1 every N steps (and at the end)")
    eval_tasks_per_domain: int = Field(60, ge=1, description="Held-out tasks scored per domain")
    eval_tasks_for: dict[str, int] = Field(
        {"code": 200},
        description="Per-domain exceptions to eval_tasks_per_domain, as the post-training report's: on the same "
        "two checkpoints 60 code tasks measured +0.050 +- 0.037 and all 200 +0.095 +- 0.022",
    )
    eval_samples: int = Field(
        4,
        ge=0,
        description="Held-out samples per task at the rollout temperature for sampled pass@1 (0 = off)",
    )
    filter_samples: int = Field(
        4, ge=0, description="Difficulty filter: samples per train prompt before RL (0 = off)"
    )
    filter_samples_for: dict[str, int] = Field(
        default_factory=dict,
        description="Per-domain exceptions to filter_samples ({knowledge: 16}): a domain the starting policy solves "
        "rarely at the rollout temperature has few prompts with a pass in 4 samples, and those few are memorised "
        "(filter_samples 0 turns the filter off for every domain)",
    )
    filter_prompts_per_domain: int = Field(
        1024,
        ge=1,
        description="Train prompts per domain the filter scores (task_suites' train and rl_pool): enough that "
        "a kept prompt recurs about once in the run",
    )
    score_batch_prompts: int = Field(
        32,
        ge=1,
        description="Prompts per generation batch of the difficulty filter and the sampled held-out pass@1 "
        "(rows = prompts x samples): 32 x 4 rows decode 1.46x faster than a training batch's 8 x 4 on CPU",
    )
    eval_workers: Workers = Field(
        "auto",
        description="Extra processes that decode a share of each evaluation-sized batch (filter, held-out and "
        "test scoring; training/rollout/sharded.py): auto = 1 with 2+ CPUs. Sampled draws depend on the count",
    )
    min_domain_prompts: int = Field(
        8,
        ge=1,
        description="A domain the filter keeps fewer prompts of is left out of training: every batch gives each "
        "domain its turns (domain_weights), so 2 kept prompts would take a quarter of every step and be memorised",
    )
    keep_solved_share: float = Field(
        0.15,
        ge=0,
        le=1,
        description="Share of the prompts the filter found always solved kept in training (seeded) as anchors: "
        "their groups give no gradient while solved and pull the policy back once it starts failing them",
    )
    domain_weights: dict[str, int] = Field(
        default_factory=dict,
        description="Turns of a domain in each round of a batch's draws (1 each by default; {tool: 2} gives tool 2 "
        "of every 5 prompts with four domains): tool alone gained +0.15 held-out in 120 steps where a quarter of "
        "each mixed batch gained nothing in 240 (docs/post_training_results.md)",
    )
    family_balanced: bool = Field(
        False,
        description="Batches draw a domain's task families in turn (code's floor_div, scale_add, ...), not its "
        "kept prompts uniformly: families the filter kept few prompts of are trained as often as the rest",
    )
    seed: int = Field(0, description="Seed of prompt order and sampling")

    @field_validator("domain_weights", "filter_samples_for")
    @classmethod
    def _known_domains(cls, value: dict[str, int], info: ValidationInfo) -> dict[str, int]:
        return check_domain_counts(value, str(info.field_name))


Log = Callable[[dict[str, float], int], None]


def greedy_trajectories(
    engine: RolloutEngine,
    tokenizer: Any,
    tasks: Sequence[Task],
    suites: dict[str, TaskSuite],
    max_new_tokens: int,
    max_turns: int,
) -> list[Trajectory]:
    """One greedy rollout per task, verified."""
    return rollout(
        engine,
        tokenizer,
        tasks,
        1,
        SamplingParams(max_new_tokens=max_new_tokens, temperature=0),
        lambda task, text: suites[task.domain].verify(task, text),
        call_tool,
        max_turns,
        group_prefix="eval-",
    )


def task_rewards(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Each trajectory's reward by task id (one rollout per task, as greedy evals make)."""
    return {t.prompt_id: t.reward for t in trajs}


def tool_call_rates(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Per domain, the share of trajectories that called a tool at least once: `tool_calls/<domain>`. Shows
    which way a policy solves a domain it may solve either way (math: in the reasoning or with the calculator)."""
    by_domain: dict[str, list[bool]] = defaultdict(list)
    for t in trajs:
        by_domain[t.task].append(any(m["role"] == "tool" for m in t.messages))
    return {f"tool_calls/{d}": sum(v) / len(v) for d, v in sorted(by_domain.items())}


def miss_counts(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Failed rollouts per domain and kind (`misses/<domain>/<kind>`: the verdict's first word, as Agentic RL's
    `failures/...`, or the rollout's status when it did not end, `truncated`): what a flat score is made of, e.g.
    tool's wrong copies against answers never given."""
    kinds = Counter(
        (t.task, t.status if t.status != "ok" else failure_kind(t.reason)) for t in trajs if t.reward <= 0
    )
    return {f"misses/{domain}/{kind}": float(n) for (domain, kind), n in sorted(kinds.items())}


def missed(trajs: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """The failed rollouts in short: task, reason and the conversation after the prompt, for a person to read."""
    return [
        {"task": t.task, "prompt_id": t.prompt_id, "reason": t.reason or t.status,
         "messages": [m for m in t.messages if m.get("role") != "system"]}
        for t in trajs if t.reward <= 0
    ]  # fmt: skip


def pass_at_1_of(rewards: dict[str, float], tasks: Sequence[Task]) -> dict[str, float]:
    """Greedy pass_at_1 per domain with its standard error: `pass_at_1/<domain>`, `pass_at_1_se/<domain>`, `n/<domain>`."""
    by_domain: dict[str, list[float]] = defaultdict(list)
    for t in tasks:
        by_domain[t.domain].append(rewards[t.id])
    out = {}
    for domain, r in sorted(by_domain.items()):
        p = sum(r) / len(r)
        out[f"pass_at_1/{domain}"] = p
        out[f"pass_at_1_se/{domain}"] = math.sqrt(p * (1 - p) / len(r))
        out[f"n/{domain}"] = float(len(r))
    return out


def pass_at_1(
    engine: RolloutEngine,
    tokenizer: Any,
    tasks: Sequence[Task],
    suites: dict[str, TaskSuite],
    max_new_tokens: int,
    max_turns: int,
) -> dict[str, float]:
    """Greedy pass_at_1 per domain with its standard error (see `pass_at_1_of`)."""
    rewards = task_rewards(greedy_trajectories(engine, tokenizer, tasks, suites, max_new_tokens, max_turns))
    return pass_at_1_of(rewards, tasks)


def paired_gain(before: dict[str, float], after: dict[str, float], tasks: Sequence[Task]) -> dict[str, float]:
    """Per domain, the mean of after - before over the same tasks and its standard error (paired: the tasks both
    checkpoints solve or both fail add no noise), with the tasks fixed and broken: `paired_gain/<domain>`,
    `paired_gain_se/<domain>`, `fixed/<domain>`, `broken/<domain>`. Tasks missing from either side are skipped."""
    by_domain: dict[str, list[float]] = defaultdict(list)
    for t in tasks:
        if t.id in before and t.id in after:
            by_domain[t.domain].append(after[t.id] - before[t.id])
    out = {}
    for domain, d in sorted(by_domain.items()):
        mean = sum(d) / len(d)
        var = sum((x - mean) ** 2 for x in d) / (len(d) - 1) if len(d) > 1 else 0.0
        out[f"paired_gain/{domain}"] = mean
        out[f"paired_gain_se/{domain}"] = math.sqrt(var / len(d))
        out[f"fixed/{domain}"] = float(sum(x > 0 for x in d))
        out[f"broken/{domain}"] = float(sum(x < 0 for x in d))
    return out


def mixed_batches(
    tasks: Sequence[Task],
    per_step: int,
    seed: int,
    by_family: bool = False,
    weights: dict[str, int] | None = None,
):
    """Endless batches that cycle through the domains so every batch mixes them; a domain with weight w takes w
    turns per round (1 by default). With `by_family`, a domain's prompts also cycle through its task families
    (`meta["family"]`): a family the filter kept 3 prompts of is drawn as often as one it kept 30 of."""
    rng = random.Random(seed)
    pools: dict[str, dict[str, list[Task]]] = defaultdict(lambda: defaultdict(list))
    for t in tasks:
        pools[t.domain][(family_of(t) or "") if by_family else ""].append(t)
    domains = [d for d in sorted(pools) for _ in range((weights or {}).get(d, 1))]
    queues = {(d, f): [] for d in pools for f in pools[d]}
    families = {d: sorted(pools[d]) for d in pools}
    turns = dict.fromkeys(pools, 0)
    turn = 0
    while True:
        batch = []
        while len(batch) < per_step:
            d = domains[turn % len(domains)]
            turn += 1
            f = families[d][turns[d] % len(families[d])]
            turns[d] += 1
            if not queues[d, f]:
                queues[d, f] = rng.sample(pools[d][f], len(pools[d][f]))
            batch.append(queues[d, f].pop())
        yield batch


def _step_metrics(trajs: list[Trajectory], out: GRPOOut, mask: torch.Tensor) -> dict[str, float]:
    metrics: dict[str, float] = {}
    by_domain: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_domain[t.task].append(t.reward)
    for d, r in by_domain.items():
        metrics[f"reward/{d}"] = sum(r) / len(r)
    metrics["reward/mean"] = sum(t.reward for t in trajs) / len(trajs)
    metrics.update(grpo_metrics(out, mask))
    metrics["response_length"] = sum(sum(t.loss_mask) for t in trajs) / len(trajs)
    metrics["truncated_fraction"] = sum(t.status == "truncated" for t in trajs) / len(trajs)
    return metrics


def difficulty_filter_rates(
    engine: RolloutEngine, tokenizer: Any, tasks: Sequence[Task], suites, cfg: ReasoningRLConfig
) -> dict[str, float]:
    """Pass rate of each task over `cfg.filter_samples` samples of the current policy
    (`cfg.filter_samples_for[domain]` for the domains named there)."""
    by_samples: dict[int, list[Task]] = defaultdict(list)
    for t in tasks:
        by_samples[cfg.filter_samples_for.get(t.domain, cfg.filter_samples)].append(t)
    rates: dict[str, float] = {}
    for samples, group in sorted(by_samples.items()):
        rates |= sampled_pass_rates(
            engine, tokenizer, group, suites, cfg, samples, 7, f"difficulty filter ({samples} samples)"
        )
    return rates


def sampled_pass_rates(
    engine: RolloutEngine, tokenizer: Any, tasks: Sequence[Task], suites, cfg: ReasoningRLConfig,
    samples: int, seed_offset: int, what: str,
) -> dict[str, float]:  # fmt: skip
    """Pass rate of each task over `samples` samples at the rollout temperature, in chunks of
    `cfg.score_batch_prompts` prompts (bounded memory, and a progress line per chunk); the seeds depend only
    on the chunk."""
    rates: dict[str, list[float]] = defaultdict(list)
    size = cfg.score_batch_prompts
    for i in range(0, len(tasks), size):
        params = SamplingParams(cfg.max_new_tokens, cfg.temperature, seed=cfg.seed + seed_offset + i)
        trajs = rollout(
            engine, tokenizer, tasks[i : i + size], samples, params,
            lambda task, text: suites[task.domain].verify(task, text), call_tool, cfg.max_turns, "sampled-",
        )  # fmt: skip
        for t in trajs:
            rates[t.prompt_id].append(t.reward)
        log.info("%s: %d / %d prompts sampled", what, min(i + size, len(tasks)), len(tasks))
    return {k: sum(v) / len(v) for k, v in rates.items()}


def sampled_pass_at_1(rates: dict[str, float], tasks: Sequence[Task]) -> dict[str, float]:
    """pass@1 at the rollout temperature per domain (mean of the tasks' sampled pass rates) with its standard
    error over tasks: `sampled_pass_at_1/<domain>`, `sampled_pass_at_1_se/<domain>`."""
    by_domain: dict[str, list[float]] = defaultdict(list)
    for t in tasks:
        by_domain[t.domain].append(rates[t.id])
    out = {}
    for domain, r in sorted(by_domain.items()):
        mean = sum(r) / len(r)
        var = sum((x - mean) ** 2 for x in r) / max(1, len(r) - 1)
        out[f"sampled_pass_at_1/{domain}"] = mean
        out[f"sampled_pass_at_1_se/{domain}"] = math.sqrt(var / len(r))
    return out


class _ReasoningStage:
    """Reasoning RL's part of the shared loop: mixed-domain batches of the difficulty-filtered train set,
    verified rollouts with tools, GRPO + IcePop; its per-run state is the filtered set."""

    def __init__(self, loop: OnPolicyLoop, tokenizer: Any, train_tasks: Sequence[Task],
                 heldout_tasks: Sequence[Task], suites: dict[str, TaskSuite], cfg: ReasoningRLConfig,
                 log_metrics: Log, on_eval: Callable[[list[Trajectory], int], None] | None = None):  # fmt: skip
        self.loop, self.tokenizer, self.cfg, self.on_eval = loop, tokenizer, cfg, on_eval
        self.engine = evaluation_engine(loop.engine, cfg)  # the filter's and held-out evals' rollouts
        self.all_train, self.heldout, self.suites, self.log_metrics = (
            list(train_tasks),
            heldout_tasks,
            suites,
            log_metrics,
        )
        self.train: list[Task] = []
        self._batches = None
        # step 0's greedy rewards and sampled pass rates: later evals are paired with them
        self.initial_rewards: dict[str, float] = {}
        self.initial_rates: dict[str, float] = {}

    def batches(self):
        if self._batches is None:
            cfg = self.cfg
            self._batches = mixed_batches(
                self.train, cfg.prompts_per_step, cfg.seed, cfg.family_balanced, cfg.domain_weights
            )
        return self._batches

    def evaluate(self, step: int) -> dict[str, float]:
        cfg, engine, tok = self.cfg, self.engine, self.tokenizer
        trajs = greedy_trajectories(engine, tok, self.heldout, self.suites, cfg.max_new_tokens, cfg.max_turns)
        if self.on_eval is not None:
            self.on_eval(trajs, step)
        rewards = task_rewards(trajs)
        out = pass_at_1_of(rewards, self.heldout) | tool_call_rates(trajs) | miss_counts(trajs)
        out |= family_means(rewards, self.heldout, "family") | family_counts(self.heldout, "family_n")
        if step == 0:
            self.initial_rewards = rewards
        elif self.initial_rewards:
            out.update(paired_gain(self.initial_rewards, rewards, self.heldout))
        if cfg.eval_samples:  # the same seeds at every eval: differences between steps are the policy's
            rates = sampled_pass_rates(
                engine,
                tok,
                self.heldout,
                self.suites,
                cfg,
                cfg.eval_samples,
                11,
                f"held-out eval step {step}",
            )
            out.update(sampled_pass_at_1(rates, self.heldout))
            out.update(family_means(rates, self.heldout, "family_sampled"))
            if step == 0:
                self.initial_rates = rates
            elif self.initial_rates:
                gain = paired_gain(self.initial_rates, rates, self.heldout)
                out.update({f"sampled_{k}": v for k, v in gain.items() if k.startswith("paired_gain")})
        return out

    def prepare(self) -> None:
        self.train = _filtered_train(self.engine, self.tokenizer, self.all_train, self.suites, self.cfg,
                                     self.log_metrics)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {
            "train_ids": [t.id for t in self.train],
            "initial_rewards": self.initial_rewards,
            "initial_rates": self.initial_rates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        by_id = {t.id: t for t in self.all_train}
        self.train = [by_id[i] for i in state["train_ids"]]
        self.initial_rewards = state.get("initial_rewards", {})  # older checkpoints: no paired gain
        self.initial_rates = state.get("initial_rates", {})

    def skip(self, steps: int) -> None:
        for _ in range(steps):
            next(self.batches())

    def sample(self, step: int) -> list[Trajectory]:
        cfg, suites = self.cfg, self.suites
        sampling = SamplingParams(
            cfg.max_new_tokens, cfg.temperature, cfg.top_p, seed=cfg.seed * 100_003 + step
        )
        return rollout(
            self.engine, self.tokenizer, next(self.batches()), cfg.group_size, sampling,
            lambda task, text: suites[task.domain].verify(task, text), call_tool, cfg.max_turns, f"s{step}-",
        )  # fmt: skip

    def loss(self, model: nn.Module, trajs: list[Trajectory], batch: dict[str, torch.Tensor]):
        return grpo_loss(model, trajs, batch, self.cfg.group_size, self.cfg)

    def metrics(
        self, trajs, batch, out: GRPOOut, loss, grad_norm: float, times: StepTimes
    ) -> dict[str, float]:
        metrics = _step_metrics(trajs, out, batch["mask"])
        gen_s = trajs[0].timings["generate_s"]
        metrics.update(
            {
                "loss": float(loss.detach()),
                "grad_norm": grad_norm,
                "time/generate_s": gen_s,
                "time/verify_s": trajs[0].timings["verify_s"] + trajs[0].timings["environment_s"],
                "time/train_s": times.train_s,
                "tokens_per_s": sum(len(t.response_ids) for t in trajs) / max(gen_s, 1e-9),
                "step_s": times.step_s(),
                "rollout_s": times.rollout_s,
            }
        )
        return metrics


def train_reasoning_rl(
    model: nn.Module,
    tokenizer: Any,
    train_tasks: Sequence[Task],
    heldout_tasks: Sequence[Task],
    suites: dict[str, TaskSuite],
    cfg: ReasoningRLConfig,
    log_metrics: Log,
    engine: RolloutEngine | None = None,
    on_sample: Callable[[list[Trajectory], int], None] | None = None,
    checkpoint_dir: Path | None = None,
    job: str | None = None,
    on_eval: Callable[[list[Trajectory], int], None] | None = None,
) -> dict[str, float]:
    """Train `model` in place; returns the last held-out evaluation and step metrics; `on_eval` gets each
    evaluation's greedy held-out rollouts with the step. With `checkpoint_dir`,
    state is saved every `cfg.checkpoint_every` steps and a rerun resumes from the newest save, reaching the
    same weights as an uninterrupted run (per-step sampling seeds, the batch stream replayed to the step);
    a checkpoint of another `job` (fingerprint) is refused (training/rl/loop.py)."""
    loop = OnPolicyLoop(model, tokenizer, cfg, engine, checkpoint_dir, job, "reasoning RL")
    log.info("reasoning RL: %d indexer tensors frozen, %d trainable tensors", loop.frozen, len(loop.params))
    stage = _ReasoningStage(loop, tokenizer, train_tasks, heldout_tasks, suites, cfg, log_metrics, on_eval)
    try:
        return loop.run(stage, log_metrics, on_sample, cfg.group_size)
    finally:
        close_engine(stage.engine)


def evaluation_engine(engine: RolloutEngine, cfg: ReasoningRLConfig) -> RolloutEngine:
    """`engine` with its evaluation-sized batches split over `cfg.eval_workers` processes (a local engine
    only: a remote one is scaled by its server); close it when done."""
    workers = eval_workers(cfg.eval_workers)
    if workers and isinstance(engine, LocalRolloutEngine):
        # a training batch stays in this process: its weights change every step
        return ShardedRolloutEngine(engine, workers, min_rows=cfg.prompts_per_step * cfg.group_size + 1)
    return engine


def _filtered_train(
    engine: RolloutEngine, tokenizer: Any, train: list[Task], suites, cfg: ReasoningRLConfig, log_metrics: Log
) -> list[Task]:
    """The difficulty filter: train prompts the starting policy solves sometimes. A domain with none is left
    out (never or always solved, its groups have zero advantage: rollouts with no gradient); only if no domain
    has any is the whole pool kept, with a warning that this run cannot learn from it. A `keep_solved_share` of
    the always-solved prompts of the trained domains is added as anchors."""
    if not cfg.filter_samples:
        return train
    pool = per_domain(train, cfg.filter_prompts_per_domain, cfg.seed)
    rates = difficulty_filter_rates(engine, tokenizer, pool, suites, cfg)
    kept, metrics = keep_with_anchors(pool, rates, cfg, "reasoning_rl")
    log_metrics(metrics, 0)
    return kept


def keep_with_anchors(
    pool: list[Task], rates: dict[str, float], cfg: Any, stage: str
) -> tuple[list[Task], dict[str, float]]:
    """`keep_sometimes_solved` plus `cfg.keep_solved_share` of the always-solved tasks of the trained domains as
    anchors (`cfg`: any stage config with min_domain_prompts, keep_solved_share and seed)."""
    kept, metrics = keep_sometimes_solved(pool, rates, cfg.min_domain_prompts, stage)
    kept_ids = {t.id for t in kept}  # with no prompt solved sometimes the filter keeps the whole pool
    rest = [t for t in pool if t.id not in kept_ids]
    anchors = solved_anchors(rest, rates, {t.domain for t in kept}, cfg.keep_solved_share, cfg.seed)
    counts = Counter(t.domain for t in anchors)
    return kept + anchors, metrics | {f"filter/anchors/{d}": float(n) for d, n in counts.items()}


def keep_sometimes_solved(
    pool: list[Task], rates: dict[str, float], min_per_domain: int, stage: str
) -> tuple[list[Task], dict[str, float]]:
    """The difficulty filter's rule, for every RL stage: keep the tasks whose sampled pass rate is in (0, 1) and
    leave out a domain with fewer than `min_per_domain` of them (every batch gives each domain its turns,
    so a handful would be memorised). Only if nothing is left is the whole pool kept, with a warning that the
    run cannot learn from it. Returns the kept tasks and the filter's metrics (`filter/...`)."""
    kept = [t for t in pool if 0.0 < rates.get(t.id, 0.0) < 1.0]
    metrics = _filter_metrics(pool, rates, kept)
    counts = Counter(t.domain for t in kept)
    few = sorted(d for d, n in counts.items() if n < min_per_domain)
    if few and len(few) < len(counts):
        log.warning("difficulty filter: fewer than %d tasks kept for %s (%s); left out of training "
                    "(%s.min_domain_prompts)", min_per_domain, ", ".join(few),
                    ", ".join(f"{d}: {counts[d]}" for d in few), stage)  # fmt: skip
        kept = [t for t in kept if t.domain not in few]
    left_out = sorted({t.domain for t in pool} - {t.domain for t in kept} - set(few))
    if not kept:
        log.warning("difficulty filter: no task is solved sometimes by the starting policy; training on the "
                    "whole pool, where every group has zero advantage (check the parent checkpoint)")  # fmt: skip
        return pool, metrics
    if left_out:
        log.warning("difficulty filter: no %s task is solved sometimes by the starting policy; left out of "
                    "training", ", ".join(left_out))  # fmt: skip
    return kept, metrics


def solved_anchors(
    pool: list[Task], rates: dict[str, float], domains: set[str], share: float, seed: int
) -> list[Task]:
    """A seeded `share` of the always-solved prompts of the trained `domains`. Difficulty filtering drops them,
    so nothing stops RL on a related skill from breaking them (on tiny, RL on `add2_const` took `add2` from
    1.0 to 0.33); kept, they cost rollouts but no gradient until a sample fails."""
    solved = [t for t in pool if rates.get(t.id, 0.0) >= 1.0 and t.domain in domains]
    if share <= 0 or not solved:
        return []
    return random.Random(seed).sample(solved, round(share * len(solved)))


def per_domain(tasks: list[Task], n: int | Callable[[str], int], seed: int) -> list[Task]:
    """Up to `n` tasks of each domain (`n(domain)` when a function), a seeded sample (the difficulty filter's
    pool)."""
    rng = random.Random(seed)
    by: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by[t.domain].append(t)
    size = n if callable(n) else (lambda _: n)
    return [t for d in sorted(by) for t in rng.sample(by[d], min(size(d), len(by[d])))]


def _filter_metrics(pool: list[Task], rates: dict[str, float], kept: list[Task]) -> dict[str, float]:
    out: dict[str, float] = {"filter/pool": float(len(pool)), "filter/kept": float(len(kept))}
    for domain in sorted({t.domain for t in pool}):
        out[f"filter/kept/{domain}"] = float(sum(t.domain == domain for t in kept))
    for lo, hi, name in ((0.0, 0.0, "never"), (1.0, 1.0, "always")):
        out[f"filter/{name}_solved"] = float(sum(lo <= rates.get(t.id, 0.0) <= hi for t in pool))
    # per family: a family never solved here has no prompt in RL, so it cannot gain
    return out | family_means(rates, pool, "filter/pass_rate") | family_counts(kept, "filter/kept")
