"""The process launcher: command building, and failures (crash, SIGKILL, timeout) always raise."""

from __future__ import annotations

import sys
import time

import pytest

from infra.launcher import LaunchCommand, LaunchError, build_launch_command, run_command


def test_commands_for_each_launcher(tmp_path):
    one = build_launch_command("training.launch_entry", ["--spec", "s.json"], torch_extensions_dir=tmp_path)
    assert one.argv[1:] == ["-m", "training.launch_entry", "--spec", "s.json"]
    assert one.env["WORLD_SIZE"] == "1" and one.env["RANK"] == "0" and one.env["MASTER_ADDR"] == "127.0.0.1"
    assert one.env["TORCH_EXTENSIONS_DIR"] == str(tmp_path) and one.env["HF_HUB_OFFLINE"] == "1"
    tr = build_launch_command(
        "m", ["--x"], launcher="torchrun", nproc=2, master_port=29555, threads_per_process=1
    )
    assert tr.argv[1:4] == ["-m", "torch.distributed.run", "--nproc_per_node=2"]
    assert "--master_port=29555" in tr.argv and tr.argv[-3:] == ["-m", "m", "--x"]
    assert tr.env["OMP_NUM_THREADS"] == "1"
    ds = build_launch_command("m", [], launcher="deepspeed", nproc=2)
    assert (
        ds.argv[1:3] == ["-m", "deepspeed.launcher.runner"]
        and "--num_gpus=2" in ds.argv
        and "--module" in ds.argv
    )
    with pytest.raises(ValueError):
        build_launch_command("m", [], launcher="python", nproc=2)


def _python(code: str) -> LaunchCommand:
    return LaunchCommand(argv=[sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin"})


def test_success_and_log(tmp_path):
    run_command(_python("print('hello')"), log_path=tmp_path / "log.txt")
    assert (tmp_path / "log.txt").read_text() == "hello\n"


def test_crash_raises_with_the_output_tail():
    with pytest.raises(LaunchError, match="exited with code 3") as err:
        run_command(_python("import sys; print('boom'); sys.exit(3)"))
    assert err.value.returncode == 3 and "boom" in err.value.log_tail


def test_oom_kill_raises():
    with pytest.raises(LaunchError, match="SIGKILL.*OOM") as err:
        run_command(_python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert err.value.returncode == -9


def test_timeout_kills_the_process_group():
    start = time.monotonic()
    with pytest.raises(LaunchError, match="timed out"):
        run_command(
            _python("import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"), timeout_s=1
        )
    assert time.monotonic() - start < 20
