"""Two dedup runs of one kind at the same time: the index commit is a compare-and-swap
(`ObjectStore.put_bytes_if_absent`), so they never take the same sequence number and the later one is
deduplicated against the earlier one. Real moto S3 server and the local store, real threads."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest_dedup import snapshot_a, snapshot_b, write_shards  # tests/pipelines is on sys.path

from infra.committed import read_committed
from infra.settings import StoreSettings, load_profile, validate_stage
from infra.store import LocalStore, S3Store
from pipelines.dedup import DedupConfig, dedup_partition
from pipelines.dedup.index import IndexEntry, IndexMismatchError, commit_entry, list_entries

A, B = "2024-10", "2024-05"


def micro_config(**overrides) -> DedupConfig:
    return validate_stage(load_profile("micro"), "dedup_web", DedupConfig, overrides)


def _stores(kind: str, tmp_path, request):
    if kind == "local":
        return LocalStore(tmp_path / "store")
    endpoint, bucket = request.getfixturevalue("s3_bucket")
    url = f"s3://{bucket}/crucible"
    return S3Store(url, StoreSettings(url=url, endpoint_url=endpoint))


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_put_bytes_if_absent_lets_exactly_one_of_many_writers_create_a_key(kind, tmp_path, request):
    store = _stores(kind, tmp_path, request)
    assert store.put_bytes_if_absent("log/0000.json", b"first") is True
    assert store.put_bytes_if_absent("log/0000.json", b"second") is False
    assert store.get_bytes("log/0000.json") == b"first"

    # 8 threads race for one fresh key: one wins, the object holds the winner's bytes whole
    results: dict[int, bool] = {}
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        writer = _stores(kind, tmp_path, request) if kind == "s3" else store  # one boto3 client per thread
        barrier.wait()
        results[i] = writer.put_bytes_if_absent("log/0001.json", f"writer-{i}".encode() * 1000)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, ok in results.items() if ok]
    assert len(results) == 8 and len(winners) == 1
    assert store.get_bytes("log/0001.json") == f"writer-{winners[0]}".encode() * 1000
    assert store.list("log/") == ["log/0000.json", "log/0001.json"]  # no temp files left behind


def _upload(store, snapshot: str, docs: list[dict], shards: int, staging) -> None:
    for key in write_shards(staging, f"web/filtered/{snapshot}/kept", docs, shards=shards):
        store.put_file(key, staging / key)


def _kept_ids(store, snapshot: str) -> list[str]:
    out = read_committed(store, f"dedup/web/{snapshot}")
    return sorted(
        json.loads(line)["id"]
        for key in out.keys(".jsonl.gz", under="kept")
        for line in gzip.decompress(store.get_bytes(key)).splitlines()
    )


# One dedup run in its own process: imports first, then it waits for the go file so both runs start together.
_RUN = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from infra.settings import StoreSettings, load_profile, validate_stage
    from infra.store import LocalStore, S3Store
    from pipelines.dedup import DedupConfig, dedup_partition

    root, endpoint, snapshot, scratch, go = sys.argv[1:6]
    if root.startswith("s3://"):
        store = S3Store(root, StoreSettings(url=root, endpoint_url=endpoint))
    else:
        store = LocalStore(root)
    cfg = validate_stage(load_profile("micro"), "dedup_web", DedupConfig)
    while not Path(go).exists():
        time.sleep(0.01)
    result = dedup_partition(cfg, store, snapshot, scratch=Path(scratch))
    print(json.dumps({"seq": result.extra["seq"], "metrics": result.metrics}))
    """
)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_two_concurrent_dedup_runs_take_distinct_seqs_and_the_later_sees_the_earlier(kind, tmp_path, request):
    """Two new snapshots of one kind deduplicated at the same time in two processes (as two `crucible run`s or
    an in-process run beside a Dagster one, where no pool serialises them): on 98a639e both took seq 0 and
    neither saw the other's documents."""
    store = _stores(kind, tmp_path, request)
    a_docs = snapshot_a()
    docs = {A: a_docs, B: snapshot_b(a_docs)}
    for snap, d in docs.items():
        _upload(store, snap, d, 2, tmp_path / "staging")
    root = str(store.root) if kind == "local" else store.uri().rstrip("/")
    endpoint = "" if kind == "local" else request.getfixturevalue("s3_bucket")[0]
    script, go = tmp_path / "run.py", tmp_path / "go"
    script.write_text(_RUN)
    procs = {}
    for snap in docs:
        (tmp_path / snap).mkdir()
        procs[snap] = subprocess.Popen(
            [sys.executable, str(script), root, endpoint, snap, str(tmp_path / snap), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    time.sleep(4)  # both have imported and wait (a slow import only shortens the overlap, never removes it)
    go.touch()
    results = {}
    for snap, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results[snap] = json.loads(out.strip().splitlines()[-1])
    seqs = {snap: r["seq"] for snap, r in results.items()}
    assert sorted(seqs.values()) == [0, 1], f"both runs took the same sequence number: {seqs}"
    first, second = sorted(seqs, key=seqs.get)
    assert results[first]["metrics"]["indexed_docs"] == 0
    # the race happened: the later one lost the compare-and-swap and recomputed against the winner
    assert (results[first]["metrics"]["attempts"], results[second]["metrics"]["attempts"]) == (1, 2)
    assert results[second]["metrics"]["indexed_docs"] == len(docs[first])  # it saw every earlier document
    entries = list_entries(store, "dedup/web/index")
    assert [(e.snapshot, e.seq) for e in entries] == [(first, 0), (second, 1)]
    assert entries[1].deduped_against == [entries[0].ref]

    # the same documents survive as when the two runs are done one after the other in that order
    serial = LocalStore(tmp_path / "serial")
    for snap in (first, second):
        _upload(serial, snap, docs[snap], 2, tmp_path / "staging")
        dedup_partition(micro_config(), serial, snap, scratch=tmp_path)
    for snap in (first, second):
        assert _kept_ids(store, snap) == _kept_ids(serial, snap)
    assert results[second]["metrics"]["cross_partition_dups"] == (12 if first == A else 14)


def test_commit_entry_appends_only_onto_the_index_it_was_computed_from(tmp_path):
    """The protocol under the concurrency test, step by step on the local store."""
    store = LocalStore(tmp_path / "store")
    for snap, d in {A: snapshot_a(), B: snapshot_b(snapshot_a())}.items():
        write_shards(store.root, f"web/filtered/{snap}/kept", d, shards=2)
    cfg = micro_config()
    dedup_partition(cfg, store, A, scratch=tmp_path)
    (a,) = list_entries(store, "dedup/web/index")
    # an entry computed before A committed (seq 0, nothing earlier) must not land on top of A
    stale = IndexEntry(snapshot=B, seq=0, version="0" * 16, config=a.config)
    assert commit_entry(store, "dedup/web/index", stale) == (False, None)
    # nor one that claims A at another version
    moved = IndexEntry(B, 1, "1" * 16, a.config, deduped_against=[{**a.ref, "version": "f" * 16}])
    assert commit_entry(store, "dedup/web/index", moved) == (False, None)
    # an identical rerun appends nothing; the log still has A's one record
    assert commit_entry(store, "dedup/web/index", a) == (True, a)
    assert store.list("dedup/web/index/_log/") == ["dedup/web/index/_log/0000000000.json"]
    b = dedup_partition(cfg, store, B, scratch=tmp_path)
    assert b.extra["seq"] == 1 and b.metrics["attempts"] == 1
    assert [e.snapshot for e in list_entries(store, "dedup/web/index")] == [A, B]

    # an index of the old layout (manifest.json per snapshot) is refused, not silently ignored
    legacy = LocalStore(tmp_path / "legacy")
    legacy.put_json(f"dedup/web/index/{A}/manifest.json", {"snapshot": A, "seq": 0})
    write_shards(legacy.root, f"web/filtered/{B}/kept", snapshot_a(), shards=1)
    with pytest.raises(IndexMismatchError, match="old layout"):
        dedup_partition(cfg, legacy, B, scratch=tmp_path)
