"""The post-training chain as Dagster assets on the micro profile: task suites + agentic tasks -> SFT data -> SFT
-> Reasoning RL -> Agentic RL from a (micro) midtrained checkpoint, each checkpoint registered in MLflow with
lineage to its parent and to the task versions, held-out scores per domain for every model."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.midtraining import checkpoint_prefix
from assets.pretraining import TOKENIZER_PREFIX
from infra.committed import Producer, commit, read_committed
from infra.settings import load_profile
from infra.store import LocalStore
from infra.tracking import UPSTREAM_RUNS_TAG, Tracker
from training.checkpoint import export_hf
from training.model import build_model
from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CORPUS = [
    "What is 3 + 4? Answer: 7. Use the calculator to compute 12 * 34. def f(x): return x + 1",
    "Which term is defined as: a computer program? Answer: software",
] * 40


@pytest.fixture
def midtrained(tmp_path, dagster_home):
    """A committed tokenizer and a micro `midtrain_stage3` checkpoint, as the training job would leave them."""
    profile = load_profile()
    store = LocalStore(profile.state_path / profile.store.url)
    tok_dir = train_tokenizer(CORPUS, TokenizerConfig(vocab_size=512), tmp_path / "tok")
    store.begin_stage(Producer(asset="corpus_tokenizer"))
    commit(store, TOKENIZER_PREFIX, {n: tok_dir / n for n in ("tokenizer.json", "tokenizer_config.json")})
    from assets.post_training import _model_cfg

    cfg, _ = _model_cfg(tok_dir)
    hf = export_hf(
        build_model(cfg, seed=0),
        tmp_path / "hf",
        {n: tok_dir / n for n in ("tokenizer.json", "tokenizer_config.json")},
    )
    store.begin_stage(Producer(asset="midtrain_stage3", mlflow_run_id="parent-run"))
    commit(store, checkpoint_prefix("midtrain_stage3"), hf)
    return store, len(load_tokenizer(tok_dir))


def test_post_training_chain_registers_checkpoints_with_lineage(midtrained):
    from assets.agentic import agentic_assets
    from assets.post_training import post_training_assets
    from assets.resources import resources_for

    store, _ = midtrained
    instance = dg.DagsterInstance.get()
    # resources of this test's state dir (assets.definitions.defs keeps the one of the process's first import)
    resources = {**resources_for(load_profile()), "pipes": dg.PipesSubprocessClient()}
    result = dg.materialize(post_training_assets + agentic_assets, instance=instance, resources=resources)
    assert result.success
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
    # Agentic RL: trained from the Reasoning RL checkpoint against task services (real subprocesses) through
    # the async loop; lineage to its parent and the agentic task set, the services' versions as tags
    agentic_run = tracker.get_run(tracker.model_version_run_id("crucible-agentic_rl", "1"))
    assert rl_run.info.run_id in agentic_run.data.tags[UPSTREAM_RUNS_TAG]
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
