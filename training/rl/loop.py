"""The on-policy step loop Reasoning RL, General RL and on-policy distillation share, with periodic atomic
checkpoints and resume.

One step = push the trainer's weights to the rollout engine (fully on-policy: the engine samples θ_old), let
the stage sample and score its prompts, build the response batch, let the stage compute its loss, one clipped
AdamW step. Held-out evaluation every `eval_every` steps and at the end. What differs between the stages is a
`Stage`: how it picks prompts, samples and scores them, which loss, which metrics, which held-out evaluation,
and any per-run state (Reasoning RL's filtered train set, General RL's judge counts).

Checkpoints (`training.checkpoint`'s atomic format under `checkpoint_dir`) hold the model, the optimizer, the
RNG states, the step, the last and the step-0 held-out evaluation, the stage's per-run state and the job's
fingerprint. A rerun with the same `checkpoint_dir` resumes after the newest one: the stage's prompt stream is
replayed to the step (every step's sampling seed depends only on the step), so on CPU it reaches the weights
an uninterrupted run reaches, bit for bit. A checkpoint written by a different job (another fingerprint) is
refused, never resumed: the run dir is named by `training.job.job_key` over config, parent and inputs, and
the fingerprint checks the same inside the run."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from training.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    load_model_state,
    save_checkpoint,
    save_model_state,
)
from training.dsa_indexer import current_dsa_mode, set_dsa_mode
from training.rl.losses import group_advantages, grpo_icepop_loss
from training.rl.policy import freeze_indexer, response_batch, token_logprobs
from training.rollout.engine import LocalRolloutEngine, RolloutEngine, engine_dtype
from training.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)
Log = Callable[[dict[str, float], int], None]


class ModelOptimizerState:
    """Model and optimizer as `training.checkpoint` saves them (its CheckpointEngine, one process)."""

    rank, world_size = 0, 1

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def save_state(self, directory: Path) -> None:
        save_model_state(self.model, directory / "model.safetensors")
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def load_state(self, directory: Path) -> None:
        load_model_state(self.model, directory / "model.safetensors")
        self.optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=False))

    def barrier(self) -> None:
        pass


def resume_step(checkpoint_dir: Path | None) -> int:
    """The step a run with this checkpoint dir resumes after (0 = from the start)."""
    found = latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
    return int(found.name.removeprefix("step_")) if found else 0


def saved_trainer_state(checkpoint_dir: Path | None) -> dict[str, Any]:
    """The trainer state of the newest complete checkpoint ({} if none), without loading any weights."""
    found = latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
    return json.loads((found / "trainer_state.json").read_text()) if found else {}


def input_digest(path: str | Path | None) -> str | None:
    """sha256 of a file's bytes, or of a directory's file names and bytes (`training.job.tree_digest`)."""
    from training.job import tree_digest

    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        return tree_digest(path)
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_same_job(saved: dict[str, Any], job: str | None, where: Path) -> None:
    """Refuse to resume a checkpoint another job wrote (its config, parent or inputs differ)."""
    if job is not None and saved.get("job") not in (None, job):
        raise RuntimeError(
            f"{where} was written by a different job (fingerprint {saved['job']}, this job {job}): its "
            "config, parent or inputs differ; refusing to resume it. Give this job its own run dir "
            "(training.job.job_key) or delete that one."
        )


@dataclass
class StepTimes:
    """When the step started, and how long its rollouts (with scoring) and its update took."""

    t0: float
    rollout_s: float
    train_s: float

    def step_s(self) -> float:
        return time.perf_counter() - self.t0


class Stage(Protocol):
    """What one on-policy stage supplies to `run_on_policy_loop`."""

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out evaluation of the current policy (the engine holds its weights); logged as `heldout/...`."""
        ...

    def prepare(self) -> None:
        """Before step 1 of a fresh run, after the step-0 evaluation (e.g. Reasoning RL's difficulty filter)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Per-run state (JSON) saved with every checkpoint."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def skip(self, steps: int) -> None:
        """Advance the prompt stream over `steps` steps already trained (a resumed run)."""
        ...

    def sample(self, step: int) -> list[Trajectory] | None:
        """This step's prompts, sampled through the engine and scored (None or [] = skip the step)."""
        ...

    def loss(
        self, model: nn.Module, trajs: list[Trajectory], batch: dict[str, torch.Tensor]
    ) -> tuple[Any, Any]:
        """(loss, whatever `metrics` needs) on the response batch."""
        ...

    def metrics(self, trajs: list[Trajectory], batch: dict[str, torch.Tensor], out: Any,
                loss: torch.Tensor, grad_norm: float, times: StepTimes) -> dict[str, float]:  # fmt: skip
        """The step's metrics (MLflow names are the stage's)."""
        ...


