"""`crucible lineage` over the post-training chain on the micro profile: the walk from a registered checkpoint
back to the crawl snapshots, broken links, stale reads, the report on the checkpoint's MLflow run, and
Dagster's staleness after a code-version change.

The post-training chain (task_suites -> sft_data_set -> sft_checkpoint -> reasoning_rl_checkpoint) runs once
per module as real Dagster assets; its upstream (crawl -> tokenizer, token shards -> midtrain_stage3) is a
small stand-in chain of MLflow runs and commits recorded the way `assets/tracked.py` records them, so the
test does not train the pretraining graph (tests/assets/test_whole_graph.py walks that one). Each test works
on its own copy of that state."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.assets.graph.asset_graph import AssetGraph
from dagster._core.definitions.data_version import (
    CachingStaleStatusResolver,
    StaleCauseCategory,
    StaleStatus,
)

from assets.cli import main
from assets.midtraining import checkpoint_prefix
from assets.pretraining import TOKENIZER_PREFIX
from assets.tracked import read_lineage
from infra.committed import POINTER, Producer, commit, read_committed
from infra.lineage_report import EXIT_BROKEN, EXIT_STALE
from infra.settings import REPO_ROOT, load_profile
from infra.store import LocalStore
from infra.tracking import UPSTREAM_RUNS_TAG, Tracker
from training.checkpoint import export_hf
from training.model import build_model
from training.tokenizer import TokenizerConfig, train_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CORPUS = [
    "What is 3 + 4? Answer: 7. Use the calculator to compute 12 * 34. def f(x): return x + 1",
    "Which term is defined as: a computer program? Answer: software",
] * 40
TOK_FILES = ("tokenizer.json", "tokenizer_config.json")
TASKS = "post_training/task_suites"


def _store() -> LocalStore:
    profile = load_profile()
    return LocalStore(profile.state_path / profile.store.url)


def _stage(tracker, store, asset, partition="", reads=(), outputs=None, group="training") -> str:
    """One stand-in stage run: its reads and commits recorded on the store handle, its lineage tags written
    by the asset layer's own `read_lineage`."""
    name = f"{asset}[{partition}]" if partition else asset
    tags = {
        "dagster.asset_key": asset,
        "dagster.partition_key": partition,
        "crucible.code_version": "stand-in",
    }
    with tracker.stage_run(group, name, tags) as run:
        store.begin_stage(Producer(asset=asset, partition=partition, mlflow_run_id=run.run_id))
        for prefix in reads:
            read_committed(store, prefix)
        version = ""
        for prefix, files in (outputs or {}).items():
            version = commit(store, prefix, files).version
        run.set_tags({**read_lineage(store.reads, []), "crucible.data_version": version})
    return run.run_id


def _text(tmp: Path, name: str, text: str) -> dict[str, Path]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / name).write_text(text)
    return {name: tmp / name}


def _upstream_chain(tmp: Path, tag: str = "1") -> None:
    """Crawl and code snapshots -> tokenizer, token shards -> midtrain_stage3 (registered), as MLflow runs."""
    tracker, store = Tracker.from_profile(load_profile()), _store()
    warc, code = "web/warc/local-docs-0001", "code/raw/code-0001"
    _stage(tracker, store, "web_warc", "local-docs-0001", outputs={warc: _text(tmp / "w", "a.warc", tag)})
    _stage(tracker, store, "code_raw_files", "code-0001", outputs={code: _text(tmp / "c", "a.py", "x = 1")})
    tok_dir = train_tokenizer(CORPUS, TokenizerConfig(vocab_size=512), tmp / "tok")
    tok = {n: tok_dir / n for n in TOK_FILES}
    _stage(tracker, store, "corpus_tokenizer", reads=[warc, code], outputs={TOKENIZER_PREFIX: tok})
    shards = {"training/token_shards": _text(tmp / "s", "shard-0.bin", tag)}
    _stage(tracker, store, "token_shards", reads=[warc, code, TOKENIZER_PREFIX], outputs=shards)
    from assets.post_training import _model_cfg

    cfg, _ = _model_cfg(tok_dir)
    hf = export_hf(build_model(cfg, seed=0), tmp / "hf", tok)
    reads = ["training/token_shards", TOKENIZER_PREFIX]
    run_id = _stage(
        tracker, store, "midtrain_stage3", reads=reads, outputs={checkpoint_prefix("midtrain_stage3"): hf}
    )
    tracker.register_model("crucible-midtrain_stage3", run_id, "checkpoint", {})


