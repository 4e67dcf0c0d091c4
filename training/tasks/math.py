"""Math: arithmetic and linear algebra generated in code at graded difficulty; answers checked with sympy, so
any equivalent form counts ("10/4", "5/2", "2.5"; "5x", "5*x", "x*5")."""

from __future__ import annotations

import random
import re
from tokenize import TokenError  # parse_expr raises it for unbalanced brackets

import sympy
from sympy.parsing.sympy_parser import (
    implicit_multiplication_application,
    parse_expr,
    standard_transformations,
)

from training.tasks.base import Split, Task, Verdict, extract_answer, split_seed, task_id
from training.tasks.tools import calculator

X = sympy.Symbol("x")
# Only digits, x, operators, brackets and spaces reach the parser (parse_expr evaluates Python): a model's
# answer is never code.
_SAFE_EXPR = re.compile(r"^[0-9x+\-*/^(). ]{1,64}$")
_TRANSFORMS = standard_transformations + (implicit_multiplication_application,)
_GLOBALS = {
    "Integer": sympy.Integer,
    "Float": sympy.Float,
    "Rational": sympy.Rational,
    "Symbol": sympy.Symbol,
}


def parse_answer(text: str) -> sympy.Expr | None:
    """A sympy expression for a model's answer, or None if it is not a safe, well-formed expression."""
    text = text.strip().rstrip(".").replace("x =", "").replace("x=", "").strip()
    if not _SAFE_EXPR.match(text):
        return None
    try:
        return parse_expr(
            text.replace("^", "**"), local_dict={"x": X}, global_dict=_GLOBALS, transformations=_TRANSFORMS
        )
    # sympy's transformations can also build code naming things outside _GLOBALS ("15x1." -> Number,
    # "15x..1" -> Symbol.Float): any failure to parse is "not an expression", never a crashed RL step
    except (
        SyntaxError, TypeError, ValueError, ZeroDivisionError, NameError, AttributeError, sympy.SympifyError,
        TokenError,
    ):  # fmt: skip
        return None


def equivalent(answer: str, reference: str) -> bool:
    got, want = parse_answer(answer), parse_answer(reference)
    if got is None or want is None:
        return False
    try:
        return sympy.simplify(got - want) == 0
    except (TypeError, ValueError):
        return False


_ARITHMETIC = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")
_SHIFTED = re.compile(r"Solve for x: x \+ (\d+) = (-?\d+)")
_LINEAR = re.compile(r"Solve for x: (\d+)x \+ (\d+) = (-?\d+)")
_LIKE_TERMS = re.compile(r"Simplify: (\d+)x \+ (\d+)x")


def calculator_expression(prompt: str) -> tuple[str, str] | None:
    """(the calculator expression that solves a math prompt, how its result becomes the answer: "{}" or
    "{}x"), or None for a prompt of no known form. The arithmetic is the tool's; the model only has to set the
    problem up and copy numbers, which a small model learns where one-digit facts it does not."""
    if m := _ARITHMETIC.fullmatch(prompt):
        return f"{m[1]} {m[2]} {m[3]}", "{}"
    if m := _SHIFTED.fullmatch(prompt):
        return f"{m[2]} - {m[1]}", "{}"
    if m := _LINEAR.fullmatch(prompt):
        return f"({m[3]} - {m[2]}) / {m[1]}", "{}"
    if m := _LIKE_TERMS.fullmatch(prompt):
        return f"{m[1]} + {m[2]}", "{}x"
    return None


