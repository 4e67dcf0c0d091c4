"""Checkpoints are atomic and complete: a run killed with SIGKILL resumes to bit-identical final weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch

from training.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from training.job import (
    TrainJobSpec,
    job_key,
    read_metrics,
    run_training_job,
    training_command,
    tree_digest,
    write_spec,
)
from training.launch_entry import run
from training.model import ModelConfig, build_model
from training.optim import OptimConfig
from training.trainer import LocalEngine

STEPS = 30


def make_spec(run_dir) -> TrainJobSpec:
    return TrainJobSpec(
        run_dir=str(run_dir),
        model=ModelConfig.for_size("micro"),
        trainer={"steps": STEPS, "log_every": 1, "eval_every": 0, "checkpoint_every": 4, "progress": False},
        data={"kwargs": {"vocab_size": 512, "batch_size": 8, "seq_len": 64, "pattern": "markov"}},
        distributed={"threads_per_process": 1},
        export_hf=False,
    )


def test_checkpoint_is_complete_atomic_and_pruned(tmp_path):
    engine = LocalEngine(build_model(ModelConfig.for_size("micro")), OptimConfig())
    root = tmp_path / "checkpoints"
    for step in (4, 8):
        save_checkpoint(root, step, engine, {"step": step}, {"index": step}, keep=2)
    # A write killed half-way leaves only a temp dir, which is neither listed nor in the way of a rewrite.
    torn = root / ".tmp_step_00000012"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"partial")
    assert latest_checkpoint(root).name == "step_00000008"
    save_checkpoint(root, 12, engine, {"step": 12}, {"index": 12}, keep=2)
    assert [p.name for p in list_checkpoints(root)] == ["step_00000008", "step_00000012"]
    assert not torn.exists()
    files = {p.name for p in (root / "step_00000012").iterdir()}
    assert files == {
        "model.safetensors",
        "optimizer.pt",
        "rng_rank0.pt",
        "data_rank0.json",
        "trainer_state.json",
        "checkpoint.json",
    }
    assert json.loads((root / "step_00000012" / "data_rank0.json").read_text()) == {"index": 12}
    manifest = json.loads((root / "step_00000012" / "checkpoint.json").read_text())
    assert manifest["step"] == 12 and set(manifest["files"]) == files - {"checkpoint.json"}


def test_a_saved_step_is_kept_and_a_torn_one_replaced(tmp_path):
    engine = LocalEngine(build_model(ModelConfig.for_size("micro")), OptimConfig())
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 8, engine, {"step": 8}, {"index": 1}, keep=2)
    save_checkpoint(root, 8, engine, {"step": 8}, {"index": 2}, keep=2)
    assert json.loads((root / "step_00000008" / "data_rank0.json").read_text()) == {"index": 1}
    (root / "step_00000008" / "rng_rank0.pt").unlink()
    save_checkpoint(root, 8, engine, {"step": 8}, {"index": 3}, keep=2)
    assert json.loads((root / "step_00000008" / "data_rank0.json").read_text()) == {"index": 3}
    assert [p.name for p in root.iterdir()] == ["step_00000008"]  # no temp or trash dir left


def test_a_step_dir_with_a_missing_or_short_file_is_not_a_checkpoint(tmp_path):
    engine = LocalEngine(build_model(ModelConfig.for_size("micro")), OptimConfig())
    root = tmp_path / "checkpoints"
    for step in (4, 8):
        save_checkpoint(root, step, engine, {"step": step}, {"index": step}, keep=2)
    (root / "step_00000008" / "optimizer.pt").unlink()  # as a kill inside rmtree of this dir would
    assert [p.name for p in list_checkpoints(root)] == ["step_00000004"]
    with pytest.raises(ValueError, match="step_00000008 is not a complete checkpoint: optimizer.pt missing"):
        load_checkpoint(root / "step_00000008", engine)
    model = root / "step_00000004" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-10])
    assert list_checkpoints(root) == []


@pytest.fixture()
def reference(tmp_path_factory):
    """The uninterrupted run, in this process with the child's thread count."""
    threads = torch.get_num_threads()
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    try:
        return run(make_spec(run_dir)), run_dir
    finally:
        torch.set_num_threads(threads)


def test_sigkill_and_rerun_reaches_bit_identical_weights(tmp_path, reference):
    reference_result, reference_dir = reference
    spec = make_spec(tmp_path / "run")
    cmd = training_command(spec)
    proc = subprocess.Popen(cmd.argv, env=cmd.env, start_new_session=True, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    try:
        while not any(r["step"] >= 13 for r in read_metrics(spec.run_dir)):
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no progress"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    resumed_from = latest_checkpoint(tmp_path / "run" / "checkpoints")
    killed_at = max(r["step"] for r in read_metrics(spec.run_dir))
    assert resumed_from is not None and 12 <= int(resumed_from.name[5:]) <= killed_at < STEPS

    result = run_training_job(spec)
    assert "resumed from" in (tmp_path / "run" / "train.log").read_text()
    assert result["step"] == STEPS
    assert (
        result["weights_digest"] == reference_result["weights_digest"]
    )  # bit-identical to the uninterrupted run
    rows = read_metrics(spec.run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # re-run steps replaced, none duplicated
    assert [r["loss"] for r in rows] == [r["loss"] for r in read_metrics(reference_dir)]


def test_a_run_dir_resumes_only_the_job_it_was_made_for(tmp_path):
    spec = make_spec(tmp_path / "run")
    write_spec(spec)
    (tmp_path / "run" / "checkpoints").mkdir()
    # the same job (how it reports may change) resumes
    write_spec(spec.model_copy(update={"callbacks": ["x:y"]}))
    with_bar = spec.trainer.model_copy(update={"progress": True})
    write_spec(spec.model_copy(update={"trainer": with_bar}))
    # another job's checkpoints are never handed back as this one's
    longer = spec.trainer.model_copy(update={"steps": STEPS + 10})
    with pytest.raises(RuntimeError, match=r"different training job \(spec fields differ: trainer\)"):
        write_spec(spec.model_copy(update={"trainer": longer}))
    with pytest.raises(RuntimeError, match="init_from"):
        write_spec(spec.model_copy(update={"init_from": str(tmp_path / "parent")}))


def test_job_key_follows_every_part_and_parent_weights(tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "model.safetensors").write_bytes(b"weights-1")
    first = job_key("rows-v1", tree_digest(parent), {"lr": 1e-3})
    assert first == job_key("rows-v1", tree_digest(parent), {"lr": 1e-3})
    assert len(first) == 16
    assert job_key("rows-v1", tree_digest(parent), {"lr": 5e-4}) != first
    assert job_key("rows-v2", tree_digest(parent), {"lr": 1e-3}) != first
    (parent / "model.safetensors").write_bytes(b"weights-2")  # same path, new parent weights
    assert job_key("rows-v1", tree_digest(parent), {"lr": 1e-3}) != first
