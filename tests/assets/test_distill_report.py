"""The post-training chain as Dagster assets on the micro profile: SFT -> Reasoning RL -> its distillation ->
Agentic RL -> its distillation -> General RL -> `distilled_checkpoint` (from the General RL checkpoint, every
earlier stage a teacher). Each distilled checkpoint is registered with lineage to its parent and its teachers,
the next RL stage starts from it, General RL's prompts and outcome reward model are registered, and
`post_training_report` scores every checkpoint of the chain (one chain run serves all these checks)."""

from __future__ import annotations

import dagster as dg
import pytest
from post_training_checks import check_sft_reasoning_and_agentic_rl  # tests/assets is on sys.path

from infra.committed import read_committed
from infra.settings import load_profile
from infra.tracking import UPSTREAM_RUNS_TAG, Tracker

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_distilled_checkpoint_and_report(midtrained):
    from assets.agentic import agentic_assets
    from assets.distill import distill_assets
    from assets.general import general_assets
    from assets.post_training import post_training_assets
    from assets.report import report_assets
    from assets.resources import resources_for

    instance = dg.DagsterInstance.get()
    resources = {**resources_for(load_profile()), "pipes": dg.PipesSubprocessClient()}
    result = dg.materialize(
        post_training_assets + agentic_assets + general_assets + distill_assets + report_assets, instance=instance,
        resources=resources,
    )  # fmt: skip
    assert result.success
    tracker = Tracker.from_profile(load_profile())
    check_sft_reasoning_and_agentic_rl(instance, midtrained)
    _check_general_rl(instance, tracker, midtrained)
    run = tracker.get_run(tracker.model_version_run_id("crucible-distilled", "1"))
    upstream = run.data.tags[UPSTREAM_RUNS_TAG]
    for teacher in ("crucible-sft", "crucible-reasoning_rl", "crucible-agentic_rl", "crucible-general_rl"):
        assert tracker.model_version_run_id(teacher, "1") in upstream, teacher
    assert run.data.tags["crucible.distill_parent"] == "general_rl"
    m = run.data.metrics
    for teacher in ("sft", "reasoning_rl", "agentic_rl", "general_rl"):
        assert f"reverse_kl/{teacher}" in m and 0.0 <= m[f"heldout/agreement/{teacher}"] <= 1.0
        assert m[f"prompts/{teacher}"] >= 1
    assert m["parent/reverse_kl_exact/general_rl"] < 1e-3  # the student starts as that teacher
    assert {s.step for s in tracker.client.get_metric_history(run.info.run_id, "reverse_kl/mean")} == {1, 2}
    # after each earlier RL stage: its distillation, taught by that stage and the ones before it
    for asset, parent, teachers in (
        ("reasoning_rl_distilled", "reasoning_rl", ["sft", "reasoning_rl"]),
        ("agentic_rl_distilled", "agentic_rl", ["sft", "reasoning_rl", "agentic_rl"]),
    ):
        mid = tracker.get_run(tracker.model_version_run_id(f"crucible-{asset}", "1"))
        assert mid.data.tags["crucible.distill_parent"] == parent
        assert mid.data.tags["crucible.distill_teachers"].split(",") == teachers
        assert mid.data.metrics[f"parent/reverse_kl_exact/{parent}"] < 1e-3
        assert all(f"reverse_kl/{t}" in mid.data.metrics for t in teachers)
    # the next RL stage starts from the distilled checkpoint: it is that run's upstream
    agentic = tracker.get_run(tracker.model_version_run_id("crucible-agentic_rl", "1"))
    distilled_rl = tracker.model_version_run_id("crucible-reasoning_rl_distilled", "1")
    assert distilled_rl in agentic.data.tags[UPSTREAM_RUNS_TAG]
    general = tracker.get_run(tracker.model_version_run_id("crucible-general_rl", "1"))
    assert (
        tracker.model_version_run_id("crucible-agentic_rl_distilled", "1")
        in general.data.tags[UPSTREAM_RUNS_TAG]
    )
    event = instance.get_latest_materialization_event(dg.AssetKey("post_training_report"))
    md = event.asset_materialization.metadata["report"].value
    table = md.split("\n\n")[1].splitlines()
    names = [row.split("|")[1].strip() for row in table[2:]]
    assert names == ["midtrain_stage3", "sft", "reasoning_rl", "reasoning_rl_distilled", "agentic_rl",
                     "agentic_rl_distilled", "general_rl", "distilled"]  # fmt: skip
    assert all(k in table[0] for k in ("pass@1/math", "success/terminal", "general/total")), table[0]
    assert all(" ± " in cell for row in table[2:] for cell in row.strip("|").split("|")[1:])
    recovery = md.split("### Each distillation against the same RL checkpoint without it")[1]
    table_rows = [row for row in recovery.splitlines() if row.startswith("| ")][1:]  # without the header
    distilled_rows = {row.split("|")[1].strip() for row in table_rows}
    assert distilled_rows == {"reasoning_rl_distilled", "agentic_rl_distilled", "distilled"}, recovery
    assert "plot/post_training_report" in event.asset_materialization.metadata


def _check_general_rl(instance, tracker, store) -> None:
    """General RL: its prompt set is committed where distillation reads it, the outcome reward model is
    registered with its held-out pair accuracy, and `general_rl_checkpoint` with lineage to its parent (the
    distilled Agentic RL checkpoint), its prompts and the ORM, every reward component in MLflow for the parent
    and the trained model."""
    from assets.general import GENERAL_PROMPTS_PREFIX

    assert read_committed(store, GENERAL_PROMPTS_PREFIX).producer.asset == "general_prompts"
    orm_run = tracker.get_run(tracker.model_version_run_id("crucible-outcome_reward_model", "1"))
    assert 0.0 <= orm_run.data.metrics["heldout/pair_accuracy"] <= 1.0
    assert orm_run.data.metrics["heldout/pairs"] >= 4
    run = tracker.get_run(tracker.model_version_run_id("crucible-general_rl", "1"))
    upstream = run.data.tags[UPSTREAM_RUNS_TAG]
    assert tracker.model_version_run_id("crucible-agentic_rl_distilled", "1") in upstream
    assert orm_run.info.run_id in upstream
    m = run.data.metrics
    for c in ("total", "orm", "language", "constraints", "format", "exemplar"):
        for who in ("heldout/", "compare/agentic_rl_distilled/"):
            assert 0.0 <= m[f"{who}reward/{c}"] <= 1.0, (who, c)
    assert {s.step for s in tracker.client.get_metric_history(run.info.run_id, "reward/orm")} == {1, 2}
    event = instance.get_latest_materialization_event(dg.AssetKey("general_rl_checkpoint"))
    assert "plot/general_rl_curves" in event.asset_materialization.metadata
