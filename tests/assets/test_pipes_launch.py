"""A training process launched over Dagster Pipes that crashes, is SIGKILLed (the OOM killer) or overruns its
`timeout_s`: the asset fails with the exit reason, the MLflow run ends FAILED and no process is left behind."""

import os
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from assets.pipes_launch import PipesLaunch
from assets.resources import MlflowResource, ObjectStoreResource
from assets.tracked import run_stage
from infra.launcher import LaunchCommand
from infra.stage import StageResult

# One training "step" reported over Pipes, then the way this run ends (argv[1]). The grandchild stands for
# a torchrun rank: a timeout must kill it too.
CHILD = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from dagster_pipes import open_dagster_pipes

    mode, pid_file = sys.argv[1], sys.argv[2]
    pipes = open_dagster_pipes()
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(pid_file, "w").write(str(rank.pid))
    pipes.report_custom_message({"step": 1.0, "loss": 2.5})
    print("step 2: forward", flush=True)
    if mode == "ok":
        rank.kill()
        pipes.close()
    elif mode == "crash":
        rank.kill()
        sys.exit(3)
    elif mode == "oom":
        rank.kill()
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        time.sleep(600)
    """
)


class NoConfig(BaseModel):
    pass


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> tuple[str, str]:
    """One MLflow backend for the module (creating a sqlite one takes seconds); runs are told apart by id."""
    root = tmp_path_factory.mktemp("mlflow")
    return f"sqlite:///{root / 'mlflow.db'}", str(root / "artifacts")


def _materialize(tmp_path: Path, tracking: tuple[str, str], mode: str, timeout_s: float | None = None):
    script, pid_file, log_path = tmp_path / "child.py", tmp_path / "rank.pid", tmp_path / "train.log"
    script.write_text(CHILD)
    cmd = LaunchCommand([sys.executable, str(script), mode, str(pid_file)], dict(os.environ))
    launches: list[PipesLaunch] = []

    @dg.asset(group_name="training")
    def tiny_training(
        context: dg.AssetExecutionContext,
        store: ObjectStoreResource,
        mlflow: MlflowResource,
        pipes: dg.PipesSubprocessClient,
    ) -> dg.MaterializeResult:
        def stage(cfg, s, part, run):
            launches.append(PipesLaunch(context, pipes))
            launches[-1](cmd, log_path, timeout_s)
            return StageResult(metrics={"steps": 2.0})

        return run_stage(context, store=store, mlflow=mlflow, config=NoConfig(), fn=stage)

    tracking_uri, artifact_root = tracking
    resources = {
        "store": ObjectStoreResource(url=str(tmp_path / "store")),
        "mlflow": MlflowResource(tracking_uri=tracking_uri, artifact_root=artifact_root),
        "pipes": dg.PipesSubprocessClient(),
    }
    started = time.monotonic()
    with dg.instance_for_test() as instance:
        result = dg.materialize([tiny_training], resources=resources, instance=instance, raise_on_error=False)
    seconds = time.monotonic() - started
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("crucible/training").experiment_id
    runs = client.search_runs([experiment], filter_string=f"tags.`dagster.run_id` = '{result.run_id}'")
    rank_pid = int(pid_file.read_text())
    return result, [r.info.status for r in runs], rank_pid, launches, log_path, seconds


def _failure_message(result) -> str:
    [failure] = result.get_step_failure_events()
    return failure.event_specific_data.error.to_string()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie of the killed group whose parent died is reaped by init soon after
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_clean_run_materializes_with_its_messages_and_log(tmp_path, tracking):
    result, statuses, _, launches, log_path, _ = _materialize(tmp_path, tracking, "ok", timeout_s=120)
    assert result.success and statuses == ["FINISHED"]
    assert launches[0].messages == [{"step": 1.0, "loss": 2.5}]
    assert "step 2: forward" in log_path.read_text()


def test_a_crash_mid_step_fails_the_asset_with_the_exit_code(tmp_path, tracking):
    result, statuses, _, _, _, _ = _materialize(tmp_path, tracking, "crash", timeout_s=120)
    assert not result.success
    message = _failure_message(result)
    assert "training process exited with code 3" in message
    assert "step 2: forward" in message  # the last output comes with the error
    assert statuses == ["FAILED"]


def test_an_oom_kill_fails_the_asset_naming_the_signal(tmp_path, tracking):
    result, statuses, _, _, _, _ = _materialize(tmp_path, tracking, "oom", timeout_s=120)
    assert not result.success
    assert "training process killed by SIGKILL (likely the OOM killer)" in _failure_message(result)
    assert statuses == ["FAILED"]


def test_timeout_kills_the_process_group_and_fails_the_asset(tmp_path, tracking):
    result, statuses, rank_pid, _, _, seconds = _materialize(tmp_path, tracking, "hang", timeout_s=3)
    assert not result.success
    assert "training process timed out after 3 s" in _failure_message(result)
    assert statuses == ["FAILED"]
    assert seconds < 60  # the child would sleep 600 s
    deadline = time.monotonic() + 10
    while not _gone(rank_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(rank_pid), "a rank of the timed-out job is still running"


def _write_in_two_parts(path: Path, stop) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"method": "log", "params": {"message": "step 1')
        f.flush()
        time.sleep(0.3)  # the reader polls every 10 ms: it sees the half line many times
        f.write(': loss 2.5"}}\n{"last": true}\n')
    stop.set()


def test_the_message_reader_parses_only_whole_lines_and_reads_the_last_one(tmp_path):
    """A message the child has half written is not handed to the JSON parser (dagster's own tail does, and
    its reader thread dies), and a message written just before the session closes is still read."""
    import json
    import threading

    from dagster._utils import tail_file

    from infra.launcher import whole_lines

    lines = {}
    for name, tail in (("ours", whole_lines), ("dagster", tail_file)):
        path, stop = tmp_path / f"{name}.jsonl", threading.Event()
        path.touch()
        writer = threading.Thread(target=_write_in_two_parts, args=(path, stop))
        writer.start()
        lines[name] = list(tail(str(path), stop.is_set))
        writer.join()
    assert [json.loads(line) for line in lines["ours"]] == [
        {"method": "log", "params": {"message": "step 1: loss 2.5"}},
        {"last": True},
    ]
    assert not lines["dagster"][0].endswith("\n")  # why the project has its own reader
