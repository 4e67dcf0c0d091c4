"""The multi-task rollout orchestrator: which task family the next rollout comes from, and which task service
runs it.

Task services (one agentic family each, infra/task_service.py) register and send heartbeats. The async RL loop
asks `next_task_domain()` for the family whose share of started episodes is furthest below its ratio, then
`acquire(domain)` for a lease on the live service of that family with the fewest episodes in flight (within the
family's concurrency cap), and `release(lease, outcome)` when the episode ends. Every lease is released exactly
once, so `started == finished + env_failures + cancelled + in_flight` holds per family at all times.

Fault tolerance: a service whose last heartbeat is older than `heartbeat_timeout_s` is reaped (taken out of
rotation) and its open leases are closed as environment failures; a late `release` of such a lease returns the
recorded outcome instead of counting again. `mark_failed(url)` takes a service out at once (a caller saw it
die). A service out of rotation gets `False` from `heartbeat` and comes back by registering again, as a
replacement process does. Plain Python with an injectable clock; infra/orchestrator_server.py puts HTTP on it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

log = logging.getLogger(__name__)

Outcome = Literal["ok", "env_failure", "cancelled", "open_failed"]
OUTCOMES: tuple[str, ...] = ("ok", "env_failure", "cancelled", "open_failed")


class NoServiceAvailable(LookupError):
    """No live service of the family has free capacity right now (try again later or another family)."""


@dataclass(frozen=True)
class Lease:
    """The right to run one episode on one service; released exactly once."""

    id: str
    domain: str
    url: str


@dataclass
class ServiceRecord:
    domain: str
    url: str
    version: str
    last_heartbeat: float
    live: bool = True
    down_reason: str = ""  # why it is out of rotation
    open_leases: set[str] = field(default_factory=set)
    served: int = 0  # leases released (any outcome) since it first registered
    registrations: int = 1


@dataclass
class DomainCounts:
    started: int = 0
    finished: int = 0  # ended with a verdict (any reward)
    env_failures: int = 0
    cancelled: int = 0  # closed without a verdict by the caller (a stopped straggler)
    open_failures: int = 0  # the service failed to open the episode; the caller retried elsewhere
    first_started_at: float | None = None


class Orchestrator:
    """Per-family ratios and concurrency caps over registered task services; thread-safe.

    `ratios`: family -> weight (normalised; a family with weight 0 is never picked by `next_task_domain`).
    `max_concurrency`: family -> cap on episodes in flight over all its services (absent: no cap).
    `heartbeat_timeout_s`: a service silent for longer is taken out of rotation by `reap`.
    """

    def __init__(
        self,
        ratios: dict[str, float],
        max_concurrency: dict[str, int] | None = None,
        heartbeat_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not ratios:
            raise ValueError("ratios: give at least one task family, e.g. {'terminal': 1.0}")
        bad = {d: r for d, r in ratios.items() if not isinstance(r, int | float) or r < 0}
        if bad or sum(ratios.values()) <= 0:
            raise ValueError(f"ratios: need non-negative weights with a positive sum, got {ratios}")
        max_concurrency = dict(max_concurrency or {})
        unknown = sorted(set(max_concurrency) - set(ratios))
        if unknown:
            raise ValueError(f"max_concurrency: families {unknown} have no ratio; known: {sorted(ratios)}")
        bad = {d: c for d, c in max_concurrency.items() if not isinstance(c, int) or c < 1}
        if bad:
            raise ValueError(f"max_concurrency: caps must be integers >= 1, got {bad}")
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {heartbeat_timeout_s}")
        total = float(sum(ratios.values()))
        self.ratios = {d: r / total for d, r in ratios.items()}
        self.max_concurrency = max_concurrency
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.clock = clock
        self.services: dict[str, ServiceRecord] = {}
        self.counts = {d: DomainCounts() for d in ratios}
        self._leases: dict[str, Lease] = {}
        self._closed: dict[str, tuple[str, str]] = {}  # lease id -> (outcome, reason) once released
        self._orphans: dict[str, ServiceRecord] = {}  # open leases of deregistered services
        self._ids = itertools.count(1)
        self._lock = threading.RLock()

    # --- services -------------------------------------------------------------------------------------------

    def register(self, domain: str, url: str, version: str) -> None:
        """Put a service in rotation (again); idempotent, so a service may re-register at any time."""
        if domain not in self.ratios:
            raise ValueError(
                f"domain {domain!r} has no ratio in this orchestrator; known: {sorted(self.ratios)}"
            )
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url {url!r} must be an http(s) URL")
        with self._lock:
            now = self.clock()
            record = self.services.get(url)
            if record is None:
                self.services[url] = ServiceRecord(domain, url, version, now)
                log.info("task service %s (%s %s) registered", url, domain, version)
                return
            if record.domain != domain:
                raise ValueError(f"url {url} is registered for {record.domain!r}, not {domain!r}")
            if not record.live:
                record.registrations += 1
                log.info("task service %s (%s %s) is back in rotation", url, domain, version)
            record.version, record.last_heartbeat, record.live, record.down_reason = version, now, True, ""

    def heartbeat(self, url: str) -> bool:
        """Record a heartbeat; False if the service is unknown or out of rotation (it should register)."""
        with self._lock:
            record = self.services.get(url)
            if record is None or not record.live:
                return False
            record.last_heartbeat = self.clock()
            return True

    def deregister(self, url: str) -> None:
        """Take a service out of rotation for good (a clean shutdown); its open leases stay the callers'."""
        with self._lock:
            record = self.services.pop(url, None)
            if record is not None:
                log.info("task service %s deregistered", url)
                for lease_id in record.open_leases:  # callers still release them; keep them countable
                    self._orphans[lease_id] = record

    def mark_failed(self, url: str, reason: str) -> None:
        """Take a service out of rotation at once (a caller could not reach it); it returns by registering."""
        with self._lock:
            record = self.services.get(url)
            if record is not None and record.live:
                record.live, record.down_reason = False, reason
                log.warning("task service %s out of rotation: %s", url, reason)

    def reap(self, now: float | None = None) -> dict[str, int]:
        """Take services silent for longer than the heartbeat timeout out of rotation and close their open
        leases as environment failures; returns {url: leases closed} for the services reaped now."""
        with self._lock:
            now = self.clock() if now is None else now
            reaped: dict[str, int] = {}
            for record in self.services.values():
                silent = now - record.last_heartbeat
                if not record.live and not record.open_leases:
                    continue
                if silent <= self.heartbeat_timeout_s:
                    continue
                reason = f"task service {record.url} missed heartbeats for {silent:.1f} s"
                if record.live:
                    record.live, record.down_reason = False, reason
                    log.warning("%s: out of rotation", reason)
                reaped[record.url] = len(record.open_leases)
                for lease_id in list(record.open_leases):
                    self._close(lease_id, "env_failure", reason)
            return reaped

    # --- picking and leasing --------------------------------------------------------------------------------

    def _available(self, domain: str) -> list[ServiceRecord]:
        cap = self.max_concurrency.get(domain)
        if cap is not None and self._in_flight(domain) >= cap:
            return []
        return [s for s in self.services.values() if s.domain == domain and s.live]

    def _in_flight(self, domain: str) -> int:
        return sum(len(s.open_leases) for s in self.services.values() if s.domain == domain)

    def next_task_domain(self) -> str | None:
        """The family furthest below its ratio (in started episodes, ratios renormalised over the families
        that can take an episode now); None if none can."""
        with self._lock:
            self.reap()
            candidates = [d for d, r in self.ratios.items() if r > 0 and self._available(d)]
            if not candidates:
                return None
            # Deficit in episodes after one more start, among the families that can take one: picks track
            # ratio * n to within one episode, and a family back from an outage is not given a burst.
            weight = sum(self.ratios[d] for d in candidates)
            started = sum(self.counts[d].started for d in candidates)
            return max(
                candidates, key=lambda d: self.ratios[d] / weight * (started + 1) - self.counts[d].started
            )

    def acquire(self, domain: str | None = None) -> Lease:
        """A lease on the live service of `domain` (default: `next_task_domain()`) with the fewest episodes
        in flight; raises NoServiceAvailable when none is live or the family is at its concurrency cap."""
        with self._lock:
            if domain is None:
                domain = self.next_task_domain()
                if domain is None:
                    raise NoServiceAvailable("no task family has a live service with free capacity")
            elif domain not in self.ratios:
                raise ValueError(
                    f"domain {domain!r} has no ratio in this orchestrator; known: {sorted(self.ratios)}"
                )
            self.reap()
            services = self._available(domain)
            if not services:
                live = sum(1 for s in self.services.values() if s.domain == domain and s.live)
                raise NoServiceAvailable(
                    f"{domain}: {live} live service(s), {self._in_flight(domain)} episode(s) in flight, "
                    f"cap {self.max_concurrency.get(domain, 'none')}"
                )
            service = min(services, key=lambda s: (len(s.open_leases), s.served))
            lease = Lease(f"L{next(self._ids)}", domain, service.url)
            self._leases[lease.id] = lease
            service.open_leases.add(lease.id)
            counts = self.counts[domain]
            counts.started += 1
            if counts.first_started_at is None:
                counts.first_started_at = self.clock()
            return lease

    def release(self, lease_id: str, outcome: str, reason: str = "") -> tuple[str, str]:
        """End a lease with `outcome` (ok, env_failure, cancelled, open_failed); returns the outcome and
        reason recorded, which differ from the arguments when the lease was already closed (its service was
        reaped): the caller must then treat the episode as that outcome. Releasing twice never counts twice."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r}: choose one of {OUTCOMES}")
        with self._lock:
            if lease_id in self._closed:
                return self._closed[lease_id]
            if lease_id not in self._leases:
                raise KeyError(f"lease {lease_id!r} was never granted by this orchestrator")
            self._close(lease_id, outcome, reason)
            return self._closed[lease_id]

    def _close(self, lease_id: str, outcome: str, reason: str) -> None:
        lease = self._leases.pop(lease_id)
        self._closed[lease_id] = (outcome, reason)
        record = self.services.get(lease.url) or self._orphans.pop(lease_id, None)
        if record is not None:
            record.open_leases.discard(lease_id)
            record.served += 1
        counts = self.counts[lease.domain]
        if outcome == "ok":
            counts.finished += 1
        elif outcome == "env_failure":
            counts.env_failures += 1
        elif outcome == "cancelled":
            counts.cancelled += 1
        else:  # open_failed: the episode never started; the caller opens it elsewhere
            counts.started -= 1
            counts.open_failures += 1

    # --- reporting ------------------------------------------------------------------------------------------

    def stats(self) -> dict:
        """Per family: target ratio, share of started episodes, started / finished / env_failures /
        cancelled / open_failures / in_flight, throughput (finished episodes per second since the family's
        first start) and its services (live or not, version, in flight, served, seconds since heartbeat)."""
        with self._lock:
            now = self.clock()
            total = sum(c.started for c in self.counts.values())
            domains = {}
            for domain, c in self.counts.items():
                elapsed = now - c.first_started_at if c.first_started_at is not None else 0.0
                domains[domain] = {
                    "ratio": self.ratios[domain],
                    "share": c.started / total if total else 0.0,
                    "started": c.started,
                    "finished": c.finished,
                    "env_failures": c.env_failures,
                    "cancelled": c.cancelled,
                    "open_failures": c.open_failures,
                    "in_flight": self._in_flight(domain),
                    "throughput": c.finished / elapsed if elapsed > 0 else 0.0,
                    "max_concurrency": self.max_concurrency.get(domain),
                    "live_services": sorted(
                        s.url for s in self.services.values() if s.domain == domain and s.live
                    ),
                }
            services = [
                {
                    "url": s.url,
                    "domain": s.domain,
                    "version": s.version,
                    "live": s.live,
                    "down_reason": s.down_reason,
                    "in_flight": len(s.open_leases),
                    "served": s.served,
                    "registrations": s.registrations,
                    "heartbeat_age_s": now - s.last_heartbeat,
                }
                for s in self.services.values()
            ]
            return {"domains": domains, "services": services}
