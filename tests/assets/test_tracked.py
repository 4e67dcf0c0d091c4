"""assets/tracked.py on a real Dagster instance and a real MLflow store: lineage is what a stage read,
every partition of a range gets its own materialization, a failing partition keeps the earlier ones."""

import json

import dagster as dg
import pytest
from pydantic import BaseModel

from assets.resources import MlflowResource, ObjectStoreResource, resources_for
from assets.tracked import run_stage
from infra.committed import commit, read_committed
from infra.settings import load_profile
from infra.stage import StageResult
from infra.tracking import UPSTREAM_RUNS_TAG, UPSTREAM_VERSIONS_TAG, Tracker

PARTS = dg.StaticPartitionsDefinition(["a", "b", "c"])
LINEAGE_MISSING_TAG = "crucible.lineage_missing"
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


class UpConfig(dg.Config):
    text: str = "v1"
    fail_on: str = ""
    metrics: int = 1
    artifact: bool = False


class DownConfig(dg.Config):
    read: bool = True
    race: bool = False


class _Plain(BaseModel, extra="allow"):
    """run_stage resolves launchpad configs; a test's config is passed as the plain model it is."""


def _plain(config: dg.Config) -> BaseModel:
    return _Plain(**config.model_dump())


def _write(store, prefix: str, text: str, tmp) -> str:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "part-0.txt").write_text(text)
    return commit(store, prefix, tmp).version


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run(), group_name="test")
def up(context, config: UpConfig, store: ObjectStoreResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    def stage(cfg, object_store, part, run):
        if part == cfg.fail_on:
            raise RuntimeError(f"partition {part} fails")
        tmp = load_profile().state_path / "tmp" / run.run_id
        version = _write(object_store, f"up/{part}", f"{cfg.text} {part}", tmp)
        metrics = {f"m{i:03d}": i for i in range(cfg.metrics)}
        artifacts = {}
        if cfg.artifact:
            from infra.figures import artifact_dir

            artifacts["note.txt"] = artifact_dir("up-artifacts-") / "note.txt"
            artifacts["note.txt"].write_text(part)
        return StageResult(
            metrics=metrics, outputs={"data": f"up/{part}"}, data_version=version, artifacts=artifacts
        )

    return run_stage(context, store=store, mlflow=mlflow, config=_plain(config), fn=stage)


@dg.asset(partitions_def=PARTS, backfill_policy=dg.BackfillPolicy.single_run(), group_name="test", deps=[up])
def down(
    context, config: DownConfig, store: ObjectStoreResource, mlflow: MlflowResource
) -> dg.MaterializeResult:
    def stage(cfg, object_store, part, run):
        if cfg.race:  # another run rematerializes the upstream after this stage started
            _materialize([up], context.instance, part, {"ops": {"up": {"config": {"text": "v2"}}}})
        text = "nothing read"
        if cfg.read:
            out = read_committed(object_store, f"up/{part}")
            text = object_store.get_bytes(out.key("part-0.txt")).decode()
        tmp = load_profile().state_path / "tmp" / run.run_id
        version = _write(object_store, f"down/{part}", text, tmp)
        return StageResult(metrics={"n": 1}, outputs={"data": f"down/{part}"}, data_version=version)

    return run_stage(
        context, store=store, mlflow=mlflow, config=_plain(config), fn=stage, upstream=[dg.AssetKey("up")]
    )


def _materialize(assets, instance, partition=None, run_config=None, tags=None, raise_on_error=True):
    return dg.materialize(
        assets,
        selection=[assets[-1]],
        instance=instance,
        resources=resources_for(load_profile()),
        partition_key=partition,
        run_config=run_config,
        tags=tags,
        raise_on_error=raise_on_error,
    )


def _mats(instance, key: str, partition: str) -> list:
    flt = dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition])
    return [r.asset_materialization for r in instance.fetch_materializations(flt, limit=100).records]


def _meta(mat) -> dict:
    return {k: getattr(v, "value", v) for k, v in mat.metadata.items()}


@pytest.fixture
def instance(dagster_home):
    with dg.DagsterInstance.get() as inst:
        yield inst


