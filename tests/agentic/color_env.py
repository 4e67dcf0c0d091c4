"""A light test environment (no torch import, so a task-service subprocess serving it starts fast): reward 1
when the answer contains a target string, with sleeps and scheduled crashes."""

from __future__ import annotations

import threading
import time

from training.agentic.protocol import EnvironmentCrash
from training.tasks.base import Task, Verdict


class _ColorEpisode:
    def __init__(self, env: ColorEnv, task: Task):
        self.env, self.task, self.closed = env, task, False

    def tool(self, payload: str) -> str:
        time.sleep(self.env.latency_s)
        return f"echo {payload[:20]}"

    def finish(self, response: str) -> Verdict:
        time.sleep(self.env.latency_s)
        if self.env.target in response:
            return Verdict(1.0, "correct")
        return Verdict(0.0, "wrong_answer", found=float(bool(self.env.found) and self.env.found in response))

    def close(self) -> None:
        self.closed = True


class ColorEnv:
    """Reward 1 when the answer contains `target` (an "e": about half of an untrained model's samples, so
    groups carry signal); opening an episode sleeps, and every `crash_every`-th open crashes (an environment
    failure, not the policy's). A failed answer containing `found` (if set) is credited as one whose tools
    had returned the answer (`Verdict.found`)."""

    domain, version = "color", "c1"

    def __init__(self, latency_s: float = 0.0, crash_every: int = 0, target: str = "e", found: str = ""):
        self.latency_s, self.crash_every, self.target, self.opened = latency_s, crash_every, target, 0
        self.found = found
        self.lock = threading.Lock()

    def open(self, task: Task) -> _ColorEpisode:
        with self.lock:
            self.opened += 1
            n = self.opened
        time.sleep(self.latency_s)
        if self.crash_every and n % self.crash_every == 0:
            raise EnvironmentCrash(f"container {n} did not start")
        return _ColorEpisode(self, task)


def color_environments(
    latency_s: float = 0.0, crash_every: int = 0, target: str = "e"
) -> dict[str, ColorEnv]:
    return {"color": ColorEnv(latency_s, crash_every, target)}


def color_service(family: str, latency_s: str = "0") -> ColorEnv:
    """The factory task-service subprocesses load (`--factory tests.agentic.test_async_loop:color_service`)."""
    env = ColorEnv(float(latency_s))
    env.domain = family
    return env
