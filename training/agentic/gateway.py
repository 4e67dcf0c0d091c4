"""The TITO gateway: the only path from agentic rollouts to the inference replicas.

Token-in, token-out: a request is token ids, the answer is the exact token ids and log-probs the engine
produced, and every exchange is recorded (rollout id, turn, replica, prompt ids, output ids, log-probs,
policy version) so the trainer works on what the engine sampled, never on re-tokenized text.

Routing: a `Router` (training/agentic/routing.py) picks the replica from the rollout id and the in-flight load,
so all turns of a rollout meet the replica that holds their prefix in its cache.

Fault tolerance: a replica whose request raises a connection-level error (`RolloutServerError`,
`ConnectionError`, `OSError`, `TimeoutError`) is taken out of rotation and the request is retried on another
one. A replica out of rotation is probed (`health(replica_id, engine) -> bool`) at most every
`probe_interval_s`, lazily on the next request or by `check_replicas()`; once healthy it is given the latest
pushed weights again (a restarted server comes back with its start checkpoint) and rejoins the ring. Give
`HttpRolloutEngine` replicas few retries (e.g. `retries=1`): their own backoff delays the failover.

Sampling seeds: the gateway derives each request's seed from (params.seed, rollout id, turn), so the samples
of a group differ although they share params, and a retried request draws the same seed on its new replica.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import requests
import torch

from training.agentic.routing import ConsistentHashRouter, NoReplica, Router, stable_hash
from training.rollout.engine import Generation, RolloutEngine, SamplingParams
from training.rollout.http_engine import RolloutServerError

log = logging.getLogger(__name__)

REPLICA_FAILURES: tuple[type[BaseException], ...] = (
    RolloutServerError,
    ConnectionError,
    OSError,
    TimeoutError,
)


@dataclass(frozen=True)
class GatewayRecord:
    """One generation request as served: what the trainer's tokens and log-probs must equal."""

    rollout_id: str
    turn: int
    replica: str
    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_version: int
    finish_reason: str
    seed: int
    attempts: int  # 1 = served by the first replica tried


def default_health(replica: str, engine: Any) -> bool:
    """An HTTP replica is healthy when `GET /health` answers 200; an in-process one always is."""
    url = getattr(engine, "base_url", None)
    if url is None:
        return True
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def replica_cache_stats(engine: Any) -> dict[str, int] | None:
    """Prefix-cache counters of a replica: `cache_stats()` in process, `/health`'s `prefix_cache` over HTTP."""
    if hasattr(engine, "cache_stats"):
        return engine.cache_stats()
    url = getattr(engine, "base_url", None)
    if url is None:
        return None
    try:
        return requests.get(f"{url}/health", timeout=2).json().get("prefix_cache")
    except (requests.RequestException, ValueError):
        return None


def request_seed(seed: int, rollout_id: str, turn: int) -> int:
    return stable_hash(f"{seed}/{rollout_id}/{turn}") % 2**31


