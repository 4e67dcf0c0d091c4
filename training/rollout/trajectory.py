"""One trajectory record for every RL stage (what a checkpoint was trained on; samples go to MLflow)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "env_failure", "truncated", "stale"]


@dataclass
class Trajectory:
    """A prompt and its response as the engine produced it, token for token.

    token_ids = prompt_ids + response ids (policy tokens and environment observations, in order); logprobs and
    loss_mask cover the response only: logprobs are the engine's for policy tokens (0.0 elsewhere), loss_mask is
    1 on policy tokens that train, 0 on observations. policy_versions holds one version per generated segment."""

    id: str
    task: str  # the task's domain
    prompt_id: str
    group_id: str
    messages: list[dict[str, Any]]
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    status: Status = "ok"
    reason: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_segment(self, ids: list[int], logprobs: list[float] | None, version: int | None) -> None:
        """Append generated tokens (with their log-probs and version) or, with logprobs=None, observation tokens."""
        self.response_ids += ids
        if logprobs is None:
            self.logprobs += [0.0] * len(ids)
            self.loss_mask += [0] * len(ids)
        else:
            if len(logprobs) != len(ids):
                raise ValueError(f"{len(ids)} tokens but {len(logprobs)} log-probs")
            self.logprobs += list(logprobs)
            self.loss_mask += [1] * len(ids)
            if version is not None:
                self.policy_versions.append(version)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def failure_kind(reason: str) -> str:
    """The kind of a verifier's reason without its details ("tests_failed: ..." -> "tests_failed"), a safe part
    of a metric name."""
    head = reason.split(":")[0].split(",")[0].split()
    return re.sub(r"[^a-z0-9_]", "_", head[0].lower()) if head else "unknown"
