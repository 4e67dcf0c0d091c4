"""Code: small Python functions written from a one-line spec, checked by hidden unit tests that run in the
sandbox (infra/sandbox.py). Difficulty grows with the function family: constants, then two arguments, then
strings and lists, then loops."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from infra.sandbox import SandboxLimits, run_python
from training.tasks.base import Split, Task, Verdict, split_seed, task_id

NAMES = ["f", "g", "h", "calc", "solve", "compute", "transform", "apply"]
_CODE_BLOCK = re.compile(r"```(?:python)?\n(.*?)```", re.DOTALL)
_LIMITS = SandboxLimits(wall_s=5, cpu_s=2, memory_mb=256, output_bytes=8192)

# family -> (difficulty, spec template, body template, tests(rng, k) -> list[(args tuple, expected)])
Family = tuple[int, str, str, Callable[[random.Random, int], list[tuple[tuple, object]]]]


def _ints(rng: random.Random, n: int = 4) -> list[int]:
    return [rng.randint(-20, 20) for _ in range(n)]


FAMILIES: dict[str, Family] = {
    "add_const": (1, "returns x plus {k}", "return x + {k}", lambda r, k: [((x,), x + k) for x in _ints(r)]),
    "mul_const": (1, "returns x times {k}", "return x * {k}", lambda r, k: [((x,), x * k) for x in _ints(r)]),
    "sub_const": (1, "returns x minus {k}", "return x - {k}", lambda r, k: [((x,), x - k) for x in _ints(r)]),
    "add2": (
        2,
        "returns a plus b",
        "return a + b",
        lambda r, k: [((a, b), a + b) for a, b in _pairs(r)],
    ),
    "max2": (
        2,
        "returns the larger of a and b",
        "return max(a, b)",
        lambda r, k: [((a, b), max(a, b)) for a, b in _pairs(r)],
    ),
    "min2": (
        2,
        "returns the smaller of a and b",
        "return min(a, b)",
        lambda r, k: [((a, b), min(a, b)) for a, b in _pairs(r)],
    ),
    "is_even": (
        3,
        "returns True if x is even, else False",
        "return x % 2 == 0",
        lambda r, k: [((x,), x % 2 == 0) for x in _ints(r)],
    ),
    "square": (3, "returns x squared", "return x * x", lambda r, k: [((x,), x * x) for x in _ints(r)]),
    "reverse": (
        3,
        "returns the string s reversed",
        "return s[::-1]",
        lambda r, k: [((w,), w[::-1]) for w in _words(r)],
    ),
    "sum_list": (
        4,
        "returns the sum of the list xs",
        "return sum(xs)",
        lambda r, k: [((xs,), sum(xs)) for xs in _lists(r)],
    ),
    "count_pos": (
        4,
        "returns how many numbers in the list xs are positive",
        "return sum(1 for v in xs if v > 0)",
        lambda r, k: [((xs,), sum(1 for v in xs if v > 0)) for xs in _lists(r)],
    ),
}
_ARGS = {"add2": "a, b", "max2": "a, b", "min2": "a, b", "reverse": "s", "sum_list": "xs", "count_pos": "xs"}


def _pairs(rng: random.Random) -> list[tuple[int, int]]:
    return [(rng.randint(-20, 20), rng.randint(-20, 20)) for _ in range(4)]


def _words(rng: random.Random) -> list[str]:
    return ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 6))) for _ in range(4)]


def _lists(rng: random.Random) -> list[list[int]]:
    return [[rng.randint(-9, 9) for _ in range(rng.randint(0, 5))] for _ in range(4)]


def extract_code(response: str) -> str | None:
    """The last fenced code block, else the response from its first `def ` line; None if neither."""
    blocks = _CODE_BLOCK.findall(response)
    if blocks:
        return blocks[-1]
    start = response.find("def ")
    return response[start:].split("<|")[0] if start >= 0 else None


class CodeSuite:
    domain = "code"
    version = "code-v1"

    def __init__(self, limits: SandboxLimits = _LIMITS):
        self.limits = limits

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]:
        rng = random.Random(split_seed(split, seed) * 17 + difficulty)
        families = [name for name, fam in FAMILIES.items() if fam[0] <= difficulty]
        tasks: dict[str, Task] = {}
        for _ in range(n * 20):
            if len(tasks) >= n:
                break
            family = rng.choice(families)
            level, spec, body, tests_for = FAMILIES[family]
            k, name = rng.randint(2, 9), rng.choice(NAMES)
            args = _ARGS.get(family, "x")
            prompt = f"Write a Python function `{name}({args})` that {spec.format(k=k)}."
            tests = "\n".join(f"assert {name}{a!r} == {e!r}" for a, e in tests_for(rng, k))
            tests = tests.replace(",)", ")")
            solution = f"def {name}({args}):\n    {body.format(k=k)}\n"
            tid = task_id(self.domain, prompt)
            meta = {"family": family, "solution": solution, "function": name}
            tasks.setdefault(tid, Task(tid, self.domain, prompt, tests, level, split, meta))
        return list(tasks.values())

    def verify(self, task: Task, response: str) -> Verdict:
        code = extract_code(response)
        if not code or not code.strip():
            return Verdict(0.0, "no_code")
        result = run_python(f"{code}\n\n{task.answer}\n", self.limits)
        if result.ok:
            return Verdict(1.0, "correct")
        return Verdict(0.0, f"{result.status}: {result.reason}"[:200])

    def solution(self, task: Task) -> list[dict]:
        return [{"role": "assistant", "content": f"```python\n{task.meta['solution']}```"}]
