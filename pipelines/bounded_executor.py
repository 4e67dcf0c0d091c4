"""Run a datatrove `LocalPipelineExecutor`'s tasks in worker processes with a wall-clock deadline.

datatrove's own pool (a `multiprocess` forkserver Pool plus a Manager) has no bound on its teardown: under
load, `Pool.terminate()` / `join()` was seen waiting 900 s after every task had finished, and the
interpreter's exit handler then waited on the same forkserver child forever. Here every task is one spawned
process that is a direct child of ours (reaped with `waitpid`, no forkserver in between), sends back its
stats over a pipe and leaves with `os._exit` (no interpreter teardown to hang in). The parent waits on the
pipes with a deadline; a task that overruns it, or a process that does not exit after reporting, is
SIGKILLed and reaped, so a stage either finishes or fails with the reason within its deadline.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass

import multiprocess
from datatrove.executor import LocalPipelineExecutor
from datatrove.utils.stats import PipelineStats
from multiprocess.connection import wait

log = logging.getLogger(__name__)

# a task process that has reported its stats gets this long to exit before it is killed
EXIT_GRACE_S = 10.0


class TaskDeadlineExceeded(RuntimeError):
    """The stage's tasks did not finish within their deadline (the task processes were killed)."""


class TaskFailed(RuntimeError):
    """A task raised or its process died; the message carries the task's traceback or exit reason."""


@dataclass
class _Running:
    rank: int
    slot: int
    process: multiprocess.process.BaseProcess
    reader: object
    started: float


def _task_main(executor: LocalPipelineExecutor, rank: int, slot: int, writer) -> None:
    """In the task process: run one rank, send ("ok", stats) or ("error", traceback), leave at once."""
    code = 0
    try:
        writer.send(("ok", executor._run_for_rank(rank, slot)))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent, which raises it
        code = 1
        writer.send(("error", traceback.format_exc()))
    finally:
        writer.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _exit_reason(exitcode: int | None) -> str:
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode} without reporting"


def _kill(task: _Running) -> None:
    if task.process.is_alive():
        task.process.kill()
    task.process.join(5)  # a direct child: SIGKILL + waitpid cannot wait on anyone else


def _collect(task: _Running) -> tuple[str, object]:
    """The task's report, then its process reaped (killed if it lingers after reporting)."""
    try:
        status, payload = task.reader.recv()
    except (EOFError, OSError):
        task.process.join(EXIT_GRACE_S)
        status, payload = "died", _exit_reason(task.process.exitcode)
    task.reader.close()
    task.process.join(EXIT_GRACE_S)
    if task.process.is_alive():
        log.warning("task %d reported but did not exit within %.0f s; killed", task.rank, EXIT_GRACE_S)
        _kill(task)
    return status, payload


def run_tasks_bounded(
    executor: LocalPipelineExecutor, workers: int, deadline_s: float, stage: str = "stage"
) -> PipelineStats:
    """Run every task of `executor` in at most `workers` spawned processes; merged stats of all tasks.

    Raises TaskDeadlineExceeded if they are not all done within `deadline_s` seconds, TaskFailed if a task
    raises or dies (with its traceback / exit reason). Either way no task process outlives the call.
    """
    ctx = multiprocess.get_context("spawn")  # dill pickling, as datatrove's own pool
    executor.save_executor_as_json()
    pending = list(range(executor.world_size))
    free_slots = list(range(workers))
    running: dict[object, _Running] = {}
    stats: dict[int, PipelineStats] = {}
    start = time.monotonic()
    try:
        while pending or running:
            while pending and free_slots:
                rank, slot = pending.pop(0), free_slots.pop(0)
                reader, writer = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_task_main, args=(executor, rank, slot, writer), daemon=True)
                process.start()
                writer.close()
                running[reader] = _Running(rank, slot, process, reader, time.monotonic())
            remaining = deadline_s - (time.monotonic() - start)
            if remaining <= 0:
                late = ", ".join(str(t.rank) for t in running.values())
                raise TaskDeadlineExceeded(
                    f"{stage}: tasks still running after the deadline of {deadline_s:g} s "
                    f"(task(s) {late} of {executor.world_size}); killed them"
                )
            for reader in wait(list(running), timeout=remaining):
                task = running.pop(reader)
                free_slots.append(task.slot)
                status, payload = _collect(task)
                if status == "error":
                    raise TaskFailed(f"{stage}: task {task.rank} failed:\n{payload}")
                if status == "died":
                    raise TaskFailed(f"{stage}: task {task.rank} {payload}")
                stats[task.rank] = payload
    finally:
        for task in running.values():
            _kill(task)
            task.reader.close()
    merged = sum((stats[rank] for rank in sorted(stats)), start=PipelineStats())
    with executor.logging_dir.open("stats.json", "wt") as fh:
        merged.save_to_disk(fh)
    return merged
