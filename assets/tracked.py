"""The one pattern every asset follows: resolve config, open one MLflow run per partition with lineage tags,
call the stage function, log what it returns, and hand Dagster metadata that links back to MLflow."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import dagster as dg
from pydantic import BaseModel

from assets.resources import MlflowResource, ObjectStoreResource
from assets.stage_config import resolve
from infra.partition_keys import validate_partition_keys
from infra.settings import load_profile
from infra.stage import StageResult
from infra.store import ObjectStore
from infra.tracking import UPSTREAM_RUNS_TAG, UPSTREAM_VERSIONS_TAG, StageRun, git_commit

log = logging.getLogger(__name__)

StageFn = Callable[[Any, ObjectStore, str | None, StageRun], StageResult]
CheckFn = Callable[[Any, StageResult], list[tuple[str, bool, dict]]]


def code_version(*modules: ModuleType) -> str:
    """A code version that changes when the stage's own modules change (Dagster marks assets stale)."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(inspect.getsource(module).encode())
    return digest.hexdigest()[:12]


@dataclass
class Upstream:
    asset: str
    partition: str | None
    mlflow_run_id: str | None
    data_version: str | None


def _run_id_for(metadata: dict, partition: str | None) -> str | None:
    runs = metadata.get("mlflow_runs")
    if runs is not None:
        mapping = runs.value if hasattr(runs, "value") else runs
        if isinstance(mapping, str):
            mapping = json.loads(mapping)
        if partition in mapping:
            return mapping[partition]
    single = metadata.get("mlflow_run_id")
    return getattr(single, "value", single) if single is not None else None


def upstream_lineage(
    instance: dg.DagsterInstance, keys: Sequence[dg.AssetKey], partition: str | None
) -> list[Upstream]:
    """The latest materialization of each upstream asset: the same partition if it has one, else all."""
    found: list[Upstream] = []
    for key in keys:
        partitions: list[str | None]
        if partition is not None and _latest(instance, key, partition) is not None:
            partitions = [partition]
        else:
            partitions = sorted(instance.get_materialized_partitions(key)) or [None]
        for part in partitions:
            record = _latest(instance, key, part)
            if record is None:
                continue
            mat = record.asset_materialization
            metadata = mat.metadata if mat else {}
            version = mat.tags.get("dagster/data_version") if mat and mat.tags else None
            found.append(Upstream(key.to_user_string(), part, _run_id_for(metadata, part), version))
    return found


def _latest(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None):
    flt = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None)
    records = instance.fetch_materializations(flt, limit=1).records
    return records[0] if records else None


def _metric_metadata(metrics: dict[str, float]) -> dict[str, Any]:
    out = {}
    for key, value in sorted(metrics.items())[:60]:
        out[key] = (
            dg.MetadataValue.float(float(value))
            if isinstance(value, float)
            else dg.MetadataValue.int(int(value))
            if isinstance(value, int | bool)
            else value
        )
    return out


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
) -> dg.MaterializeResult:
    """Run `fn` once per partition of this run, each inside its own MLflow run.

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
    results: dict[str | None, tuple[StageRun, StageResult]] = {}
    for part in partitions:
        ups = upstream_lineage(context.instance, upstream, part)
        tags = {
            "dagster.run_id": context.run_id,
            "dagster.asset_key": asset_name,
            "dagster.partition_key": part or "",
            "crucible.code_version": context.assets_def.code_versions_by_key.get(key) or "",
            "crucible.git_commit": commit,
            "crucible.profile": profile.name,
            UPSTREAM_RUNS_TAG: ",".join(u.mlflow_run_id for u in ups if u.mlflow_run_id),
            UPSTREAM_VERSIONS_TAG: json.dumps(
                {f"{u.asset}[{u.partition or ''}]": u.data_version for u in ups}
            ),
        }
        run_name = f"{asset_name}[{part}]" if part else asset_name
        context.log.info("%s: MLflow run in experiment %s/%s", run_name, tracker.experiment_prefix, group)
        with tracker.stage_run(group, run_name, tags, params=cfg.model_dump(mode="json")) as run:
            started = time.time()
            result = fn(cfg, object_store, part, run)
            result.metrics.setdefault("wall_time_s", round(time.time() - started, 3))
            _log_result(run, result)
            for name, subpath in (register(result) if register else {}).items():
                version = tracker.register_model(
                    name,
                    run.run_id,
                    subpath,
                    {**tags, "crucible.data_version": result.data_version, "crucible.run_name": run_name},
                )
                result.outputs[f"model/{name}"] = f"models:/{name}/{version.version}"
                context.log.info("registered %s version %s", name, version.version)
        results[part] = (run, result)
    return _materialize_result(results, cfg, checks)


def _log_result(run: StageRun, result: StageResult) -> None:
    run.log_metrics(result.metrics)
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


def _materialize_result(results: dict, cfg: Any, checks: CheckFn | None) -> dg.MaterializeResult:
    runs = {part: run.run_id for part, (run, _) in results.items()}
    last_run, last = list(results.values())[-1]
    versions = [r.data_version for _, r in results.values()]
    metadata: dict[str, Any] = {
        "mlflow_run_id": last_run.run_id,
        "mlflow_runs": dg.MetadataValue.json({str(k): v for k, v in runs.items()}),
        "data_version": ",".join(versions),
        **{f"output/{k}": dg.MetadataValue.path(v) for k, v in last.outputs.items()},
        **_metric_metadata(last.metrics),
    }
    if last_run.url:
        metadata["mlflow_run_url"] = dg.MetadataValue.url(last_run.url)
    if last.report_md:
        metadata["report"] = dg.MetadataValue.md(last.report_md)
    check_results = []
    if checks:
        outcomes: dict[str, list[tuple[bool, dict]]] = {}
        for part, (_, result) in results.items():
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
    version = (
        versions[0] if len(versions) == 1 else hashlib.sha256("".join(versions).encode()).hexdigest()[:16]
    )
    return dg.MaterializeResult(
        metadata=metadata,
        check_results=check_results or None,
        data_version=dg.DataVersion(version) if version else None,
    )
