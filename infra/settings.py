"""Typed settings and profiles (`micro`, `tiny`, `cluster`), chosen by `CRUCIBLE_PROFILE`.

A profile is a YAML file in `infra/profiles/`. It holds the edges to the outside world (state dir, object
store, MLflow) and, under `stages:`, the default config of every stage. Stage sections are validated by the
stage's own pydantic model (see `validate_stage`), so a bad value fails when the Dagster code loads.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.yaml_text import load_yaml

PROFILES_DIR = Path(__file__).parent / "profiles"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = "tiny"

M = TypeVar("M", bound=BaseModel)

# Every `stages:` section a profile may hold (the names assets pass to validate_stage / launchpad_config):
# a misspelt section would otherwise be ignored and its stage run on defaults.
STAGE_NAMES = frozenset(
    {
        "web_crawl",
        "web_extract",
        "web_checks",
        "code_crawl",
        "code_language_id",
        "code_metadata_fix",
        "code_quality",
        "dedup_web",
        "dedup_code",
        "math_filter",
        "world_knowledge",
        "tokenizer",
        "token_shards",
        "pretrain",
        "context_extension",
        "checkpoint_evals",
        "task_suites",
        "sft_data",
        "sft",
        "reasoning_rl",
        "agentic_tasks",
        "agentic_rl",
        "general_prompts",
        "outcome_reward_model",
        "general_rl",
        "distill",
        "post_training_report",
    }
)


class SettingsError(ValueError):
    """A profile or a stage config is invalid; the message names the file and the field."""


class StoreSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field("store", description="Local directory (relative to the state dir) or s3://bucket/prefix")
    endpoint_url: str | None = Field(None, description="S3 endpoint (MinIO, moto, ...); None = AWS")
    region: str = Field("us-east-1", description="S3 region")
    aws_profile: str | None = Field(
        None, description="Named AWS credentials profile; None = env/instance role"
    )
    multipart_threshold_mb: int = Field(64, gt=0, description="Objects above this size upload in parts")
    max_attempts: int = Field(3, ge=1, description="Attempts per S3 call (retries with backoff)")
    connect_timeout_s: float = Field(5.0, gt=0, description="S3: seconds to open a connection")
    read_timeout_s: float = Field(
        10.0, gt=0, description="S3: seconds to wait for response bytes (a PUT waits twice: 100-continue)"
    )


class TrackingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; None = sqlite in the state dir ($MLFLOW_TRACKING_URI wins)"
    )
    experiment_prefix: str = Field("crucible", description="Experiments are named <prefix>/<asset group>")
    ui_url: str | None = Field(
        "http://127.0.0.1:5000", description="MLflow UI that run links point at (`make ui` serves it here)"
    )


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Profile name")
    state_dir: Path = Field(Path(".crucible"), description="Where local state lives (relative to the repo)")
    store: StoreSettings = Field(default_factory=StoreSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    stages: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Per-stage config defaults")
    source: Path | None = Field(None, description="The YAML file this profile came from")

    @property
    def state_path(self) -> Path:
        env = os.environ.get("CRUCIBLE_STATE_DIR")
        path = Path(env) if env else self.state_dir
        return path if path.is_absolute() else REPO_ROOT / path

    def stage(self, name: str) -> dict[str, Any]:
        return dict(self.stages.get(name, {}))


def _deep_merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_profile_yaml(name: str, seen: tuple[str, ...] = ()) -> dict:
    path = PROFILES_DIR / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
        raise SettingsError(f"unknown profile {name!r} (CRUCIBLE_PROFILE); choose one of {known}")
    if name in seen:
        raise SettingsError(f"{path}: 'extends' loops through {' -> '.join(seen + (name,))}")
    try:
        data = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping at the top level")
    parent = data.pop("extends", None)
    if parent:
        data = _deep_merge(_read_profile_yaml(parent, seen + (name,)), data)
    return data


def format_validation_error(where: str, exc: ValidationError) -> str:
    lines = [f"{where}: invalid configuration"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  - field '{field}': {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def load_profile(name: str | None = None) -> Profile:
    """Load the named profile (default: $CRUCIBLE_PROFILE or `tiny`), failing with the bad field's name."""
    name = name or os.environ.get("CRUCIBLE_PROFILE") or DEFAULT_PROFILE
    data = _read_profile_yaml(name)
    data["name"] = name
    data["source"] = str(PROFILES_DIR / f"{name}.yaml")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(format_validation_error(str(PROFILES_DIR / f"{name}.yaml"), exc)) from None
    for stage in profile.stages:
        if stage not in STAGE_NAMES:
            raise SettingsError(
                f"{profile.source}: unknown stage {stage!r} under stages: {_unknown_stage(stage)}"
            )
    return profile


def _unknown_stage(stage: str) -> str:
    close = difflib.get_close_matches(stage, STAGE_NAMES, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}valid stages: {', '.join(sorted(STAGE_NAMES))}"


def _with_nested_defaults(model: type[BaseModel], values: dict, default: BaseModel | None = None) -> dict:
    """`values` with each nested model given as a partial dict filled in from the field's own default: a stage
    whose default trainer has lr 1e-3 keeps it when a profile sets only `trainer: {steps: 3000}` (pydantic alone
    would build a fresh TrainerConfig with the class's defaults). Plain dict fields are replaced, not merged."""
    out = dict(values)
    for key, value in values.items():
        field = model.model_fields.get(key)
        if field is None or not isinstance(value, dict):
            continue
        current = (
            getattr(default, key, None)
            if default is not None
            else field.get_default(call_default_factory=True)
        )
        if isinstance(current, BaseModel):
            out[key] = current.model_dump() | _with_nested_defaults(type(current), value, current)
    return out


def validate_stage(profile: Profile, stage: str, model: type[M], overrides: dict | None = None) -> M:
    """Validate one stage's config (profile defaults + overrides) against the stage's pydantic model."""
    if stage not in STAGE_NAMES:  # a new stage is added to the vocabulary, or no profile could configure it
        raise SettingsError(
            f"stage {stage!r} is not in STAGE_NAMES (infra/settings.py); {_unknown_stage(stage)}"
        )
    values = _with_nested_defaults(model, _deep_merge(profile.stage(stage), overrides or {}))
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        where = f"{profile.source or profile.name} (stages.{stage})"
        raise SettingsError(format_validation_error(where, exc)) from None
