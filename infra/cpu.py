"""How many CPU threads an in-process model may take: all of them when this process is the only run on the
machine (`crucible run` materializes one job at a time), else its share of the runs Dagster's queue lets
use the LLM judge at once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

SOLE_RUN_ENV = "CRUCIBLE_SOLE_RUN"
# dagster.yaml, run queue: crucible/resource=llm runs at a time (a test keeps the two equal)
JUDGE_RUNS_AT_ONCE = 2


def cpus() -> int:
    return len(os.sched_getaffinity(0))


def native_bf16() -> bool:
    """Whether this CPU runs bf16 matmuls natively (AVX512-BF16 or AMX); elsewhere torch emulates them,
    several times slower than fp32."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def judge_threads() -> int:
    """Threads for a local judge model: every CPU under a sole run, else an equal share of the CPUs among
    the judge runs the queue allows at once (at least one)."""
    return cpus() if os.environ.get(SOLE_RUN_ENV) == "1" else max(1, cpus() // JUDGE_RUNS_AT_ONCE)


def sole_run():
    """Mark this process as the only run on the machine while the block runs (the previous value is put back)."""
    return cpu_share(sole=True)


@contextmanager
def cpu_share(sole: bool) -> Iterator[None]:
    """Mark this process as the only run on the machine (sole) or as sharing it, while the block runs; the
    previous value is put back."""
    before = os.environ.get(SOLE_RUN_ENV)
    os.environ[SOLE_RUN_ENV] = "1" if sole else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SOLE_RUN_ENV, None)
        else:
            os.environ[SOLE_RUN_ENV] = before
