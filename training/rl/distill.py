"""On-policy cross-stage distillation (docs/recipe.md, "On-policy cross-stage distillation", Eq. 2).

The final checkpoints of earlier stages are teachers. Each step samples prompts from every teacher's own
training set in configured proportions, lets the student answer on-policy through the rollout engine (multi-
turn with tools: `training.rollout.multiturn` for the reasoning domains, the agentic `RolloutDriver` with
in-process environments for the agentic families), scores the student's own tokens under the teacher of the
prompt's set, and makes one update on Eq. 1 with the advantage replaced per token by
Â_t = sg[log π_teacher(y_t) - log π_θ(y_t)] (group size 1).

The loop is plain Python: `train_distill(...)` takes the student, the teachers, the prompt sets and a
`log(metrics, step)` callback, and returns the final metrics."""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from pydantic import ConfigDict, Field
from torch import nn

from training.dsa_indexer import current_dsa_mode, set_dsa_mode
from training.rl.losses import on_policy_distillation_loss
from training.rl.policy import freeze_indexer, response_batch, token_logprobs
from training.rl.reasoning import pass_at_1
from training.rl.settings import PolicyUpdateConfig
from training.rollout.engine import LocalRolloutEngine, RolloutEngine, SamplingParams
from training.rollout.multiturn import prompt_ids, rollout
from training.rollout.trajectory import Trajectory
from training.tasks.base import Task, TaskSuite, Verdict
from training.tasks.tools import call_tool

log = logging.getLogger(__name__)
Log = Callable[[dict[str, float], int], None]


class DistillConfig(PolicyUpdateConfig):
    """On-policy distillation settings (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    steps: int = Field(40, ge=1, description="Optimizer steps (each on a fresh on-policy batch)")
    prompts_per_step: int = Field(16, ge=1, description="Prompts per batch over all teachers (group size 1)")
    proportions: dict[str, float] = Field(
        default_factory=dict,
        description="Teacher name -> share of each batch's prompts from its training set (empty = equal)",
    )
    max_new_tokens: int = Field(48, ge=1, description="Tokens generated per turn")
    max_turns: int = Field(3, ge=1, description="Assistant turns (tool calls) per trajectory")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (student and teacher log-probs)")
    eval_every: int = Field(20, ge=1, description="Held-out evaluation every N steps (and at 0 and the end)")
    eval_prompts_per_teacher: int = Field(
        16, ge=1, description="Held-out prompts per teacher for greedy agreement and exact reverse KL"
    )
    eval_tasks_per_domain: int = Field(40, ge=1, description="Held-out tasks scored per domain (pass@1)")
    seed: int = Field(0, description="Seed of prompt order and sampling")


def batch_counts(proportions: Mapping[str, float], teachers: Sequence[str], total: int) -> dict[str, int]:
    """Prompts per teacher in one batch: `total` split by `proportions` (largest remainder, every teacher with a
    positive share gets at least one prompt when total allows)."""
    unknown = sorted(set(proportions) - set(teachers))
    if unknown:
        raise ValueError(f"distill.proportions: no teacher named {unknown}; teachers are {sorted(teachers)}")
    shares = {t: float(proportions.get(t, 0.0 if proportions else 1.0)) for t in teachers}
    if any(v < 0 for v in shares.values()) or sum(shares.values()) <= 0:
        raise ValueError(f"distill.proportions: shares must be >= 0 with a positive sum, got {shares}")
    norm = sum(shares.values())
    exact = {t: total * v / norm for t, v in shares.items()}
    counts = {t: int(x) for t, x in exact.items()}
    for t in sorted(exact, key=lambda t: (counts[t] > 0, counts[t] - exact[t])):
        if sum(counts.values()) >= total:
            break
        if shares[t] > 0:
            counts[t] += 1
    return {t: n for t, n in counts.items() if n > 0}


class _Prompts:
    """Endless shuffled passes over one teacher's training set."""

    def __init__(self, tasks: Sequence[Task], seed: int):
        if not tasks:
            raise ValueError("a teacher has no prompts: give it a non-empty training set")
        self.tasks, self.rng, self.queue = list(tasks), random.Random(seed), []

    def take(self, n: int) -> list[Task]:
        out = []
        while len(out) < n:
            if not self.queue:
                self.queue = self.rng.sample(self.tasks, len(self.tasks))
            out.append(self.queue.pop())
        return out


def sample_student(
    engine: RolloutEngine,
    tokenizer: Any,
    tasks: Sequence[Task],
    suites: Mapping[str, TaskSuite],
    environments: Mapping[str, Any],
    params: SamplingParams,
    max_turns: int,
    prefix: str,
) -> list[Trajectory]:
    """One on-policy trajectory per task: agentic families through their environments, every other domain
    through the multi-turn tool loop (verified when its suite is known; the reward is only logged)."""
    agentic = [t for t in tasks if t.domain in environments]
    plain = [t for t in tasks if t.domain not in environments]
    trajs: list[Trajectory] = []
    if plain:

        def verify(task: Task, text: str) -> Verdict:
            suite = suites.get(task.domain)
            return suite.verify(task, text) if suite is not None else Verdict(0.0, "no_verifier")

        trajs += rollout(engine, tokenizer, plain, 1, params, verify, call_tool, max_turns, prefix)
    if agentic:
        from training.agentic.driver import RolloutDriver

        driver = RolloutDriver(
            lambda ids, prompts, p: engine.generate(prompts, p), tokenizer, environments, params, max_turns
        )
        try:
            trajs += driver.run(agentic, 1, prefix + "agentic")
        finally:
            driver.close()
    return trajs


