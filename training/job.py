"""A training job: one phase (model + trainer + data + launch settings) run as a child process.

The parent (a Dagster asset, a test, a benchmark) writes a `TrainJobSpec` to `<run_dir>/spec.json` and starts
`python -m training.launch_entry --spec <run_dir>/spec.json` under the configured launcher. The child writes
`<run_dir>/metrics.jsonl` (one JSON line per report), `<run_dir>/checkpoints/`, the HF export `<run_dir>/hf/`
and `<run_dir>/result.json`. Rerunning the same spec resumes from the newest checkpoint.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra.launcher import LaunchCommand, build_launch_command, run_command
from training.distributed import DistributedConfig
from training.model import ModelConfig
from training.trainer import TrainerConfig

ENTRY_MODULE = "training.launch_entry"


class DataSpec(BaseModel):
    """Where batches come from: `factory` ("module:function") is called as f(rank=, world_size=, **kwargs)."""

    model_config = ConfigDict(extra="forbid")

    factory: str = Field("training.batch_source:synthetic_batches", description="'module:function' factory")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the factory")


class TrainJobSpec(BaseModel):
    """Everything one training phase needs; serialised to JSON for the child process."""

    model_config = ConfigDict(extra="forbid")

    run_dir: str = Field(description="Directory of this phase's outputs and checkpoints")
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="Model sizes (and RoPE of this phase)"
    )
    init_from: str | None = Field(
        None, description="HF model dir to start from (previous phase); None = fresh"
    )
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Loop, optimizer, DSA stage")
    data: DataSpec = Field(default_factory=DataSpec, description="Training batches")
    eval_data: DataSpec | None = Field(None, description="Held-out batches (factory returns a list)")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="Launch settings")
    export_hf: bool = Field(True, description="Write the final model as an HF dir (<run_dir>/hf)")
    extra_files: dict[str, str] = Field(default_factory=dict, description="Files copied into the HF dir")
    callbacks: list[str] = Field(
        default_factory=list, description="'module:function' factories f(spec) -> metrics callback (rank 0)"
    )


def import_object(path: str) -> Callable:
    """`module:function` -> the function."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"expected 'module:function', got {path!r}")
    return getattr(importlib.import_module(module), name)


def job_key(*parts: Any) -> str:
    """16 hex characters naming a job by everything that decides its result (configs, data versions, the
    parent checkpoint's digest): the run directory of a job, so a rerun resumes only the same job."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def tree_digest(root: Path) -> str:
    """sha256 over a directory's file names and bytes (a checkpoint's identity, whatever path it sits at)."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


# fields that may differ between a run and its resumption (how it reports, not what it computes)
_RESUME_FREE_FIELDS = {"callbacks"}


def _resumable_view(spec: dict) -> dict:
    view = {k: v for k, v in spec.items() if k not in _RESUME_FREE_FIELDS}
    view["trainer"] = {k: v for k, v in (view.get("trainer") or {}).items() if k != "progress"}
    return view


def write_spec(spec: TrainJobSpec) -> Path:
    """Write `<run_dir>/spec.json`. A run dir that already holds another job's spec is refused: resuming its
    checkpoints would hand back a model trained on different settings as if it were this job's."""
    run_dir = Path(spec.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "spec.json"
    if path.exists() and (run_dir / "checkpoints").exists():
        old = _resumable_view(json.loads(path.read_text()))
        new = _resumable_view(json.loads(spec.model_dump_json()))
        changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        if changed:
            raise RuntimeError(
                f"{run_dir} holds checkpoints of a different training job (spec fields differ: {', '.join(changed)}); "
                "refusing to resume it. Give this job its own run dir (see training.job.job_key) or delete that one."
            )
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(spec.model_dump_json(indent=1))
    tmp.replace(path)
    return path


def training_command(spec: TrainJobSpec, torch_extensions_dir: Path | None = None) -> LaunchCommand:
    """Write the spec and return the command + env that runs it (hand it to Dagster Pipes or `run_command`)."""
    spec_path = write_spec(spec)
    d = spec.distributed
    return build_launch_command(
        ENTRY_MODULE,
        ["--spec", str(spec_path)],
        launcher=d.launcher,
        nproc=d.nproc,
        torch_extensions_dir=torch_extensions_dir,
        threads_per_process=d.threads_per_process,
    )


# Runs a launch command to completion, raising if it fails: `run_command` by default, Dagster Pipes from assets/.
Launch = Callable[[LaunchCommand, Path, float | None], None]


def run_training_job(
    spec: TrainJobSpec, torch_extensions_dir: Path | None = None, launch: Launch | None = None
) -> dict[str, Any]:
    """Run one phase to completion in child processes; returns `result.json`. Raises if any rank crashes
    or is killed (nothing is reported as a success unless the child exits 0)."""
    cmd = training_command(spec, torch_extensions_dir)
    run_dir = Path(spec.run_dir)
    if launch is None:
        run_command(cmd, log_path=run_dir / "train.log", timeout_s=spec.distributed.timeout_s)
    else:
        launch(cmd, run_dir / "train.log", spec.distributed.timeout_s)
    result_path = run_dir / "result.json"
    if not result_path.exists():
        raise RuntimeError(f"training job in {run_dir} exited without writing result.json")
    return json.loads(result_path.read_text())


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The metrics lines a run has written so far (a torn last line from a killed run is skipped)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
