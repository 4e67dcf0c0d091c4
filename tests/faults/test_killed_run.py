"""A run SIGKILLed mid-stage frees its pool slot and ends FAILED in Dagster and MLflow without manual action.

The real thing: `dagster dev` (webserver, daemon, code server) on a temp DAGSTER_HOME holding the repo's
dagster.yaml, runs queued and launched by the DefaultRunLauncher into their own process, a stage that goes
through assets/tracked.py in the `dedup_web` pool (one slot), and a real SIGKILL of the run's process.
"""

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from local_servers import dagster_dev, graphql

from infra.settings import REPO_ROOT, load_profile
from infra.tracking import PID_TAG, Tracker

BIN = Path(sys.executable).parent

DEFS = textwrap.dedent(
    """
    import os, time
    from pathlib import Path

    import dagster as dg
    from pydantic import BaseModel

    from assets.resources import MlflowResource, ObjectStoreResource, resources_for
    from assets.tracked import run_stage
    from infra.settings import load_profile
    from infra.stage import StageResult

    MARKS = Path(os.environ["KILL_TEST_MARKS"])


    class HoldConfig(dg.Config):
        hold: bool = False


    class Plain(BaseModel, extra="allow"):
        pass


    @dg.asset(pool="dedup_web", group_name="dedup")
    def pooled(context, config: HoldConfig, store: ObjectStoreResource, mlflow: MlflowResource):
        def stage(cfg, object_store, part, run):
            (MARKS / context.run_id).write_text(str(os.getpid()))
            deadline = time.time() + 120
            while cfg.hold and time.time() < deadline:  # holds the pool slot until it is killed
                time.sleep(0.2)
            return StageResult(metrics={"held": float(cfg.hold)})

        return run_stage(context, store=store, mlflow=mlflow, config=Plain(**config.model_dump()), fn=stage)


    defs = dg.Definitions(
        assets=[pooled],
        jobs=[dg.define_asset_job("pooled_job", selection=[pooled], tags={"crucible/resource": "cpu"})],
        resources=resources_for(load_profile()),
        executor=dg.in_process_executor,
    )
    """
)


@pytest.fixture
def dagster_dev_defs(dagster_home, tmp_path, port, monkeypatch):
    """`dagster dev -f <defs>` in its own process group; yields (url, marks dir)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("KILL_TEST_MARKS", str(marks))
    (tmp_path / "killable_defs.py").write_text(DEFS)
    t0 = time.time()
    args = ["-f", str(tmp_path / "killable_defs.py")]
    with dagster_dev(args, port, tmp_path / "dagster_dev.log", REPO_ROOT, timeout_s=90) as url:
        print(f"dagster dev up in {time.time() - t0:.0f} s")
        yield url, marks


def _launch(url: str, hold: bool) -> str:
    repo = graphql(
        url, "{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }"
    )["repositoriesOrError"]["nodes"][0]
    selector = {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"]}
    launched = graphql(
        url,
        """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
        __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
        {
            "p": {
                "selector": {**selector, "jobName": "pooled_job"},
                "runConfigData": {"ops": {"pooled": {"config": {"hold": hold}}}},
            }
        },
    )
    assert launched["launchRun"]["__typename"] == "LaunchRunSuccess", launched
    return launched["launchRun"]["run"]["runId"]


def _wait(what: str, until, seconds: float):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = until()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {seconds:.0f} s")


@pytest.mark.slow
def test_sigkilled_run_frees_its_pool_slot_and_is_failed_in_dagster_and_mlflow(dagster_dev_defs):
    import dagster as dg

    url, marks = dagster_dev_defs
    started = time.time()
    held = _launch(url, hold=True)
    pid = int(
        _wait(
            "the first run reaches its stage",
            lambda: (marks / held).exists() and (marks / held).read_text(),
            90,
        )
    )
    tracker = Tracker.from_profile(load_profile())
    (mlflow_run,) = tracker.find_runs("dedup", f"tags.`dagster.run_id` = '{held}'")
    assert mlflow_run.info.status == "RUNNING" and mlflow_run.data.tags[PID_TAG] == str(pid)

    second = _launch(url, hold=False)  # queued behind the first run's dedup_web slot
    print(f"first run in its stage after {time.time() - started:.0f} s")
    os.kill(pid, signal.SIGKILL)
    with dg.DagsterInstance.get() as instance:

        def finished():
            run = instance.get_run_by_id(second)
            return run.status if run.is_finished else None

        # on 98a639e the second run waited for the dead run's dedup_web slot forever
        assert _wait("the next run of the pool finishes", finished, 100) == dg.DagsterRunStatus.SUCCESS
        print(f"second run done after {time.time() - started:.0f} s")
        assert instance.get_run_by_id(held).status == dg.DagsterRunStatus.FAILURE
        assert instance.event_log_storage.get_concurrency_info("dedup_web").claimed_slots == []
    assert tracker.get_run(mlflow_run.info.run_id).info.status == "FAILED"  # marked by the next stage
    assert (
        tracker.get_run(mlflow_run.info.run_id)
        .data.tags["crucible.failed_reason"]
        .startswith(f"process gone: pid {pid} ")
    )