def teacher_logprobs(
    teachers: Mapping[str, nn.Module],
    owner: Sequence[str],
    batch: dict[str, torch.Tensor],
    temperature: float,
) -> torch.Tensor:
    """[B, T] log π_teacher of every sampled token, each row under the teacher whose set its prompt came from."""
    out = torch.zeros_like(batch["mask"])
    for name, teacher in teachers.items():
        rows = torch.tensor([i for i, o in enumerate(owner) if o == name], dtype=torch.long)
        if len(rows) == 0:
            continue
        sub = {k: v[rows] for k, v in batch.items()}
        with torch.no_grad():
            out[rows] = token_logprobs(teacher, sub, temperature)[0]
    return out


def _mean_over(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp_min(1.0))


@torch.no_grad()
def teacher_agreement(
    student: nn.Module,
    teacher: nn.Module,
    tokenizer: Any,
    tasks: Sequence[Task],
    max_new_tokens: int,
    pad_id: int,
) -> dict[str, float]:
    """On the student's greedy first turn of each prompt: the share of tokens that are also the teacher's
    argmax (`agreement`), and the exact per-token reverse KL(π_student || π_teacher) over the whole vocabulary
    (`reverse_kl_exact`), a low-variance view of what distillation minimises."""
    engine = LocalRolloutEngine(student, dtype=torch.float32, pad_id=pad_id)
    from training.tokenizer import END_OF_TURN, EOS

    stop = tuple(tokenizer.convert_tokens_to_ids(t) for t in (END_OF_TURN, EOS))
    prompts = [prompt_ids(tokenizer, t) for t in tasks]
    gens = engine.generate(prompts, SamplingParams(max_new_tokens, 0.0, stop_token_ids=stop))
    agree = kl = count = 0.0
    for prompt, gen in zip(prompts, gens, strict=True):
        if not gen.token_ids:
            continue
        ids = torch.tensor([prompt + gen.token_ids])
        span = slice(len(prompt) - 1, ids.shape[1] - 1)
        ls = torch.log_softmax(student(input_ids=ids).logits[0, span].float(), -1)
        lt = torch.log_softmax(teacher(input_ids=ids).logits[0, span].float(), -1)
        target = torch.tensor(gen.token_ids)
        agree += float((lt.argmax(-1) == target).sum())
        kl += float((ls.exp() * (ls - lt)).sum())
        count += len(gen.token_ids)
    return {"agreement": agree / max(count, 1.0), "reverse_kl_exact": kl / max(count, 1.0)}


