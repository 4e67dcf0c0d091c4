"""The agentic environments as a deployment: an orchestrator (HTTP, in this process) and one or more task-service
processes per family that register with it and are restarted if they die (TaskServiceFleet). The Agentic RL
job opens its environments here; the rollout worker reaches them through
`infra.service_pool.orchestrated_environments`."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infra.orchestrator_server import orchestrator_server
from infra.task_service import TaskServiceFleet
from training.agentic.orchestrator import Orchestrator


@dataclass
class AgenticServices:
    url: str  # the orchestrator's
    orchestrator: Orchestrator
    fleet: TaskServiceFleet

    def stats(self) -> dict:
        return self.orchestrator.stats()


@contextmanager
def agentic_services(
    ratios: Mapping[str, float],
    facts_json: Path,
    replicas: int = 1,
    max_concurrency: int = 64,
    latency_mean_s: float = 0.0,
    latency_sigma: float = 1.0,
    seed: int = 0,
    startup_timeout_s: float = 120.0,
) -> Iterator[AgenticServices]:
    """Start the orchestrator and `replicas` task services per family with a positive ratio; wait until all
    have registered; stop everything on exit."""
    families = {d: r for d, r in ratios.items() if r > 0}
    orchestrator = Orchestrator(
        dict(families), {d: max_concurrency for d in families}, heartbeat_timeout_s=10.0
    )
    args = (
        "--factory-arg", f"facts={facts_json}",
        "--factory-arg", f"latency_mean_s={latency_mean_s}",
        "--factory-arg", f"latency_sigma={latency_sigma}",
        "--factory-arg", f"latency_seed={seed}",
    )  # fmt: skip
    with (
        orchestrator_server(orchestrator) as url,
        TaskServiceFleet({d: replicas for d in families}, url, args) as fleet,
    ):
        deadline = time.monotonic() + startup_timeout_s
        while True:
            per_family = orchestrator.stats()["domains"]
            live = {d: len(per_family.get(d, {}).get("live_services", [])) for d in families}
            if all(n >= replicas for n in live.values()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"task services did not all register within {startup_timeout_s:.0f} s: {live}"
                )
            time.sleep(0.1)
        yield AgenticServices(url, orchestrator, fleet)
