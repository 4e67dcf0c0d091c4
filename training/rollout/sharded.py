"""A rollout engine whose large batches are split by rows across this process and spawned worker processes.

Why: on CPU a decode step of a small policy is per-op overhead more than FLOPs. Measured on the tiny SFT
checkpoint (2 cores): in fp32 a second torch thread buys ~1.02x at 64 rows, two 1-thread processes with
half the rows each 1.4-1.7x; in bf16 (the rollout dtype) 128 rows took 2.68 s in one 2-thread process and
2.08 s split over two (1.29x). Evaluation-sized calls (the difficulty filter, held-out and test scoring:
100+ rows) gain; a training step's 16 rows stay in this process (`min_rows`).

Each worker holds a copy of the engine's weights in the engine's dtype (the same numbers), re-sent when the
engine's policy version changes. Rows keep their order. Sampling: with `row_seeds` every row draws from its
own generator, so the tokens do not depend on the split; with one batch seed, shard k samples with
seed + k (deterministic for a given worker count, but not the draws of an unsplit call).
"""

from __future__ import annotations

import contextlib
import io
import logging
import multiprocessing
from dataclasses import replace
from typing import Any

import torch

from training.rollout.engine import Generation, LocalRolloutEngine, SamplingParams

log = logging.getLogger(__name__)


def _worker(conn, config, dsa_mode: str, dtype: torch.dtype, pad_id: int, threads: int) -> None:
    from transformers import GlmMoeDsaForCausalLM

    from training.dsa_indexer import set_dsa_mode

    torch.set_num_threads(threads)
    engine = None
    while True:
        msg = conn.recv()
        if msg is None:
            return
        kind, payload, version = msg
        try:
            if kind == "weights":
                state = torch.load(io.BytesIO(payload), weights_only=True)
                if engine is None:  # built on CPU, not meta: non-persistent buffers (RoPE) are computed
                    model = GlmMoeDsaForCausalLM(config)
                    model.load_state_dict(state)
                    if dsa_mode != "native":
                        set_dsa_mode(model, dsa_mode)
                    engine = LocalRolloutEngine(model, dtype=dtype, pad_id=pad_id)
                engine.sync_weights(state, version)
                conn.send(("ok", None))
            else:
                prompts, params = payload
                conn.send(("ok", engine.generate(prompts, params)))
        except Exception as exc:  # sent back: the caller raises it with the worker's message
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class ShardedRolloutEngine:
    """`engine` plus `workers` spawned processes; `generate` of at least `min_rows` prompts splits the rows
    evenly (this process takes the first share), each share on CPUs / (workers + 1) torch threads. Use as a
    context manager, or `close()`."""

    def __init__(self, engine: LocalRolloutEngine, workers: int = 1, min_rows: int = 32):
        if workers < 0 or min_rows < 2:
            raise ValueError(f"workers {workers} must be >= 0 and min_rows {min_rows} >= 2")
        self.engine, self.workers, self.min_rows = engine, workers, min_rows
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._synced: int | None = None

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def sync_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.engine.sync_weights(state_dict, version)  # workers follow at their next call

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.workers == 0 or len(prompts) < self.min_rows:
            return self.engine.generate(prompts, params)
        self._start()
        self._sync()
        shards = self.workers + 1
        bounds = [len(prompts) * k // shards for k in range(shards + 1)]
        parts = [
            (prompts[a:b], self._shard_params(params, k, a, b))
            for k, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))
        ]
        for conn, part in zip(self._conns, parts[1:], strict=True):
            conn.send(("generate", part, self.engine.policy_version))
        threads = torch.get_num_threads()
        torch.set_num_threads(self._threads())  # the workers take the other cores
        try:
            mine = self.engine.generate(*parts[0])
        except Exception:
            with contextlib.suppress(RuntimeError):
                self._gather()  # read the workers' replies, or the next call would take them for its own
            raise
        finally:
            torch.set_num_threads(threads)
        return [g for share in [mine, *self._gather()] for g in share]

    @staticmethod
    def _shard_params(params: SamplingParams, k: int, a: int, b: int) -> SamplingParams:
        if params.row_seeds:
            return replace(params, row_seeds=params.row_seeds[a:b])
        return replace(params, seed=params.seed + k)

    def _threads(self) -> int:
        from infra.cpu import cpus

        return max(1, cpus() // (self.workers + 1))

    def _start(self) -> None:
        if self._procs:
            return
        ctx = multiprocessing.get_context("spawn")
        model = self.engine.model
        dsa_mode = getattr(
            next((m for m in model.modules() if hasattr(m, "dsa_mode")), None), "dsa_mode", "native"
        )
        for _ in range(self.workers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                args=(child, model.config, dsa_mode, self.engine.dtype, self.engine.pad_id, self._threads()),
                daemon=True,
            )  # fmt: skip
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        log.info("sharded rollouts: %d worker process(es) started", self.workers)

    def _sync(self) -> None:
        if self._synced == self.engine.policy_version:
            return
        buf = io.BytesIO()
        torch.save(self.engine.model.state_dict(), buf)
        for conn in self._conns:
            conn.send(("weights", buf.getvalue(), self.engine.policy_version))
        self._gather()
        self._synced = self.engine.policy_version

    def _gather(self) -> list:
        """Every worker's reply, in worker order; all are read before the first failure is raised, so no
        reply is left in a pipe for the next call."""
        values, failure = [], None
        for k, conn in enumerate(self._conns, start=1):
            try:
                status, value = conn.recv()
            except EOFError:
                failure = failure or f"worker {k} died (exit {self._exitcode(k)})"
                continue
            if status != "ok":
                failure = failure or f"worker {k} failed: {value}"
            values.append(value)
        if failure:
            if "died" in failure:
                self.close()
            raise RuntimeError(f"sharded rollouts: {failure}")
        return values

    def _exitcode(self, k: int):
        return self._procs[k - 1].exitcode if len(self._procs) >= k else None

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self._procs, self._conns, self._synced = [], [], None

    def __enter__(self) -> ShardedRolloutEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def close_engine(engine: object) -> None:
    """Stop a sharded engine's workers; any other engine is left as it is."""
    if isinstance(engine, ShardedRolloutEngine):
        engine.close()


def eval_workers(workers: int | str) -> int:
    """Worker processes for evaluation-sized rollouts: `auto` = one where there are 2+ CPUs (the report's and
    the filter's measured case), else a number as given."""
    from infra.cpu import cpus

    return (1 if cpus() >= 2 else 0) if workers == "auto" else int(workers)
