"""Terminal tasks: a few small text files in a throwaway directory, tools `ls`, `cat`, `grep`, `write`, and a
test script that checks the directory afterwards, run in the sandbox (infra/sandbox.py) over the episode's files.

Level 1: write a given word to a file (one tool call, copy the prompt).
Level 2: copy the text of one file into another (cat, then write what came back).
Level 3: find which file holds a word (e.g. owl7) and write that file's name to answer.txt (grep, then write)."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

from infra.sandbox import SandboxLimits, run_python
from training.agentic.episodes import Delay, ExtraLatency, clip, parse_tool_call, replay_verify, similarity
from training.agentic.protocol import EnvironmentCrash
from training.tasks.base import Split, Task, Verdict, split_seed, task_id

WORDS = [
    "red", "blue", "green", "gold", "lime", "pink", "cat", "dog", "owl", "fox", "bee", "elk",
    "sun", "moon", "star", "rain", "snow", "wind", "oak", "pine", "rose", "fig", "plum", "kiwi",
]  # fmt: skip
# file names like owl.txt or plum.log: enough distinct (source, target) pairs for hundreds of level-2 prompts
FILES = [f"{w}.{ext}" for w in WORDS for ext in ("txt", "log", "md")]
TOOLS = {"ls": (), "cat": ("path",), "grep": ("word",), "write": ("path", "content")}
MAX_FILES, MAX_CONTENT = 8, 80
_LIMITS = SandboxLimits(wall_s=10, cpu_s=2, memory_mb=256, output_bytes=4096)


def _value(rng: random.Random) -> str:
    return f"{rng.choice(WORDS)}{rng.randint(1, 99)}"


def _check_script(expected: dict[str, str]) -> str:
    """The test script: every named file exists with exactly this text (surrounding whitespace ignored)."""
    lines = ["import os"]
    for name, text in sorted(expected.items()):
        lines.append(f"assert os.path.exists({name!r}), {f'{name} is missing'!r}")
        lines.append(f"got = open({name!r}).read().strip()")
        lines.append(f"assert got == {text!r}, {name!r} + ' holds ' + repr(got[:40])")
    return "\n".join(lines) + "\n"


class TerminalEpisode:
    def __init__(self, task: Task, latency: ExtraLatency, limits: SandboxLimits):
        self.task, self.limits, self.delay = task, limits, Delay(latency, task.id)
        try:
            self.dir = Path(tempfile.mkdtemp(prefix="crucible-terminal-"))
            for name, text in task.meta["files"].items():
                (self.dir / name).write_text(text + "\n")
        except OSError as exc:
            raise EnvironmentCrash(f"terminal: cannot make the episode dir: {exc}") from exc

    def _files(self) -> dict[str, str]:
        if not self.dir.is_dir():
            raise EnvironmentCrash(f"terminal: episode dir {self.dir} is gone")
        try:
            return {p.name: p.read_text() for p in sorted(self.dir.iterdir()) if p.is_file()}
        except OSError as exc:
            raise EnvironmentCrash(f"terminal: cannot read the episode dir: {exc}") from exc

    def tool(self, payload: str) -> str:
        self.delay.wait()
        files = self._files()
        parsed = parse_tool_call(payload, TOOLS)
        if isinstance(parsed, str):
            return parsed
        name, args = parsed
        path = args.get("path", "")
        if name == "ls":
            return clip(" ".join(files) or "(empty)")
        if name == "grep":
            word = args.get("word", "").strip()
            hits = [f for f, text in files.items() if word and word in text.split()]
            return clip(" ".join(hits) or "no match")
        if not path or "/" in path or path.startswith(".") or len(path) > 20:
            return "error: path must be a plain file name like a.txt"
        if name == "cat":
            return clip(files[path].strip()) if path in files else f"error: no file {path}"
        content = args.get("content", "")
        if path == "main.py":  # the test script's own name in the sandbox
            return "error: main.py is reserved"
        if len(content) > MAX_CONTENT or (path not in files and len(files) >= MAX_FILES):
            return f"error: at most {MAX_FILES} files of {MAX_CONTENT} characters"
        try:
            (self.dir / path).write_text(content + "\n")
        except OSError as exc:
            raise EnvironmentCrash(f"terminal: cannot write in the episode dir: {exc}") from exc
        return "ok"

    def finish(self, response: str) -> Verdict:
        """Run the task's test script in the sandbox over the episode's files (the response itself is unused:
        the state is what counts)."""
        self.delay.wait()
        files = self._files()
        result = run_python(self.task.answer, self.limits, files=files)
        if result.ok:
            return Verdict(1.0, "correct")
        if result.status == "error":
            last = (result.stderr.strip().splitlines() or [result.reason])[-1]
            return Verdict(0.0, f"tests_failed: {last}"[:200], partial=self._closeness(files))
        # the script is ours and tiny: anything else is the sandbox failing, not the policy
        raise EnvironmentCrash(f"terminal: sandbox {result.status}: {result.reason}"[:200])

    def _closeness(self, files: dict[str, str]) -> float:
        """Mean similarity of each file the worked solution writes to what the episode's file holds (0 when
        it is missing): a write of `fox69` for `fox96` comes close, a wrong file name does not."""
        writes = {a["path"]: a["content"] for name, a, _ in self.task.meta["steps"] if name == "write"}
        return sum(similarity(files[p], c) if p in files else 0.0 for p, c in writes.items()) / max(
            1, len(writes)
        )

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class TerminalSuite:
    """Task suite and in-process environment of the terminal family."""

    domain = "terminal"
    # v2: values and file names in quotes, so the prompt and the tool call's JSON tokenize them alike
    version = "terminal-v2"

    def __init__(self, latency: ExtraLatency | None = None, limits: SandboxLimits = _LIMITS):
        self.latency, self.limits = latency or ExtraLatency(), limits

    def generate(self, split: Split, n: int, seed: int, difficulty: int) -> list[Task]:
        if difficulty not in (1, 2, 3):
            raise ValueError(f"terminal: difficulty {difficulty} is not one of 1, 2, 3")
        rng = random.Random(split_seed(split, seed) * 31 + difficulty)
        tasks: dict[str, Task] = {}
        for _ in range(n * 20):
            if len(tasks) >= n:
                break
            prompt, files, expected, steps = self._make(rng, difficulty)
            tid = task_id(self.domain, prompt)
            meta = {"files": files, "steps": steps}
            tasks.setdefault(
                tid, Task(tid, self.domain, prompt, _check_script(expected), difficulty, split, meta)
            )
        return list(tasks.values())

    def _make(self, rng: random.Random, level: int) -> tuple[str, dict, dict, list]:
        names = rng.sample(FILES, 3)
        values = [_value(rng) for _ in names]
        if level == 1:
            value, target = values[0], names[0]
            files = {names[1]: values[1]}
            steps = [("write", {"path": target, "content": value}, "ok")]
            return f'Write "{value}" to "{target}".', files, {target: value}, steps
        if level == 2:
            src, dst = names[0], names[1]
            files = {src: values[0], names[2]: values[2]}
            steps = [
                ("cat", {"path": src}, values[0]),
                ("write", {"path": dst, "content": values[0]}, "ok"),
            ]
            return f'Copy the text of "{src}" to "{dst}".', files, {dst: values[0], src: values[0]}, steps
        # level 3: three files of three words; exactly one holds the word asked for
        words = [f"{w}{rng.randint(1, 99)}" for w in rng.sample(WORDS, 7)]
        target_word, others = words[0], words[1:]
        files = {name: " ".join(others[2 * i : 2 * i + 2]) for i, name in enumerate(names)}
        holder = rng.randrange(3)
        files[names[holder]] = f"{files[names[holder]]} {target_word}"
        files = {k: " ".join(rng.sample(v.split(), len(v.split()))) for k, v in files.items()}
        steps = [
            ("grep", {"word": target_word}, names[holder]),
            ("write", {"path": "answer.txt", "content": names[holder]}, "ok"),
        ]
        prompt = f'Which file has the word "{target_word}"? Write its name to "answer.txt".'
        return prompt, files, {"answer.txt": names[holder]}, steps

    def open(self, task: Task) -> TerminalEpisode:
        return TerminalEpisode(task, self.latency, self.limits)

    def verify(self, task: Task, response: str) -> Verdict:
        return replay_verify(self, task, response)

    def solution(self, task: Task) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for name, args, result in task.meta["steps"]:
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": args}]}
            )
            messages.append({"role": "tool", "content": result})
        return [*messages, {"role": "assistant", "content": "Done."}]
