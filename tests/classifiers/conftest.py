"""Fixtures for classifier tests: a real OpenAI-compatible HTTP judge server (infra/llm_server.py) in a
subprocess on 127.0.0.1, and a persistent cache for Debian packages used as text sources."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from infra.settings import REPO_ROOT


@pytest.fixture(scope="session")
def debian_cache() -> Path:
    """Where Debian packages are extracted; shared with the `tiny` profile's cache so they download once."""
    path = REPO_ROOT / ".crucible" / "cache" / "debian-docs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_llm_server(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.llm_server", "--host", "127.0.0.1", "--port", "0", *args],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"llm_server did not start: {line!r}")
    return proc, line.split("listening on ", 1)[1].strip()


def stop_server(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)  # its own process group: started with start_new_session
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class JudgeServer:
    def __init__(self, url: str):
        self.url = url

    def stats(self) -> dict:
        return requests.get(f"{self.url}/stats", timeout=5).json()

    def chat_requests(self) -> int:
        return self.stats().get("requests/chat", 0)


@pytest.fixture(scope="module")
def judge_server():
    """The flaky keyword scorer (tests/classifiers/judge_models.py) behind a real HTTP server."""
    proc, url = start_llm_server("--factory", "tests.classifiers.judge_models:flaky_keyword_scorer")
    try:
        yield JudgeServer(url)
    finally:
        stop_server(proc)
