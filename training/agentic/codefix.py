"""Code fixing: a two-function module (`mod.py`, `calc.py`, ...) with one bug, fail-to-pass tests (they fail on the bug) and
pass-to-pass tests (the other function: they must keep passing). Tools `read` (the module) and `run_tests` (the
tests in the sandbox, a one-line summary). The final response holds the whole fixed module in a ```python
block; reward 1 only if every fail-to-pass and every pass-to-pass test passes, run in the sandbox.

Level 1: a wrong constant, the prompt states what the function should return.
Level 2: a wrong operator (+ for *, min for max), the prompt states what the function should return.
Level 3: either bug, the prompt says only "make the tests pass": run the tests, read, fix."""

from __future__ import annotations

import json
import random
import secrets
from typing import Any

from infra.sandbox import SandboxLimits, run_python
from training.agentic.episodes import Delay, ExtraLatency, clip, parse_tool_call, replay_verify
from training.agentic.protocol import EnvironmentCrash
from training.tasks.base import Split, Task, Verdict, split_seed, task_id
from training.tasks.code import ARGS, FAMILIES, NAMES, extract_code

TOOLS = {"read": ("path",), "run_tests": ()}
MODULES = ("mod.py", "calc.py", "util.py", "core.py", "ops.py", "lib.py", "num.py", "fns.py")
_LIMITS = SandboxLimits(wall_s=10, cpu_s=2, memory_mb=256, output_bytes=8192)
# family (training/tasks/code.py) -> wrong-operator bodies (level 2); level 1 changes the constant instead
WRONG_OPERATOR = {
    "add_const": "return x - {k}",
    "sub_const": "return x + {k}",
    "mul_const": "return x + {k}",
    "add2": "return a - b",
    "max2": "return min(a, b)",
    "min2": "return max(a, b)",
}
CONSTANT_FAMILIES = ("add_const", "sub_const", "mul_const")
HELPERS = ("max2", "min2", "add2", "square", "is_even")

# Runs in the sandbox as main.py next to the module; prints one report line tagged with a per-run nonce.
_RUNNER = """
import importlib
import json
import os
import sys
sys.path.insert(0, os.getcwd())  # python -I leaves the script's directory off the path
cases = json.loads({cases!r})
report = {{"fail_to_pass": [0, 0], "pass_to_pass": [0, 0], "first_failure": ""}}
try:
    mod = importlib.import_module({module!r})
    error = None
except BaseException as exc:
    mod, error = None, "import: " + type(exc).__name__
for group, tests in cases.items():
    for fn, args, want in tests:
        report[group][1] += 1
        call = fn + "(" + ", ".join(repr(a) for a in args) + ")"
        try:
            got = getattr(mod, fn)(*args) if error is None else None
            ok = error is None and type(got) is type(want) and got == want
            why = error or (call + " == " + repr(want) + " got " + repr(got)[:20])
        except Exception as exc:
            ok, why = False, call + " raised " + type(exc).__name__
        report[group][0] += ok
        if not ok and not report["first_failure"]:
            report["first_failure"] = why
print({nonce!r} + json.dumps(report))
"""


def _function(name: str, family: str, body: str) -> str:
    return f"def {name}({ARGS.get(family, 'x')}):\n    {body}\n"


def _outputs(source: str, fn: str, inputs: list[tuple]) -> list[Any]:
    """Our own generated module (trusted, two lines) evaluated in process to pick tests that fail on the bug."""
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # noqa: S102 - source is a template filled with ints, never model output
    return [namespace[fn](*args) for args in inputs]


def summary(report: dict[str, Any]) -> str:
    f2p, p2p = report["fail_to_pass"], report["pass_to_pass"]
    line = f"fail_to_pass {f2p[0]}/{f2p[1]}, pass_to_pass {p2p[0]}/{p2p[1]}"
    return clip(f"{line}; {report['first_failure']}" if report["first_failure"] else line)


class CodefixEpisode:
    def __init__(self, task: Task, latency: ExtraLatency, limits: SandboxLimits):
        self.task, self.limits, self.delay = task, limits, Delay(latency, task.id)
        self.closed = False

    def _run(self, module: str) -> dict[str, Any] | Verdict:
        """The test report of `module` in the sandbox, or a 0 verdict when the module broke the run."""
        if self.closed:
            raise EnvironmentCrash("codefix: episode already closed")
        nonce = f"REPORT-{secrets.token_hex(8)}:"
        module_file = self.task.meta["module_file"]
        runner = _RUNNER.format(
            cases=json.dumps(self.task.meta["tests"]), nonce=nonce, module=module_file.removesuffix(".py")
        )
        result = run_python(runner, self.limits, files={module_file: module})
        if result.status == "unavailable":
            raise EnvironmentCrash(f"codefix: sandbox unavailable: {result.reason}"[:200])
        for line in result.stdout.splitlines():
            if line.startswith(nonce):
                return json.loads(line[len(nonce) :])
        # the module's code ended the run (exit at import, endless loop, memory): the policy's fault. (A module
        # that reads the runner could forge the report; the nonce only stops accidents, not a determined policy.)
        return Verdict(0.0, f"no_test_report: {result.status} {result.reason}"[:200])

    def tool(self, payload: str) -> str:
        self.delay.wait()
        parsed = parse_tool_call(payload, TOOLS)
        if isinstance(parsed, str):
            return parsed
        name, args = parsed
        if name == "read":
            if args.get("path", self.task.meta["module_file"]) != self.task.meta["module_file"]:
                return f"error: the module is {self.task.meta['module_file']}"
            return clip(self.task.meta["module"])
        report = self._run(self.task.meta["module"])
        if isinstance(report, Verdict):  # our own two-line module gave no report: the sandbox failed
            raise EnvironmentCrash(f"codefix: run_tests on the task's module: {report.reason}"[:200])
        return summary(report)

    def finish(self, response: str) -> Verdict:
        self.delay.wait()
        code = extract_code(response)
        if not code or not code.strip():
            return Verdict(0.0, "no_code")
        report = self._run(code)
        if isinstance(report, Verdict):
            return report
        f2p, p2p = report["fail_to_pass"], report["pass_to_pass"]
        if f2p[0] == f2p[1] and p2p[0] == p2p[1]:
            return Verdict(1.0, "correct")
        # progress on the bug, kept only as far as the rest still works: the task's own module scores 0
        progress = f2p[0] / max(1, f2p[1]) * p2p[0] / max(1, p2p[1])
        return Verdict(0.0, f"tests_failed: {summary(report)}"[:200], partial=progress)

    def close(self) -> None:
        self.closed = True


