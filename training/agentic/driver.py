"""Many multi-turn rollouts in flight at once: generation is batched over every rollout that is waiting for
the model, environment calls (open, tool, finish) run on a thread pool, so a slow environment holds only its
own rollout. Token-in, token-out as in training/rollout/multiturn.py: the engine's ids and log-probs are
kept as returned, observations are tokenized on their own and masked from the loss, and each generated
segment records the policy version that produced it.

`RolloutDriver` is used two ways: `run(tasks)` drives a finite set to the end (held-out evaluation), and the
async rollout worker calls `start_group` / `poll` forever, pausing new generation while the trainer is busy
(partial rollouts: paused rollouts keep their tokens, log-probs and versions and resume with new weights)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from training.agentic.gateway import request_seed
from training.agentic.protocol import Environment, EnvironmentCrash, Episode
from training.rollout.engine import Generation, SamplingParams
from training.rollout.multiturn import TOOL_CALL, observation_ids, prompt_ids
from training.rollout.trajectory import Trajectory
from training.tasks.base import Task, Verdict
from training.tokenizer import END_OF_TURN, EOS

Generate = Callable[[list[str], list[list[int]], SamplingParams], list[Generation]]
"""(rollout ids, prompts, params) -> generations: an engine, or the TITO gateway that routes by rollout id."""


@dataclass
class _Live:
    traj: Trajectory
    task: Task
    episode: Episode | None = None
    turn: int = 0
    started: float = 0.0
    env_s: float = 0.0
    gen_s: float = 0.0


class RolloutDriver:
    def __init__(
        self,
        generate: Generate,
        tokenizer: Any,
        environments: Mapping[str, Environment],
        params: SamplingParams,
        max_turns: int,
        max_batch: int = 32,
        env_threads: int = 16,
        batch_wait_s: float = 0.0,
        lockstep: bool = False,
    ):
        stop = tuple(tokenizer.convert_tokens_to_ids(t) for t in (END_OF_TURN, EOS))
        self.generate, self.tokenizer, self.envs = generate, tokenizer, dict(environments)
        self.params, self.max_turns, self.max_batch = (
            replace(params, stop_token_ids=stop),
            max_turns,
            max_batch,
        )
        self.pool = ThreadPoolExecutor(env_threads, thread_name_prefix="env")
        self.waiting: list[_Live] = []  # waiting for the model
        self.batch_wait_s, self._waiting_since = batch_wait_s, 0.0
        # lockstep: generate only once every environment call is back, the waiting rollouts in id order, so the
        # batches (and the float rounding of their forward passes) are the same in every run
        self.lockstep = lockstep
        self.env_calls: dict[Future, tuple[str, _Live]] = {}
        self._closing: dict[Future, _Live] = {}  # episode closes queued on the pool
        self.finished: list[Trajectory] = []
        self.paused = False
        self._seed = itertools.count(params.seed * 1_000_003)
        self.generated_tokens = 0
        self.generate_s = 0.0  # wall time inside the engine (the compute the rollouts need)

    # -- feeding -----------------------------------------------------------------------------------------
    def start_group(self, task: Task, group_size: int, group_id: str) -> None:
        if task.domain not in self.envs:
            raise KeyError(f"no environment for domain {task.domain!r}; have {sorted(self.envs)}")
        ids = prompt_ids(self.tokenizer, task)
        for k in range(group_size):
            traj = Trajectory(
                id=f"{group_id}-{k}",
                task=task.domain,
                prompt_id=task.id,
                group_id=group_id,
                messages=[{"role": "user", "content": task.prompt}],
                prompt_ids=list(ids),
            )
            live = _Live(traj, task, started=time.perf_counter())
            self._submit("open", live, self.envs[task.domain].open, task)

    def opening(self) -> int:
        """Episodes whose environment is still being opened."""
        return sum(kind == "open" for kind, _ in self.env_calls.values())

    def in_flight(self) -> int:
        return len(self.waiting) + len(self.env_calls)

    # -- running -----------------------------------------------------------------------------------------
    def poll(self, timeout: float = 0.05) -> list[Trajectory]:
        """One step: a batched generation for the rollouts waiting on the model (unless paused), else wait
        up to `timeout` for environment calls; returns the trajectories finished since the last poll."""
        self._collect(block=False)
        if self.waiting and not self.paused and self._batch_ready():
            self._generate_batch()
        elif self.env_calls:
            if self.waiting and not self.paused and not self.lockstep:  # no longer than the batching window
                timeout = min(
                    timeout, max(0.0, self._waiting_since + self.batch_wait_s - time.perf_counter())
                )
            self._collect(block=True, timeout=timeout)
        elif timeout:
            time.sleep(min(timeout, 0.01))
        done, self.finished = self.finished, []
        return done

    def run(self, tasks: Sequence[Task], group_size: int, prefix: str = "eval") -> list[Trajectory]:
        for i, task in enumerate(tasks):
            self.start_group(task, group_size, f"{prefix}{i}")
        out: list[Trajectory] = []
        while self.in_flight():
            out += self.poll(timeout=0.5)
        return out + self.poll(timeout=0)

    def close(self) -> None:
        for _, live in self.env_calls.values():
            self._close_episode(live)
        for live in self.waiting:
            self._close_episode(live)
        self.pool.shutdown(wait=False, cancel_futures=True)
        # a close still queued was cancelled with the rest: run it here (an episode holds a dir, a sandbox)
        for fut, live in list(self._closing.items()):
            if fut.cancelled():
                self._close_episode(live)
        for fut, (kind, _) in self.env_calls.items():
            if kind == "open" and not fut.cancelled():  # still opening: close the episode once it is open
                fut.add_done_callback(_close_opened)

    # -- internals -----------------------------------------------------------------------------------------
    def _enqueue(self, live: _Live) -> None:
        if not self.waiting:
            self._waiting_since = time.perf_counter()
        self.waiting.append(live)

    def _batch_ready(self) -> bool:
        """Generate now, or wait a moment for more rollouts to come back from their environments: one batched
        call is much cheaper than several small ones (an engine without continuous batching)."""
        if self.lockstep:
            return not self.env_calls
        if len(self.waiting) >= self.max_batch or not self.env_calls:
            return True
        return time.perf_counter() - self._waiting_since >= self.batch_wait_s

    def _submit(self, kind: str, live: _Live, fn: Callable, *args: Any) -> None:
        def timed() -> tuple[Any, float]:
            t0 = time.perf_counter()
            return fn(*args), time.perf_counter() - t0

        self.env_calls[self.pool.submit(timed)] = (kind, live)

    def _collect(self, block: bool, timeout: float = 0.0) -> None:
        if not self.env_calls:
            return
        done = [f for f in self.env_calls if f.done()]
        if not done and block:
            done = list(wait(list(self.env_calls), timeout=timeout, return_when=FIRST_COMPLETED).done)
        for fut in done:
            kind, live = self.env_calls.pop(fut)
            try:
                value, seconds = fut.result()
            except EnvironmentCrash as exc:
                self._fail(live, f"{kind}: {exc}")
                continue
            except Exception as exc:  # a bug in a task's code is the environment's failure, not the policy's
                self._fail(live, f"{kind}: {type(exc).__name__}: {exc}")
                continue
            live.env_s += seconds
            if kind == "open":
                live.episode = value
                self._enqueue(live)
            elif kind == "tool":
                live.traj.messages.append({"role": "tool", "content": value})
                live.traj.add_segment(observation_ids(self.tokenizer, value), None, None)
                self._enqueue(live)
            else:
                self._finish(live, value)

    def _generate_batch(self) -> None:
        if self.lockstep:
            self.waiting.sort(key=lambda live: live.traj.id)
        batch, self.waiting = self.waiting[: self.max_batch], self.waiting[self.max_batch :]
        self._waiting_since = 0.0  # the rest waited already: next poll may generate them at once
        # a seed per (rollout, turn): which rollouts share a batch depends on when their environments answer
        params = replace(
            self.params,
            seed=next(self._seed),
            row_seeds=tuple(request_seed(self.params.seed, b.traj.id, b.turn) for b in batch),
        )
        t0 = time.perf_counter()
        outs = self.generate([b.traj.id for b in batch], [b.traj.token_ids for b in batch], params)
        seconds = time.perf_counter() - t0
        self.generate_s += seconds
        for live, out in zip(batch, outs, strict=True):
            live.gen_s += seconds
            self.generated_tokens += len(out.token_ids)
            traj = live.traj
            traj.add_segment(out.token_ids, out.logprobs, out.policy_version)
            text = self.tokenizer.decode(out.token_ids)
            traj.messages.append({"role": "assistant", "content": text})
            live.turn += 1
            call = TOOL_CALL.search(text)
            if out.finish_reason == "length":
                traj.status, traj.reason = (
                    "truncated",
                    f"no end of turn in {self.params.max_new_tokens} tokens",
                )
            elif call and live.turn < self.max_turns:
                self._submit("tool", live, live.episode.tool, call.group(1))
                continue
            response = "\n".join(m["content"] for m in traj.messages if m["role"] == "assistant")
            self._submit("finish", live, live.episode.finish, response)

    def _finish(self, live: _Live, verdict: Verdict) -> None:
        traj = live.traj
        traj.reward, traj.reward_components = verdict.reward, verdict.components()
        if traj.status == "ok":
            traj.reason = verdict.reason
        fut = self.pool.submit(self._close_episode, live)
        self._closing[fut] = live
        fut.add_done_callback(
            lambda f: f.cancelled() or self._closing.pop(f, None)
        )  # cancelled: close() runs it
        self._done(live)

    def _fail(self, live: _Live, reason: str) -> None:
        live.traj.status, live.traj.reason, live.traj.reward = "env_failure", reason[:300], 0.0
        self._close_episode(live)
        self._done(live)

    def _done(self, live: _Live) -> None:
        live.traj.timings = {
            "generate_s": live.gen_s,
            "environment_s": live.env_s,
            "wall_s": time.perf_counter() - live.started,
        }
        self.finished.append(live.traj)

    @staticmethod
    def _close_episode(live: _Live) -> None:
        if live.episode is not None:
            try:
                live.episode.close()
            except Exception:  # closing is best effort; the episode is over either way
                pass


def _close_opened(fut: Future) -> None:
    if not fut.cancelled() and fut.exception() is None:
        episode, _ = fut.result()
        try:
            episode.close()
        except Exception:  # best effort, as in RolloutDriver._close_episode
            pass
