"""`crucible run` on the micro profile: web -> code -> tokenizer -> pretraining -> midtraining -> evals, with
every checkpoint registered in MLflow and its lineage walked back to the crawl snapshots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.settings import REPO_ROOT, load_profile
from infra.tracking import Tracker

BIN = Path(sys.executable).parent


def _walk(node: dict) -> list[dict]:
    return [node] + [n for child in node["upstream"] for n in _walk(child)]


@pytest.mark.e2e
def test_crucible_run_registers_checkpoints_with_lineage_to_the_crawl(dagster_home, tmp_path):
    jobs = ["web_corpus", "code_corpus", "training"]
    run = subprocess.run(
        [str(BIN / "crucible"), "run", "--only", *jobs],
        cwd=REPO_ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "whole graph done" in run.stdout

    tracker = Tracker.from_profile(load_profile())
    names = {m.name for m in tracker.client.search_registered_models()}
    checkpoints = [
        "crucible-base",
        "crucible-midtrain_stage1",
        "crucible-midtrain_stage2",
        "crucible-midtrain_stage3",
    ]
    assert set(checkpoints) <= names and "code_language_classifier" in names

    lineage = subprocess.run(
        [str(BIN / "crucible"), "lineage", "crucible-midtrain_stage3/1", "--json"],
        cwd=REPO_ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert lineage.returncode == 0, lineage.stderr[-2000:]
    nodes = _walk(json.loads(lineage.stdout))
    assets = {(n["asset"], n["partition"]) for n in nodes}
    assert ("web_warc", "local-docs-0001") in assets and ("code_raw_files", "code-0001") in assets
    assert {"midtrain_stage2", "midtrain_stage1", "base_checkpoint", "token_shards"} <= {a for a, _ in assets}

    version = tracker.client.get_model_version("crucible-midtrain_stage3", "1")
    tags = version.tags
    assert tags["dagster.asset_key"] == "midtrain_stage3" and tags["crucible.upstream_runs"]
    assert tags["crucible.git_commit"] and tags["crucible.data_version"]
    import mlflow.artifacts
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    local = mlflow.artifacts.download_artifacts(
        artifact_uri=version.source, dst_path=str(tmp_path / "ckpt"), tracking_uri=tracker.tracking_uri
    )
    config = AutoConfig.from_pretrained(local)
    assert config.model_type == "glm_moe_dsa" and config.max_position_embeddings >= 384
    model = AutoModelForCausalLM.from_pretrained(local)
    tokenizer = AutoTokenizer.from_pretrained(local)
    ids = tokenizer("The pass key is 12345.", return_tensors="pt").input_ids
    assert model(ids).logits.shape[-1] == config.vocab_size

    (stage1,) = tracker.find_runs("training", "tags.`dagster.asset_key` = 'midtrain_stage1'", max_results=1)
    # The micro stage 1 opens with a recall-curriculum phase (2 steps x 2 rows of synthetic recall).
    assert stage1.data.metrics["rows/recall_rows/128"] == 4
    assert stage1.data.metrics["recall_curriculum/128/loss"] > 0

    (evals,) = tracker.find_runs("training", "tags.`dagster.asset_key` = 'checkpoint_evals'", max_results=1)
    metrics = evals.data.metrics
    assert "base_checkpoint/passkey/chance" in metrics
    assert any(k.startswith("midtrain_stage3/passkey/acc/") for k in metrics)