class CodefixSuite:
    """Task suite and in-process environment of the code-fixing family."""

    domain = "codefix"
    version = "codefix-v1"

    def __init__(self, latency: ExtraLatency | None = None, limits: SandboxLimits = _LIMITS):
        self.latency, self.limits = latency or ExtraLatency(), limits

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]:
        if difficulty not in (1, 2, 3):
            raise ValueError(f"codefix: difficulty {difficulty} is not one of 1, 2, 3")
        rng = random.Random(split_seed(split, seed) * 37 + difficulty)
        tasks: dict[str, Task] = {}
        for _ in range(n * 30):
            if len(tasks) >= n:
                break
            task = self._make(rng, difficulty, split)
            if task is not None:
                tasks.setdefault(task.id, task)
        return list(tasks.values())

    def _make(self, rng: random.Random, level: int, split: Split) -> Task | None:
        bug = "constant" if level == 1 else "operator" if level == 2 else rng.choice(["constant", "operator"])
        family = rng.choice(CONSTANT_FAMILIES if bug == "constant" else sorted(WRONG_OPERATOR))
        helper = rng.choice([h for h in HELPERS if h != family])
        name, helper_name = rng.sample(NAMES, 2)
        module_file, k = rng.choice(MODULES), rng.randint(2, 9)
        _, spec, body, tests_for = FAMILIES[family]
        wrong = body.format(k=k + rng.choice([-1, 1, 2])) if bug == "constant" else WRONG_OPERATOR[family]
        buggy_fn = _function(name, family, wrong.format(k=k))
        helper_fn = _function(helper_name, helper, FAMILIES[helper][2].format(k=k))
        module = f"{buggy_fn}\n{helper_fn}"
        fixed = f"{_function(name, family, body.format(k=k))}\n{helper_fn}"
        cases = tests_for(rng, k)
        got = _outputs(buggy_fn, name, [a for a, _ in cases])
        failing = [(a, e, g) for (a, e), g in zip(cases, got, strict=True) if g != e][:3]
        if len(failing) < 2:
            return None
        tests = {
            "fail_to_pass": [[name, list(a), e] for a, e, _ in failing],
            "pass_to_pass": [[helper_name, list(a), e] for a, e in FAMILIES[helper][3](rng, k)[:3]],
        }
        if level < 3:
            prompt = f"Fix {module_file}: {name} {spec.format(k=k)}."
        else:  # nothing about the bug: the tests say what is wrong
            prompt = f"Tests of {module_file} fail. Fix {name}, keep {helper_name}."
        a, want, wrong_value = failing[0]
        n_p2p = len(tests["pass_to_pass"])
        report = {
            "fail_to_pass": [0, len(failing)],
            "pass_to_pass": [n_p2p, n_p2p],
            "first_failure": f"{name}({', '.join(repr(v) for v in a)}) == {want!r} got {wrong_value!r}",
        }
        meta = {"module_file": module_file, "module": module, "fixed": fixed, "tests": tests, "bug": bug,
                "family": family, "test_summary": summary(report)}  # fmt: skip
        tid = task_id(self.domain, prompt)
        return Task(tid, self.domain, prompt, json.dumps(tests, sort_keys=True), level, split, meta)

    def open(self, task: Task) -> CodefixEpisode:
        return CodefixEpisode(task, self.latency, self.limits)

    def verify(self, task: Task, response: str) -> Verdict:
        return replay_verify(self, task, response)

    def solution(self, task: Task) -> list[dict[str, Any]]:
        def call(name: str, args: dict) -> dict:
            return {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": args}]}

        steps: list[dict[str, Any]] = []
        if task.difficulty == 3:
            steps += [call("run_tests", {}), {"role": "tool", "content": task.meta["test_summary"]}]
        steps += [
            call("read", {"path": task.meta["module_file"]}),
            {"role": "tool", "content": task.meta["module"]},
        ]
        return [*steps, {"role": "assistant", "content": f"```python\n{task.meta['fixed']}```"}]
