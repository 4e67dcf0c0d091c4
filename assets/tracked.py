"""The one pattern every asset follows: resolve config, open one MLflow run per partition with lineage tags,
call the stage function, log what it returns, and hand Dagster metadata that links back to MLflow."""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import dagster as dg
from dagster._core.definitions.data_version import (
    CODE_VERSION_TAG,
    DATA_VERSION_IS_USER_PROVIDED_TAG,
    DATA_VERSION_TAG,
)
from dagster._core.definitions.source_asset import SYSTEM_METADATA_KEY_SOURCE_ASSET_OBSERVATION
from pydantic import BaseModel

from assets.resources import MlflowResource, ObjectStoreResource
from assets.stage_config import resolve
from infra.committed import CommittedOutput, Producer
from infra.figures import discard_artifact_dirs
from infra.lineage_report import STATUS_TAG as LINEAGE_STATUS_TAG
from infra.lineage_report import render_html
from infra.partition_keys import validate_partition_keys
from infra.settings import load_profile
from infra.stage import StageResult
from infra.store import ObjectStore
from infra.tracking import (
    HOST_TAG,
    LINEAGE_MISSING_TAG,
    PID_TAG,
    UPSTREAM_RUNS_TAG,
    UPSTREAM_VERSIONS_TAG,
    StageRun,
    git_commit,
    metric_name,
    process_gone,
    process_tags,
)

log = logging.getLogger(__name__)

StageFn = Callable[[Any, ObjectStore, str | None, StageRun], StageResult]
CheckFn = Callable[[Any, StageResult], list[tuple[str, bool, dict]]]
METADATA_METRICS = 60  # Dagster shows metadata as one table; the MLflow run has every metric
PLOT_METADATA_BYTES = 400_000  # a PNG inlined in the Dagster event; the event log keeps it in its database


def code_version(*modules: ModuleType) -> str:
    """A code version that changes when the stage's own modules change (Dagster marks assets stale)."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()[:12]


def _metric_metadata(metrics: dict[str, float]) -> dict[str, Any]:
    """Numbers for the Dagster event; more than METADATA_METRICS are cut, and the event says so."""
    out: dict[str, Any] = {}
    for key, value in sorted(metrics.items())[:METADATA_METRICS]:
        out[key] = (
            dg.MetadataValue.float(float(value))
            if isinstance(value, float)
            else dg.MetadataValue.int(int(value))
            if isinstance(value, int | bool)
            else value
        )
    if len(metrics) > METADATA_METRICS:
        out["metrics_truncated"] = f"{METADATA_METRICS} of {len(metrics)} (all in the MLflow run)"
    return out


def read_lineage(reads: dict[str, CommittedOutput] | None, upstream: Sequence[dg.AssetKey]) -> dict[str, str]:
    """Lineage tags from what the stage actually read (`store.reads`): the producers' MLflow runs, each
    prefix's version and producer, and the declared upstream assets with no recorded read (never guessed)."""
    reads = reads or {}
    runs: list[str] = []
    versions: dict[str, dict[str, str]] = {}
    for prefix, out in sorted(reads.items()):
        producer = out.producer
        if producer.mlflow_run_id and producer.mlflow_run_id not in runs:
            runs.append(producer.mlflow_run_id)
        versions[prefix] = {"asset": f"{producer.asset}[{producer.partition}]", "version": out.version}
    read_assets = {out.producer.asset for out in reads.values()}
    missing = [k.to_user_string() for k in upstream if k.to_user_string() not in read_assets]
    tags = {UPSTREAM_RUNS_TAG: ",".join(runs), UPSTREAM_VERSIONS_TAG: json.dumps(versions)}
    if missing:
        tags[LINEAGE_MISSING_TAG] = ",".join(missing)
    return tags


def _fail_stale_runs(context: dg.AssetExecutionContext, tracker, group: str, asset: str, part: str) -> None:
    """Mark this asset partition's MLflow runs FAILED whose process is gone or whose Dagster run ended."""

    def stale_reason(run) -> str | None:
        tags = run.data.tags
        if process_gone(tags, current_dagster_run=context.run_id):
            return f"process gone: pid {tags.get(PID_TAG)} on {tags.get(HOST_TAG)} no longer runs"
        dagster_run_id = tags.get("dagster.run_id", "")
        if not dagster_run_id or dagster_run_id == context.run_id:
            return None
        dagster_run = context.instance.get_run_by_id(dagster_run_id)
        if dagster_run is not None and dagster_run.is_finished:
            return f"its Dagster run {dagster_run_id} ended {dagster_run.status.value}"
        return None

    for run_id in tracker.fail_stale_runs(group, asset, part, stale_reason):
        context.log.warning("marked stale MLflow run %s of %s[%s] FAILED", run_id, asset, part)