def _resources() -> dict:
    from assets.resources import resources_for

    # built for the current state dir (assets.definitions.defs keeps the one of the process's first import)
    return {**resources_for(load_profile()), "pipes": dg.PipesSubprocessClient()}


@pytest.fixture(scope="module")
def chain_state(tmp_path_factory) -> Path:
    """State dir (store, MLflow, DAGSTER_HOME) after the stand-in upstream and the real post-training chain."""
    root = tmp_path_factory.mktemp("lineage_chain")
    state = root / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CRUCIBLE_PROFILE", "micro")
        mp.setenv("CRUCIBLE_STATE_DIR", str(state))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        home = state / "dagster_home"
        home.mkdir(parents=True)
        shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
        mp.setenv("DAGSTER_HOME", str(home))
        _upstream_chain(root / "work")
        from assets.agentic import agentic_tasks
        from assets.post_training import post_training_assets

        with dg.DagsterInstance.get() as instance:
            assets = [agentic_tasks, *post_training_assets]  # sft_data_set reads the agentic tasks' SFT share
            result = dg.materialize(assets, instance=instance, resources=_resources())
        assert result.success
    return state


@pytest.fixture
def chain(chain_state, monkeypatch) -> Path:
    """This test's own copy of the chain's state, at the state dir the autouse fixture set."""
    state = Path(os.environ["CRUCIBLE_STATE_DIR"])
    shutil.copytree(chain_state, state)
    monkeypatch.setenv("DAGSTER_HOME", str(state / "dagster_home"))
    return state


