"""Fixtures for classifier tests: a real OpenAI-compatible HTTP judge server (infra/llm_server.py) in a
subprocess on 127.0.0.1, and a persistent cache for Debian packages used as text sources."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from infra.llm_server import llm_server_process
from infra.settings import REPO_ROOT


@pytest.fixture(scope="session")
def debian_cache() -> Path:
    """Where Debian packages are extracted; shared with the `tiny` profile's cache so they download once."""
    path = REPO_ROOT / ".crucible" / "cache" / "debian-docs"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    with llm_server_process("--factory", "tests.classifiers.judge_models:flaky_keyword_scorer") as url:
        yield JudgeServer(url)
