"""Checks of the post-training chain as `crucible run` leaves it on the micro profile (task suites + agentic
tasks -> SFT data -> SFT -> Reasoning RL -> its distillation -> Agentic RL -> its distillation -> General RL ->
`distilled_checkpoint` -> `post_training_report`): each checkpoint registered in MLflow with lineage to its
parent, its teachers and the task versions, held-out scores per domain for every model, the report's table.
Run by tests/assets/test_whole_graph.py on its one run of the whole graph, so the suite trains the chain once."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import dagster as dg
import pytest

from infra.committed import fetch_committed, read_committed
from infra.settings import load_profile
from infra.tracking import UPSTREAM_RUNS_TAG, Tracker


def check_post_training_chain(instance: dg.DagsterInstance, store) -> None:
    """Every post-training check, on the state of a finished `crucible run`."""
    tracker = Tracker.from_profile(load_profile())
    _check_sft_reasoning_and_agentic_rl(instance, tracker, store)
    _check_general_rl(instance, tracker, store)
    _check_distillation_and_report(instance, tracker)


def _rope(store, checkpoint: str) -> tuple:
    """(rope_parameters, max_position_embeddings) of a committed checkpoint's config.json."""
    with tempfile.TemporaryDirectory() as tmp:
        _, path = fetch_committed(store, f"checkpoints/{checkpoint}", Path(tmp))
        config = json.loads((path / "config.json").read_text())
    return config["rope_parameters"], config["max_position_embeddings"]


def _check_sft_reasoning_and_agentic_rl(instance: dg.DagsterInstance, tracker: Tracker, store) -> None:
    sft_run = tracker.get_run(tracker.model_version_run_id("crucible-sft", "1"))
    rl_run = tracker.get_run(tracker.model_version_run_id("crucible-reasoning_rl", "1"))
    # lineage: RL read the SFT checkpoint and the task suites; SFT read the SFT data and the midtrained parent
    assert sft_run.info.run_id in rl_run.data.tags[UPSTREAM_RUNS_TAG]
    suites_version = read_committed(store, "post_training/task_suites").meta["suite_version"]
    assert (
        suites_version and read_committed(store, "post_training/task_suites").producer.asset == "task_suites"
    )
    assert (
        tracker.model_version_run_id("crucible-midtrain_stage3", "1") in sft_run.data.tags[UPSTREAM_RUNS_TAG]
    )
    # SFT continues the midtrained model under its own extended RoPE (it once fell back to the base's)
    assert _rope(store, "sft_checkpoint") == _rope(store, "midtrain_stage3") != _rope(store, "base")
    metrics = rl_run.data.metrics
    # RL drew from train and the RL-only pool task_suites committed beside it
    counts = read_committed(store, "post_training/task_suites").meta["counts"]
    pool = sum(n for key, n in counts.items() if key.startswith("rl_pool/"))
    assert metrics["tasks/rl_pool"] == pool > 0, (metrics.get("tasks/rl_pool"), counts)
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
    # the gain over the SFT model is paired per task: the same tasks at step 0 and at the end
    first, last = (next(m.value for m in held if m.step == s) for s in (0, 2))
    assert metrics["heldout/paired_gain/math"] == pytest.approx(last - first)
    # the test set, scored once after training for the RL policy and its parent (SFT), paired per task; micro's
    # test set is its own (3 per level), so the run says it is not the frozen tiny one
    for domain in ("math", "code", "tool"):
        mine, theirs = metrics[f"test/pass_at_1/{domain}"], metrics[f"test/parent/pass_at_1/{domain}"]
        assert metrics[f"test/paired_gain/{domain}"] == pytest.approx(mine - theirs)
    assert "test/pass_at_1/knowledge" not in metrics
    assert metrics["test/n/math"] == 6 and metrics["test/n/code"] == 3
    assert len(rl_run.data.tags["crucible.test_sha256"]) == 64
    assert rl_run.data.tags["crucible.test_frozen"] == "False"
    sampled = tracker.client.get_metric_history(rl_run.info.run_id, "heldout/sampled_pass_at_1/code")
    first, last = (next(m.value for m in sampled if m.step == s) for s in (0, 2))
    assert metrics["heldout/sampled_paired_gain/code"] == pytest.approx(last - first)
    assert {m.step for m in tracker.client.get_metric_history(sft_run.info.run_id, "loss")}
    assert "reasoning_rl_curves.png" in {
        a.path.rsplit("/", 1)[-1] for a in tracker.client.list_artifacts(rl_run.info.run_id, "plots")
    }
    rl_event = instance.get_latest_materialization_event(dg.AssetKey("reasoning_rl_checkpoint"))
    assert "plot/reasoning_rl_curves" in rl_event.asset_materialization.metadata
    # the held-out rollouts SFT and the result fail, to read, as many as the miss counts of each evaluation
    samples = json.loads(
        Path(tracker.client.download_artifacts(rl_run.info.run_id, "samples.json")).read_text()
    )
    for step in (0, 2):
        misses = samples[f"heldout_misses/{step}"]
        # one value per key and step: the last eval's metrics are logged again with the run's final metrics
        counted = sum(next((m.value for m in tracker.client.get_metric_history(rl_run.info.run_id, k)
                            if m.step == step), 0.0) for k in metrics if k.startswith("heldout/misses/"))  # fmt: skip
        assert len(misses) == counted and all(m["reason"] and m["messages"] for m in misses)
    # held-out code per family (which families RL learned), at step 0 and at the end, and in the report
    families = [k for k in metrics if k.startswith("heldout/family_n/code/")]
    assert families and sum(metrics[k] for k in families) == metrics["heldout/n/code"]
    assert metrics["heldout/n/code"] == 3 and metrics["heldout/n/math"] == 2  # micro's eval_tasks_for
    name = families[0].removeprefix("heldout/family_n/")
    steps = tracker.client.get_metric_history(rl_run.info.run_id, f"heldout/family/{name}")
    assert sorted({m.step for m in steps}) == [0, 2]
    report = rl_event.asset_materialization.metadata["report"].value
    assert "per family" in report and f"| {name} |" in report
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
        # the gain over the parent, paired per task over the 2 held-out tasks (none failed in micro's envs)
        assert am[f"heldout/env_failures/{d}"] == am[f"parent/env_failures/{d}"] == 0
        gain = am[f"heldout/success/{d}"] - am[f"parent/success/{d}"]
        assert am[f"heldout/paired_gain/{d}"] == pytest.approx(gain)
        for who in ("parent/", "heldout/"):  # micro's agentic tasks are all level 1
            assert am[f"{who}success/{d}/level1"] == pytest.approx(am[f"{who}success/{d}"])
        assert am[f"heldout/fixed/{d}"] - am[f"heldout/broken/{d}"] == pytest.approx(gain * 2)
        # sampled success (2 rollouts per task, the same seeds before and after), paired the same way
        sampled_gain = am[f"heldout/sampled_success/{d}"] - am[f"parent/sampled_success/{d}"]
        assert am[f"heldout/sampled_paired_gain/{d}"] == pytest.approx(sampled_gain)
        assert am[f"services/{d}/started"] >= 1
    assert am["policy_version"] == 2  # micro: 2 steps, a push after each
    assert am["buffer/received"] >= 8
    assert {m.step for m in tracker.client.get_metric_history(agentic_run.info.run_id, "reward/mean")} == {
        1,
        2,
    }
    agentic_event = instance.get_latest_materialization_event(dg.AssetKey("agentic_rl_checkpoint"))
    assert "plot/agentic_rl_curves" in agentic_event.asset_materialization.metadata


