"""A Spark standalone cluster on 127.0.0.1 from the pyspark wheel's own jars: one master and one worker, each a
JVM started with `spark-class` in its own process group, stopped when the block ends. Executors run this
venv's Python (PYSPARK_PYTHON), so they import the project like the driver does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
from local_servers import stop_process_group  # tests/ is on sys.path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _start(argv: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )


@contextmanager
def spark_standalone(
    workdir: Path, cores: int = 2, memory: str = "2g", timeout_s: float = 90
) -> Iterator[str]:
    """Yields the master URL `spark://127.0.0.1:PORT` once the master lists the worker as ALIVE."""
    home = _spark_home()
    spark_class = str(home / "bin" / "spark-class")
    port, ui_port, worker_ui = _free_port(), _free_port(), _free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_WORKER_DIR": str(workdir / "work"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    workdir.mkdir(parents=True, exist_ok=True)
    master_log, worker_log = workdir / "master.log", workdir / "worker.log"
    procs = [
        _start(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            master_log,
            env,
            workdir,
        )
    ]
    url = f"spark://127.0.0.1:{port}"
    try:
        procs.append(
            _start(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(cores),
                    "--memory",
                    memory,
                    "--webui-port",
                    str(worker_ui),
                    "--work-dir",
                    str(workdir / "work"),
                    url,
                ],
                worker_log,
                env,
                workdir,
            )
        )
        deadline = time.monotonic() + timeout_s
        while True:
            for proc, log in zip(procs, (master_log, worker_log), strict=False):
                assert proc.poll() is None, f"{log.name} exited:\n{log.read_text()[-3000:]}"
            try:
                state = requests.get(f"http://127.0.0.1:{ui_port}/json/", timeout=2).json()
                if any(w["state"] == "ALIVE" for w in state.get("workers", [])):
                    break
            except (requests.RequestException, ValueError):  # not up yet, or slow under load
                pass
            assert time.monotonic() < deadline, (
                f"no ALIVE worker in {timeout_s}s:\n{master_log.read_text()[-2000:]}\n{worker_log.read_text()[-2000:]}"
            )
            time.sleep(0.5)
        yield url
    finally:
        for proc in reversed(procs):
            stop_process_group(proc)
