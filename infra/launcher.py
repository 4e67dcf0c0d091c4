"""Start a (distributed) Python module as a child process: one process, `torchrun`, or the `deepspeed` CLI.

`build_launch_command` returns the argv and the full environment (process-group rendezvous on 127.0.0.1,
offline HF, a persistent TORCH_EXTENSIONS_DIR so DeepSpeed's JIT-compiled ops are built once). The asset
layer can hand these to Dagster Pipes; `run_command` runs them directly and raises `LaunchError` on any
non-zero exit, including a child killed by a signal (SIGKILL usually means the OOM killer), so a crashed
run can never look like a success.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

Launcher = Literal["python", "torchrun", "deepspeed"]


@dataclass(frozen=True)
class LaunchCommand:
    """What to execute: argv, the complete child environment and the working directory."""

    argv: list[str]
    env: dict[str, str] = field(repr=False)
    cwd: str | None = None


class LaunchError(RuntimeError):
    """The launched process failed; `returncode` < 0 means it was killed by that signal."""

    def __init__(self, message: str, returncode: int | None, log_tail: str = ""):
        super().__init__(f"{message}\n--- last output ---\n{log_tail}" if log_tail else message)
        self.returncode = returncode
        self.log_tail = log_tail


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for the process-group rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_launch_command(
    module: str,
    args: list[str],
    *,
    launcher: Launcher = "python",
    nproc: int = 1,
    python: str = sys.executable,
    master_port: int | None = None,
    torch_extensions_dir: Path | None = None,
    threads_per_process: int = 0,
    extra_env: dict[str, str] | None = None,
    cwd: Path | None = None,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str = "127.0.0.1",
) -> LaunchCommand:
    """argv + env to run `python -m module *args` on `nproc` processes per node via `launcher`.

    Multi-node (`nnodes` > 1, torchrun only): run this command once per node (e.g. one pod per node) with that
    node's `node_rank`, the same `master_addr` (node 0's address) and the same fixed `master_port`; node 0
    hosts the rendezvous. The deepspeed CLI reaches other nodes through a hostfile and ssh/pdsh instead."""
    if nnodes > 1 and launcher != "torchrun":
        raise ValueError(
            f"launcher {launcher!r} starts one node; use torchrun (one command per node) for nnodes > 1"
        )
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank {node_rank} is not in [0, nnodes={nnodes})")
    if nnodes > 1 and master_port is None:
        raise ValueError("nnodes > 1 needs a fixed master_port that every node is given")
    port = master_port or free_port()
    env = dict(os.environ)
    env.update({"MASTER_ADDR": master_addr, "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"})
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    if torch_extensions_dir is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(torch_extensions_dir)
    if threads_per_process:
        env["OMP_NUM_THREADS"] = str(threads_per_process)
    env.update(extra_env or {})
    if launcher == "python":
        if nproc != 1:
            raise ValueError("launcher 'python' starts one process; use torchrun or deepspeed for nproc > 1")
        env.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
        argv = [python, "-m", module, *args]
    elif launcher == "torchrun":
        argv = [
            python, "-m", "torch.distributed.run",
            f"--nproc_per_node={nproc}", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
            f"--master_addr={master_addr}", f"--master_port={port}",
            "-m", module, *args,
        ]  # fmt: skip
    elif launcher == "deepspeed":
        argv = [
            python, "-m", "deepspeed.launcher.runner",
            f"--num_gpus={nproc}", "--master_addr=127.0.0.1", f"--master_port={port}",
            "--no_ssh_check", "--module", module, *args,
        ]  # fmt: skip
    else:
        raise ValueError(f"unknown launcher {launcher!r}")
    return LaunchCommand(argv=argv, env=env, cwd=str(cwd) if cwd else None)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (likely the OOM killer)" if -returncode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {returncode}"


def run_command(
    cmd: LaunchCommand,
    *,
    log_path: Path | None = None,
    timeout_s: float | None = None,
    tail_lines: int = 40,
    echo: bool = False,
) -> None:
    """Run `cmd` in its own process group, tee its output to `log_path` and the logger (and stdout if `echo`,
    e.g. for Dagster's captured logs); raise `LaunchError` unless it exits 0. On timeout (or if the caller is
    interrupted) the whole process group is killed."""
    tail: deque[str] = deque(maxlen=tail_lines)
    log.info("launching: %s", " ".join(cmd.argv))
    proc = subprocess.Popen(
        cmd.argv,
        env=cmd.env,
        cwd=cmd.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # own process group: a timeout kills every rank
    )
    reader = threading.Thread(target=_pump, args=(proc, tail, log_path, echo), daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reader.join(timeout=5)
        raise LaunchError(
            f"training process timed out after {timeout_s:g} s (timeout_s); its process group was killed",
            None,
            "\n".join(tail),
        ) from None
    except BaseException:
        _kill_group(proc)
        raise
    reader.join(timeout=30)
    if returncode != 0:
        raise LaunchError(f"training process {describe_exit(returncode)}", returncode, "\n".join(tail))


def _pump(proc: subprocess.Popen, tail: deque, log_path: Path | None, echo: bool = False) -> None:
    log_file = open(log_path, "a") if log_path else None  # noqa: SIM115
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if log_file:
                log_file.write(line)
                log_file.flush()
            if echo:
                sys.stdout.write(line)
            log.debug("%s", line.rstrip("\n"))
    finally:
        if log_file:
            log_file.close()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@contextmanager
def message_file() -> Iterator[str]:
    """A fresh path in a throwaway directory, for a child's message stream (removed with the directory)."""
    with tempfile.TemporaryDirectory(prefix="crucible-pipes-") as tmp:
        yield os.path.join(tmp, "messages")


def whole_lines(path: str, should_stop: Callable[[], bool], poll_s: float = 0.01) -> Iterator[str]:
    """Tail `path`, yielding only complete lines. dagster's `tail_file` yields whatever `readline()` returns,
    which can be a line the writer has not finished: Dagster's reader thread then dies on the JSON (seen in a tiny
    run at char 100 of a message), and the stage's logs stop streaming."""
    pending = ""
    with open(path, encoding="utf-8") as stream:
        while True:
            stopping = should_stop()  # before the read: a stop seen here means the read gets every last byte
            chunk = stream.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending
                    pending = ""
            elif stopping:
                if pending.strip():
                    yield pending  # the writer ended mid-line: let the parser report it
                return
            else:
                time.sleep(poll_s)
