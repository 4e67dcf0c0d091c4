"""`crucible run` on the micro profile, every job of `assets.definitions.JOBS` (web -> code -> knowledge ->
rescue -> tokenizer -> pretraining -> midtraining -> evals -> post-training), with every checkpoint registered
in MLflow, its lineage walked back to the crawl snapshots and the eval numbers in a trained model's ranges.
The post-training chain's own checks (tests/assets/post_training_checks.py) run on the same state, so the
suite trains that chain once."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest
from post_training_checks import check_post_training_chain  # tests/assets is on sys.path

from infra.llm_server import llm_server_process
from infra.settings import REPO_ROOT, load_profile, validate_stage
from infra.store import open_store
from infra.tracking import Tracker
from training.context_extension import ContextExtensionConfig

BIN = Path(sys.executable).parent


def _walk(node: dict) -> list[dict]:
    return [node] + [n for child in node["upstream"] for n in _walk(child)]


@pytest.mark.e2e
@pytest.mark.timeout(2400)  # measured: `crucible run` 838 s (training 655 s) and 414 s on a loaded 2-core box
def test_crucible_run_registers_checkpoints_with_lineage_to_the_crawl(dagster_home, tmp_path):
    from assets.definitions import JOBS

    jobs = [job.name for job in JOBS]
    assert {"web_corpus", "code_corpus", "knowledge", "web_rescue", "training"} <= set(jobs)
    started = time.monotonic()
    # The micro math filter asks an OpenAI-compatible judge (the deterministic keyword scorer) over HTTP.
    with llm_server_process("--keyword-scorer") as judge_url:
        env = {**os.environ, "CRUCIBLE_JUDGE_URL": judge_url, "CRUCIBLE_JUDGE_MODEL": "keyword-scorer"}
        run = subprocess.run(
            [str(BIN / "crucible"), "run"],  # no --only: every job, in graph order
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
        )
    print(f"crucible run: {time.monotonic() - started:.0f} s")
    print("\n".join(line for line in run.stdout.splitlines() if " done in " in line))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "whole graph done" in run.stdout
    for job in jobs:
        assert f"crucible: {job} done in" in run.stdout, job

    tracker = Tracker.from_profile(load_profile())

    def last_run(group: str, asset: str):
        (run,) = tracker.find_runs(group, f"tags.`dagster.asset_key` = '{asset}'", max_results=1)
        return run

    base, evals = last_run("training", "base_checkpoint"), last_run("training", "checkpoint_evals")
    shards, rescue = last_run("training", "token_shards"), last_run("knowledge", "web_rescued")
    wk = last_run("knowledge", "world_knowledge_classifier")
    metrics = evals.data.metrics
    print("evals:", {k: round(v, 4) for k, v in sorted(metrics.items()) if "depth" not in k})
    print("base:", {k: round(v, 4) for k, v in sorted(base.data.metrics.items())})
    print("shards:", {k: v for k, v in sorted(shards.data.metrics.items()) if k.startswith("train_tokens/")})
    print(
        "rescue:",
        rescue.data.metrics,
        "wk:",
        wk.data.metrics.get("world_knowledge_fasttext/auc_encyclopedic_vs_web"),
    )

    # Eval numbers of a trained model (measured on micro, two runs: dense loss 5.17 / 5.12; perplexity at 64
    # tokens 131-219 for every source and checkpoint; stage 3 / base short perplexity 0.988 / 0.983). An
    # untrained model has loss ln(512) = 6.24 and perplexity ~512.
    vocab = 512
    assert base.data.metrics["dense/loss"] < math.log(vocab) - 0.5
    assert metrics["base_checkpoint/passkey/chance"] == 0.25
    sources = {k.rsplit("/", 1)[1] for k in metrics if k.startswith("base_checkpoint/ppl/ctx_64/")}
    assert {"web", "code", "math"} <= sources, sources  # web too: it holds out heldout_min_docs docs
    for ckpt in ("base_checkpoint", "midtrain_stage1", "midtrain_stage2", "midtrain_stage3"):
        for source in sources:
            ppl = metrics[f"{ckpt}/ppl/ctx_64/{source}"]
            assert math.isfinite(ppl) and 1.0 < ppl < 0.6 * vocab, (ckpt, source, ppl)
        for length in (128, 256):  # a share of whole items
            acc, n = metrics[f"{ckpt}/passkey/acc/{length}"], metrics[f"{ckpt}/passkey/n/{length}"]
            assert n > 0 and abs(acc * n - round(acc * n)) < 1e-6, (ckpt, length, acc, n)
        assert 0.0 < metrics[f"{ckpt}/dsa/topk_mass"] <= metrics[f"{ckpt}/dsa/topk_mass_oracle"] + 1e-6
        first, second = metrics[f"{ckpt}/copy/nll_first"], metrics[f"{ckpt}/copy/nll_second"]
        assert metrics[f"{ckpt}/copy/gain"] == pytest.approx(first - second) and first < math.log(vocab), ckpt
    # Pretraining draws no source more than max_source_epochs (4) times over its train tokens.
    epochs = {k.split("/", 1)[1]: v for k, v in base.data.metrics.items() if k.startswith("source_epochs/")}
    assert {"web", "code", "math"} <= set(epochs) and max(epochs.values()) <= 4.0 + 1e-6, epochs
    # Midtraining keeps the short-context model: within the gate's bound (max_short_ppl_ratio 1.10).
    assert metrics["final_vs_base/short_ppl_ratio/max"] < 1.10
    # Every source holds out at least heldout_min_docs docs (16; half of a smaller source), so each
    # perplexity averages the rows its held-out text gives, up to ppl_max_tokens (1024 = 16 rows of 64).
    for source in ("web", "code", "math"):
        held = shards.data.metrics[f"heldout_docs/{source}"]
        assert held >= min(16, (held + shards.data.metrics[f"train_docs/{source}"]) // 2), source
        rows = max(1, min(1024, int(shards.data.metrics[f"heldout_tokens/{source}"])) // 64)
        assert metrics[f"base_checkpoint/ppl_rows/ctx_64/{source}"] == rows, source
        assert metrics[f"final_vs_base/short_ppl_rows/{source}"] == rows, source

    # The knowledge and rescue jobs feed the mixture: math tokens, and the rescued documents' tokens.
    for source in ("web", "code", "math"):
        assert shards.data.metrics[f"train_tokens/{source}"] > 0, source
    assert (shards.data.metrics.get("train_tokens/knowledge", 0) > 0) == (rescue.data.metrics["rescued"] > 0)
    assert rescue.data.metrics["scored"] > 0

    names = {m.name for m in tracker.client.search_registered_models()}
    checkpoints = [
        "crucible-base",
        "crucible-midtrain_stage1",
        "crucible-midtrain_stage2",
        "crucible-midtrain_stage3",
    ]
    assert set(checkpoints) <= names and "code_language_classifier" in names

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

    # The numbers `checkpoint_evals` logged for stage 3 are the registered checkpoint's: evaluating the
    # downloaded version again gives them (one torch thread here and in `crucible run`: the same sums).
    from assets.midtraining import heldout_shards
    from assets.pretraining import local_tokenizer
    from training.evals import EvalConfig, evaluate_checkpoint_dir

    profile = load_profile()
    store = open_store(profile.store, profile.state_path)
    again = evaluate_checkpoint_dir(
        local,
        local_tokenizer(store),
        heldout_shards(store),
        validate_stage(profile, "checkpoint_evals", EvalConfig),
        tmp_path / "evals",
    ).metrics
    assert again.keys() <= {k.removeprefix("midtrain_stage3/") for k in metrics}
    for key, value in again.items():
        assert metrics[f"midtrain_stage3/{key}"] == pytest.approx(value, rel=1e-5, abs=1e-9), key

    stage1 = last_run("training", "midtrain_stage1")
    # The micro stage 1 opens with a recall-curriculum phase: 2 steps x (2 recall rows + the replay rows).
    replay = validate_stage(
        load_profile("micro"), "context_extension", ContextExtensionConfig
    ).curriculum_replay_rows
    assert replay > 0 and stage1.data.metrics["rows/replay_rows/128"] == 2 * replay
    assert stage1.data.metrics["rows/recall_rows/128"] == 2 * (2 + replay)
    assert stage1.data.metrics["recall_curriculum/128/loss"] > 0

    lineage = subprocess.run(
        [str(BIN / "crucible"), "lineage", "crucible-midtrain_stage3/1", "--json"],
        cwd=REPO_ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert lineage.returncode == 0, lineage.stderr[-2000:]
    nodes = _walk(json.loads(lineage.stdout))
    assets = {(n["asset"], n["partition"]) for n in nodes}
    print("lineage:", sorted({a for a, _ in assets}))
    assert ("web_warc", "local-docs-0001") in assets and ("code_raw_files", "code-0001") in assets
    assert {"midtrain_stage2", "midtrain_stage1", "base_checkpoint", "token_shards"} <= {a for a, _ in assets}
    # The knowledge and rescue jobs' outputs are in the mixture: their runs are in the checkpoint's lineage.
    assert {"math_filtered", "web_rescued"} <= {a for a, _ in assets}

    # The post-training chain: the distilled checkpoint's lineage walks through every stage to the crawl,
    # with no broken or stale link.
    distilled = subprocess.run(
        [str(BIN / "crucible"), "lineage", "crucible-distilled/1", "--json"],
        cwd=REPO_ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    tree = json.loads(distilled.stdout)
    chain = {n["asset"] for n in _walk(tree)}
    print("distilled lineage:", sorted(chain))
    assert distilled.returncode == 0 and tree["broken_links"] == [] == tree["stale_links"], distilled.stderr[
        -2000:
    ]
    assert {
        "general_rl_checkpoint", "agentic_rl_distilled", "agentic_rl_checkpoint", "reasoning_rl_distilled",
        "reasoning_rl_checkpoint", "sft_checkpoint",
        "agentic_tasks", "task_suites", "sft_data_set", "midtrain_stage3", "base_checkpoint", "token_shards",
        "web_warc", "code_raw_files",
    } <= chain  # fmt: skip
    # SFT -> Reasoning RL -> Agentic RL -> General RL, the distillation after each and the results table
    profile = load_profile()
    check_post_training_chain(dg.DagsterInstance.get(), open_store(profile.store, profile.state_path))
