"""One declaration per tracked stage: `tracked_asset(...)` builds the `@dg.asset` that calls `run_stage`, so
a stage module says what differs (config, stage function, deps, checks) and nothing else."""

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import Any

import dagster as dg

from assets.partitions import single_run
from assets.pipes_launch import PipesLaunch
from assets.resources import MlflowResource, ObjectStoreResource
from assets.tracked import CheckFn, StageFn, code_version, run_stage
from infra.stage import StageResult
from infra.store import ObjectStore
from infra.tracking import StageRun

RegisterFn = Callable[[StageResult], dict[str, str]]
LaunchedStageFn = Callable[[PipesLaunch, Any, ObjectStore, str | None, StageRun], StageResult]


@dataclass(frozen=True)
class Launches:
    """A stage that launches processes over Dagster Pipes: the asset takes the `pipes` resource and the
    stage gets a `PipesLaunch` bound to this materialization as its first argument."""

    stage: LaunchedStageFn


@dataclass(frozen=True)
class Check:
    """An asset check the stage's `evaluate` function reports on; blocking by default, so a failed check
    stops the assets downstream."""

    name: str
    description: str | None = None
    blocking: bool = True


def tracked_asset(
    name: str,
    description: str,
    *,
    config: type[dg.Config],
    stage: StageFn | Launches,
    code_modules: Sequence[ModuleType],
    group: str,
    partitions: dg.PartitionsDefinition | None = None,
    deps: Sequence[str] = (),
    upstream: Sequence[str] | None = None,
    checks: Sequence[Check] = (),
    evaluate: CheckFn | None = None,
    register: RegisterFn | None = None,
    pool: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> dg.AssetsDefinition:
    """The asset `name` running `stage` through `assets.tracked.run_stage`.

    `config` is the launchpad config class (`assets.stage_config.launchpad_config`); the code version hashes
    `code_modules`; partitioned assets run a backfill in one run. `upstream` (default: `deps`) names the
    assets whose reads lineage expects; `evaluate` computes the results of `checks`."""
    if bool(checks) != (evaluate is not None):
        raise ValueError(f"{name}: declare checks and the evaluate function that reports them together")
    upstream_keys = [dg.AssetKey(a) for a in (deps if upstream is None else upstream)]

    def materialize(context: dg.AssetExecutionContext, values: dg.Config, store, mlflow, fn: StageFn):
        return run_stage(
            context,
            store=store,
            mlflow=mlflow,
            config=values,
            fn=fn,
            upstream=upstream_keys,
            checks=evaluate,
            register=register,
        )

    if isinstance(stage, Launches):

        def compute(
            context: dg.AssetExecutionContext,
            config: dg.Config,
            store: ObjectStoreResource,
            mlflow: MlflowResource,
            pipes: dg.PipesSubprocessClient,
        ) -> dg.MaterializeResult:
            return materialize(
                context, config, store, mlflow, partial(stage.stage, PipesLaunch(context, pipes))
            )

    else:

        def compute(
            context: dg.AssetExecutionContext,
            config: dg.Config,
            store: ObjectStoreResource,
            mlflow: MlflowResource,
        ) -> dg.MaterializeResult:
            return materialize(context, config, store, mlflow, stage)

    compute.__annotations__["config"] = config  # Dagster reads the config schema from this annotation
    with warnings.catch_warnings():
        # backfill_policy is beta in Dagster and chosen on purpose (a backfill is one run); its warning
        # would otherwise print once per partitioned asset every time the definitions load.
        warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)
        return dg.asset(
            name=name,
            description=description,
            group_name=group,
            partitions_def=partitions,
            backfill_policy=single_run if partitions else None,
            deps=list(deps),
            code_version=code_version(*code_modules),
            pool=pool,
            kinds={"python"},
            tags=dict(tags) if tags else None,
            check_specs=[
                dg.AssetCheckSpec(c.name, asset=name, blocking=c.blocking, description=c.description)
                for c in checks
            ]
            or None,
        )(compute)
