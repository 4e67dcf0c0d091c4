"""The code crawl manifest: a YAML list of sources (git repos, Debian binary/source packages, npm, PyPI).

Names, versions and refs end up as arguments of git, apt-get, npm and pip, so each is checked against what
its registry allows: nothing that starts with `-`, no control characters, no `..` path segments, and git
locations only over the transports in `infra.code_sources.GIT_URL_SCHEMES` (no `ext::` / `fd::` helpers).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from infra.code_sources import GIT_URL_SCHEMES
from infra.yaml_text import load_yaml

SourceKind = Literal["git", "debian", "debian_source", "npm", "pypi"]

# the names each registry accepts (Debian policy 5.6.1, npm's validate-npm-package-name, PEP 508)
_PACKAGE_NAME = {
    "debian": r"[a-z0-9][a-z0-9+.-]+",
    "debian_source": r"[a-z0-9][a-z0-9+.-]+",
    "npm": r"(@[A-Za-z0-9][A-Za-z0-9._~-]*/)?[A-Za-z0-9][A-Za-z0-9._~-]*",
    "pypi": r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?",
}
_VERSION = re.compile(r"([0-9]+:)?[A-Za-z0-9][A-Za-z0-9.+~_-]*")  # Debian (with epoch), PEP 440, semver, tags
_GIT_REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ManifestError(ValueError):
    """The manifest file is missing or invalid; the message names the file and the entry."""


def git_location_problem(location: str) -> str | None:
    """Why `location` is not an allowed git repository (a URL over GIT_URL_SCHEMES or a local path), or None."""
    if location.startswith("-"):
        return "must not start with '-' (git would read it as an option)"
    if "::" in location:
        return (
            "git remote helpers (`ext::`, `fd::`, ...) are not allowed; use an https:// URL or a local path"
        )
    if "://" in location:
        scheme = location.split("://", 1)[0].lower()
        if scheme not in GIT_URL_SCHEMES:
            return (
                f"scheme {scheme!r} is not allowed; use one of {', '.join(GIT_URL_SCHEMES)} or a local path"
            )
    elif ":" in location.split("/", 1)[0]:
        return "host:path (ssh) locations are not allowed; use an https:// URL or a local path"
    if ".." in location.split("/"):
        return "must not contain '..' segments; use `path:` (relative to the manifest) for a local checkout"
    return None


def _value_problem(field: str, value: str, pattern: re.Pattern, allowed: str) -> str | None:
    if _CONTROL.search(value) or not pattern.fullmatch(value) or ".." in value.split("/"):
        return f"{field} {value!r} is not allowed: {allowed}"
    return None


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

    @model_validator(mode="after")
    def _safe_command_arguments(self) -> SourceSpec:
        problems = [self._name_problem()]
        if self.version is not None:
            problems.append(_value_problem("version", self.version, _VERSION, f"expected {_VERSION.pattern}"))
        if self.commit is not None:
            problems.append(
                _value_problem(
                    "commit", self.commit, _GIT_REF, f"expected a sha, tag or branch ({_GIT_REF.pattern})"
                )
            )
        if problem := next((p for p in problems if p), None):
            raise ValueError(problem)
        return self

    def _name_problem(self) -> str | None:
        if _CONTROL.search(self.name):
            return f"name {self.name!r} is not allowed: control characters"
        if self.kind == "git":
            problem = git_location_problem(self.name)
            return f"name {self.name!r} is not allowed: {problem}" if problem else None
        pattern = _PACKAGE_NAME[self.kind]
        return _value_problem(
            "name", self.name, re.compile(pattern), f"a {self.kind} package name is {pattern}"
        )


class CodeManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    description: str = Field("", description="What this manifest is for")
    max_files_per_source: int = Field(600, ge=1, description="Default cap on records per source")
    sources: list[SourceSpec] = Field(description="What to fetch")


def _describe(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        lines.append(f"  - {where or 'manifest'}: {err['msg'].removeprefix('Value error, ')}")
    return "\n".join(lines)


def load_manifest(path: str | Path) -> CodeManifest:
    path = Path(path)
    if not path.exists():
        raise ManifestError(f"code manifest {path} does not exist")
    try:
        data = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ManifestError(f"code manifest {path} is invalid: {exc}") from None
    try:
        manifest = CodeManifest.model_validate(data)
    except ValidationError as exc:
        raise ManifestError(f"code manifest {path} is invalid:\n{_describe(exc)}") from None
    for spec in manifest.sources:
        if spec.path is not None and not spec.path.is_absolute():
            spec.path = (path.parent / spec.path).resolve()
    return manifest
