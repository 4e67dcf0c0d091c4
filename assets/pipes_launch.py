"""Launch training processes through Dagster Pipes: logs and metrics stream into the asset's run, and a
crashed, OOM-killed or timed-out process fails the asset with the reason and its last output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import dagster as dg

from infra.launcher import LaunchCommand, message_file, run_command, whole_lines

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
        with (
            message_file() as messages,
            dg.open_pipes_session(
                context=self.context,
                context_injector=self.client.context_injector,
                message_reader=WholeLineMessageReader(messages),
                extras={"log_path": str(log_path)},
            ) as session,
        ):
            env = {**cmd.env, **session.get_bootstrap_env_vars()}
            run_command(
                LaunchCommand(cmd.argv, env, cmd.cwd), log_path=log_path, timeout_s=timeout_s, echo=True
            )
        self.messages.extend(session.get_custom_messages())  # complete once the session has closed


class WholeLineMessageReader(dg.PipesFileMessageReader):
    """`PipesFileMessageReader` that parses only complete lines (see `whole_lines`)."""

    def _reader_thread(self, handler, is_resource_complete) -> None:
        try:
            for line in whole_lines(self._path, is_resource_complete.is_set):
                handler.handle_message(json.loads(line))
        except Exception:
            handler.report_pipes_framework_exception(f"{type(self).__name__} reader thread", sys.exc_info())
            raise
