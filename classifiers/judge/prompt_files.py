"""Versioned judge prompts: one text file per version in `classifiers/judge/prompts/` (`<task>_v<N>.txt`).

File format (sections start with `### `, lines before the first section starting with `#` are comments):

    ### system
    You are ...
    ### user
    ... <document>{document}</document> ...
    ### example score=5          (zero or more few-shot examples, shown as earlier chat turns)
    a document that deserves a 5
    ### answer_prefix          (optional: text the answer starts with, e.g. "Score: ")

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
    system: str
    user_template: str
    examples: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    answer_prefix: str = ""
    max_score: int = 5

    def messages(self, document: str) -> list[dict]:
        """Chat messages asking for the score of `document` (few-shot examples first)."""
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for text, score in self.examples:
            msgs.append({"role": "user", "content": self.user_template.replace("{document}", text)})
            msgs.append({"role": "assistant", "content": f"{self.answer_prefix}{score}"})
        msgs.append({"role": "user", "content": self.user_template.replace("{document}", document)})
        return msgs


def parse_prompt_file(text: str, name: str) -> JudgePrompt:
    sections: dict[str, list[str]] = {}
    examples: list[tuple[str, int]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            current = []
            if m.group(1) == "example":
                if m.group(2) is None:
                    raise ValueError(f"prompt {name}: '### example' needs score=N")
                examples.append(("", int(m.group(2))))
                sections.setdefault("_examples", []).append(str(len(examples) - 1))
                sections[f"_example_{len(examples) - 1}"] = current
            else:
                sections[m.group(1)] = current
        elif current is not None:
            current.append(line)
        elif line.strip() and not line.startswith("#"):
            raise ValueError(f"prompt {name}: text before the first '### section': {line!r}")
    if "user" not in sections or "{document}" not in "\n".join(sections["user"]):
        raise ValueError(f"prompt {name}: needs a '### user' section containing {{document}}")
    examples = [
        ("\n".join(sections[f"_example_{i}"]).strip(), score) for i, (_, score) in enumerate(examples)
    ]
    prefix = "\n".join(sections.get("answer_prefix", [])).strip("\n")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return JudgePrompt(
        name=name,
        prompt_id=f"{name}-{digest}",
        system="\n".join(sections.get("system", [])).strip(),
        user_template="\n".join(sections["user"]).strip(),
        examples=tuple(examples),
        answer_prefix=prefix.rstrip("\n") + (" " if prefix.endswith(" ") else ""),
    )


def load_prompt(name: str, prompts_dir: Path | None = None) -> JudgePrompt:
    """Load `<name>.txt` (e.g. `edu_math_v1`) from the prompts folder."""
    path = Path(prompts_dir or PROMPTS_DIR) / f"{name}.txt"
    if not path.exists():
        known = sorted(p.stem for p in Path(prompts_dir or PROMPTS_DIR).glob("*.txt"))
        raise FileNotFoundError(f"no judge prompt {name!r}; known: {known}")
    return parse_prompt_file(path.read_text(encoding="utf-8"), name)
