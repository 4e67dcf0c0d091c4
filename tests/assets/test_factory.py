"""assets/factory.py: one `tracked_asset` declaration gives the asset Dagster would get from the hand-written
`@dg.asset` + `run_stage` form (config schema, checks, partitions, pool, tags, code version), and runs."""

import json
import warnings

import dagster as dg
import pytest
from pydantic import BaseModel, Field

from assets.factory import Check, Launches, tracked_asset
from assets.resources import resources_for
from assets.stage_config import launchpad_config
from assets.tracked import code_version
from infra.committed import commit
from infra.settings import load_profile
from infra.stage import StageResult


class EchoSettings(BaseModel):
    text: str = Field("hello", description="What the stage writes")


EchoConfig = launchpad_config(
    "tokenizer", EchoSettings, load_profile()
)  # any known stage: its other keys are ignored
PARTS = dg.StaticPartitionsDefinition(["a", "b"])


def _echo(cfg: EchoSettings, store, part, run) -> StageResult:
    tmp = load_profile().state_path / "tmp" / run.run_id
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "echo.txt").write_text(cfg.text)
    version = commit(store, f"echo/{part}", tmp).version
    return StageResult(
        metrics={"chars": len(cfg.text)}, outputs={"echo": f"echo/{part}"}, data_version=version
    )


def _not_empty(cfg: EchoSettings, result: StageResult) -> list[tuple[str, bool, dict]]:
    return [("echo_not_empty", result.metrics["chars"] > 0, {"chars": result.metrics["chars"]})]


echo = tracked_asset(
    "echo",
    "Writes the configured text.",
    config=EchoConfig,
    stage=_echo,
    code_modules=[json],
    group="test",
    partitions=PARTS,
    deps=["upstream_thing"],
    checks=[Check("echo_not_empty", "Something was written")],
    evaluate=_not_empty,
    pool="echo_pool",
    tags={"crucible/resource": "cpu"},
)


def test_the_declaration_sets_what_the_hand_written_asset_did():
    key = dg.AssetKey("echo")
    spec = echo.specs_by_key[key]
    assert echo.group_names_by_key[key] == "test"
    assert echo.partitions_def == PARTS
    assert echo.backfill_policy == dg.BackfillPolicy.single_run()
    assert [d.asset_key for d in spec.deps] == [dg.AssetKey("upstream_thing")]
    assert echo.code_versions_by_key[key] == code_version(json)
    assert spec.description == "Writes the configured text."
    assert spec.tags["crucible/resource"] == "cpu" and spec.kinds == {"python"}
    assert echo.op.pool == "echo_pool"
    (check,) = echo.check_specs
    assert (check.name, check.blocking, check.description) == (
        "echo_not_empty",
        True,
        "Something was written",
    )
    fields = echo.op.config_field.config_type.fields
    assert fields["text"].default_value == "hello" and fields["text"].description == "What the stage writes"
    assert echo.required_resource_keys >= {"store", "mlflow"} and "pipes" not in echo.required_resource_keys


def test_a_launched_stage_takes_the_pipes_resource_and_unpartitioned_has_no_backfill_policy():
    launched = tracked_asset(
        "launched",
        "Launches.",
        config=EchoConfig,
        stage=Launches(lambda launch, cfg, store, part, run: _echo(cfg, store, part, run)),
        code_modules=[json],
        group="test",
    )
    assert "pipes" in launched.required_resource_keys
    assert launched.partitions_def is None and launched.backfill_policy is None


def test_a_partitioned_declaration_does_not_print_dagsters_backfill_policy_beta_warning():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet = tracked_asset(
            "quiet", "Partitioned.", config=EchoConfig, stage=_echo, code_modules=[json], group="test",
            partitions=PARTS,
        )  # fmt: skip
        warnings.warn("a warning from the declaring code still shows", UserWarning, stacklevel=1)
    assert quiet.backfill_policy == dg.BackfillPolicy.single_run()
    # ResourceWarnings come from the garbage collection of other tests' processes on this worker, at any moment
    shown = [str(w.message) for w in seen if not issubclass(w.category, ResourceWarning)]
    assert shown == ["a warning from the declaring code still shows"]


def test_checks_without_the_function_that_reports_them_are_refused():
    with pytest.raises(ValueError, match="together"):
        tracked_asset("bad", "Bad.", config=EchoConfig, stage=_echo, code_modules=[json], group="test",
                      checks=[Check("never_reported")])  # fmt: skip


def test_a_declared_asset_materializes_with_its_check_and_mlflow_run(dagster_home):
    with dg.DagsterInstance.get() as instance:
        result = dg.materialize(
            [echo],
            instance=instance,
            resources=resources_for(load_profile()),
            partition_key="a",
            run_config={"ops": {"echo": {"config": {"text": "from the launchpad"}}}},
        )
    (mat,) = result.asset_materializations_for_node("echo")
    assert mat.metadata["chars"].value == len("from the launchpad")
    assert mat.metadata["mlflow_run_id"].value
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == "echo_not_empty" and check.passed
