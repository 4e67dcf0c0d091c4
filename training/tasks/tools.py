"""Tool-integrated reasoning: arithmetic too long to do in one step, with a calculator the model may call.

A call is `<tool_call>{"name": "calculator", "arguments": {"expression": "..."}}</tool_call>` (the
tokenizer's special tokens); the rollout loop runs it with `call_tool` and feeds the result back as an
observation turn; the final turn must say `Answer: <number>`.

The worked solution quotes the number it copies from the result (`Answer: "31186"`, tool-v2): after a quote a
number's first digit is the bare token it is in the result (`<tool_response>31186`); after `Answer: ` it would be
the leading-space token (" 3" against "3"), so the copy would start from a token the result does not hold."""

from __future__ import annotations

import ast
import json
import operator
import random
import warnings

from training.tasks.base import Split, Task, Verdict, extract_answer, split_seed, task_id

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 64


def calculator(expression: str) -> str:
    """+, -, * and exact / over integers, evaluated from the syntax tree (never eval); an error message
    otherwise (a division with a remainder is an error: every answer here is an integer)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        return "error: expression too long"
    try:
        with warnings.catch_warnings():  # model text like "3if": Python warns on stderr, once per rollout
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return "error: not an expression"

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 10**12:
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = value(node.left), value(node.right)
            if right == 0 or left % right:
                raise ValueError("division by zero" if right == 0 else "inexact division")
            return left // right
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(type(node).__name__)

    try:
        return str(value(tree.body))
    except ValueError as exc:
        return f"error: unsupported {exc}"


TOOLS = {"calculator": calculator}


def call_tool(payload: str) -> str:
    """Run one tool call given as the JSON text between <tool_call> tags; errors come back as text."""
    try:
        call = json.loads(payload)
        fn = TOOLS[call["name"]]
        return fn(**call.get("arguments", {}))
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return f"error: bad tool call ({type(exc).__name__})"


class ToolSuite:
    """Difficulty 1: a two-digit product; 2: three-digit by two-digit; 3: a product plus a sum; 4: two products."""

    domain = "tool"
    version = "tool-v2"

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]:
        rng = random.Random(split_seed(split, seed) * 13 + difficulty)
        tasks: dict[str, Task] = {}
        for _ in range(n * 20):
            if len(tasks) >= n:
                break
            expression = self._expression(rng, difficulty)
            prompt = f"Use the calculator to compute {expression}."
            tid = task_id(self.domain, prompt)
            meta = {"expression": expression}
            tasks.setdefault(
                tid, Task(tid, self.domain, prompt, calculator(expression), difficulty, split, meta)
            )
        return list(tasks.values())

    def _expression(self, rng: random.Random, level: int) -> str:
        if level == 1:
            return f"{rng.randint(10, 99)} * {rng.randint(10, 99)}"
        if level == 2:
            return f"{rng.randint(100, 999)} * {rng.randint(10, 99)}"
        if level == 3:
            return f"{rng.randint(10, 99)} * {rng.randint(10, 99)} + {rng.randint(100, 999)}"
        return f"{rng.randint(10, 99)} * {rng.randint(10, 99)} - {rng.randint(10, 99)} * {rng.randint(2, 9)}"

    def verify(self, task: Task, response: str) -> Verdict:
        answer = extract_answer(response)
        if answer is None:
            return Verdict(0.0, "no_answer")
        return (
            Verdict(1.0, "correct")
            if answer.strip().rstrip(".") == task.answer
            else Verdict(0.0, "wrong_answer")
        )

    def solution(self, task: Task) -> list[dict]:
        call = {"name": "calculator", "arguments": {"expression": task.meta["expression"]}}
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": task.answer},
            {"role": "assistant", "content": f'Answer: "{task.answer}"'},
        ]
