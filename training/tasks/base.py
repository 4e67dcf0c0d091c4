"""What every task suite shares: the task record, the verdict, the split rule and answer extraction."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

Split = Literal["train", "heldout", "test"]
# Held-out tasks come from their own seed stream and any prompt that also appears in train is dropped from
# train, so a held-out score never measures memorised prompts. Test tasks (scored once per model version,
# never used to choose anything) have a third stream; any prompt also in train or held-out is dropped.
HELDOUT_SEED_OFFSET = 1_000_003
TEST_SEED_OFFSET = 2_000_029


@dataclass(frozen=True)
class Task:
    """One prompt with what its verifier needs. `answer` is the reference (an expression, a word, a test file)."""

    id: str
    domain: str
    prompt: str
    answer: str
    difficulty: int
    split: Split
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(row: dict[str, Any]) -> Task:
        return Task(**row)


@dataclass(frozen=True)
class Verdict:
    reward: float  # 1.0 or 0.0
    reason: str  # "correct", or why not: "no_answer", "wrong_answer", "tests_failed: ...", "timeout", ...
    # how close a failed attempt came, in [0, 1] (share of tests passed, similarity of what was written):
    # a training signal only (`AgenticRLConfig.partial_credit`); success is `reward`
    partial: float = 0.0
    # 1.0 when a tool had returned the answer (search: a result's term), also a training signal only
    # (`AgenticRLConfig.found_credit`)
    found: float = 0.0

    def components(self) -> dict[str, float]:
        """What a trajectory records of it (`Trajectory.reward_components`)."""
        return {"verifier": self.reward, "partial": self.partial, "found": self.found}


class TaskSuite(Protocol):
    domain: str
    version: str

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]: ...

    def verify(self, task: Task, response: str) -> Verdict: ...

    def solution(self, task: Task) -> list[dict[str, Any]]:
        """A worked solution as assistant / tool messages (the SFT target)."""
        ...


def task_id(domain: str, prompt: str) -> str:
    return f"{domain}-{hashlib.sha256(prompt.encode()).hexdigest()[:12]}"


def split_seed(split: Split, seed: int) -> int:
    return seed + {"train": 0, "heldout": HELDOUT_SEED_OFFSET, "test": TEST_SEED_OFFSET}[split]


ANSWER_RE = re.compile(r"(?:final answer|answer)\s*[:=]\s*(.+?)\s*(?:$|\n|<\|)", re.IGNORECASE)


def extract_answer(response: str) -> str | None:
    """The text after the last 'Answer:' (case-insensitive), up to the line's end, without one pair of
    surrounding double quotes (`Answer: "42"` is 42); None if there is none."""
    found = ANSWER_RE.findall(response)
    if not found:
        return None
    answer = found[-1].strip()
    return answer[1:-1].strip() if len(answer) >= 2 and answer[0] == answer[-1] == '"' else answer


def normalise_text(text: str) -> str:
    """Lower case, punctuation and articles removed, whitespace collapsed (normalised exact match)."""
    text = re.sub(r"[^\w\s]", " ", text.lower())
    words = [w for w in text.split() if w not in ("a", "an", "the")]
    return " ".join(words)
