"""Launch training processes through Dagster Pipes: logs and metrics stream into the asset's run, and a
crashed or OOM-killed process fails the asset (Pipes raises on a non-zero exit)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from infra.launcher import LaunchCommand

CALLBACK = "assets.pipes_reporter:pipes_metrics"


class PipesLaunch:
    """A `training.job.Launch`: runs each command with a Pipes subprocess client and keeps its messages."""

    def __init__(self, context: dg.AssetExecutionContext, client: dg.PipesSubprocessClient):
        self.context, self.client = context, client
        self.messages: list[Any] = []

    def __call__(self, cmd: LaunchCommand, log_path: Path, timeout_s: float | None) -> None:
        self.context.log.info("launching %s", " ".join(cmd.argv[:6]))
        invocation = self.client.run(
            command=list(cmd.argv),
            env=dict(cmd.env),
            context=self.context,
            extras={"log_path": str(log_path)},
        )
        self.messages.extend(invocation.get_custom_messages())
