"""What the agentic task families share: tool-call parsing, extra environment latency with a long tail, and
scoring a finished response by replaying its tool calls on a fresh episode."""

from __future__ import annotations

import difflib
import hashlib
import json
import random
import re
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from training.agentic.protocol import Environment
from training.tasks.base import Task, Verdict

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
MAX_RESULT_CHARS = 120  # the policy is tiny: an observation must fit in a few dozen tokens


class ExtraLatency(BaseModel):
    """Sleep added to every tool call and finish, so a benchmark can show what asynchrony buys.

    A delay is mean_s * X with X lognormal of mean 1 (sigma sets how long the tail is); seeded per episode."""

    model_config = ConfigDict(extra="forbid")
    mean_s: float = Field(0.0, ge=0, description="Mean extra seconds per tool call / finish (0 = none)")
    sigma: float = Field(
        1.0, ge=0, le=3, description="Lognormal sigma of the delay: 0 constant, 1.5 long tail"
    )
    seed: int = Field(0, description="Seed of the delays (mixed with the task id and the call index)")

    def rng(self, task_id: str) -> random.Random:
        digest = hashlib.sha256(f"{self.seed}\t{task_id}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def sample(self, rng: random.Random) -> float:
        if self.mean_s <= 0:
            return 0.0
        return self.mean_s * rng.lognormvariate(-(self.sigma**2) / 2, self.sigma)


class Delay:
    """The per-episode delay stream: `wait()` sleeps the next seeded delay and returns it."""

    def __init__(self, latency: ExtraLatency, task_id: str):
        self.latency, self.rng, self.total_s = latency, latency.rng(task_id), 0.0

    def wait(self) -> float:
        seconds = self.latency.sample(self.rng)
        if seconds > 0:
            time.sleep(seconds)
        self.total_s += seconds
        return seconds


def parse_tool_call(payload: str, tools: dict[str, tuple[str, ...]]) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) of a JSON tool call, or an error text naming what is wrong (returned to the policy).
    `tools` maps each tool name to the argument names it takes."""
    try:
        call = json.loads(payload)
    except json.JSONDecodeError:
        return "error: tool call is not JSON"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return "error: tool call needs a name"
    name, args = call["name"], call.get("arguments", {})
    if name not in tools:
        return f"error: unknown tool {name[:20]!r}; tools: {', '.join(tools)}"
    if not isinstance(args, dict) or set(args) - set(tools[name]):
        return f"error: {name} takes {', '.join(tools[name]) or 'no arguments'}"
    if any(not isinstance(v, str) for v in args.values()):
        return "error: arguments must be strings"
    return name, args


def similarity(got: str, want: str) -> float:
    """How close `got` is to `want`, in [0, 1] (difflib's ratio on the stripped texts): the partial credit of
    an answer or a written file that missed by a few characters (`fox96` written as `fox69`)."""
    got, want = got.strip(), want.strip()
    return difflib.SequenceMatcher(None, got, want, autojunk=False).ratio() if got or want else 1.0


def clip(text: str, limit: int = MAX_RESULT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tool_calls_in(response: str) -> list[str]:
    """The payloads of every <tool_call> in a response, in order."""
    return [m.strip() for m in TOOL_CALL.findall(response)]


def replay_verify(env: Environment, task: Task, response: str) -> Verdict:
    """Score a complete response (all assistant turns joined) without a live episode: open a fresh one, run
    the response's tool calls in order, then finish. This is `TaskSuite.verify` for stateful tasks."""
    episode = env.open(task)
    try:
        for payload in tool_calls_in(response):
            episode.tool(payload)
        return episode.finish(response)
    finally:
        episode.close()
