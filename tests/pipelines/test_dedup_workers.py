"""The datatrove dedup engine with several tasks: in worker processes (the bounded executor) or one after the
other in this process, it writes byte for byte what one task writes; a step over its deadline fails the
stage naming it and leaves no process behind."""

from __future__ import annotations

import time

import multiprocess
import pytest
from conftest_dedup import snapshot_a, tree_bytes, write_shards  # tests/pipelines is on sys.path

from infra.committed import is_committed
from infra.settings import load_profile, validate_stage
from infra.store import LocalStore
from pipelines.bounded_executor import TaskDeadlineExceeded
from pipelines.dedup import DedupConfig, dedup_partition
from pipelines.dedup.index import list_entries

A = "2024-10"


def micro_config(**overrides) -> DedupConfig:
    return validate_stage(load_profile("micro"), "dedup_web", DedupConfig, overrides)


def _store(root) -> LocalStore:
    store = LocalStore(root)
    write_shards(store.root, f"web/filtered/{A}/kept", snapshot_a(), shards=4)
    return store


def test_several_tasks_write_what_one_task_writes(tmp_path):
    runs = {
        "one task": micro_config(),
        "worker processes": micro_config(tasks=3, workers=2),  # 4 shards over 3 tasks: uneven shares
        "tasks in this process": micro_config(tasks=2, workers=1),
    }
    trees, versions = {}, {}
    for name, cfg in runs.items():
        store = _store(tmp_path / name)
        versions[name] = dedup_partition(cfg, store, A, scratch=tmp_path).data_version
        trees[name] = tree_bytes(store.root, "dedup")  # kept shards, clusters, index part and log
    assert multiprocess.active_children() == []
    assert len(trees["one task"]) > 10
    assert trees["worker processes"] == trees["one task"] == trees["tasks in this process"]
    assert versions["worker processes"] == versions["one task"] == versions["tasks in this process"]


def test_a_dedup_step_over_its_deadline_fails_naming_it(tmp_path):
    store = _store(tmp_path / "store")
    config = micro_config(tasks=2, workers=2, task_deadline_s=0.2)  # less than starting a worker takes
    start = time.monotonic()
    with pytest.raises(TaskDeadlineExceeded, match=r"dedup fingerprints: .*deadline of 0.2 s"):
        dedup_partition(config, store, A, scratch=tmp_path)
    assert time.monotonic() - start < 30  # the deadline plus killing and reaping, not the whole run
    assert multiprocess.active_children() == []
    assert not is_committed(store, f"dedup/web/{A}")  # nothing published
    assert list_entries(store, "dedup/web/index") == []
