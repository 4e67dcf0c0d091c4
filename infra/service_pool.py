"""`ServicePool`: how the async RL loop opens episodes on the task services the orchestrator knows.

`open_episode(task)` leases a live service of `task.domain` from the orchestrator (in process or an
`OrchestratorClient`), waiting up to `acquire_wait_s` for one with free capacity, and opens the episode there.
If the service fails to open it (`EnvironmentCrash`: dead, unreachable, sandbox broken) the service is marked
failed (out of rotation until it registers again) and the next live one is tried, up to `max_open_attempts`.

The returned `PooledEpisode` is an `Episode` that releases its lease exactly once: `ok` after a verdict,
`env_failure` when the service crashes mid-episode (the crash is re-raised, so the loop records the sample as
an environment failure with the reason), `cancelled` when closed without a verdict. If the orchestrator had
already closed the lease as a failure (the service missed its heartbeats), `finish` raises EnvironmentCrash
too, so the loop and the orchestrator's stats agree: no sample is lost silently or counted twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from infra.json_http import HttpCallFailed
from infra.task_service import ServiceUnreachable, TaskServiceClient
from training.agentic.orchestrator import Lease, NoServiceAvailable
from training.agentic.protocol import EnvironmentCrash, Episode
from training.tasks.base import Task, Verdict

log = logging.getLogger(__name__)


class LeaseSource(Protocol):
    """What the pool needs from an orchestrator (`Orchestrator` and `OrchestratorClient` both are one)."""

    def acquire(self, domain: str | None = None) -> Lease: ...

    def release(self, lease_id: str, outcome: str, reason: str = "") -> tuple[str, str]: ...

    def mark_failed(self, url: str, reason: str) -> None: ...

    def stats(self) -> dict: ...


class PooledEpisode:
    """An episode on a leased task service; releases the lease once, whatever happens."""

    def __init__(self, pool: ServicePool, lease: Lease, episode: Episode):
        self.pool, self.lease, self.episode = pool, lease, episode
        self.outcome: tuple[str, str] | None = None  # (outcome, reason) as the orchestrator recorded it
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.lease.url

    def _end(self, outcome: str, reason: str = "") -> tuple[str, str]:
        with self._lock:
            if self.outcome is None:
                self.outcome = self.pool.orchestrator.release(self.lease.id, outcome, reason)
                self.pool.count(self.outcome[0])
            return self.outcome

    def _crashed(self, exc: EnvironmentCrash) -> EnvironmentCrash:
        reason = f"{self.lease.domain} on {self.url}: {exc}"
        if isinstance(exc, ServiceUnreachable):
            self.pool.orchestrator.mark_failed(self.url, reason)
        _, recorded = self._end("env_failure", reason)
        return EnvironmentCrash(recorded)

    def tool(self, payload: str) -> str:
        if self.outcome is not None:
            raise EnvironmentCrash(
                f"episode on {self.url} already ended ({self.outcome[0]}: {self.outcome[1]})"
            )
        try:
            return self.episode.tool(payload)
        except EnvironmentCrash as exc:
            raise self._crashed(exc) from exc
        except Exception as exc:  # a bug (a refused call): release the lease, then let it surface
            self._end("env_failure", f"{type(exc).__name__}: {exc}")
            raise

    def finish(self, response: str) -> Verdict:
        if self.outcome is not None:
            raise EnvironmentCrash(
                f"episode on {self.url} already ended ({self.outcome[0]}: {self.outcome[1]})"
            )
        try:
            verdict = self.episode.finish(response)
        except EnvironmentCrash as exc:
            raise self._crashed(exc) from exc
        except Exception as exc:
            self._end("env_failure", f"{type(exc).__name__}: {exc}")
            raise
        outcome, reason = self._end("ok")
        if outcome != "ok":  # the orchestrator closed the lease first (heartbeats missed): one answer only
            raise EnvironmentCrash(reason)
        return verdict

    def close(self) -> None:
        if self.outcome is None:
            self.episode.close()
            self._end("cancelled", "closed before finish")


class ServicePool:
    """Opens episodes on leased task services; `stats` counts what it saw (opened, open_retries, ok,
    env_failure, cancelled) for the loop to log next to the orchestrator's own numbers."""

    def __init__(
        self,
        orchestrator: LeaseSource,
        timeout_s: float = 60.0,
        max_open_attempts: int = 3,
        acquire_wait_s: float = 30.0,
        poll_s: float = 0.05,
    ):
        if max_open_attempts < 1:
            raise ValueError(f"max_open_attempts must be >= 1, got {max_open_attempts}")
        self.orchestrator = orchestrator
        self.timeout_s, self.max_open_attempts = timeout_s, max_open_attempts
        self.acquire_wait_s, self.poll_s = acquire_wait_s, poll_s
        self.stats = {"opened": 0, "open_retries": 0, "ok": 0, "env_failure": 0, "cancelled": 0}
        self._clients: dict[str, TaskServiceClient] = {}
        self._lock = threading.Lock()

    def count(self, key: str) -> None:
        with self._lock:
            self.stats[key] = self.stats.get(key, 0) + 1

    def client(self, url: str) -> TaskServiceClient:
        with self._lock:
            if url not in self._clients:
                self._clients[url] = TaskServiceClient(url, timeout_s=self.timeout_s)
            return self._clients[url]

    def _acquire(self, domain: str, deadline: float) -> Lease:
        while True:
            try:
                return self.orchestrator.acquire(domain)
            except (NoServiceAvailable, HttpCallFailed) as exc:  # none free, or the orchestrator restarting
                if time.monotonic() >= deadline:
                    raise EnvironmentCrash(
                        f"no task service for {domain} within {self.acquire_wait_s:.0f} s: {exc}"
                    ) from exc
                time.sleep(self.poll_s)

    def environments(self, domains: Iterable[str]) -> dict[str, PoolEnvironment]:
        """{domain: Environment} over this pool, for `agentic_rollout(environments=...)`."""
        return {domain: PoolEnvironment(self, domain) for domain in domains}

    def open_episode(self, task: Task) -> PooledEpisode:
        """Open `task` on a live service of its family; EnvironmentCrash (with every attempt's reason) if
        none is available in time or `max_open_attempts` services failed to open it."""
        deadline = time.monotonic() + self.acquire_wait_s
        reasons = []
        for attempt in range(self.max_open_attempts):
            lease = self._acquire(task.domain, deadline)
            try:
                episode = self.client(lease.url).open(task)
            except EnvironmentCrash as exc:
                reason = f"{task.domain} on {lease.url}: {exc}"
                reasons.append(reason)
                self.orchestrator.mark_failed(lease.url, reason)
                self.orchestrator.release(lease.id, "open_failed", reason)
                if attempt + 1 < self.max_open_attempts:
                    self.count("open_retries")
                log.warning("could not open task %s (attempt %d): %s", task.id, attempt + 1, reason)
                continue
            except Exception:
                self.orchestrator.release(lease.id, "open_failed", "refused")
                raise
            self.count("opened")
            return PooledEpisode(self, lease, episode)
        raise EnvironmentCrash(
            f"task {task.id}: {self.max_open_attempts} service(s) failed to open it: " + " | ".join(reasons)
        )


