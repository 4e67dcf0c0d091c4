"""The contract between agentic tasks, the task services that serve them, the orchestrator and the async RL loop.

An agentic task family (terminal, codefix, search) is a `TaskSuite` (training/tasks/base.py: generate, verify,
solution) that also opens stateful episodes: `open(task) -> Episode`. The rollout loop drives an episode with
the model's tool calls (the JSON between `<tool_call>` tags, as in training/tasks/tools.py) and ends it with
the final response. A task service (infra/task_service.py) serves one family over HTTP with the same calls;
`TaskServiceClient` there implements `Environment` too, so the loop never knows which one it has.

An environment that breaks (its process died, its sandbox could not start, HTTP failed) raises
`EnvironmentCrash`: the sample is dropped as an environment failure with this reason, never scored 0."""

from __future__ import annotations

from typing import Protocol

from training.tasks.base import Task, Verdict

AGENTIC_DOMAINS = ("terminal", "codefix", "search")


def check_family_sizes(sizes: dict[str, int], setting: str) -> dict[str, int]:
    """A per-family size setting ({family: n}): every key a family, every n at least 1; names the setting."""
    for family, n in sorted(sizes.items()):
        if family not in AGENTIC_DOMAINS or n < 1:
            raise ValueError(
                f"{setting}: {family}: {n} must name a family of {list(AGENTIC_DOMAINS)} with at least 1 task"
            )
    return sizes


class EnvironmentCrash(RuntimeError):
    """The environment itself failed (not the policy); the message is the recorded reason."""


class Episode(Protocol):
    """One task being solved: state (files, a module under test, a search index) lives here."""

    def tool(self, payload: str) -> str:
        """Run one tool call (the JSON text between <tool_call> tags); a bad call returns an error text."""
        ...

    def finish(self, response: str) -> Verdict:
        """Score the episode given all assistant text joined by newlines; may run tests in the sandbox."""
        ...

    def close(self) -> None:
        """Release the episode's resources (throwaway dirs); idempotent."""
        ...


class Environment(Protocol):
    """A task family that can open episodes, in process or behind a task service."""

    domain: str
    version: str

    def open(self, task: Task) -> Episode: ...
