"""SIGKILL at seeded random points while a real training process saves a checkpoint, then rerun: the
checkpoint directory offers only complete checkpoints (the previous one or the new one), and resuming
reaches the bytes of an uninterrupted run.

The kill points are file-system events on the checkpoint directory (Python audit events: open, mkdir,
rename, remove, rmdir, scandir) inside `save_checkpoint` of one step: the child counts them and SIGKILLs
itself at the chosen one.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from training.checkpoint import STEP_DIR, list_checkpoints, load_checkpoint
from training.job import TrainJobSpec, training_command
from training.launch_entry import run
from training.model import ModelConfig, build_model
from training.optim import OptimConfig
from training.trainer import LocalEngine

STEPS, EVERY, KILLED_SAVE = 12, 4, 8
SEED, KILL_POINTS = 18, 5

# The real training entry point, with every file-system event of one save counted (and one fatal).
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    import training.trainer as trainer
    from training.job import TrainJobSpec
    from training.launch_entry import run

    spec_path, target_step, kill_at, count_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ckpt_root = str(Path(spec_path).parent / "checkpoints")
    FS_EVENTS = {"open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.scandir", "shutil.rmtree",
                 "os.listdir", "os.truncate"}
    state = {"armed": False, "events": 0}

    def in_checkpoints(event, args):
        # a path under the checkpoint root, a directory fd (rmtree's scandir) or a name relative to one
        # (rmtree's unlink / rmdir); not the imports' .py/.pyc reads, whose count depends on the bytecode cache
        path = args[0]
        if isinstance(path, int):
            return True
        relative = event in ("os.remove", "os.rmdir") and args[1] is not None and args[1] >= 0
        return relative or ckpt_root in os.fsdecode(path)

    def hook(event, args):
        if state["armed"] and event in FS_EVENTS and in_checkpoints(event, args):
            state["events"] += 1
            if state["events"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    real_save = trainer.save_checkpoint

    def save_checkpoint(root, step, *args, **kwargs):
        state["armed"] = step == target_step
        try:
            return real_save(root, step, *args, **kwargs)
        finally:
            if state["armed"]:
                state["armed"] = False
                Path(count_file).write_text(str(state["events"]))

    trainer.save_checkpoint = save_checkpoint
    run(TrainJobSpec.model_validate_json(Path(spec_path).read_text()))
    """
)


def make_spec(run_dir: Path) -> TrainJobSpec:
    return TrainJobSpec(
        run_dir=str(run_dir),
        model=ModelConfig.for_size("micro"),
        trainer={
            "steps": STEPS,
            "log_every": 1,
            "eval_every": 0,
            "checkpoint_every": EVERY,
            "progress": False,
            "keep_checkpoints": 1,
        },  # fmt: skip - every save also prunes the previous checkpoint
        data={"kwargs": {"vocab_size": 512, "batch_size": 4, "seq_len": 32, "pattern": "markov"}},
        distributed={"threads_per_process": 1},
        export_hf=False,
    )


def _run_child(tmp_path: Path, spec: TrainJobSpec, kill_at: int) -> tuple[int, Path]:
    script, count_file = tmp_path / "child.py", tmp_path / f"events-{kill_at}.txt"
    script.write_text(CHILD)
    cmd = training_command(spec)  # writes the spec; its env (threads, offline HF) for our own argv
    argv = [
        sys.executable,
        str(script),
        str(Path(spec.run_dir) / "spec.json"),
        str(KILLED_SAVE),
        str(kill_at),
    ]
    proc = subprocess.run([*argv, str(count_file)], env=cmd.env, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
    return proc.returncode, count_file


def _assert_only_complete_checkpoints(root: Path) -> list[int]:
    """Every step_* directory is listed only if complete, and every listed one loads strictly."""
    listed = list_checkpoints(root)
    engine = LocalEngine(build_model(ModelConfig.for_size("micro")), OptimConfig())
    for path in listed:
        trainer_state, data_state = load_checkpoint(path, engine)
        assert trainer_state["step"] == int(STEP_DIR.match(path.name).group(1)) and data_state
    return [int(STEP_DIR.match(p.name).group(1)) for p in listed]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    threads = torch.get_num_threads()
    try:
        return run(make_spec(tmp_path_factory.mktemp("uninterrupted")))["weights_digest"]
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def save_events(tmp_path_factory) -> int:
    """File-system events in the save of step KILLED_SAVE of an uninterrupted child (kill_at=0: never)."""
    tmp = tmp_path_factory.mktemp("count")
    returncode, count_file = _run_child(tmp, make_spec(tmp / "run"), kill_at=0)
    assert returncode == 0
    return int(count_file.read_text())


def _kill_points(n_events: int) -> list[int]:
    """One seeded random event in each of KILL_POINTS equal slices of the save (start to prune)."""
    rng = random.Random(SEED)
    edges = [1 + round(i * n_events / KILL_POINTS) for i in range(KILL_POINTS + 1)]
    return [rng.randrange(lo, max(hi, lo + 1)) for lo, hi in zip(edges, edges[1:], strict=False)]


@pytest.mark.parametrize("slice_index", range(KILL_POINTS))
def test_sigkill_during_save_leaves_a_complete_checkpoint_and_resumes_bit_identical(
    tmp_path, reference, save_events, slice_index
):
    kill_at = _kill_points(save_events)[slice_index]
    spec = make_spec(tmp_path / "run")
    returncode, _ = _run_child(tmp_path, spec, kill_at)
    assert returncode == -signal.SIGKILL, f"no kill at event {kill_at} of {save_events}"
    root = Path(spec.run_dir) / "checkpoints"
    assert _assert_only_complete_checkpoints(root)[-1:] in ([EVERY], [KILLED_SAVE])  # previous or new

    threads = torch.get_num_threads()
    try:
        resumed = run(spec)  # the rerun, in this process
    finally:
        torch.set_num_threads(threads)
    assert resumed["step"] == STEPS
    assert resumed["weights_digest"] == reference
    assert _assert_only_complete_checkpoints(root) == [STEPS]
    assert json.loads((Path(spec.run_dir) / "result.json").read_text())["weights_digest"] == reference