def _lineage(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["lineage", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _tree(capsys, target: str) -> tuple[int, dict]:
    code, out, _ = _lineage(capsys, target, "--json")
    return code, json.loads(out)


def _nodes(node: dict) -> list[dict]:
    return [node] + [n for child in node["upstream"] for n in _nodes(child)]


def _path(tree: dict, assets: list[str]) -> bool:
    """A chain of upstream runs with these assets from the root, following "(see above)" references."""
    full = {n["run_id"]: n for n in _nodes(tree) if not n["seen"]}

    def walk(node: dict, rest: list[str]) -> bool:
        node = full.get(node["run_id"], node)
        if node["asset"] != rest[0]:
            return False
        return len(rest) == 1 or any(walk(child, rest[1:]) for child in node["upstream"])

    return walk(tree, assets)


def _rematerialize_task_suites(seed: int, assets=None) -> None:
    from assets.post_training import task_suites

    with dg.DagsterInstance.get() as instance:
        result = dg.materialize(
            assets or [task_suites],
            selection=[dg.AssetKey("task_suites")],
            instance=instance,
            resources=_resources(),
            run_config={"ops": {"task_suites": {"config": {"seed": seed}}}},
        )
    assert result.success


def test_rl_checkpoint_lineage_reaches_the_crawl_and_the_task_suite_version(chain, capsys, tmp_path):
    store = _store()
    code, tree = _tree(capsys, "crucible-reasoning_rl/1")
    nodes = _nodes(tree)
    assets = {(n["asset"], n["partition"]) for n in nodes}
    assert ("web_warc", "local-docs-0001") in assets and ("code_raw_files", "code-0001") in assets
    chain_to_crawl = [
        "reasoning_rl_checkpoint",
        "sft_checkpoint",
        "midtrain_stage3",
        "token_shards",
        "web_warc",
    ]
    assert _path(tree, chain_to_crawl)
    assert _path(tree, ["reasoning_rl_checkpoint", "sft_checkpoint", "sft_data_set", "task_suites"])
    # the suite version the RL run trained on: the task_suites node's data version and the version it read
    suites = read_committed(store, TASKS)
    (suites_node,) = [n for n in nodes if n["asset"] == "task_suites" and not n["seen"]]
    assert suites_node["data_version"] == suites.meta["suite_version"]
    rl_read = [r for r in tree["reads"] if r["prefix"] == TASKS]
    assert rl_read == [{"prefix": TASKS, "asset": "task_suites[]", "version": suites.version,
                        "current": suites.version, "status": "ok", "detail": ""}]  # fmt: skip
    assert tree["stale_links"] == [] and tree["broken_links"] == [] and code == 0
    # a leaf built from Debian archives names them (the profile's dictd packages, by version)
    assert suites_node["sources"] and all(
        x.startswith("dict-") and x.endswith(".deb") for x in suites_node["sources"]
    )

    code, out, err = _lineage(capsys, "crucible-sft/1")
    print(out)
    lines = out.splitlines()
    assert lines[0].startswith("sft_checkpoint  mlflow=")
    assert any(line.startswith("        web_warc[local-docs-0001]  mlflow=") for line in lines)
    assert (
        f"task_suites  mlflow={suites_node['run_id']}" in out and f"read {TASKS}@{suites.version[:12]}" in out
    )
    assert f"sources={','.join(suites_node['sources'])}" in out
    assert code == 0 and err.strip() == ""

    page = tmp_path / "lineage.html"
    assert _lineage(capsys, "crucible-reasoning_rl/1", "--html", str(page))[0] == 0
    html = page.read_text()
    assert "web_warc[local-docs-0001]" in html and suites.meta["suite_version"] in html
    assert "<script" not in html and "src=" not in html and "<link" not in html  # self-contained


def test_the_lineage_report_is_an_artifact_of_each_registered_checkpoint_run(chain):
    tracker = Tracker.from_profile(load_profile())
    for model, asset in (
        ("crucible-sft", "sft_checkpoint"),
        ("crucible-reasoning_rl", "reasoning_rl_checkpoint"),
    ):
        run_id = tracker.model_version_run_id(model, "1")
        (chain / model).mkdir()
        report = json.loads(
            Path(tracker.client.download_artifacts(run_id, "lineage.json", str(chain / model))).read_text()
        )
        assert report["run_id"] == run_id and report["asset"] == asset
        assert any(n["asset"] == "web_warc" for n in _nodes(report))
        assert report["broken_links"] == [] and report["stale_links"] == []
        assert tracker.get_run(run_id).data.tags["crucible.lineage_status"] == "ok"
        artifacts = {a.path for a in tracker.client.list_artifacts(run_id)}
        assert {"lineage.json", "lineage.html"} <= artifacts
    # only checkpoints (assets that register a model) carry one
    suites_run = tracker.find_runs("post_training", "tags.`dagster.asset_key` = 'task_suites'")[0]
    assert "lineage.json" not in {a.path for a in tracker.client.list_artifacts(suites_run.info.run_id)}


def test_a_corrupted_link_is_reported_broken(chain, capsys):
    tracker, store = Tracker.from_profile(load_profile()), _store()
    assert _tree(capsys, "crucible-reasoning_rl/1")[1]["broken_links"] == []
    sft_data = read_committed(store, "post_training/sft_data")
    store.delete(f"post_training/sft_data/{POINTER}")  # the SFT data's committed pointer is gone
    code, out, err = _lineage(capsys, "crucible-reasoning_rl/1")
    assert code == EXIT_BROKEN
    assert f"post_training/sft_data@{sft_data.version[:12]} (sft_data_set[]): " in out
    assert "_committed.json is gone (no committed version) (lineage broken)" in out
    assert f"incomplete, post_training/sft_data@{sft_data.version[:12]} read by sft_checkpoint[]" in err

    # the RL run's recorded upstream run rewritten to one MLflow does not know
    rl_run = tracker.model_version_run_id("crucible-reasoning_rl", "1")
    sft_run = tracker.model_version_run_id("crucible-sft", "1")
    upstream = tracker.get_run(rl_run).data.tags[UPSTREAM_RUNS_TAG]
    tracker.client.set_tag(rl_run, UPSTREAM_RUNS_TAG, upstream.replace(sft_run, "0" * 32))
    code, tree = _tree(capsys, "crucible-reasoning_rl/1")
    assert code == EXIT_BROKEN
    new = set(tree["broken_links"])
    sft_ckpt = read_committed(store, "checkpoints/sft_checkpoint").version
    assert new == {
        f"no MLflow run {'0' * 32} (deleted, or another server) (upstream of reasoning_rl_checkpoint[])",
        f"checkpoints/sft_checkpoint@{sft_ckpt[:12]} read by reasoning_rl_checkpoint[]: "
        "no MLflow run of its producer is recorded",
    }


def test_a_recommitted_task_suite_makes_its_readers_stale(chain, capsys):
    store = _store()
    old = read_committed(store, TASKS).version
    _rematerialize_task_suites(seed=7)
    new = read_committed(store, TASKS).version
    assert new != old
    code, out, err = _lineage(capsys, "crucible-reasoning_rl/1")
    # both runs that read the suite are stale; SFT, which read only the SFT data, is not
    edge = f"read {TASKS}@{old[:12]} stale (now @{new[:12]})"
    stale_lines = [line.strip() for line in out.splitlines() if "stale" in line]
    assert len(stale_lines) == 2 and all(line.startswith("task_suites  mlflow=") for line in stale_lines)
    assert all(line.endswith(edge) for line in stale_lines)
    stale = sorted(line for line in err.splitlines() if line.startswith("crucible lineage: stale, "))
    assert [line.split(" read by ")[1].split(":")[0] for line in stale] == [
        "reasoning_rl_checkpoint[]",
        "sft_data_set[]",
    ]
    assert all("re-committed since by task_suites[] run " in line for line in stale)
    assert code == EXIT_STALE


def test_a_recommitted_upstream_exits_with_the_stale_code(chain, capsys, tmp_path):
    tracker, store = Tracker.from_profile(load_profile()), _store()
    assert _lineage(capsys, "crucible-midtrain_stage3/1")[0] == 0
    # token shards re-materialized after the checkpoint was trained
    _stage(tracker, store, "token_shards", outputs={"training/token_shards": _text(tmp_path, "s.bin", "v2")})
    code, out, err = _lineage(capsys, "crucible-midtrain_stage3/1")
    assert code == EXIT_STALE
    (line,) = [line for line in out.splitlines() if "stale" in line]
    assert line.startswith("  token_shards  mlflow=")
    assert (
        err.startswith("crucible lineage: stale, training/token_shards@")
        and "read by midtrain_stage3[]" in err
    )


def _statuses(instance, assets) -> dict[str, tuple[StaleStatus, list]]:
    """What the Dagster UI shows (Unsynced = STALE) for each asset, with the causes' categories."""
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView
    from dagster._core.definitions.temporal_context import TemporalContext
    from dagster._time import get_current_datetime

    graph = AssetGraph.from_assets(assets)
    view = AssetGraphView(
        temporal_context=TemporalContext(effective_dt=get_current_datetime(), last_event_id=None),
        instance=instance,
        asset_graph=graph,
    )
    resolver = CachingStaleStatusResolver(instance=instance, asset_graph=graph, loading_context=view)
    return {
        key.to_user_string(): (resolver.get_status(key), [c.category for c in resolver.get_stale_causes(key)])
        for key in graph.materializable_asset_keys
    }


def test_a_new_code_version_marks_exactly_that_asset_then_its_readers_unsynced(chain):
    from assets.post_training import post_training_assets, task_suites
    from assets.tracked import code_version
    from training.tasks import suites as task_suites_module

    # each asset's code version is the hash of its stage's module: editing that module changes exactly it
    assert task_suites.code_versions_by_key[dg.AssetKey("task_suites")] == code_version(task_suites_module)
    versions = [v for a in post_training_assets for v in a.code_versions_by_key.values()]
    assert len(set(versions)) == 4 and all(len(v) == 12 for v in versions)
    names = ["task_suites", "sft_data_set", "sft_checkpoint", "reasoning_rl_checkpoint"]
    fresh = (StaleStatus.FRESH, [])
    # the same definitions with task_suites' code changed
    changed = dg.map_asset_specs(
        lambda spec: (
            spec.replace_attributes(code_version="changed") if spec.key.path == ["task_suites"] else spec
        ),
        post_training_assets,
    )
    with dg.DagsterInstance.get() as instance:
        assert _statuses(instance, post_training_assets) == dict.fromkeys(names, fresh)
        statuses = _statuses(instance, changed)
    assert statuses.pop("task_suites") == (StaleStatus.STALE, [StaleCauseCategory.CODE])
    assert statuses == dict.fromkeys(names[1:], fresh)  # its readers read the same data as before

    # rematerialized with the new code and the same seed: the same suite (the data version is its content
    # hash), so nothing downstream is unsynced
    _rematerialize_task_suites(seed=0, assets=changed)
    with dg.DagsterInstance.get() as instance:
        assert _statuses(instance, changed) == dict.fromkeys(names, fresh)

    # another seed: a new suite version, and exactly the two assets that read the suite are unsynced
    _rematerialize_task_suites(seed=7, assets=changed)
    with dg.DagsterInstance.get() as instance:
        statuses = _statuses(instance, changed)
    assert {k for k, (status, _) in statuses.items() if status == StaleStatus.STALE} == {
        "sft_data_set",
        "reasoning_rl_checkpoint",
    }
    assert statuses["sft_data_set"][1] == statuses["reasoning_rl_checkpoint"][1] == [StaleCauseCategory.DATA]