def column_steps(prompt: str) -> str | None:
    """Worked steps one digit column at a time, units first ("68 + 55" -> "8 + 5 = 13, 6 + 5 + 1 = 12,
    68 + 55 = 123"), for a multi-digit sum, difference or product by one digit; None for other prompts.
    Each step is a one-digit fact, so a small model need not do a whole number in one token's forward pass."""
    m = _ARITHMETIC.fullmatch(prompt)
    if not m or max(len(m[1]), len(m[3])) < 2 or (m[2] == "*" and len(m[3]) > 1):
        return None
    a, op, b = int(m[1]), m[2], int(m[3])
    da, db = [int(c) for c in reversed(m[1])], [int(c) for c in reversed(m[3])]
    steps, carry = [], 0
    for i in range(max(len(da), len(db)) if op == "+" else len(da)):
        x, y = da[i] if i < len(da) else 0, db[i] if i < len(db) else 0
        if op == "+":
            steps.append(f"{x} + {y}{f' + {carry}' if carry else ''} = {x + y + carry}")
            carry = (x + y + carry) // 10
        elif op == "-":
            x -= carry
            carry = int(x < y)
            steps.append(f"{x + 10 * carry} - {y} = {x + 10 * carry - y}")
        else:
            steps.append(f"{x} * {b}{f' + {carry}' if carry else ''} = {x * b + carry}")
            carry = (x * b + carry) // 10
    result = {"+": a + b, "-": a - b, "*": a * b}[op]
    return ", ".join(steps) + f", {a} {op} {b} = {result}"


class MathSuite:
    """Difficulty 1: one-digit sums; 2: two-digit sums and differences; 3: products and x + a = b;
    4: a*x + b = c with an integer root, and collecting like terms."""

    domain = "math"
    version = "math-v2"

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]:
        rng = random.Random(split_seed(split, seed) * 31 + difficulty)
        tasks: dict[str, Task] = {}
        for _ in range(n * 20):
            if len(tasks) >= n:
                break
            prompt, answer, steps = self._problem(rng, difficulty)
            tid = task_id(self.domain, prompt)
            tasks.setdefault(tid, Task(tid, self.domain, prompt, answer, difficulty, split, {"steps": steps}))
        return list(tasks.values())

    def _problem(self, rng: random.Random, level: int) -> tuple[str, str, str]:
        if level == 1:
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            return f"What is {a} + {b}?", str(a + b), f"{a} + {b} = {a + b}"
        if level == 2:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if rng.random() < 0.5:
                return f"What is {a} + {b}?", str(a + b), f"{a} + {b} = {a + b}"
            a, b = max(a, b), min(a, b)
            return f"What is {a} - {b}?", str(a - b), f"{a} - {b} = {a - b}"
        if level == 3:
            if rng.random() < 0.5:
                a, b = rng.randint(10, 99), rng.randint(2, 9)
                return f"What is {a} * {b}?", str(a * b), f"{a} * {b} = {a * b}"
            a, root = rng.randint(1, 20), rng.randint(-10, 20)
            return f"Solve for x: x + {a} = {root + a}", str(root), f"x = {root + a} - {a} = {root}"
        if rng.random() < 0.5:
            a, b, root = rng.randint(2, 9), rng.randint(1, 20), rng.randint(-9, 9)
            c = a * root + b
            return (
                f"Solve for x: {a}x + {b} = {c}",
                str(root),
                f"{a}x = {c} - {b} = {c - b}, x = {c - b} / {a} = {root}",
            )
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        return f"Simplify: {a}x + {b}x", f"{a + b}*x", f"{a}x + {b}x = ({a} + {b})x = {a + b}x"

    def verify(self, task: Task, response: str) -> Verdict:
        answer = extract_answer(response)
        if answer is None:
            return Verdict(0.0, "no_answer")
        if parse_answer(answer) is None:
            return Verdict(0.0, "unparsable_answer")
        return Verdict(1.0, "correct") if equivalent(answer, task.answer) else Verdict(0.0, "wrong_answer")

    def calculator_solution(self, task: Task) -> list[dict] | None:
        """A worked solution that calls the calculator (tasks/tools.py) for the arithmetic, or None."""
        found = calculator_expression(task.prompt)
        if found is None:
            return None
        expression, form = found
        result = calculator(expression)
        call = {"name": "calculator", "arguments": {"expression": expression}}
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": result},
            {"role": "assistant", "content": f'Answer: "{form.format(result)}"'},  # quoted: tools.py
        ]

    def solution(self, task: Task) -> list[dict]:
        answer = task.answer.replace("*x", "x")
        return [
            {"role": "assistant", "reasoning_content": task.meta["steps"], "content": f"Answer: {answer}"}
        ]
