"""Documents one stage writes and another reads, as one pydantic model each.

The producer builds the model and writes `model_dump()`; the reader parses with `parse_document`, which fails
(naming the file and the offending keys) instead of guessing at a shape it does not know.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Document = TypeVar("Document", bound=BaseModel)


class LanguageSamplingWeight(BaseModel):
    """One language's entry in the code sampling weights."""

    model_config = ConfigDict(extra="forbid")
    files: int = Field(ge=0, description="Files of this language in the snapshot")
    chars: int = Field(ge=0, description="Characters of this language in the snapshot")
    mean_quality: float = Field(description="Mean quality score of the language's files")
    language_weight: float = Field(ge=0, description="Expected copies of each file of this language")
    classifier: bool = Field(description="True if a trained quality classifier scored the files")
    quality_histogram: dict[str, int] = Field(default_factory=dict, description="Files per quality bucket")


class CodeSamplingWeights(BaseModel):
    """`<code quality prefix>/<snapshot>/sampling_weights.json`: written by the code quality stage, read by
    the token-shard mixture (language names as the language ID stage spells them, e.g. "Lua")."""

    model_config = ConfigDict(extra="forbid")
    snapshot: str = Field(description="Code snapshot the weights were computed on")
    temperature: float = Field(ge=1, description="Language sampling temperature")
    beta: float = Field(ge=0, description="Per-file quality sharpness")
    method: str = Field(description="How a file's weight is computed")
    languages: dict[str, LanguageSamplingWeight] = Field(description="Weights and counts per language")
    eval: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Per-language classifier eval")

    def language_weights(self) -> dict[str, float]:
        """{lower-cased language: expected copies per file}."""
        return {lang.lower(): entry.language_weight for lang, entry in self.languages.items()}


def parse_document(model: type[Document], raw: Any, source: str) -> Document:
    """`raw` parsed as `model`; a ValueError naming `source` and every offending key otherwise."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "\n".join(
            f"  - key '{'.'.join(map(str, err['loc'])) or '<root>'}': {err['msg']}" for err in exc.errors()
        )
        raise ValueError(f"{source}: not a {model.__name__} document\n{problems}") from None