def train_distill(
    model: nn.Module,
    tokenizer: Any,
    teachers: Mapping[str, nn.Module],
    prompts: Mapping[str, Sequence[Task]],
    cfg: DistillConfig,
    log_metrics: Log,
    suites: Mapping[str, TaskSuite] | None = None,
    environments: Mapping[str, Any] | None = None,
    heldout_prompts: Mapping[str, Sequence[Task]] | None = None,
    heldout_tasks: Sequence[Task] = (),
    engine: RolloutEngine | None = None,
    on_sample: Callable[[list[Trajectory], int], None] | None = None,
) -> dict[str, float]:
    """Distil `teachers` into `model` (trained in place) on-policy; returns the last step's metrics and the last
    evaluation (`heldout/...`): per teacher greedy agreement and exact reverse KL on `heldout_prompts`, and
    greedy pass@1 on `heldout_tasks` for the domains with a suite."""
    missing = sorted(set(teachers) - set(prompts))
    if missing:
        raise ValueError(f"distillation: teacher(s) {missing} have no prompt set; give prompts[name] = tasks")
    suites, environments = dict(suites or {}), dict(environments or {})
    heldout_prompts = {k: list(v)[: cfg.eval_prompts_per_teacher] for k, v in (heldout_prompts or {}).items()}
    torch.manual_seed(cfg.seed)
    pad_id = tokenizer.pad_token_id
    counts = batch_counts(cfg.proportions, list(teachers), cfg.prompts_per_step)
    streams = {name: _Prompts(prompts[name], cfg.seed + i) for i, name in enumerate(sorted(teachers))}
    for teacher in teachers.values():
        teacher.eval()
        set_dsa_mode(teacher, "sparse_gather")  # native's top-k attention, faster on CPU (no KV cache here)
        for p in teacher.parameters():
            p.requires_grad_(False)
    model.train()
    frozen = freeze_indexer(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
    dtype = torch.bfloat16 if cfg.engine_dtype == "bfloat16" else torch.float32
    engine = engine or LocalRolloutEngine(model, dtype=dtype, pad_id=pad_id)
    mode = current_dsa_mode(model)
    set_dsa_mode(
        model, "sparse_gather"
    )  # the trainer's forward: native's values and gradients, faster on CPU
    log.info("distillation: teachers %s, prompts per step %s, %d indexer tensors frozen", sorted(teachers),
             counts, frozen)  # fmt: skip

    def evaluate(step: int) -> dict[str, float]:
        out: dict[str, float] = {}
        model.eval()
        for name, tasks in sorted(heldout_prompts.items()):
            scores = teacher_agreement(model, teachers[name], tokenizer, tasks, cfg.max_new_tokens, pad_id)
            out.update({f"{k}/{name}": v for k, v in scores.items()})
        scored = [t for t in heldout_tasks if t.domain in suites]
        if scored:
            engine.sync_weights(model.state_dict(), step)
            out.update(pass_at_1(engine, tokenizer, scored, suites, cfg.max_new_tokens, cfg.max_turns))
        model.train()
        log_metrics({f"heldout/{k}": v for k, v in out.items()}, step)
        return out

    final = evaluate(0)
    metrics: dict[str, float] = {}
    for step in range(1, cfg.steps + 1):
        t0 = time.perf_counter()
        engine.sync_weights(model.state_dict(), step - 1)  # fully on-policy: the engine samples θ_old
        batch_tasks: list[Task] = []
        owner_of: dict[str, str] = {}
        for name, n in sorted(counts.items()):
            for task in streams[name].take(n):
                # teachers' sets may share prompts (SFT's and Reasoning RL's): the id names the teacher
                task = replace(task, id=f"{name}:{task.id}")
                batch_tasks.append(task)
                owner_of[task.id] = name
        sampling = SamplingParams(cfg.max_new_tokens, cfg.temperature, seed=cfg.seed * 100_003 + step)
        trajs = sample_student(
            engine, tokenizer, batch_tasks, suites, environments, sampling, cfg.max_turns, f"s{step}-"
        )
        trajs = [t for t in trajs if t.status != "env_failure" and sum(t.loss_mask) > 0]
        if not trajs:
            log.warning("distillation step %d: no trajectory with policy tokens; skipped", step)
            continue
        owner = [owner_of[t.prompt_id] for t in trajs]
        t_rollout = time.perf_counter() - t0
        batch = response_batch(trajs, pad_id)
        t1 = time.perf_counter()
        logp_teacher = teacher_logprobs(teachers, owner, batch, cfg.temperature)
        with torch.no_grad():
            logp_old, _ = token_logprobs(model, batch, cfg.temperature)
        logp, entropy = token_logprobs(model, batch, cfg.temperature)
        loss, stats = on_policy_distillation_loss(
            logp,
            logp_old,
            batch["logp_infer"],
            logp_teacher,
            batch["mask"],
            cfg.beta,
            cfg.eps_low,
            cfg.eps_high,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
        optimizer.step()
        metrics = _step_metrics(trajs, owner, logp_old, logp_teacher, batch["mask"], entropy, stats)
        metrics.update({
            "loss": float(loss.detach()), "grad_norm": grad_norm, "rollout_s": t_rollout,
            "time/train_s": time.perf_counter() - t1, "step_s": time.perf_counter() - t0,
        })  # fmt: skip
        log_metrics(metrics, step)
        if on_sample is not None and step in (1, cfg.steps):
            on_sample(trajs[:8], step)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            final = evaluate(step)
    set_dsa_mode(model, mode)
    return {**metrics, **{f"heldout/{k}": v for k, v in final.items()}}


def _step_metrics(
    trajs: list[Trajectory],
    owner: list[str],
    logp_old: torch.Tensor,
    logp_teacher: torch.Tensor,
    mask: torch.Tensor,
    entropy: torch.Tensor,
    stats,
) -> dict[str, float]:
    """Per teacher: the mean reverse-KL estimate E[log π_θ - log π_teacher] over the sampled tokens (what the
    advantage drives to zero), its share of prompts and the verifier reward; IcePop statistics."""
    log_ratio = logp_old - logp_teacher
    metrics: dict[str, float] = {"reverse_kl/mean": _mean_over(log_ratio, mask)}
    rows_of: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(owner):
        rows_of[name].append(i)
    for name, rows in sorted(rows_of.items()):
        idx = torch.tensor(rows)
        metrics[f"reverse_kl/{name}"] = _mean_over(log_ratio[idx], mask[idx])
        metrics[f"prompts/{name}"] = float(len(rows))
        metrics[f"reward/{name}"] = sum(trajs[i].reward for i in rows) / len(rows)
    metrics["rho/mean"], metrics["rho/min"], metrics["rho/max"] = stats.rho_mean, stats.rho_min, stats.rho_max
    metrics["icepop/masked_fraction"] = stats.masked_fraction
    metrics["clip_fraction"] = stats.clip_fraction
    metrics["entropy"] = _mean_over(entropy, mask)
    metrics["response_length"] = float(mask.sum(1).mean())
    metrics["truncated_fraction"] = sum(t.status == "truncated" for t in trajs) / len(trajs)
    return metrics
