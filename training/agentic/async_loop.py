"""Agentic RL (docs/recipe.md, Stage 2): the trainer and the rollout worker are separate processes.

The worker (`worker_main`, its own process) keeps `in_flight_groups` groups of rollouts going through a
`RolloutDriver` and sends every finished trajectory to the trainer over a queue. The trainer buffers them
(`TrajectoryBuffer`: groups, staleness, environment failures, padding), takes a batch once
`batch_trajectories` are ready, and makes one update on Eq. 3-5 (direct double-sided importance sampling
against the rollout log-probs). Every `push_every` steps it writes its weights (temp + rename) and tells the
worker, which loads them between two generation batches; the optimizer state is reset after each push.

Modes: "async" never pauses the worker. "sync" is the baseline and the partial-rollout mode: the worker
pauses generation once a batch of groups is complete and resumes when the trainer has stepped; with
`in_flight_groups` above the batch's groups the stragglers are held with their tokens, log-probs and versions
and resume on the new weights (APRIL's partial rollouts)."""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import queue
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from torch import nn

from training.agentic.buffer import TrajectoryBuffer, trained_reward
from training.agentic.driver import RolloutDriver
from training.agentic.gateway import TitoGateway
from training.agentic.protocol import Environment, check_family_sizes
from training.dsa_indexer import set_dsa_mode
from training.rl.losses import double_sided_is_loss, group_advantages
from training.rl.policy import freeze_indexer, response_batch, token_logprobs
from training.rollout.engine import LocalRolloutEngine, SamplingParams, engine_dtype
from training.rollout.prefix_cache import PrefixCachingEngine
from training.rollout.sharded import ShardedRolloutEngine, eval_workers
from training.rollout.trajectory import Trajectory, failure_kind
from training.tasks.base import Task
from training.worker_pool import Workers

log = logging.getLogger(__name__)
Log = Callable[[dict[str, float], int], None]
KEEP_PUSHED = 8
MAX_WORKER_RESTARTS = 3  # weight files kept: the worker may be a few pushes behind when it reads its queue


