"""dedup_partition on the datatrove engine: planted duplicates, keep rule, cross-snapshot backfill,
idempotent reruns, stale flags, and a run killed with SIGKILL then rerun."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest_dedup import (  # tests/pipelines is on sys.path (prepend import mode)
    A_DROPPED,
    B_DROPPED,
    cluster_rows,
    read_kept_ids,
    snapshot_a,
    snapshot_b,
    tree_bytes,
    write_shards,
)
from png_check import assert_drawn_png

from infra.committed import is_committed, read_committed
from infra.settings import StoreSettings, load_profile, validate_stage
from infra.store import LocalStore, S3Store
from pipelines.dedup import DedupConfig, dedup_partition
from pipelines.dedup.index import IndexMismatchError, list_entries

A, B = "2024-10", "2024-05"


def micro_config(**overrides) -> DedupConfig:
    return validate_stage(load_profile("micro"), "dedup_web", DedupConfig, overrides)


@pytest.fixture
def corpus(tmp_path) -> tuple[LocalStore, list[dict], list[dict]]:
    store = LocalStore(tmp_path / "store")
    a_docs = snapshot_a()
    b_docs = snapshot_b(a_docs)
    write_shards(store.root, f"web/filtered/{A}/kept", a_docs, shards=4)
    write_shards(store.root, f"web/filtered/{B}/kept", b_docs, shards=2)
    return store, a_docs, b_docs


def test_planted_duplicates_are_removed_by_the_keep_rule(corpus, tmp_path):
    store, a_docs, _ = corpus
    result = dedup_partition(micro_config(), store, A, scratch=tmp_path)
    m = result.metrics
    assert (m["docs_in"], m["docs_out"]) == (166, 132)
    assert (m["exact_dups"], m["url_dups"], m["near_dups"], m["cross_partition_dups"]) == (10, 6, 18, 0)
    kept = read_kept_ids(store.root, f"dedup/web/{A}/kept")
    assert set(kept) == {d["id"] for d in a_docs} - A_DROPPED and len(kept) == 132
    assert {f"best-{i:02d}" for i in range(4)} <= set(kept)  # higher quality beats the older id
    assert {f"far-{i:02d}" for i in range(8)} <= set(kept)  # Jaccard ~0.2 is not a duplicate
    # clusters: 34 pairs plus the base-060 / chain-0 / chain-1 triple
    assert result.extra["histogram"] == {2: 32, 3: 1} and m["clusters"] == 33 and m["largest_cluster"] == 3
    assert m["tokens_in"] == 166 * 200  # punctuation is not a token
    assert m["unique_tokens"] == m["tokens_out"] == 132 * 200
    rows = cluster_rows(store.root, f"dedup/web/{A}/clusters")
    assert rows["chain-1"]["root_doc_id"] == "base-060" and rows["chain-1"]["cluster_size"] == 3
    assert rows["base-050"]["root_doc_id"] == "best-00" and rows["base-050"]["reason"] == "near"
    assert rows["url-03"]["reason"] == "url" and rows["exact-04"]["reason"] == "exact"
    assert {r for r, row in rows.items() if not row["kept"]} == A_DROPPED
    png = result.artifacts["dedup/cluster_sizes.png"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_drawn_png(png, min_bytes=5_000)
    assert_drawn_png(result.artifacts["plots/dedup_funnel.png"])
    funnel = result.extra["plots"]["dedup_funnel"]["panels"]
    assert funnel["documents left after each step"]["documents"] == [166, 156, 150, 132]
    assert funnel["documents dropped, by step and reason"]["dropped"] == [10, 6, 18]
    assert "| exact (normalised content) | 156 | 10 |" in result.report_md
    assert result.extra["check_passed"] and result.data_version
    out = read_committed(store, f"dedup/web/{A}")
    assert out.version == result.data_version and out.meta["seq"] == 0
    assert out.meta["metrics"]["docs_out"] == 132 and out.meta["histogram"] == {"2": 32, "3": 1}
    assert out.names() == [f"clusters/{i:05d}.parquet" for i in range(4)] + [
        f"kept/{i:05d}.jsonl.gz" for i in range(4)
    ]


def test_backfill_first_processed_wins_reruns_are_idempotent_and_changes_flag_stale(corpus, tmp_path):
    store, a_docs, b_docs = corpus
    cfg = micro_config()
    dedup_partition(cfg, store, A, scratch=tmp_path)
    a_first = tree_bytes(store.root, f"dedup/web/{A}")

    # backfill the OLDER snapshot: it loses its copies of what 2024-10 (processed first) kept or dropped
    b = dedup_partition(cfg, store, B, scratch=tmp_path)
    assert b.extra["seq"] == 1 and b.metrics["indexed_docs"] == 166
    assert (
        b.metrics["cross_partition_dups"] == 12 and b.metrics["near_dups"] == 9
    )  # 5 cross + 4 within 2024-05
    assert set(read_kept_ids(store.root, f"dedup/web/{B}/kept")) == {d["id"] for d in b_docs} - B_DROPPED
    rows = cluster_rows(store.root, f"dedup/web/{B}/clusters")
    assert rows["bexact-0"]["root_doc_id"] == "base-070" and rows["bexact-0"]["root_snapshot"] == A
    assert rows["bdropped-1"]["root_doc_id"] == "base-000"  # transitively: exact-00 was a copy of base-000
    assert (
        rows["bdropped-0"]["root_doc_id"] == "near-00"
    )  # a dropped 2024-10 document still blocks its copies
    assert tree_bytes(store.root, f"dedup/web/{A}") == a_first  # nothing retroactive

    # rerunning either partition keeps its seq and reproduces its bytes (2024-10 ignores the later 2024-05)
    index_before = tree_bytes(store.root, "dedup/web/index")
    b_first = tree_bytes(store.root, f"dedup/web/{B}")
    a_again = dedup_partition(cfg, store, A, scratch=tmp_path)
    assert (
        a_again.extra["seq"] == 0
        and a_again.metrics["indexed_docs"] == 0
        and not a_again.extra["stale_partitions"]
    )
    assert tree_bytes(store.root, f"dedup/web/{A}") == a_first
    dedup_partition(cfg, store, B, scratch=tmp_path)
    assert tree_bytes(store.root, f"dedup/web/{B}") == b_first
    assert tree_bytes(store.root, "dedup/web/index") == index_before

    # 2024-10 changes upstream (one shard loses a document): 2024-05 was deduped against the old version
    write_shards(store.root, f"web/filtered/{A}/kept", [d for d in a_docs if d["id"] != "solo-0"], shards=4)
    changed = dedup_partition(cfg, store, A, scratch=tmp_path)
    assert changed.extra["stale_partitions"] == [B] and changed.metrics["stale_partitions"] == 1
    assert changed.metrics["docs_out"] == 131 and "**stale**: 2024-05" in changed.report_md
    entry = {e.snapshot: e for e in list_entries(store, "dedup/web/index")}[A]
    assert entry.version == changed.data_version and entry.seq == 0
    assert read_committed(store, f"dedup/web/{A}").version == changed.data_version
    # the replaced version stays for readers mid-read (index parts and outputs alike), older ones are gone
    for prefix in (f"dedup/web/index/{A}", f"dedup/web/{A}"):
        assert set(store.list_prefixes(prefix)) == {f"v-{changed.data_version}", f"v-{a_again.data_version}"}

    # an index built with other shingles cannot be mixed in
    with pytest.raises(IndexMismatchError, match="2024-05"):
        dedup_partition(micro_config(ngram_size=4), store, "2025-01", input_prefix=f"web/filtered/{B}/kept")


def test_code_files_use_code_defaults(tmp_path):
    store = LocalStore(tmp_path / "store")
    body = "def area(radius):\n    return 3.14159 * radius * radius\n" * 8
    files = [
        {"text": body, "id": "a.py", "metadata": {"path": "a.py", "language": "python"}},
        {
            "text": body.replace("\n    ", "\n        "),
            "id": "b.py",
            "metadata": {"path": "b.py"},
        },  # re-indented
        {
            "text": body.replace("radius", "Radius"),
            "id": "c.py",
            "metadata": {"path": "c.py"},
        },  # case matters
        {"text": 'fn main() { println!("hi"); }\n', "id": "d.rs", "metadata": {"path": "d.rs"}},
    ]
    write_shards(store.root, "code/files/s1", files, shards=1)
    cfg = validate_stage(load_profile("micro"), "dedup_code", DedupConfig)
    result = dedup_partition(cfg, store, "s1", scratch=tmp_path)
    assert (result.metrics["exact_dups"], result.metrics["near_dups"]) == (1, 0)
    assert sorted(read_kept_ids(store.root, "dedup/code/s1/kept")) == ["a.py", "c.py", "d.rs"]


_KILLED_RUN = textwrap.dedent(
    """
    import sys, time
    from infra.store import LocalStore
    from pipelines.dedup import DedupConfig, dedup_partition

    class SlowStore(LocalStore):  # slow publishing, so the kill lands between two shard outputs
        def put_bytes(self, key, data):
            if "/kept/" in key and key.startswith("dedup/"):
                time.sleep(0.4)
            return super().put_bytes(key, data)

    dedup_partition(DedupConfig(tasks=1, workers=1), SlowStore(sys.argv[1]), "2024-10", scratch=sys.argv[2])
    """
)


def test_killed_run_then_rerun_equals_uninterrupted_run(tmp_path):
    a_docs = snapshot_a()
    killed, clean = LocalStore(tmp_path / "killed"), LocalStore(tmp_path / "clean")
    for store in (killed, clean):
        write_shards(store.root, f"web/filtered/{A}/kept", a_docs, shards=8)
    cfg = DedupConfig(tasks=1, workers=1)
    dedup_partition(cfg, clean, A, scratch=tmp_path)

    script = tmp_path / "killed_run.py"
    script.write_text(_KILLED_RUN)
    log = tmp_path / "killed_run.log"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(killed.root), str(tmp_path)],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    out_dir = killed.root / f"dedup/web/{A}"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(out_dir.glob("v-*/kept/*.jsonl.gz"))) < 3:
        assert proc.poll() is None, f"the run ended before it could be killed: {log.read_text()[-3000:]}"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list(out_dir.glob("v-*/kept/*.jsonl.gz")))
    assert 3 <= written < 8  # killed midway through publishing the shards
    assert not is_committed(killed, f"dedup/web/{A}")  # nothing readable
    assert list_entries(killed, "dedup/web/index") == []  # nothing committed to the index

    dedup_partition(cfg, killed, A, scratch=tmp_path)
    assert tree_bytes(killed.root, "dedup") == tree_bytes(clean.root, "dedup")
    assert read_committed(killed, f"dedup/web/{A}").files == read_committed(clean, f"dedup/web/{A}").files


def test_datatrove_engine_on_an_s3_store(s3_bucket, tmp_path):
    """Nothing assumes a local file system: shards, outputs and the index go through the store API."""
    endpoint, bucket = s3_bucket
    url = f"s3://{bucket}/crucible"
    store = S3Store(url, StoreSettings(url=url, endpoint_url=endpoint))
    local = tmp_path / "staging"
    for key in write_shards(local, f"web/filtered/{A}/kept", snapshot_a(), shards=2):
        store.put_file(key, local / key)
    result = dedup_partition(micro_config(), store, A, scratch=tmp_path)
    assert (result.metrics["docs_out"], result.metrics["near_dups"]) == (132, 18)
    assert [e.snapshot for e in list_entries(store, "dedup/web/index")] == [A]
    kept = []
    for key in read_committed(store, f"dedup/web/{A}").keys(".jsonl.gz", under="kept"):
        kept += [json.loads(line)["id"] for line in gzip.decompress(store.get_bytes(key)).splitlines()]
    assert set(kept) == {d["id"] for d in snapshot_a()} - A_DROPPED