class OnPolicyLoop:
    """The trainer side of one run: optimizer, rollout engine, checkpoint and resume. Built before the stage
    (the stage samples through `loop.engine`), then `run(stage, ...)`."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        cfg: Any,
        engine: RolloutEngine | None = None,
        checkpoint_dir: Path | None = None,
        job: str | None = None,
        what: str = "RL",
    ):
        self.model, self.cfg, self.what = model, cfg, what
        self.checkpoint_dir, self.job = (Path(checkpoint_dir) if checkpoint_dir else None), job
        torch.manual_seed(cfg.seed)
        self.pad_id = tokenizer.pad_token_id
        model.train()
        self.frozen = freeze_indexer(model)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate, weight_decay=0.0)
        self.state = ModelOptimizerState(model, self.optimizer)
        self.saved = latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
        self.resumed: dict[str, Any] = {}
        if self.saved:
            check_same_job(json.loads((self.saved / "trainer_state.json").read_text()), job, self.saved)
            self.resumed = load_checkpoint(self.saved, self.state)[0]  # model, optimizer and RNG states
        dtype = engine_dtype(cfg.engine_dtype, next(model.parameters()).device)
        self.engine = engine or LocalRolloutEngine(model, dtype=dtype, pad_id=self.pad_id)
        self.mode = current_dsa_mode(model)
        set_dsa_mode(
            model, "sparse_gather"
        )  # the trainer's forward: native's values and gradients, faster on CPU
        self.start = int(self.resumed.get("step", 0))
        self.engine.sync_weights(model.state_dict(), self.start)
        self.initial_eval: dict[str, float] = dict(self.resumed.get("initial", {}))

    def run(
        self,
        stage: Stage,
        log_metrics: Log,
        on_sample: Callable[[list[Trajectory], int], None] | None = None,
        samples_shown: int = 8,
    ) -> dict[str, float]:
        """Steps `start + 1 .. cfg.steps`; returns the last step's metrics and the last held-out evaluation."""
        cfg, model, engine = self.cfg, self.model, self.engine

        def evaluate(step: int) -> dict[str, float]:
            out = stage.evaluate(step)
            log_metrics({f"heldout/{k}": v for k, v in out.items()}, step)
            return out

        if self.resumed:
            log.info("%s: resumed after step %d from %s", self.what, self.start, self.saved)
            final = self.resumed["heldout"]
            stage.load_state_dict(self.resumed.get("stage", self.resumed))  # older checkpoints: top level
            stage.skip(self.start)  # the prompts the saved steps consumed
        else:
            final = self.initial_eval = evaluate(0)
            stage.prepare()
        metrics: dict[str, float] = {}
        for step in range(self.start + 1, cfg.steps + 1):
            t0 = time.perf_counter()
            engine.sync_weights(model.state_dict(), step - 1)  # fully on-policy: the engine samples θ_old
            trajs = stage.sample(step)
            if not trajs:
                log.warning("%s step %d: no trajectory to train on; skipped", self.what, step)
                continue
            t_rollout = time.perf_counter() - t0
            batch = response_batch(trajs, self.pad_id)
            t1 = time.perf_counter()
            loss, out = stage.loss(model, trajs, batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip))
            self.optimizer.step()
            times = StepTimes(t0, t_rollout, time.perf_counter() - t1)
            metrics = stage.metrics(trajs, batch, out, loss, grad_norm, times)
            log_metrics(metrics, step)
            if on_sample is not None and step in (1, cfg.steps):
                on_sample(trajs[:samples_shown], step)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                engine.sync_weights(model.state_dict(), step)
                final = evaluate(step)
            if (
                self.checkpoint_dir
                and cfg.checkpoint_every
                and step % cfg.checkpoint_every == 0
                and step < cfg.steps
            ):
                trainer_state = {"step": step, "heldout": final, "initial": self.initial_eval, "job": self.job,
                                 "stage": stage.state_dict()}  # fmt: skip
                save_checkpoint(self.checkpoint_dir, step, self.state, trainer_state, {})
        set_dsa_mode(model, self.mode)
        return {**metrics, **{f"heldout/{k}": v for k, v in final.items()}}


@dataclass
class GRPOOut:
    """What the GRPO + IcePop loss leaves for the step metrics."""

    rewards: torch.Tensor  # [prompts, group]
    stats: Any
    entropy: torch.Tensor


def grpo_loss(
    model: nn.Module, trajs: list[Trajectory], batch: dict[str, torch.Tensor], group_size: int, cfg: Any
) -> tuple[torch.Tensor, GRPOOut]:
    """Eq. 1 (GRPO with IcePop, no KL) on groups of `group_size` samples per prompt, rewards normalised per
    group; θ_old is the trainer's own weights before the update: one update per on-policy batch, so its
    log-probs are this forward's, detached (a second forward would give the same bits)."""
    rewards = torch.tensor([t.reward for t in trajs]).view(-1, group_size)
    adv = group_advantages(rewards).flatten()
    logp, entropy = token_logprobs(model, batch, cfg.temperature)
    logp_old = logp.detach()
    loss, stats = grpo_icepop_loss(
        logp, logp_old, batch["logp_infer"], adv, batch["mask"], cfg.beta, cfg.eps_low, cfg.eps_high
    )
    return loss, GRPOOut(rewards, stats, entropy)


def grpo_metrics(out: GRPOOut, mask: torch.Tensor) -> dict[str, float]:
    """IcePop and clipping statistics, entropy and the share of groups without signal."""
    s = out.stats
    return {
        "rho/mean": s.rho_mean, "rho/min": s.rho_min, "rho/max": s.rho_max,
        "icepop/masked_fraction": s.masked_fraction,
        "clip_fraction": s.clip_fraction,
        "entropy": float((out.entropy * mask).sum() / mask.sum().clamp_min(1)),
        "zero_advantage_groups": float((out.rewards.std(dim=1) == 0).float().mean()),
    }  # fmt: skip