def run_stage(
    context: dg.AssetExecutionContext,
    *,
    store: ObjectStoreResource,
    mlflow: MlflowResource,
    config: dg.Config | BaseModel,
    fn: StageFn,
    upstream: Sequence[dg.AssetKey] = (),
    checks: CheckFn | None = None,
    register: Callable[[StageResult], dict[str, str]] | None = None,
) -> Iterator[dg.AssetMaterialization | dg.MaterializeResult]:
    """Run `fn` once per partition of this run, each inside its own MLflow run; assets return this generator.

    In a partition range each completed partition is materialized at once with its own metadata and run
    link, so a later failure keeps it. Lineage tags are what the stage read through `infra.committed`.
    `register(result)` names models to register: {registered model name: artifact sub-path in the run};
    each becomes a model version carrying the run's lineage tags."""
    cfg = resolve(config) if isinstance(config, dg.Config) else config
    key = context.asset_key
    asset_name = key.to_user_string()
    group = context.assets_def.group_names_by_key.get(key, "default")
    partitioned = context.has_partition_key or context.has_partition_key_range
    partitions: list[str | None] = list(context.partition_keys) if partitioned else [None]
    validate_partition_keys(partitions)  # a partition added by hand in the UI fails here, before any work
    profile = load_profile()
    object_store = store.open()
    tracker = mlflow.tracker()
    commit = git_commit()
    code_version_ = context.assets_def.code_versions_by_key.get(key) or ""
    results: dict[str | None, tuple[StageRun, StageResult, dict[str, str]]] = {}
    try:
        for part in partitions:
            _fail_stale_runs(context, tracker, group, asset_name, part or "")
            tags = {
                "dagster.run_id": context.run_id,
                "dagster.asset_key": asset_name,
                "dagster.partition_key": part or "",
                "crucible.code_version": code_version_,
                "crucible.git_commit": commit,
                "crucible.profile": profile.name,
                **process_tags(),
            }
            run_name = f"{asset_name}[{part}]" if part else asset_name
            context.log.info("%s: MLflow run in experiment %s/%s", run_name, tracker.experiment_prefix, group)
            with tracker.stage_run(group, run_name, tags, params=cfg.model_dump(mode="json")) as run:
                producer = Producer(
                    asset=asset_name,
                    partition=part or "",
                    mlflow_run_id=run.run_id,
                    dagster_run_id=context.run_id,
                )
                result, lineage = _run_partition(fn, cfg, object_store, part, run, producer, upstream)
                registered = register(result) if register else {}
                for name, subpath in registered.items():
                    version = tracker.register_model(
                        name,
                        run.run_id,
                        subpath,
                        {
                            **tags,
                            **lineage,
                            "crucible.data_version": result.data_version,
                            "crucible.run_name": run_name,
                        },
                    )
                    result.outputs[f"model/{name}"] = f"models:/{name}/{version.version}"
                    context.log.info("registered %s version %s", name, version.version)
                if registered:
                    status = _log_lineage_report(tracker, run, object_store)
                    context.log.info("%s: lineage %s (lineage.json on its MLflow run)", run_name, status)
            results[part] = (run, result, lineage)
            if len(partitions) > 1:  # materialized now: a later partition's failure does not take it back
                yield dg.AssetMaterialization(
                    asset_key=key,
                    partition=part,
                    metadata=_partition_metadata(run, result, lineage),
                    tags={
                        DATA_VERSION_TAG: result.data_version or run.run_id,
                        DATA_VERSION_IS_USER_PROVIDED_TAG: "true",
                        CODE_VERSION_TAG: code_version_ or context.run_id,
                    },
                )
        yield _materialize_result(results, cfg, checks, per_partition_events=len(partitions) > 1)
    finally:
        # logged to MLflow and inlined in the events above (or the run failed): the stages' artifact dirs can go
        discard_artifact_dirs(path for _, result, _ in results.values() for path in result.artifacts.values())


def _log_lineage_report(tracker, run: StageRun, object_store: ObjectStore) -> str:
    """A registered checkpoint carries its lineage as it was when it was trained (`lineage.json`, and a page
    to read in the MLflow UI), and its status as a tag; `crucible lineage` recomputes it later."""
    tree = tracker.lineage(run.run_id, object_store)
    run.log_dict(tree, "lineage.json")
    run.log_text(render_html(tree), "lineage.html")
    run.set_tags({LINEAGE_STATUS_TAG: tree["lineage_status"]})
    return tree["lineage_status"]