class AgenticRLConfig(BaseModel):
    """Agentic RL settings (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(30, ge=1, description="Optimizer steps")
    group_size: int = Field(4, ge=2, description="Rollouts per task (K in Eq. 5)")
    batch_trajectories: int = Field(
        24, ge=1, description="The trainer takes a batch once this many are ready"
    )
    in_flight_groups: int = Field(12, ge=1, description="Groups the worker keeps in flight (over-sampling)")
    push_every: int = Field(2, ge=1, description="Push weights to the rollout engine every K optimizer steps")
    max_staleness: int = Field(2, ge=0, description="Drop a sample whose oldest version is > tau behind")
    drop_uniform_groups: bool = Field(
        False,
        description="Drop a group whose samples all got the same reward (no gradient; DAPO's dynamic sampling); "
        "a step then trains on what is left of its batch, which may be fewer than batch_trajectories",
    )
    partial_credit: float = Field(
        0.0, ge=0, lt=1,
        description="Reward of a failed rollout: this times how close it came (share of tests passed, similarity "
        "of the file or answer written); 0 trains on success alone. Held-out success stays the verifier's 0 / 1",
    )  # fmt: skip
    found_credit: float = Field(
        0.0, ge=0, lt=1,
        description="Reward of a failed rollout whose tools had returned the answer (search: a result's term is "
        "the answer; the query was right, the copying was not); 0 = none. Held-out success stays the verifier's",
    )  # fmt: skip
    mode: Literal["async", "sync"] = Field(
        "async", description="async pipeline, or sync with partial rollouts"
    )
    task_ratios: dict[str, float] = Field(
        default_factory=lambda: {"terminal": 1.0, "codefix": 1.0, "search": 1.0},
        description="Share of rollouts per agentic task family",
    )
    max_new_tokens: int = Field(64, ge=1, description="Tokens generated per turn")
    max_turns: int = Field(4, ge=1, description="Assistant turns per rollout")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the rollouts")
    learning_rate: float = Field(3e-5, gt=0, description="AdamW learning rate")
    grad_clip: float = Field(1.0, gt=0, description="Gradient-norm clip")
    eps_low: float = Field(0.2, gt=0, lt=1, description="Double-sided IS band: lower edge 1 - eps_low")
    eps_high: float = Field(0.28, gt=0, description="Double-sided IS band: upper edge 1 + eps_high")
    engine_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="Rollout engine precision (auto = bf16 where the hardware has bf16 arithmetic)"
    )
    env_threads: int = Field(32, ge=1, description="Environment calls in flight in the worker")
    rollout_replicas: int = Field(2, ge=1, description="Inference replicas behind the TITO gateway")
    batch_wait_s: float = Field(
        0.05, ge=0, description="Worker: wait up to this long for more rollouts before a generation batch"
    )
    prefix_cache_tokens: int = Field(
        0, ge=0, description="KV prefix cache per replica in tokens (0 = batched engine without a cache)"
    )
    eval_tasks_per_domain: int = Field(150, ge=1, description="Held-out tasks scored per family")
    eval_tasks_for: dict[str, int] = Field(
        default_factory=lambda: {"search": 600},
        description="Per-family exceptions to eval_tasks_per_domain (agentic_tasks.heldout_for gives search "
        "600 held-out tasks)",
    )
    eval_samples: int = Field(
        2,
        ge=0,
        description="Held-out rollouts per task at the rollout temperature for sampled success, before and "
        "after training with the same seeds (0 = greedy only)",
    )
    eval_workers: Workers = Field(
        "auto",
        description="Extra processes that decode a share of the filter's and held-out evals' batches "
        "(training/rollout/sharded.py): auto = 1 with 2+ CPUs",
    )
    filter_samples: int = Field(
        4, ge=0, description="Difficulty filter: rollouts per train task before RL (0 = off)"
    )
    filter_tasks_per_domain: int = Field(64, ge=1, description="Train tasks per family the filter scores")
    filter_tasks_for: dict[str, int] = Field(
        default_factory=dict,
        description="Per-family exceptions to filter_tasks_per_domain (a family the parent rarely solves needs "
        "a larger pool for the filter to keep enough distinct tasks)",
    )
    # On tiny the parent solves a level-1 search task 0.60 of the time when SFT wrote its answer as a query,
    # 0.29 when SFT wrote it as an answer and 0.12 when SFT never wrote it, as for every held-out task
    # (2026-12-06), so the filter otherwise keeps mostly tasks RL can answer from memory.
    search_unwritten_only: bool = Field(
        False,
        description="Train search only on tasks whose queries and answer SFT's worked solutions never wrote, "
        "as held-out tasks' answers never were (copying a term, not recalling one)",
    )
    min_domain_prompts: int = Field(
        8, ge=1, description="A family the filter keeps fewer tasks of is left out of training"
    )
    keep_solved_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of the tasks the filter found always solved kept in training (seeded) as anchors, as "
        "in Reasoning RL: no gradient while solved, a pull back once RL starts failing them (0 = none)",
    )
    seed: int = Field(0, description="Seed of task order and sampling")

    @field_validator("filter_tasks_for", "eval_tasks_for")
    @classmethod
    def _known_families(cls, value: dict[str, int], info: ValidationInfo) -> dict[str, int]:
        return check_family_sizes(value, str(info.field_name))

    @model_validator(mode="after")
    def _credits_below_success(self) -> AgenticRLConfig:
        if self.partial_credit + self.found_credit >= 1:
            raise ValueError(
                f"partial_credit ({self.partial_credit}) + found_credit ({self.found_credit}) must be < 1: "
                "a failed rollout must get less than a success"
            )
        return self

    def filter_pool_size(self, family: str) -> int:
        return self.filter_tasks_for.get(family, self.filter_tasks_per_domain)


class WorkerSpec(BaseModel):
    """What the rollout worker process needs (plain data: it crosses a process boundary)."""

    model_config = ConfigDict(extra="forbid")
    hf_dir: str = Field(description="HF dir of the starting policy")
    tasks: list[dict[str, Any]] = Field(description="Train tasks (Task.to_json())")
    environments: str = Field(description="module:function returning {domain: Environment}")
    environment_kwargs: dict[str, Any] = Field(default_factory=dict)
    domain_picker: str | None = Field(
        None, description="module:function returning a () -> domain | None callable (the orchestrator's "
        "ratios); None = the worker's own pick by task_ratios",
    )  # fmt: skip
    domain_picker_kwargs: dict[str, Any] = Field(default_factory=dict)
    config: AgenticRLConfig
    pad_id: int
    threads: int = 1


# -- the rollout worker (its own process) ---------------------------------------------------------------
def _pick_domain(ratios: Mapping[str, float], started: Counter) -> str:
    total = sum(started.values()) + 1
    return max(ratios, key=lambda d: ratios[d] / sum(ratios.values()) - started[d] / total)


def rollout_gateway(model: nn.Module, cfg: AgenticRLConfig, dtype: torch.dtype, pad_id: int) -> TitoGateway:
    """`rollout_replicas` engines (each its own copy of the policy) behind the TITO gateway, which routes all
    turns of a rollout to one replica (consistent hashing on the rollout id) and records every request."""
    replicas = {
        f"replica-{i}": PrefixCachingEngine(model, dtype, pad_id, cfg.prefix_cache_tokens)
        if cfg.prefix_cache_tokens
        else LocalRolloutEngine(model, dtype=dtype, pad_id=pad_id)
        for i in range(cfg.rollout_replicas)
    }
    return TitoGateway(replicas)


def _worker_stats(driver: RolloutDriver, gateway: TitoGateway) -> dict[str, float]:
    g = gateway.stats()
    out = {
        "generated_tokens": float(driver.generated_tokens),
        "generate_s": driver.generate_s,
        "in_flight": float(driver.in_flight()),
        "gateway/requests": float(g["requests"]),
        "gateway/retries": float(g["retries"]),
        "gateway/replica_failures": float(g["replica_failures"]),
    }
    if g["later_turns"]:  # DP-aware routing: turns after the first that reached their rollout's replica
        out["gateway/same_replica_rate"] = g["same_replica_turns"] / g["later_turns"]
    if "prefix_cache" in g:
        out["gateway/prefix_cache_hit_rate"] = float(g["prefix_cache"]["hit_rate"])
    return out


def _drain(q: Any) -> list[tuple]:
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def worker_main(spec_json: str, out_q: Any, ctl_q: Any) -> None:
    """Rollouts until told to stop: ("weights", version, path) loads new weights, ("resume",) unpauses."""
    try:
        _worker_loop(WorkerSpec.model_validate_json(spec_json), out_q, ctl_q)
    except Exception as exc:  # the trainer must hear why, not wait forever
        log.exception("rollout worker failed")
        out_q.put(("error", f"{type(exc).__name__}: {exc}"))


def _worker_loop(spec: WorkerSpec, out_q: Any, ctl_q: Any) -> None:
    from training.job import import_object
    from training.model import load_model
    from training.tokenizer import load_tokenizer

    torch.set_num_threads(spec.threads)
    cfg = spec.config
    tokenizer = load_tokenizer(spec.hf_dir)
    model = load_model(spec.hf_dir)
    dtype = engine_dtype(cfg.engine_dtype, next(model.parameters()).device)
    set_dsa_mode(model, "sparse_gather")
    gateway = rollout_gateway(model, cfg, dtype, spec.pad_id)
    del model
    envs: dict[str, Environment] = import_object(spec.environments)(**spec.environment_kwargs)
    tasks = [Task.from_json(t) for t in spec.tasks]
    pools: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        pools[t.domain].append(t)
    ratios = {d: r for d, r in cfg.task_ratios.items() if r > 0 and pools.get(d)}
    if not ratios:
        raise ValueError(f"no train tasks for any family in task_ratios {cfg.task_ratios}")
    rng = random.Random(cfg.seed)
    orders = {d: [] for d in ratios}
    pick = import_object(spec.domain_picker)(**spec.domain_picker_kwargs) if spec.domain_picker else None
    params = SamplingParams(cfg.max_new_tokens, cfg.temperature, seed=cfg.seed)
    driver = RolloutDriver(
        gateway.generate_batch, tokenizer, envs, params, cfg.max_turns, env_threads=cfg.env_threads,
        batch_wait_s=cfg.batch_wait_s,
    )  # fmt: skip
    per_batch = math.ceil(cfg.batch_trajectories / cfg.group_size)
    started, finished_in_group = Counter(), Counter()
    groups_open, groups_done_since_resume, n_groups = 0, 0, 0
    pause_after, refill = cfg.mode == "sync", True
    last_stats = time.perf_counter()
    try:
        while True:
            messages = _drain(ctl_q)
            if any(m[0] == "stop" for m in messages):
                return
            pushes = [m for m in messages if m[0] == "weights"]
            if pushes:  # only the newest matters; the trainer deletes old files
                _, version, path = pushes[-1]
                gateway.sync_weights(torch.load(path, map_location="cpu", weights_only=True), version)
            if messages:
                driver.paused, groups_done_since_resume, refill = False, 0, True
            # async refills whenever a group ends; sync only when a round starts (stragglers carry over)
            while (refill or not pause_after) and groups_open < cfg.in_flight_groups:
                if pick is not None and driver.opening():  # its counts move when episodes open: one at a time
                    break
                domain = pick() if pick is not None else _pick_domain(ratios, started)
                if domain not in ratios:  # no family can take an episode now (or one without train tasks)
                    break
                if not orders[domain]:
                    orders[domain] = rng.sample(pools[domain], len(pools[domain]))
                task = orders[domain].pop()
                driver.start_group(task, cfg.group_size, f"g{n_groups}-{uuid.uuid4().hex[:6]}")
                started[domain] += 1
                groups_open, n_groups = groups_open + 1, n_groups + 1
            refill = refill and groups_open < cfg.in_flight_groups  # a round's fill may take several passes
            for traj in driver.poll(timeout=0.02):
                out_q.put(("trajectory", traj.to_json()))
                finished_in_group[traj.group_id] += 1
                if finished_in_group[traj.group_id] == cfg.group_size:
                    del finished_in_group[traj.group_id]
                    groups_open -= 1
                    groups_done_since_resume += 1
            if pause_after and groups_done_since_resume >= per_batch:
                driver.paused = True  # stragglers keep their state and resume on the next weights
            if time.perf_counter() - last_stats > 1.0:
                out_q.put(("stats", _worker_stats(driver, gateway)))
                last_stats = time.perf_counter()
    finally:
        driver.close()


# -- the trainer ------------------------------------------------------------------------------------------
class AgenticRun:
    """The trainer's end of one run: owns the worker process, the weight files and the buffer."""

    def __init__(self, model: nn.Module, spec: WorkerSpec, run_dir: Path):
        self.model, self.spec, self.cfg = model, spec, spec.config
        self.weights_dir = run_dir / "weights"
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.buffer = TrajectoryBuffer(
            self.cfg.group_size,
            self.cfg.max_staleness,
            self.cfg.drop_uniform_groups,
            self.cfg.partial_credit,
            self.cfg.found_credit,
        )
        self.worker_stats: dict[str, float] = {}
        self.idle_s = 0.0
        self.pushed: list[tuple[int, Path]] = []
        self.restarts = 0

    def _start_worker(self) -> None:
        ctx = mp.get_context("spawn")
        self.out_q, self.ctl_q = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(
            target=worker_main, args=(self.spec.model_dump_json(), self.out_q, self.ctl_q), daemon=True
        )
        self.proc.start()
        if self.pushed:  # a replacement starts from the newest weights, before it generates anything
            version, path = self.pushed[-1]
            self.ctl_q.put(("weights", version, str(path)))

    def _replace_dead_worker(self) -> None:
        """Keep what the dead worker finished (its queue is read to the end), then start a replacement; its
        in-flight rollouts are lost (never half-counted). Gives up after MAX_WORKER_RESTARTS."""
        while True:
            try:
                kind, payload = self.out_q.get(timeout=0.5)
            except queue.Empty:
                break
            if kind == "trajectory":
                self.buffer.add(Trajectory(**payload))
        if self.restarts >= MAX_WORKER_RESTARTS:
            raise RuntimeError(
                f"rollout worker died {self.restarts + 1} times (last exit code {self.proc.exitcode})"
            )
        self.restarts += 1
        log.warning(
            "rollout worker died (exit code %s); starting replacement %d", self.proc.exitcode, self.restarts
        )
        self._start_worker()

    def __enter__(self) -> AgenticRun:
        self._start_worker()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.ctl_q.put(("stop",))
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()

    def next_batch(self, version: int, timeout_s: float = 900.0) -> list[list[Trajectory]]:
        """Block until the buffer yields a batch; the wait counts as trainer idle time."""
        t0 = time.perf_counter()
        while True:
            groups = self.buffer.take(self.cfg.batch_trajectories, version)
            if groups:
                self.idle_s += time.perf_counter() - t0
                return groups
            if (
                groups == [] and self.cfg.mode == "sync"
            ):  # the whole batch was dropped: the paused worker goes on
                self.resume()
            if not self.proc.is_alive():
                self._replace_dead_worker()
                continue
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(
                    f"no batch of {self.cfg.batch_trajectories} trajectories in {timeout_s:.0f} s"
                )
            try:
                kind, payload = self.out_q.get(timeout=1.0)
            except queue.Empty:
                continue
            if kind == "error":
                raise RuntimeError(f"rollout worker failed: {payload}")
            if kind == "stats":
                self.worker_stats = payload
            else:
                self.buffer.add(Trajectory(**payload))

    def push(self, version: int) -> None:
        path = self.weights_dir / f"policy-v{version}.pt"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, tmp)
        tmp.replace(path)
        self.ctl_q.put(("weights", version, str(path)))
        self.pushed.append((version, path))
        for _, old in self.pushed[:-KEEP_PUSHED]:  # the worker loads the newest it has been told of
            old.unlink(missing_ok=True)
        self.pushed = self.pushed[-KEEP_PUSHED:]

    def drain(self, wait_s: float = 3.0) -> None:
        """Read what is queued (trajectories go to the buffer, stats replace the last ones), waiting up to
        `wait_s` for a stats message newer than the last step."""
        deadline = time.perf_counter() + wait_s
        while time.perf_counter() < deadline:
            try:
                kind, payload = self.out_q.get(timeout=0.2)
            except queue.Empty:
                continue
            if kind == "stats":
                self.worker_stats = payload
                return
            if kind == "trajectory":
                self.buffer.add(Trajectory(**payload))

    def resume(self) -> None:
        self.ctl_q.put(("resume",))


