"""The end of the post-training chain as Dagster assets on the micro profile: after SFT -> Reasoning RL ->
Agentic RL -> General RL, `distilled_checkpoint` (from the General RL checkpoint, every earlier stage a teacher)
is registered with lineage to its parent and its teachers, and `post_training_report` scores every checkpoint
of the chain."""

from __future__ import annotations

import dagster as dg
import pytest

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
    event = instance.get_latest_materialization_event(dg.AssetKey("post_training_report"))
    md = event.asset_materialization.metadata["report"].value
    table = md.split("\n\n")[1].splitlines()
    names = [row.split("|")[1].strip() for row in table[2:]]
    assert names == ["midtrain_stage3", "sft", "reasoning_rl", "agentic_rl", "general_rl", "distilled"]
    assert all(k in table[0] for k in ("pass@1/math", "success/terminal", "general/total")), table[0]
    assert all(" ± " in cell for row in table[2:] for cell in row.strip("|").split("|")[1:])
    assert "Distillation against the same parent without it (general_rl)" in md
    assert "plot/post_training_report" in event.asset_materialization.metadata
