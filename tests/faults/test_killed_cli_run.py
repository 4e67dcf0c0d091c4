"""A `crucible run` killed mid-stage leaves its in-process Dagster run STARTED with a pool slot claimed (no
daemon watches in-process runs); the next `crucible run` marks it FAILURE and frees the slot, so the next run
of that pool completes without manual action."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import dagster as dg
import pytest

from assets.cli import CLI_TAG, fail_dead_cli_runs

pytestmark = pytest.mark.slow

DEFS = textwrap.dedent(
    """
    import os, sys, time
    import dagster as dg

    @dg.asset(pool="dedup_web")
    def pooled(context):
        if os.environ.get("HOLD"):
            open(os.environ["HOLD"], "w").write("holding")
            time.sleep(120)  # killed here, holding the pool slot

    job = dg.define_asset_job("pooled_job", selection=[pooled])
    defs = dg.Definitions(assets=[pooled], jobs=[job])

    if __name__ == "__main__":
        from infra.tracking import process_tags
        instance = dg.DagsterInstance.get()
        defs.resolve_job_def("pooled_job").execute_in_process(
            instance=instance, tags={sys.argv[1]: "1", **process_tags()}, raise_on_error=False
        )
    """
)


def _slot_holders(instance) -> set[str]:
    return instance.event_log_storage.get_concurrency_info("dedup_web").active_run_ids


def test_killed_cli_run_is_failed_and_frees_its_pool_slot(dagster_home, tmp_path):
    script = tmp_path / "pooled_defs.py"
    script.write_text(DEFS)
    marker = tmp_path / "holding"
    env = {**os.environ, "HOLD": str(marker), "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen([sys.executable, str(script), CLI_TAG], env=env, start_new_session=True)
    deadline = time.time() + 120
    while not marker.exists():
        assert child.poll() is None and time.time() < deadline, "the held run never started"
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    instance = dg.DagsterInstance.get()
    [record] = instance.get_run_records(filters=dg.RunsFilter(tags={CLI_TAG: "1"}))
    assert record.dagster_run.status == dg.DagsterRunStatus.STARTED  # what a killed in-process run leaves
    assert _slot_holders(instance) == {record.dagster_run.run_id}

    assert fail_dead_cli_runs(instance) == [record.dagster_run.run_id]
    assert instance.get_run_by_id(record.dagster_run.run_id).status == dg.DagsterRunStatus.FAILURE
    assert _slot_holders(instance) == set()
    assert fail_dead_cli_runs(instance) == []  # nothing left to heal; live runs are never touched

    finished = subprocess.run([sys.executable, str(script), CLI_TAG], env={**env, "HOLD": ""}, timeout=120)
    assert finished.returncode == 0
    latest = instance.get_run_records(filters=dg.RunsFilter(tags={CLI_TAG: "1"}), limit=1)[0]
    assert latest.dagster_run.status == dg.DagsterRunStatus.SUCCESS