def _optimizer(model: nn.Module, cfg: AgenticRLConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)


def update(
    model: nn.Module, optimizer: torch.optim.Optimizer, groups: list[list[Trajectory]], pad_id: int,
    cfg: AgenticRLConfig,
) -> dict[str, float]:  # fmt: skip
    """One optimizer step on Eq. 3-5 over whole groups (advantage = reward - group mean, no std)."""
    trajs = [t for g in groups for t in g]
    rewards = torch.tensor(
        [[trained_reward(t, cfg.partial_credit, cfg.found_credit) for t in g] for g in groups]
    )
    adv = group_advantages(rewards, normalise_std=False).flatten()
    batch = response_batch(trajs, pad_id)
    # the rollouts' log-probs are of the tempered distribution: the ratio must compare like with like
    logp, entropy = token_logprobs(model, batch, cfg.temperature)
    loss, stats = double_sided_is_loss(
        logp, batch["logp_infer"], adv, batch["mask"], cfg.eps_low, cfg.eps_high
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(
        [p for p in model.parameters() if p.requires_grad], cfg.grad_clip
    )
    optimizer.step()
    mask = batch["mask"]
    out = {
        "loss": float(loss.detach()),
        "grad_norm": float(grad_norm),
        "ratio/mean": stats.rho_mean,
        "ratio/min": stats.rho_min,
        "ratio/max": stats.rho_max,
        "is/masked_fraction": stats.masked_fraction,
        "entropy": float((entropy * mask).sum() / mask.sum().clamp_min(1)),
        "reward/mean": sum(t.reward for t in trajs) / len(trajs),
        "reward/trained_mean": float(rewards.mean()),
        "response_tokens": float(mask.sum()) / len(trajs),
    }
    by_domain: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_domain[t.task].append(t.reward)
    out.update({f"reward/{d}": sum(r) / len(r) for d, r in by_domain.items()})
    return out


def trainer_threads(spec: WorkerSpec) -> int:
    """The trainer's torch threads while the rollout worker runs: the CPUs the worker does not take (and no
    more than it has). With a thread more, its OpenMP threads spin in barriers against the worker's."""
    from infra.cpu import cpus

    return max(1, min(torch.get_num_threads(), cpus() - spec.threads))


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_agentic_rl(
    model: nn.Module, spec: WorkerSpec, run_dir: Path, log_metrics: Log,
    on_batch: Callable[[list[Trajectory], int], None] | None = None,
) -> dict[str, float]:  # fmt: skip
    """Train `model` in place with a separate rollout worker; returns the last step's metrics, throughput,
    trainer idle fraction and the buffer's drop and padding counts."""
    cfg = spec.config
    torch.manual_seed(cfg.seed)
    model.train()
    freeze_indexer(model)
    set_dsa_mode(model, "sparse_gather")
    optimizer = _optimizer(model, cfg)
    version, metrics = 0, {}
    spanning = trained = 0
    train_s = 0.0
    t_start = time.perf_counter()
    with AgenticRun(model, spec, run_dir) as run, _threads(trainer_threads(spec)):
        for step in range(1, cfg.steps + 1):
            groups = run.next_batch(version)
            trajs = [t for g in groups for t in g]
            lags = [version - min(t.policy_versions) for t in trajs if t.policy_versions]
            spanning += sum(len(set(t.policy_versions)) > 1 for t in {t.id: t for t in trajs}.values())
            trained += len(trajs)
            t_update = time.perf_counter()
            metrics = update(model, optimizer, groups, spec.pad_id, cfg)
            train_s += time.perf_counter() - t_update
            if step % cfg.push_every == 0:
                version += 1
                run.push(version)
                optimizer = _optimizer(model, cfg)  # the recipe resets the optimizer after each push
            elif cfg.mode == "sync":
                run.resume()
            wall = time.perf_counter() - t_start
            metrics.update(run.buffer.counts.metrics())
            metrics.update({
                "policy_version": float(version),
                "staleness/mean": sum(lags) / max(1, len(lags)),
                "staleness/max": float(max(lags, default=0)),
                "partial/spanning_versions": float(spanning),
                "throughput/trajectories_per_s": run.buffer.counts.received / wall,
                "trainer/idle_fraction": run.idle_s / wall,
                "trainer/train_s": train_s,
                "worker/restarts": float(run.restarts),
                "trained_samples": float(trained),
            })  # fmt: skip
            metrics.update({f"worker/{k}": v for k, v in run.worker_stats.items()})
            log_metrics(metrics, step)
            if on_batch is not None:
                on_batch(trajs, step)
            log.info(
                "agentic RL step %d/%d: reward %.3f, %d trajectories, idle %.0f%%, stale %d, env failures %d",
                step, cfg.steps, metrics["reward/mean"], len(trajs), 100 * metrics["trainer/idle_fraction"],
                run.buffer.counts.stale, run.buffer.counts.env_failures,
            )  # fmt: skip
        run.drain()  # the worker's last stats
    metrics.update({f"worker/{k}": v for k, v in run.worker_stats.items()})
    metrics["wall_s"] = time.perf_counter() - t_start
    return metrics


def heldout_success(
    model: nn.Module, tokenizer: Any, tasks: Sequence[Task], environments: Mapping[str, Environment],
    cfg: AgenticRLConfig, pad_id: int,
) -> dict[str, float]:  # fmt: skip
    """Greedy held-out success per family with its standard error (see `success_of`)."""
    return success_of(greedy_trajectories(model, tokenizer, tasks, environments, cfg, pad_id))


def greedy_trajectories(
    model: nn.Module, tokenizer: Any, tasks: Sequence[Task], environments: Mapping[str, Environment],
    cfg: AgenticRLConfig, pad_id: int,
) -> list[Trajectory]:  # fmt: skip
    """One greedy rollout per task (fp32 engine, in-process environments)."""
    params = SamplingParams(cfg.max_new_tokens, temperature=0.0, seed=cfg.seed)
    return _rollouts(model, tokenizer, tasks, environments, cfg, pad_id, torch.float32, params, 1, "heldout")


EVAL_BATCH_ROWS = 128  # rows per generation batch of the filter and held-out evals


def _rollouts(
    model: nn.Module, tokenizer: Any, tasks: Sequence[Task], environments: Mapping[str, Environment],
    cfg: AgenticRLConfig, pad_id: int, dtype: torch.dtype, params: SamplingParams, group: int, prefix: str,
) -> list[Trajectory]:  # fmt: skip
    # The driver seeds every request's row, so neither the batch size nor the split over processes changes a
    # draw. Larger batches than the training loop's 32 rows: 64 rows decode 1.7x the tokens/s of 16 on CPU.
    engine = ShardedRolloutEngine(
        LocalRolloutEngine(model, dtype=dtype, pad_id=pad_id), eval_workers(cfg.eval_workers), min_rows=64
    )
    driver = RolloutDriver(
        lambda ids, prompts, p: engine.generate(prompts, p), tokenizer, environments, params, cfg.max_turns,
        env_threads=cfg.env_threads, lockstep=True, max_batch=EVAL_BATCH_ROWS,
    )  # fmt: skip
    try:
        return driver.run(list(tasks), group, prefix)
    finally:
        driver.close()
        engine.close()


def sampled_pass_rates(
    model: nn.Module, tokenizer: Any, tasks: Sequence[Task], environments: Mapping[str, Environment],
    cfg: AgenticRLConfig, pad_id: int, samples: int, trained: bool = False,
) -> dict[str, float]:  # fmt: skip
    """Each task's pass rate over `samples` rollouts at the rollout temperature and precision (`trained`: its
    mean trained reward, credits included); environment failures are left out (a task with only failures has
    no rate)."""
    dtype = engine_dtype(cfg.engine_dtype, next(model.parameters()).device)
    params = SamplingParams(cfg.max_new_tokens, temperature=cfg.temperature, seed=cfg.seed + 7)
    trajs = _rollouts(model, tokenizer, tasks, environments, cfg, pad_id, dtype, params, samples, "filter")
    rewards: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        if t.status != "env_failure":
            rewards[t.prompt_id].append(
                trained_reward(t, cfg.partial_credit, cfg.found_credit) if trained else t.reward
            )
    return {k: sum(v) / len(v) for k, v in rewards.items()}


def success_by_level(trajs: Sequence[Trajectory], tasks: Sequence[Task]) -> dict[str, float]:
    """`success/<family>/level<k>`: where in a family a change lands (levels ask for different skills)."""
    level = {t.id: t.difficulty for t in tasks}
    rewards: dict[tuple[str, int], list[float]] = defaultdict(list)
    for t in trajs:
        if t.status != "env_failure":
            rewards[(t.task, level[t.prompt_id])].append(t.reward)
    return {f"success/{d}/level{k}": sum(v) / len(v) for (d, k), v in sorted(rewards.items())}


def rewards_by_task(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Each task's reward, environment failures left out (they say nothing about the policy)."""
    return {t.prompt_id: t.reward for t in trajs if t.status != "env_failure"}


def success_of(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Success per family with its standard error: `success/<d>`, `success_se/<d>`, `n/<d>`; environment
    failures are counted (`env_failures/<d>`) and left out of the rate."""
    out: dict[str, float] = {}
    by_domain: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_domain[t.task].append(t)
    for d, ts in sorted(by_domain.items()):
        ok = [t.reward for t in ts if t.status != "env_failure"]
        p = sum(ok) / max(1, len(ok))
        out[f"success/{d}"] = p
        out[f"success_se/{d}"] = math.sqrt(p * (1 - p) / max(1, len(ok)))
        out[f"n/{d}"] = float(len(ok))
        out[f"env_failures/{d}"] = float(len(ts) - len(ok))
        for kind, n in Counter(
            failure_kind(t.reason) for t in ts if t.status != "env_failure" and t.reward < 1
        ).items():
            out[f"failures/{d}/{kind}"] = float(n)
    return out
