"""General RL as Dagster assets on the micro profile: after SFT -> Reasoning RL -> Agentic RL, the General RL
prompt set is committed where distillation reads it, the outcome reward model is registered with its held-out
pair accuracy, and `general_rl_checkpoint` is registered with lineage to its parent, its prompts and the ORM,
every reward component in MLflow for the parent and the trained model."""

from __future__ import annotations

import dagster as dg
import pytest

from infra.committed import read_committed
from infra.settings import load_profile
from infra.tracking import UPSTREAM_RUNS_TAG, Tracker

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_general_rl_chain(midtrained):
    from assets.agentic import agentic_assets
    from assets.general import GENERAL_PROMPTS_PREFIX, general_assets
    from assets.post_training import post_training_assets
    from assets.resources import resources_for

    instance = dg.DagsterInstance.get()
    resources = {**resources_for(load_profile()), "pipes": dg.PipesSubprocessClient()}
    result = dg.materialize(
        post_training_assets + agentic_assets + general_assets, instance=instance, resources=resources
    )
    assert result.success
    store = midtrained
    assert read_committed(store, GENERAL_PROMPTS_PREFIX).producer.asset == "general_prompts"
    tracker = Tracker.from_profile(load_profile())
    orm_run = tracker.get_run(tracker.model_version_run_id("crucible-outcome_reward_model", "1"))
    assert 0.0 <= orm_run.data.metrics["heldout/pair_accuracy"] <= 1.0
    assert orm_run.data.metrics["heldout/pairs"] >= 4
    run = tracker.get_run(tracker.model_version_run_id("crucible-general_rl", "1"))
    upstream = run.data.tags[UPSTREAM_RUNS_TAG]
    assert tracker.model_version_run_id("crucible-agentic_rl", "1") in upstream
    assert orm_run.info.run_id in upstream
    m = run.data.metrics
    for c in ("total", "orm", "language", "constraints", "format", "exemplar"):
        for who in ("heldout/", "compare/agentic_rl/"):
            assert 0.0 <= m[f"{who}reward/{c}"] <= 1.0, (who, c)
    assert {s.step for s in tracker.client.get_metric_history(run.info.run_id, "reward/orm")} == {1, 2}
    event = instance.get_latest_materialization_event(dg.AssetKey("general_rl_checkpoint"))
    assert "plot/general_rl_curves" in event.asset_materialization.metadata