class PoolEnvironment:
    """One family's `Environment` backed by the pool, for code that takes `{domain: Environment}` (e.g.
    training/agentic/rollout.py's `agentic_rollout`). `version` joins the versions of its live services."""

    def __init__(self, pool: ServicePool, domain: str):
        self.pool, self.domain = pool, domain

    @property
    def version(self) -> str:
        services = self.pool.orchestrator.stats()["services"]
        versions = sorted({s["version"] for s in services if s["domain"] == self.domain and s["live"]})
        return "+".join(versions) or "none-live"

    def open(self, task: Task) -> PooledEpisode:
        if task.domain != self.domain:
            raise ValueError(f"task {task.id} is a {task.domain!r} task, not {self.domain!r}")
        return self.pool.open_episode(task)


def orchestrated_environments(
    orchestrator_url: str,
    domains: Sequence[str],
    timeout_s: float = 60.0,
    acquire_wait_s: float = 30.0,
    max_open_attempts: int = 3,
) -> dict[str, PoolEnvironment]:
    """{domain: Environment} whose episodes run on the task services registered with the orchestrator at
    `orchestrator_url`: the `module:function` a rollout worker names to use task services
    (`infra.service_pool:orchestrated_environments`, kwargs as plain data)."""
    from infra.orchestrator_server import OrchestratorClient

    pool = ServicePool(
        OrchestratorClient(orchestrator_url),
        timeout_s=timeout_s,
        max_open_attempts=max_open_attempts,
        acquire_wait_s=acquire_wait_s,
    )
    return pool.environments(domains)


def orchestrator_domain_picker(orchestrator_url: str) -> Callable[[], str | None]:
    """The family the orchestrator wants the next rollout group in (its ratios), for a rollout worker's
    `domain_picker`; None when no family can take an episode now."""
    from infra.orchestrator_server import OrchestratorClient

    return OrchestratorClient(orchestrator_url).next_task_domain
