"""The code crawl manifest: a YAML list of sources (git repos, Debian binary/source packages, npm, PyPI)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

SourceKind = Literal["git", "debian", "debian_source", "npm", "pypi"]


class ManifestError(ValueError):
    """The manifest file is missing or invalid; the message names the file and the entry."""


class SourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: SourceKind = Field(description="Where the code comes from")
    name: str = Field(description="Package name, or the repository URL / local path for git")
    version: str | None = Field(None, description="Package version (None = the registry's current one)")
    commit: str | None = Field(
        None, description="git: commit sha, tag or branch to check out (recorded as sha)"
    )
    path: Path | None = Field(None, description="A local archive/checkout to read instead of fetching")
    include: list[str] = Field(default_factory=list, description="Only paths matching one of these globs")
    max_files: int | None = Field(None, ge=1, description="Cap on records kept from this source")

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.name}" + (f"@{self.version}" if self.version else "")


class CodeManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = Field("", description="What this manifest is for")
    max_files_per_source: int = Field(600, ge=1, description="Default cap on records per source")
    sources: list[SourceSpec] = Field(description="What to fetch")


def load_manifest(path: str | Path) -> CodeManifest:
    path = Path(path)
    if not path.exists():
        raise ManifestError(f"code manifest {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
        manifest = CodeManifest.model_validate(data)
    except (yaml.YAMLError, ValidationError) as exc:
        raise ManifestError(f"code manifest {path} is invalid: {exc}") from None
    for spec in manifest.sources:
        if spec.path is not None and not spec.path.is_absolute():
            spec.path = (path.parent / spec.path).resolve()
    return manifest
