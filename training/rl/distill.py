"""On-policy cross-stage distillation (docs/recipe.md, "On-policy cross-stage distillation", Eq. 2).

The final checkpoints of earlier stages are teachers. Each step samples prompts from every teacher's own
training set in configured proportions, lets the student answer on-policy through the rollout engine (multi-
turn with tools: `training.rollout.multiturn` for the reasoning domains, the agentic `RolloutDriver` with
in-process environments for the agentic families), scores the student's own tokens under the teacher of the
prompt's set, and makes one update on Eq. 1 with the advantage replaced per token by
Â_t = sg[log π_teacher(y_t) - log π_θ(y_t)] (group size 1) (`estimator: sampled`), or on that advantage's
expectation over the vocabulary at each sampled position, the exact per-position reverse KL (`estimator:
exact`, the default: a batch of 16 on a CPU cannot average the one-token estimate's noise away as the
report's 1024 do).

The step loop, checkpoints and resume are `training.rl.loop`'s: `train_distill(...)` takes the student, the teachers, the prompt sets and a
`log(metrics, step)` callback, and returns the final metrics."""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field
from torch import nn

from training.dsa_indexer import set_dsa_mode
from training.rl.loop import OnPolicyLoop, StepTimes
from training.rl.losses import exact_reverse_kl_distillation_loss, on_policy_distillation_loss
from training.rl.policy import response_logprobs_all, response_targets, token_logprobs
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
    estimator: Literal["exact", "sampled"] = Field(
        "exact",
        description="exact: the reverse KL over the vocabulary at each sampled position (Eq. 2 in expectation); "
        "sampled: Eq. 2's one-token advantage inside Eq. 1",
    )
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


def latest_owner(train_sets: Mapping[str, Sequence[Task]]) -> dict[str, list[Task]]:
    """Each prompt to the last teacher (in the mapping's order: the chain's) whose training set holds it (by
    task id), and teachers left with none dropped. The stage that trained on a prompt last knows it best; an
    earlier teacher that saw it too (SFT saw every reasoning task's worked solution) would pull the student
    back toward its older answer, undoing the later stage's gain instead of keeping it."""
    owner = {t.id: name for name, tasks in train_sets.items() for t in tasks}
    out = {name: [t for t in tasks if owner[t.id] == name] for name, tasks in train_sets.items()}
    return {name: tasks for name, tasks in out.items() if tasks}


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
            lambda ids, prompts, p: engine.generate(prompts, p), tokenizer, environments, params, max_turns,
            lockstep=True,
        )  # fmt: skip
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
    full: bool = False,
) -> torch.Tensor:
    """[B, T] log π_teacher of every sampled token, each row under the teacher whose set its prompt came from;
    with `full`, [B, T, V]: the teacher's log-softmax over the vocabulary at every response position."""
    out = None
    for name, teacher in teachers.items():
        rows = torch.tensor([i for i, o in enumerate(owner) if o == name], dtype=torch.long)
        if len(rows) == 0:
            continue
        sub = {k: v[rows] for k, v in batch.items()}
        with torch.no_grad():
            got = (
                response_logprobs_all(teacher, sub, temperature)
                if full
                else token_logprobs(teacher, sub, temperature)[0]
            )
        if out is None:
            out = got.new_zeros((len(owner), *got.shape[1:]))
        out[rows] = got
    if out is None:
        raise ValueError(f"distillation: no teacher owns any row of the batch (owners {sorted(set(owner))})")
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


@dataclass
class _DistillOut:
    owner: list[str]
    logp_old: torch.Tensor
    logp_teacher: torch.Tensor
    entropy: torch.Tensor
    stats: Any


