"""Atomic, complete training checkpoints and the HF export.

A checkpoint is a directory `<root>/step_<N>/` holding the model and optimizer state (written by the
engine), `trainer_state.json` (step, tokens seen, config) and per rank `rng_rank<r>.pt` (torch, numpy,
python RNG states) and `data_rank<r>.json` (the batch source's position). It is written under
`<root>/.tmp_step_<N>/` and renamed into place once every rank has finished, so a process killed at any
moment leaves either the previous checkpoint or the new one, never a half-written one. Its last file,
`checkpoint.json`, lists every file with its size: only a directory whose list verifies is a checkpoint.
Deletion (pruning, a torn step dir) first renames the directory out of the `step_*` namespace, so a kill
during `rmtree` leaves a `.trash_*` directory, never a `step_*` one with files missing. A step that is
already saved and complete is kept: a step's state is a function of its job (see `training.job.job_key`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

log = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step_(\d{8})$")
MANIFEST = "checkpoint.json"


class CheckpointEngine(Protocol):
    """What a checkpoint needs from the training engine (local torch or DeepSpeed)."""

    rank: int
    world_size: int

    def save_state(self, directory: Path) -> None: ...

    def load_state(self, directory: Path) -> None: ...

    def barrier(self) -> None: ...


def rng_state() -> dict[str, Any]:
    """The torch, numpy and python RNG states of this process."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_model_state(model: nn.Module, path: Path) -> None:
    """The full state dict (parameters and persistent buffers, e.g. the router bias) as safetensors."""
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(path))


def load_model_state(model: nn.Module, path: Path) -> None:
    model.load_state_dict(load_file(str(path)), strict=True)


def _fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    """Make renames inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_manifest(directory: Path, step: int) -> None:
    """`checkpoint.json`: every file of the checkpoint with its size, written (and synced) last."""
    files = {
        str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()
    }
    path = directory / MANIFEST
    with open(path, "w") as fh:
        json.dump({"step": step, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def checkpoint_problem(directory: Path) -> str | None:
    """Why `directory` is not a complete checkpoint (None if it is)."""
    try:
        manifest = json.loads((Path(directory) / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        return f"no readable {MANIFEST} ({exc.__class__.__name__})"
    for name, size in manifest["files"].items():
        path = Path(directory) / name
        if not path.is_file() or path.stat().st_size != size:
            return f"{name} missing or not {size} bytes"
    return None


def _delete_dir(directory: Path) -> None:
    """Rename out of the `step_*` namespace first (atomic), then remove: a kill never leaves a torn step dir."""
    trash = directory.with_name(f".trash_{directory.name}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(directory, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _clear_leftovers(root: Path) -> None:
    """Temp and trash dirs of a run killed while saving or deleting."""
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith((".tmp_step_", ".trash_step_")):
            shutil.rmtree(path, ignore_errors=True)


def save_checkpoint(
    root: Path,
    step: int,
    engine: CheckpointEngine,
    trainer_state: dict[str, Any],
    data_state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` atomically (all ranks call this); keeps the newest `keep`. Returns its path."""
    root = Path(root)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}"
    if engine.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        _clear_leftovers(root)
        tmp.mkdir()
    engine.barrier()
    engine.save_state(tmp)
    torch.save(rng_state(), tmp / f"rng_rank{engine.rank}.pt")
    (tmp / f"data_rank{engine.rank}.json").write_text(json.dumps(data_state))
    if engine.rank == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1, default=str))
    engine.barrier()
    if engine.rank == 0:
        _fsync_tree(tmp)
        _write_manifest(tmp, step)
        if final.exists() and checkpoint_problem(final) is None:
            # this step is already saved, complete: keep it (replacing would leave a moment with neither)
            _delete_dir(tmp)
        else:
            if final.exists():
                _delete_dir(final)  # a torn one
            os.replace(tmp, final)
        _fsync_dir(root)
        for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
            _delete_dir(old)
    engine.barrier()
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first (temp dirs of killed writes are ignored, and so is a
    `step_*` dir whose manifest does not verify, with a warning)."""
    root = Path(root)
    if not root.is_dir():
        return []
    complete = []
    for path in sorted(p for p in root.iterdir() if p.is_dir() and STEP_DIR.match(p.name)):
        problem = checkpoint_problem(path)
        if problem:
            log.warning("ignoring incomplete checkpoint %s: %s", path, problem)
        else:
            complete.append(path)
    return complete


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(path: Path, engine: CheckpointEngine) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore model, optimizer and this rank's RNG from `path`; returns (trainer_state, data_state)."""
    path = Path(path)
    problem = checkpoint_problem(path)
    if problem:
        raise ValueError(f"{path} is not a complete checkpoint: {problem}")
    engine.load_state(path)
    set_rng_state(torch.load(path / f"rng_rank{engine.rank}.pt", weights_only=False))
    trainer_state = json.loads((path / "trainer_state.json").read_text())
    data_state = json.loads((path / f"data_rank{engine.rank}.json").read_text())
    return trainer_state, data_state


def save_pretrained(model: Any, out_dir: str | Path) -> None:
    """`model.save_pretrained(out_dir)` (safetensors) without importing DeepSpeed when nothing has: transformers
    unwraps the model first, and accelerate imports DeepSpeed (~1.5-3 s per process) only to test whether the
    model is a DeepSpeedEngine, which it cannot be if DeepSpeed was never imported. Same files either way."""
    try:
        from accelerate.utils import other as accelerate_other
    except ImportError:
        accelerate_other = None
    if "deepspeed" in sys.modules or not hasattr(accelerate_other, "is_deepspeed_available"):
        model.save_pretrained(str(out_dir), safe_serialization=True)
        return
    with _PROBE_LOCK:  # two threads saving at once must not restore each other's stand-in
        probe = accelerate_other.is_deepspeed_available
        accelerate_other.is_deepspeed_available = lambda: False
        try:
            model.save_pretrained(str(out_dir), safe_serialization=True)
        finally:
            accelerate_other.is_deepspeed_available = probe


_PROBE_LOCK = threading.Lock()


def export_hf(model: nn.Module, out_dir: Path, extra_files: dict[str, Path] | None = None) -> Path:
    """Save `model` as an HF model dir (config.json + model.safetensors), loadable with
    `AutoModelForCausalLM.from_pretrained`; `extra_files` (e.g. {"tokenizer.json": path}) are copied in.
    Written to a temp dir and renamed, like checkpoints."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".tmp_{out_dir.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp)
    for name, src in (extra_files or {}).items():
        shutil.copy2(src, tmp / name)
    _fsync_tree(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir
