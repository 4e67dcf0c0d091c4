"""Versioned judge prompts: one text file per version in `classifiers/judge/prompts/` (`<task>_v<N>.txt`).

File format (sections start with `### `; lines before the first section starting with `#` are comments).
A *rubric* prompt asks the judge for a score in a chat:

    ### system
    You are ...
    ### user
    ... <document>{document}</document> ...
    ### example score=5          (zero or more few-shot examples, shown as earlier chat turns)
    a document that deserves a 5
    ### answer_prefix          (optional: text the answer starts with, e.g. "Score: ")

A *levels* prompt describes rubric levels instead; the judge scores a document by how likely the model
finds it after each level's description (the noisy-channel reading of a rubric, which a small model that
cannot follow instructions still supports; needs a backend that exposes document log-likelihoods):

    ### level score=0
    The following is a joke, a quotation or a website menu, with no mathematics:
    ### level score=5
    The following is a solved problem from a mathematics textbook, step by step:

The prompt id used in cache keys is `<stem>-<sha256 of the file, 8 hex>`: editing a file without bumping
its version still gives new cache entries.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

PROMPTS_DIR = Path(__file__).parent / "prompts"
_SECTION = re.compile(r"^### (\w+)(?:\s+score=(\d+))?\s*$")


@dataclass(frozen=True)
class JudgePrompt:
    name: str  # file stem, e.g. edu_math_v1
    prompt_id: str  # name + content hash, the cache key part
    system: str = ""
    user_template: str = ""
    examples: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    answer_prefix: str = ""
    levels: tuple[tuple[int, str], ...] = field(
        default_factory=tuple
    )  # (score, description) of a levels prompt
    max_score: int = 5

    @property
    def kind(self) -> str:
        return "levels" if self.levels else "rubric"

    def messages(self, document: str) -> list[dict]:
        """Chat messages asking for the score of `document` (few-shot examples first); rubric prompts only."""
        if self.kind != "rubric":
            raise ValueError(f"prompt {self.name} describes levels; it has no chat messages")
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for text, score in self.examples:
            msgs.append({"role": "user", "content": self.user_template.replace("{document}", text)})
            msgs.append({"role": "assistant", "content": f"{self.answer_prefix}{score}"})
        msgs.append({"role": "user", "content": self.user_template.replace("{document}", document)})
        return msgs


def parse_prompt_file(text: str, name: str) -> JudgePrompt:
    sections: dict[str, str] = {}
    scored: list[tuple[str, int, list[str]]] = []  # ("example" | "level", score, lines)
    current: list[str] | None = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            current = []
            if m.group(1) in ("example", "level"):
                if m.group(2) is None:
                    raise ValueError(f"prompt {name}: '### {m.group(1)}' needs score=N")
                scored.append((m.group(1), int(m.group(2)), current))
            elif m.group(1) in ("system", "user", "answer_prefix"):
                sections[m.group(1)] = current  # type: ignore[assignment]
            else:
                raise ValueError(f"prompt {name}: unknown section '### {m.group(1)}'")
        elif current is not None:
            current.append(line)
        elif line.strip() and not line.startswith("#"):
            raise ValueError(f"prompt {name}: text before the first '### section': {line!r}")
    body = {k: "\n".join(v).strip() for k, v in sections.items()}  # type: ignore[arg-type]
    examples = tuple(("\n".join(lines).strip(), s) for kind, s, lines in scored if kind == "example")
    levels = tuple(sorted((s, "\n".join(lines).strip("\n")) for kind, s, lines in scored if kind == "level"))
    if levels and ("user" in body or examples):
        raise ValueError(f"prompt {name}: a levels prompt has no '### user' or '### example' sections")
    if not levels and "{document}" not in body.get("user", ""):
        raise ValueError(f"prompt {name}: needs a '### user' section containing {{document}} (or levels)")
    if levels and len(levels) < 2:
        raise ValueError(f"prompt {name}: a levels prompt needs at least two levels")
    raw_prefix = "\n".join(sections.get("answer_prefix", []))  # type: ignore[arg-type]
    prefix = raw_prefix.strip("\n")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return JudgePrompt(
        name=name,
        prompt_id=f"{name}-{digest}",
        system=body.get("system", ""),
        user_template=body.get("user", ""),
        examples=examples,
        answer_prefix=prefix,
        levels=levels,
        max_score=max([s for s, _ in levels] or [5]),
    )


def load_prompt(name: str, prompts_dir: Path | None = None) -> JudgePrompt:
    """Load `<name>.txt` (e.g. `edu_math_v1`) from the prompts folder."""
    path = Path(prompts_dir or PROMPTS_DIR) / f"{name}.txt"
    if not path.exists():
        known = sorted(p.stem for p in Path(prompts_dir or PROMPTS_DIR).glob("*.txt"))
        raise FileNotFoundError(f"no judge prompt {name!r}; known: {known}")
    return parse_prompt_file(path.read_text(encoding="utf-8"), name)
