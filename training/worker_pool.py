"""Named jobs in spawned worker processes, each with its share of the CPUs as torch threads.

On a 2-core CPU a second torch thread buys 1.1-1.6x on a small model (per-op overhead, not FLOPs), so two
1-thread processes scoring two checkpoints side by side finish sooner than one 2-thread process scoring
them in turn (the report's table: 377 -> 307 s; checkpoint evals of two midtrained stages: 133 -> 92 s)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

log = logging.getLogger(__name__)

Workers = int | Literal["auto"]


def worker_count(workers: Workers, jobs: int) -> int:
    """`auto` = min(CPUs, jobs); a number is taken as given (at least 1)."""
    from infra.cpu import cpus

    return max(1, min(cpus(), jobs) if workers == "auto" else workers)


def _start_worker(threads: int, init: Callable[..., None] | None, init_args: tuple) -> None:
    import torch

    torch.set_num_threads(threads)
    if init is not None:
        init(*init_args)


def run_in_workers(
    jobs: Mapping[str, tuple[Callable[..., Any], tuple]],
    workers: int,
    what: str,
    init: Callable[..., None] | None = None,
    init_args: tuple = (),
) -> dict[str, Any]:
    """name -> fn(*args), each run in one of `workers` spawned processes (CPUs / workers torch threads each,
    `init(*init_args)` once per process); results in the order of `jobs`, a log line per finished job. A
    failure cancels the jobs not started and raises naming its job: nothing is half-kept. Functions and
    arguments must pickle (module-level functions)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from infra.cpu import cpus

    threads = max(1, cpus() // workers)
    log.info("%s: %d jobs in %d processes x %d torch threads", what, len(jobs), workers, threads)
    started, done = time.monotonic(), {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, context, _start_worker, (threads, init, init_args)) as pool:
        futures = {pool.submit(fn, *args): name for name, (fn, args) in jobs.items()}
        for future in as_completed(futures):
            name = futures[future]
            try:
                done[name] = future.result()
            except Exception as exc:
                for other in futures:
                    other.cancel()
                raise RuntimeError(f"{what}: {name} failed: {exc}") from exc
            log.info("%s: %s done (%d / %d) after %.0f s", what, name, len(done), len(jobs),
                     time.monotonic() - started)  # fmt: skip
    return {name: done[name] for name in jobs}
