"""Runs inside the training process (rank 0): streams the trainer's metrics and logs back to the Dagster
asset over Dagster Pipes, and reports the final materialization when the process exits cleanly.

The trainer loads it by name (`TrainJobSpec.callbacks = ["assets.pipes_reporter:pipes_metrics"]`), so
`training/` never imports Dagster. Outside a Pipes launch it is a no-op.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from typing import Any

LOG_EVERY = 10


def pipes_metrics(spec: Any) -> Callable[[int, dict[str, float]], None]:
    """A trainer callback `(step, metrics)` that forwards metrics to the Dagster asset that launched us."""
    if "DAGSTER_PIPES_CONTEXT" not in os.environ:
        return lambda step, metrics: None
    from dagster_pipes import open_dagster_pipes

    pipes = open_dagster_pipes()
    last: dict[str, Any] = {}

    def report(step: int, metrics: dict[str, float]) -> None:
        last.clear()
        last.update({"step": float(step), **{k: float(v) for k, v in metrics.items()}})
        pipes.report_custom_message(last.copy())
        if step % LOG_EVERY == 0:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in list(metrics.items())[:8])
            pipes.log.info(f"{getattr(spec, 'name', 'train')} step {step}: {shown}")

    def close() -> None:
        if last:
            pipes.report_asset_materialization(
                metadata={k: {"raw_value": v, "type": "float"} for k, v in last.items()}
            )
        pipes.close()

    atexit.register(close)
    return report