def _check_distillation_and_report(instance: dg.DagsterInstance, tracker: Tracker) -> None:
    """Distillation after every RL stage (parent, teachers, the next stage starts from it) and the report."""
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
    assert all(k in table[0] for k in ("pass_at_1/math", "success/terminal", "general/total")), table[0]
    assert " test/pass_at_1/code " in table[0] and re.search(
        r"test split tasks [1-9]", md
    )  # the test split too
    # perplexity's test split: the tail of the held-out stream (micro has ~170k held-out code tokens)
    assert re.search(
        r"perplexity test split \(held-out tokens past 4,096\): .*code 8 rows \(sha256 [0-9a-f]{16}\)", md
    )
    assert " test/ppl/code " in table[0]
    # every cell is also a metric of the report's MLflow run (a key MLflow refuses, e.g. with '@', was dropped)
    logged = tracker.get_run(event.asset_materialization.metadata["mlflow_run_id"].value).data.metrics
    assert {"distilled/pass_at_1/math", "distilled/pass_at_1/math_se", "sft/success/terminal"} <= set(logged)
    assert all(" ± " in cell for row in table[2:] for cell in row.strip("|").split("|")[1:])
    recovery = md.split("### Each distillation against the same RL checkpoint without it")[1]
    table_rows = [row for row in recovery.splitlines() if row.startswith("| ")][1:]  # without the header
    distilled_rows = {row.split("|")[1].strip() for row in table_rows}
    assert distilled_rows == {"reasoning_rl_distilled", "agentic_rl_distilled", "distilled"}, recovery
    # paired SEs over the same items, from per-item values the run keeps as an artifact
    assert "drop SE (paired)" in recovery and "Drops larger than twice their paired SE" in recovery
    report_run = event.asset_materialization.metadata["mlflow_run_id"].value
    items = json.loads(Path(tracker.client.download_artifacts(report_run, "report_items.json")).read_text())
    assert set(items) == set(names) and len(items["distilled"]["pass_at_1/math"]) >= 2
    assert len(items["distilled"]["test/pass_at_1/math"]) >= 2  # scored per task: paired SEs on it too
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