def test_lineage_names_the_upstream_run_and_version_actually_read_even_after_a_race(instance):
    tracker = Tracker.from_profile(load_profile())
    _materialize([up], instance, "a")
    first = _meta(_mats(instance, "up", "a")[0])

    _materialize([up, down], instance, "a", {"ops": {"down": {"config": {"race": True}}}}, None)
    mats = _mats(instance, "up", "a")
    assert len(mats) == 2
    second = _meta(mats[0])  # newest first: the rematerialization that happened mid-stage
    assert second["mlflow_run_id"] != first["mlflow_run_id"]

    down_run = tracker.get_run(_meta(_mats(instance, "down", "a")[0])["mlflow_run_id"])
    tags = down_run.data.tags
    # on 98a639e the tag named the upstream run that was latest when `down` started (first)
    assert tags[UPSTREAM_RUNS_TAG] == second["mlflow_run_id"]
    versions = json.loads(tags[UPSTREAM_VERSIONS_TAG])
    assert versions == {"up/a": {"asset": "up[a]", "version": second["data_version"]}}
    assert LINEAGE_MISSING_TAG not in tags
    tree = tracker.lineage(down_run.info.run_id)
    assert [n["run_id"] for n in tree["upstream"]] == [second["mlflow_run_id"]]
    assert tree["missing"] == []
    # the upstream's own commit carries its producer: asset, partition, MLflow and Dagster run
    store = resources_for(load_profile())["store"].open()
    producer = read_committed(store, "up/a").producer
    assert (producer.asset, producer.partition, producer.mlflow_run_id) == (
        "up",
        "a",
        second["mlflow_run_id"],
    )


def test_a_declared_upstream_that_was_not_read_is_a_broken_link_not_a_guess(instance, capsys):
    tracker = Tracker.from_profile(load_profile())
    _materialize([up], instance, "b")
    _materialize([up, down], instance, "b", {"ops": {"down": {"config": {"read": False}}}})
    mat = _mats(instance, "down", "b")[0]
    run = tracker.get_run(_meta(mat)["mlflow_run_id"])
    # on 98a639e the latest materialization of `up` was named as if it had been read
    assert run.data.tags[UPSTREAM_RUNS_TAG] == ""
    assert run.data.tags[LINEAGE_MISSING_TAG] == "up"
    assert _meta(mat)["lineage_missing"] == ["up"]
    assert tracker.lineage(run.info.run_id)["missing"] == ["up"]

    from assets.cli import main

    assert main(["lineage", run.info.run_id]) == 3  # the walk fails rather than guess
    printed = capsys.readouterr()
    assert "up: no recorded read (lineage broken)" in printed.out
    assert "incomplete, no recorded read of up (by down)" in printed.err


def test_each_partition_of_a_range_gets_its_own_materialization(instance):
    tracker = Tracker.from_profile(load_profile())
    result = _materialize([up], instance, tags={RANGE_START: "a", RANGE_END: "b"})
    events = [e.event_specific_data.materialization for e in result.get_asset_materialization_events()]
    assert sorted(m.partition for m in events) == ["a", "b"], "exactly one event per partition"
    meta = {p: _meta(_mats(instance, "up", p)[0]) for p in ("a", "b")}
    # on 98a639e both partitions carried b's run id, data version and outputs
    assert meta["a"]["mlflow_run_id"] != meta["b"]["mlflow_run_id"]
    for part in ("a", "b"):
        run = tracker.get_run(meta[part]["mlflow_run_id"])
        assert run.data.tags["dagster.partition_key"] == part
        assert meta[part]["output/data"] == f"up/{part}"
        assert meta[part]["data_version"] == run.data.tags["crucible.data_version"]
        assert _mats(instance, "up", part)[0].tags["dagster/data_version"] == meta[part]["data_version"]
    assert meta["a"]["data_version"] != meta["b"]["data_version"]


def test_completed_partitions_stay_materialized_when_a_later_one_fails(instance):
    tracker = Tracker.from_profile(load_profile())
    result = _materialize(
        [up],
        instance,
        run_config={"ops": {"up": {"config": {"fail_on": "b", "metrics": 70}}}},
        tags={RANGE_START: "a", RANGE_END: "c"},
        raise_on_error=False,
    )
    assert not result.success
    # on 98a639e no partition had a materialization although a was published and FINISHED in MLflow
    assert [len(_mats(instance, "up", p)) for p in ("a", "b", "c")] == [1, 0, 0]
    meta = _meta(_mats(instance, "up", "a")[0])
    assert tracker.get_run(meta["mlflow_run_id"]).info.status == "FINISHED"
    assert meta["metrics_truncated"].startswith("60 of 71 ")  # 70 stage metrics + wall_time_s
    failed = tracker.find_runs("test", "tags.`dagster.partition_key` = 'b'")
    assert [r.info.status for r in failed] == ["FAILED"]
    assert instance.get_materialized_partitions(dg.AssetKey("up")) == {"a"}


