"""Launch training processes through Dagster Pipes: logs and metrics stream into the asset's run, and a
crashed, OOM-killed or timed-out process fails the asset with the reason and its last output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from infra.launcher import LaunchCommand, run_command

CALLBACK = "assets.pipes_reporter:pipes_metrics"


class PipesLaunch:
    """A `training.job.Launch`: runs each command in a Pipes session and keeps its messages.

    The process runs under `infra.launcher.run_command` (own process group, output teed to `log_path` and
    the run's stdout, `timeout_s` enforced by killing the group), which raises `LaunchError` naming the
    exit code, the signal or the timeout; the client supplies the Pipes context injector and reader.
    """

    def __init__(self, context: dg.AssetExecutionContext, client: dg.PipesSubprocessClient):
        self.context, self.client = context, client
        self.messages: list[Any] = []

    def __call__(self, cmd: LaunchCommand, log_path: Path, timeout_s: float | None) -> None:
        self.context.log.info("launching %s (timeout %s s)", " ".join(cmd.argv[:6]), timeout_s)
        with dg.open_pipes_session(
            context=self.context,
            context_injector=self.client.context_injector,
            message_reader=self.client.message_reader,
            extras={"log_path": str(log_path)},
        ) as session:
            env = {**cmd.env, **session.get_bootstrap_env_vars()}
            run_command(
                LaunchCommand(cmd.argv, env, cmd.cwd), log_path=log_path, timeout_s=timeout_s, echo=True
            )
        self.messages.extend(session.get_custom_messages())  # complete once the session has closed