def _run_partition(
    fn: StageFn,
    cfg: Any,
    object_store: ObjectStore,
    part: str | None,
    run: StageRun,
    producer: Producer,
    upstream: Sequence[dg.AssetKey],
) -> tuple[StageResult, dict[str, str]]:
    """One stage call: its commits carry `producer`, its reads become the run's lineage tags."""
    object_store.begin_stage(producer)
    started = time.time()
    try:
        result = fn(cfg, object_store, part, run)
    finally:  # a failed run also records what it read
        lineage = read_lineage(object_store.reads, upstream)
        run.set_tags(lineage)
    result.metrics.setdefault("wall_time_s", round(time.time() - started, 3))
    _log_result(run, result)
    return result, lineage


def _partition_metadata(run: StageRun, result: StageResult, lineage: dict[str, str]) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "mlflow_run_id": run.run_id,
        "data_version": result.data_version,
        **{f"output/{k}": dg.MetadataValue.path(v) for k, v in result.outputs.items()},
        **_metric_metadata({metric_name(k): v for k, v in result.metrics.items() if metric_name(k)}),
    }
    if run.url:
        metadata["mlflow_run_url"] = dg.MetadataValue.url(run.url)
    if result.report_md:
        metadata["report"] = dg.MetadataValue.md(result.report_md)
    metadata.update(_plot_metadata(result.artifacts))
    if lineage.get(LINEAGE_MISSING_TAG):
        metadata["lineage_missing"] = dg.MetadataValue.json(lineage[LINEAGE_MISSING_TAG].split(","))
    return metadata


def _plot_metadata(artifacts: dict[str, Path]) -> dict[str, Any]:
    """The run's PNG artifacts inline in the Dagster event (Markdown with a data URI), so a curve or a
    confusion matrix is seen next to the numbers; larger images are only linked through the MLflow run."""
    out: dict[str, Any] = {}
    for subpath, path in artifacts.items():
        path = Path(path)
        if path.suffix.lower() != ".png" or not path.is_file() or path.stat().st_size > PLOT_METADATA_BYTES:
            continue
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        out[f"plot/{Path(str(subpath)).stem}"] = dg.MetadataValue.md(
            f"![{path.name}](data:image/png;base64,{data})"
        )
    return out


def _log_result(run: StageRun, result: StageResult) -> None:
    run.log_history(result.history)
    # At the last step: MLflow shows a key's value at its highest step, and a curve keeps its shape.
    run.log_metrics(result.metrics, step=max((int(r["step"]) for r in result.history), default=0))
    run.set_tags(
        {
            "crucible.data_version": result.data_version,
            **{f"crucible.output.{k}": v for k, v in result.outputs.items()},
        }
    )
    if result.report_md:
        run.log_text(result.report_md, "report.md")
    if result.sample:
        run.log_dict(result.sample, "sample.json")
    for subpath, path in result.artifacts.items():
        run.log_artifact(
            path,
            subpath if path.is_dir() else (str(subpath).rsplit("/", 1)[0] if "/" in str(subpath) else None),
        )


def _materialize_result(
    results: dict, cfg: Any, checks: CheckFn | None, per_partition_events: bool
) -> dg.MaterializeResult:
    """The step's result: the checks over all partitions, and for a single partition (or none) its event."""
    check_results = []
    if checks:
        outcomes: dict[str, list[tuple[bool, dict]]] = {}
        for part, (_, result, _) in results.items():
            for name, passed, meta in checks(cfg, result):
                outcomes.setdefault(name, []).append((passed, {**meta, "partition": part or ""}))
        for name, items in outcomes.items():
            failed = [m for ok, m in items if not ok]
            check_results.append(
                dg.AssetCheckResult(
                    check_name=name,
                    passed=not failed,
                    metadata={"details": dg.MetadataValue.json([m for _, m in items])},
                    # a check's metadata may carry "warn_only": True (e.g. the judge gate in `tiny`)
                    severity=dg.AssetCheckSeverity.WARN
                    if all(m.get("warn_only") for _, m in items)
                    else dg.AssetCheckSeverity.ERROR,
                )
            )
    if per_partition_events:
        # Each partition already has its own event; this key stops Dagster from emitting one more per
        # partition with this result's metadata (execute_step._log_materialization_or_observation_events).
        return dg.MaterializeResult(
            metadata={SYSTEM_METADATA_KEY_SOURCE_ASSET_OBSERVATION: True}, check_results=check_results or None
        )
    run, result, lineage = next(iter(results.values()))
    return dg.MaterializeResult(
        metadata=_partition_metadata(run, result, lineage),
        check_results=check_results or None,
        data_version=dg.DataVersion(result.data_version) if result.data_version else None,
    )