def test_a_failing_partition_still_removes_the_artifact_dirs_of_the_completed_ones(instance):
    import infra.figures

    root = infra.figures.ARTIFACT_ROOT
    before = set(root.glob("up-artifacts-*"))
    result = _materialize(
        [up],
        instance,
        run_config={"ops": {"up": {"config": {"fail_on": "b", "artifact": True}}}},
        tags={RANGE_START: "a", RANGE_END: "c"},
        raise_on_error=False,
    )
    assert not result.success and instance.get_materialized_partitions(dg.AssetKey("up")) == {"a"}
    # partition a's artifact was logged; before the `finally` its dir stayed behind when b failed
    assert set(root.glob("up-artifacts-*")) == before


def test_a_running_mlflow_run_whose_dagster_run_ended_is_failed_when_its_partition_runs_again(instance):
    tracker = Tracker.from_profile(load_profile())
    ended = _materialize([up], instance, "c").run_id
    # a run left RUNNING by a worker on another host (its pid cannot be checked from here)
    tags = {"dagster.asset_key": "up", "dagster.partition_key": "c", "dagster.run_id": ended}
    tags.update({"crucible.host": "another-host", "crucible.pid": "1"})
    stale = tracker.client.create_run(tracker.experiment_id("test"), tags=tags).info.run_id
    _materialize([up], instance, "b")  # another partition leaves it alone
    assert tracker.get_run(stale).info.status == "RUNNING"
    _materialize([up], instance, "c")
    run = tracker.get_run(stale)  # on 98a639e it stayed RUNNING for ever
    assert run.info.status == "FAILED"
    assert run.data.tags["crucible.failed_reason"] == f"its Dagster run {ended} ended SUCCESS"


@dg.asset(group_name="test")
def curves(context, store: ObjectStoreResource, mlflow: MlflowResource) -> dg.MaterializeResult:
    """A stage with a per-step history and a plot of it, drawn by the real plotting helper into a scratch
    artifact dir (as data stages without a work dir do)."""
    from infra.figures import artifact_dir
    from training.curves import plot_history

    def stage(cfg, object_store, part, run):
        rows = [{"step": s, "time": 1.0, "loss": 10.0 / (s + 1), "reward/math": s / 100} for s in (0, 10, 20)]
        rows.append({"step": 20, "heldout/pass_at_1/math": 0.3, "heldout/pass_at_1_se/math": 0.05})
        plot = plot_history(
            rows, {"loss": "loss", "held-out": r"heldout/pass_at_1/\w+"}, artifact_dir() / "c.png"
        )
        PLOTS.append(plot)
        return StageResult(metrics={"loss": 0.5}, history=rows, artifacts={"plots/c.png": plot})

    return run_stage(context, store=store, mlflow=mlflow, config=_Plain(), fn=stage)


PLOTS: list = []


def test_history_becomes_mlflow_curves_and_plots_show_in_the_dagster_event(instance):
    import base64

    _materialize([curves], instance)
    flt = dg.AssetRecordsFilter(asset_key=dg.AssetKey("curves"))
    mat = instance.fetch_materializations(flt, limit=1).records[0].asset_materialization
    meta = _meta(mat)
    tracker = Tracker.from_profile(load_profile())
    run_id = meta["mlflow_run_id"]
    loss = sorted((m.step, m.value) for m in tracker.client.get_metric_history(run_id, "loss"))
    # the history at its steps; the final value at the last step, so it is the one MLflow shows
    assert loss == [(0, 10.0), (10, 10 / 11), (20, 10 / 21), (20, 0.5)]
    assert [m.step for m in tracker.client.get_metric_history(run_id, "reward/math")] == [0, 10, 20]
    assert "time" not in tracker.get_run(run_id).data.metrics
    md = meta["plot/c"]
    head, data = md.split("base64,", 1)
    assert head == "![c.png](data:image/png;"
    png = base64.b64decode(data.rstrip(")"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000  # a drawn figure, not an empty canvas
    assert "c.png" in {a.path.rsplit("/", 1)[-1] for a in tracker.client.list_artifacts(run_id, "plots")}
    assert PLOTS and not PLOTS[-1].parent.exists()  # the artifact dir is removed once logged
