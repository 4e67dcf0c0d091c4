"""Checks of the first half of the post-training chain (task suites + agentic tasks -> SFT data -> SFT ->
Reasoning RL -> its distillation -> Agentic RL from a micro midtrained checkpoint): each checkpoint registered in
MLflow with lineage to its parent and to the task versions, held-out scores per domain for every model. Run by
tests/assets/test_distill_report.py on its one materialization of the whole chain."""

from __future__ import annotations

import dagster as dg

from infra.committed import read_committed
from infra.settings import load_profile
from infra.tracking import UPSTREAM_RUNS_TAG, Tracker


def check_sft_reasoning_and_agentic_rl(instance: dg.DagsterInstance, store) -> None:
    """Run by tests/assets/test_distill_report.py after its one materialization of the whole chain."""
    tracker = Tracker.from_profile(load_profile())
    sft_run = tracker.get_run(tracker.model_version_run_id("crucible-sft", "1"))
    rl_run = tracker.get_run(tracker.model_version_run_id("crucible-reasoning_rl", "1"))
    # lineage: RL read the SFT checkpoint and the task suites; SFT read the SFT data and the midtrained parent
    assert sft_run.info.run_id in rl_run.data.tags[UPSTREAM_RUNS_TAG]
    suites_version = read_committed(store, "post_training/task_suites").meta["suite_version"]
    assert (
        suites_version and read_committed(store, "post_training/task_suites").producer.asset == "task_suites"
    )
    assert "parent-run" in sft_run.data.tags[UPSTREAM_RUNS_TAG]
    metrics = rl_run.data.metrics
    for domain in ("math", "code", "tool", "knowledge"):
        for who in ("heldout/pass_at_1/", "compare/midtrain_stage3/pass_at_1/"):
            assert 0.0 <= metrics[f"{who}{domain}"] <= 1.0
    assert metrics["rho/max"] >= metrics["rho/min"] > 0
    assert 0.0 <= metrics["icepop/masked_fraction"] <= 1.0
    # per step in MLflow: reward at each RL step, held-out pass@1 at step 0 (the SFT model) and every
    # eval_every steps; the curves as a PNG on the run and in the Dagster event
    history = tracker.client.get_metric_history(rl_run.info.run_id, "reward/mean")
    assert sorted({m.step for m in history}) == [1, 2]
    held = tracker.client.get_metric_history(rl_run.info.run_id, "heldout/pass_at_1/math")
    assert sorted({m.step for m in held}) == [0, 2]
    assert {m.step for m in tracker.client.get_metric_history(sft_run.info.run_id, "loss")}
    assert "reasoning_rl_curves.png" in {
        a.path.rsplit("/", 1)[-1] for a in tracker.client.list_artifacts(rl_run.info.run_id, "plots")
    }
    rl_event = instance.get_latest_materialization_event(dg.AssetKey("reasoning_rl_checkpoint"))
    assert "plot/reasoning_rl_curves" in rl_event.asset_materialization.metadata
    assert tracker.get_run(rl_run.info.run_id).data.params["max_new_tokens"] == "8"  # not redacted
    # Agentic RL: trained from the distilled Reasoning RL checkpoint against task services (real subprocesses)
    # through the async loop; lineage to its parent and the agentic task set, the services' versions as tags
    agentic_run = tracker.get_run(tracker.model_version_run_id("crucible-agentic_rl", "1"))
    distilled_run = tracker.get_run(tracker.model_version_run_id("crucible-reasoning_rl_distilled", "1"))
    assert rl_run.info.run_id in distilled_run.data.tags[UPSTREAM_RUNS_TAG]
    assert distilled_run.info.run_id in agentic_run.data.tags[UPSTREAM_RUNS_TAG]
    tasks_meta = read_committed(store, "post_training/agentic_tasks").meta
    assert (
        agentic_run.data.tags["crucible.agentic_tasks"]
        == read_committed(store, "post_training/agentic_tasks").version
    )
    assert tasks_meta["agentic_version"]
    services = agentic_run.data.tags["crucible.task_services"]
    assert all(f"{d} {d}-v" in services for d in ("codefix", "search", "terminal")), services
    am = agentic_run.data.metrics
    for d in ("terminal", "codefix", "search"):
        for who in ("parent/success/", "heldout/success/"):
            assert 0.0 <= am[f"{who}{d}"] <= 1.0
        assert am[f"heldout/n/{d}"] + am[f"heldout/env_failures/{d}"] == 2
        assert am[f"services/{d}/started"] >= 1
    assert am["policy_version"] == 2  # micro: 2 steps, a push after each
    assert am["buffer/received"] >= 8
    assert {m.step for m in tracker.client.get_metric_history(agentic_run.info.run_id, "reward/mean")} == {
        1,
        2,
    }
    agentic_event = instance.get_latest_materialization_event(dg.AssetKey("agentic_rl_checkpoint"))
    assert "plot/agentic_rl_curves" in agentic_event.asset_materialization.metadata