class _DistillStage:
    """Distillation's part of the shared loop: prompts from every teacher's set in proportion, one on-policy
    answer each (group size 1), Eq. 2's per-token advantage under the prompt's teacher. No per-run state
    beyond the prompt streams, which are replayed on resume."""

    def __init__(self, loop: OnPolicyLoop, model: nn.Module, tokenizer: Any, teachers: Mapping[str, nn.Module],
                 prompts: Mapping[str, Sequence[Task]], cfg: DistillConfig, suites: Mapping[str, TaskSuite],
                 environments: Mapping[str, Any], heldout_prompts: Mapping[str, Sequence[Task]],
                 heldout_tasks: Sequence[Task], counts: dict[str, int]):  # fmt: skip
        self.model, self.engine, self.tokenizer, self.teachers, self.cfg = (
            model,
            loop.engine,
            tokenizer,
            teachers,
            cfg,
        )
        self.suites, self.environments, self.counts = suites, environments, counts
        self.heldout_prompts, self.heldout_tasks, self.pad_id = heldout_prompts, heldout_tasks, loop.pad_id
        self.streams = {
            name: _Prompts(prompts[name], cfg.seed + i) for i, name in enumerate(sorted(teachers))
        }
        self.owner_of: dict[str, str] = {}

    def evaluate(self, step: int) -> dict[str, float]:
        cfg, model = self.cfg, self.model
        out: dict[str, float] = {}
        model.eval()
        for name, tasks in sorted(self.heldout_prompts.items()):
            scores = teacher_agreement(model, self.teachers[name], self.tokenizer, tasks, cfg.max_new_tokens,
                                       self.pad_id)  # fmt: skip
            out.update({f"{k}/{name}": v for k, v in scores.items()})
        scored = [t for t in self.heldout_tasks if t.domain in self.suites]
        if scored:
            self.engine.sync_weights(model.state_dict(), step)
            out.update(pass_at_1(self.engine, self.tokenizer, scored, self.suites, cfg.max_new_tokens,
                                 cfg.max_turns))  # fmt: skip
        model.train()
        return out

    def prepare(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def _take(self) -> list[Task]:
        batch_tasks: list[Task] = []
        self.owner_of = {}
        for name, n in sorted(self.counts.items()):
            for task in self.streams[name].take(n):
                # teachers' sets may share prompts (SFT's and Reasoning RL's): the id names the teacher
                task = replace(task, id=f"{name}:{task.id}")
                batch_tasks.append(task)
                self.owner_of[task.id] = name
        return batch_tasks

    def skip(self, steps: int) -> None:
        for _ in range(steps):
            self._take()

    def sample(self, step: int) -> list[Trajectory]:
        cfg = self.cfg
        batch_tasks = self._take()
        sampling = SamplingParams(cfg.max_new_tokens, cfg.temperature, seed=cfg.seed * 100_003 + step)
        trajs = sample_student(self.engine, self.tokenizer, batch_tasks, self.suites, self.environments, sampling,
                               cfg.max_turns, f"s{step}-")  # fmt: skip
        return [t for t in trajs if t.status != "env_failure" and sum(t.loss_mask) > 0]

    def loss(self, model: nn.Module, trajs: list[Trajectory], batch: dict[str, torch.Tensor]):
        cfg = self.cfg
        owner = [self.owner_of[t.prompt_id] for t in trajs]
        exact = cfg.estimator == "exact"
        teacher = teacher_logprobs(self.teachers, owner, batch, cfg.temperature, full=exact)
        if exact:
            logp_all = response_logprobs_all(model, batch, cfg.temperature)
            targets = response_targets(batch).unsqueeze(-1)
            logp = logp_all.gather(-1, targets).squeeze(-1)
            logp_teacher = teacher.gather(-1, targets).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1).detach()
            logp_old = logp.detach()  # one update per on-policy batch: θ_old is θ
            loss, stats = exact_reverse_kl_distillation_loss(
                logp_all, teacher, logp_old, batch["logp_infer"], batch["mask"], cfg.beta
            )
        else:
            logp_teacher = teacher
            logp, entropy = token_logprobs(model, batch, cfg.temperature)
            logp_old = logp.detach()  # one update per on-policy batch: θ_old is θ
            loss, stats = on_policy_distillation_loss(
                logp, logp_old, batch["logp_infer"], logp_teacher, batch["mask"], cfg.beta, cfg.eps_low,
                cfg.eps_high,
            )  # fmt: skip
        return loss, _DistillOut(owner, logp_old, logp_teacher, entropy, stats)

    def metrics(
        self, trajs, batch, out: _DistillOut, loss, grad_norm: float, times: StepTimes
    ) -> dict[str, float]:
        metrics = _step_metrics(trajs, out.owner, out.logp_old, out.logp_teacher, batch["mask"], out.entropy,
                                out.stats)  # fmt: skip
        metrics.update({
            "loss": float(loss.detach()), "grad_norm": grad_norm, "rollout_s": times.rollout_s,
            "time/train_s": times.train_s, "step_s": times.step_s(),
        })  # fmt: skip
        return metrics


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
    checkpoint_dir: Path | None = None,
    job: str | None = None,
) -> dict[str, float]:
    """Distil `teachers` into `model` (trained in place) on-policy; returns the last step's metrics and the last
    evaluation (`heldout/...`): per teacher greedy agreement and exact reverse KL on `heldout_prompts`, and
    greedy pass@1 on `heldout_tasks` for the domains with a suite. With `checkpoint_dir`, state is saved every
    `cfg.checkpoint_every` steps and a rerun of the same `job` resumes there (training/rl/loop.py)."""
    missing = sorted(set(teachers) - set(prompts))
    if missing:
        raise ValueError(f"distillation: teacher(s) {missing} have no prompt set; give prompts[name] = tasks")
    suites, environments = dict(suites or {}), dict(environments or {})
    heldout_prompts = {k: list(v)[: cfg.eval_prompts_per_teacher] for k, v in (heldout_prompts or {}).items()}
    counts = batch_counts(cfg.proportions, list(teachers), cfg.prompts_per_step)
    for teacher in teachers.values():
        teacher.eval()
        set_dsa_mode(teacher, "sparse_gather")  # native's top-k attention, faster on CPU (no KV cache here)
        for p in teacher.parameters():
            p.requires_grad_(False)
    loop = OnPolicyLoop(model, tokenizer, cfg, engine, checkpoint_dir, job, "distillation")
    log.info("distillation: teachers %s, prompts per step %s, %d indexer tensors frozen", sorted(teachers),
             counts, loop.frozen)  # fmt: skip
    stage = _DistillStage(loop, model, tokenizer, teachers, prompts, cfg, suites, environments, heldout_prompts,
                          heldout_tasks, counts)  # fmt: skip
    return loop.run(stage, log_metrics, on_sample, 8)


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