class TitoGateway:
    """Routes, records and retries generation requests over `replicas` (id -> RolloutEngine).

    Thread-safe: rollout workers may call `generate` concurrently; each replica serves one request at a
    time (its own lock), so the in-flight count per replica is its queue length."""

    def __init__(
        self,
        replicas: Mapping[str, RolloutEngine],
        router: Router | None = None,
        health: Callable[[str, Any], bool] = default_health,
        probe_interval_s: float = 1.0,
        log_size: int = 100_000,
        failures: tuple[type[BaseException], ...] = REPLICA_FAILURES,
    ):
        if not replicas:
            raise ValueError("TitoGateway needs at least one replica")
        self.replicas = dict(replicas)
        self.router = router if router is not None else ConsistentHashRouter(self.replicas)
        for replica in self.replicas:
            self.router.add(replica)
        self.health, self.probe_interval_s, self.failures = health, probe_interval_s, failures
        self.log: deque[GatewayRecord] = deque(maxlen=log_size)
        self._lock = threading.Lock()  # guards the counters, the ring and the down set
        self._replica_locks = {r: threading.Lock() for r in self.replicas}
        self._in_flight = dict.fromkeys(self.replicas, 0)
        self._served = dict.fromkeys(self.replicas, 0)
        self._down: dict[str, float] = {}  # replica -> when to probe it next
        self._turns: OrderedDict[str, int] = OrderedDict()  # rollout id -> turns served, bounded like the log
        self._latest: tuple[dict[str, torch.Tensor], int] | None = None
        self.counts = {
            "requests": 0, "retries": 0, "replica_failures": 0, "revivals": 0,
            "later_turns": 0, "same_replica_turns": 0,
        }  # fmt: skip
        self._last_replica: OrderedDict[str, str] = OrderedDict()  # rollout id -> replica of its last turn

    # --- rotation -------------------------------------------------------------------------------------
    def live_replicas(self) -> list[str]:
        with self._lock:
            return [r for r in self.replicas if r not in self._down]

    def _take_out(self, replica: str, error: BaseException) -> None:
        with self._lock:
            self.counts["replica_failures"] += 1
            if replica not in self._down:
                log.warning("replica %s out of rotation: %s: %s", replica, type(error).__name__, error)
                self._down[replica] = time.monotonic() + self.probe_interval_s
                self.router.remove(replica)

    def check_replicas(self, force: bool = False) -> list[str]:
        """Probe the replicas out of rotation whose probe is due (all with `force`); returns those back."""
        now = time.monotonic()
        with self._lock:
            due = [r for r, at in self._down.items() if force or at <= now]
            for r in due:  # one prober per replica: the next probe is not due before this one ends
                self._down[r] = now + self.probe_interval_s
        back = []
        for replica in due:
            if self._revive(replica):
                back.append(replica)
        return back

    def _revive(self, replica: str) -> bool:
        engine = self.replicas[replica]
        try:
            if not self.health(replica, engine):
                return False
            with self._replica_locks[replica]:
                latest = self._latest
                if latest is not None:  # always: a restarted server serves its start checkpoint, whatever
                    engine.sync_weights(*latest)  # version its client remembers
        except self.failures as exc:
            log.info("replica %s still down: %s", replica, exc)
            return False
        with self._lock:
            self._down.pop(replica, None)
            self.router.add(replica)
            self.counts["revivals"] += 1
        log.info("replica %s back in rotation", replica)
        return True

    # --- generation -----------------------------------------------------------------------------------
    def _next_turn(self, rollout_id: str) -> int:
        with self._lock:
            turn = self._turns.pop(rollout_id, 0)
            self._turns[rollout_id] = turn + 1
            while len(self._turns) > (self.log.maxlen or 100_000):
                self._turns.popitem(last=False)
            return turn

    def end_rollout(self, rollout_id: str) -> None:
        """Forget the rollout's turn counter (its records stay in the log)."""
        with self._lock:
            self._turns.pop(rollout_id, None)

    def _pick(self, rollout_id: str, exclude: set[str]) -> str:
        self.check_replicas()
        with self._lock:
            load = {r: n for r, n in self._in_flight.items() if r not in self._down}
            try:
                replica = self.router.route(rollout_id, load)
            except NoReplica:
                replica = None
            if replica is None or replica in exclude:  # tried already in this request: any other live one
                others = [r for r in self.router.replicas if r not in exclude]
                if not others:
                    raise NoReplica(
                        f"no replica left for rollout {rollout_id}: tried {sorted(exclude)}, "
                        f"out of rotation {sorted(self._down)}"
                    )
                replica = min(others, key=lambda r: load.get(r, 0))
            self._in_flight[replica] += 1
            return replica

    def _run(self, replica: str, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One batch on `replica`; releases the in-flight slot `_pick` took for each of its requests."""
        try:
            with self._replica_locks[replica]:
                return self.replicas[replica].generate(prompts, params)
        finally:
            with self._lock:
                self._in_flight[replica] -= len(prompts)

    def generate(
        self, rollout_id: str, prompt_ids: Sequence[int], params: SamplingParams, turn: int | None = None
    ) -> Generation:
        """One turn of `rollout_id`: routed, retried on another replica if one fails, recorded.
        `turn` defaults to the number of turns the gateway has served for this rollout id."""
        turn = self._next_turn(rollout_id) if turn is None else turn
        seed = request_seed(params.seed, rollout_id, turn)
        prompt = [int(t) for t in prompt_ids]
        with self._lock:
            self.counts["requests"] += 1
        tried: set[str] = set()
        while True:
            replica = self._pick(rollout_id, tried)
            tried.add(replica)
            try:
                (out,) = self._run(replica, [prompt], replace(params, seed=seed))
            except self.failures as exc:
                self._take_out(replica, exc)
                with self._lock:
                    self.counts["retries"] += 1
                continue
            self._record(rollout_id, turn, replica, prompt, out, seed, len(tried))
            return out

    def generate_many(
        self, requests_: Sequence[tuple[str, Sequence[int]]], params: SamplingParams
    ) -> list[Generation]:
        """Many (rollout id, prompt ids) at once: routed one by one, then one batch per replica, the replicas
        in parallel. A failed replica's batch is routed again over the others. Answers in request order."""
        todo = []
        for rollout_id, prompt in requests_:
            turn = self._next_turn(rollout_id)
            todo.append((rollout_id, turn, [int(t) for t in prompt]))
        with self._lock:
            self.counts["requests"] += len(todo)
        results: list[Generation | None] = [None] * len(todo)
        tried: list[set[str]] = [set() for _ in todo]
        pending = list(range(len(todo)))
        while pending:
            groups: dict[str, list[int]] = {}
            try:
                for i in pending:
                    replica = self._pick(todo[i][0], tried[i])
                    tried[i].add(replica)
                    groups.setdefault(replica, []).append(i)
            except NoReplica:
                with self._lock:  # release the slots taken before the ring ran out
                    for r, idx in groups.items():
                        self._in_flight[r] -= len(idx)
                raise
            # one seed per batch, from its rollouts (engines that take no row seeds sample the batch with it), and
            # one per row, from its rollout and turn, so a local engine's row does not depend on its batch
            seeds = {
                r: request_seed(params.seed, ",".join(f"{todo[i][0]}:{todo[i][1]}" for i in idx), 0)
                for r, idx in groups.items()
            }

            pending = []
            with ThreadPoolExecutor(max_workers=len(groups)) as pool:
                futures = {
                    r: pool.submit(self._run, r, [todo[i][2] for i in idx], replace(params, seed=seeds[r],
                                   row_seeds=tuple(request_seed(params.seed, *todo[i][:2]) for i in idx)))
                    for r, idx in groups.items()
                }  # fmt: skip
            for replica, future in futures.items():
                idx = groups[replica]
                try:
                    outs = future.result()
                except self.failures as exc:
                    self._take_out(replica, exc)
                    with self._lock:
                        self.counts["retries"] += len(idx)
                    pending += idx
                    continue
                for i, out in zip(idx, outs, strict=True):
                    results[i] = out
                    rollout_id, turn, prompt = todo[i]
                    self._record(rollout_id, turn, replica, prompt, out, seeds[replica], len(tried[i]))
        return [r for r in results if r is not None]

    def generate_batch(
        self, rollout_ids: Sequence[str], prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        """`generate_many` in the (rollout ids, prompts, params) shape of training/agentic/driver.Generate."""
        if len(rollout_ids) != len(prompts):
            raise ValueError(f"{len(rollout_ids)} rollout ids for {len(prompts)} prompts")
        return self.generate_many(list(zip(rollout_ids, prompts, strict=True)), params)

    def _record(
        self,
        rollout_id: str,
        turn: int,
        replica: str,
        prompt: list[int],
        out: Generation,
        seed: int,
        attempts: int,
    ) -> None:
        record = GatewayRecord(
            rollout_id=rollout_id,
            turn=turn,
            replica=replica,
            prompt_ids=tuple(prompt),
            token_ids=tuple(out.token_ids),
            logprobs=tuple(out.logprobs),
            policy_version=out.policy_version,
            finish_reason=out.finish_reason,
            seed=seed,
            attempts=attempts,
        )
        with self._lock:
            self.log.append(record)
            self._served[replica] += 1
            previous = self._last_replica.pop(rollout_id, None)
            self._last_replica[rollout_id] = replica
            while len(self._last_replica) > (self.log.maxlen or 100_000):
                self._last_replica.popitem(last=False)
            if previous is not None:  # a later turn: did it land where the rollout's KV cache is?
                self.counts["later_turns"] += 1
                self.counts["same_replica_turns"] += previous == replica

    def records(self, rollout_id: str) -> list[GatewayRecord]:
        """The recorded turns of one rollout, in the order they were served."""
        with self._lock:
            return [r for r in self.log if r.rollout_id == rollout_id]

    # --- weights and stats ----------------------------------------------------------------------------
    def sync_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> list[str]:
        """Push `version` to every live replica (a replica that fails the push leaves the rotation and gets
        the weights when it comes back). Returns the replicas that now serve `version`."""
        with self._lock:
            self._latest = (state_dict, version)
        synced = []
        for replica in self.live_replicas():
            try:
                with self._replica_locks[replica]:
                    self.replicas[replica].sync_weights(state_dict, version)
                synced.append(replica)
            except self.failures as exc:
                self._take_out(replica, exc)
        return synced

    @property
    def policy_version(self) -> int:
        return self._latest[1] if self._latest is not None else 0

    def stats(self) -> dict[str, Any]:
        """Requests, retries, replica failures and revivals; per replica: in rotation, in flight, served;
        the prefix-cache hit rate summed over the replicas that report one."""
        with self._lock:
            out: dict[str, Any] = dict(self.counts)
            out["replicas"] = {
                r: {"live": r not in self._down, "in_flight": self._in_flight[r], "served": self._served[r]}
                for r in self.replicas
            }
        prompt = hit = 0
        reporting = 0
        for replica, engine in self.replicas.items():
            cache = replica_cache_stats(engine) if replica not in self._down else None
            if cache:
                reporting += 1
                prompt += int(cache.get("prompt_tokens", 0))
                hit += int(cache.get("hit_tokens", 0))
                out["replicas"][replica]["prefix_cache"] = cache
        if reporting:
            out["prefix_cache"] = {
                "prompt_tokens": prompt,
                "hit_tokens": hit,
                "hit_rate": hit / prompt if prompt else 0.0,
            }
        return out
