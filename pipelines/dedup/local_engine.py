"""The single-machine engine: datatrove's LocalPipelineExecutor runs our steps over the shards in parallel
(fingerprints, then the kept/index/cluster writes; one task runs in this process); clustering in between is
numpy (`clusters.py`)."""

from __future__ import annotations

import copy
import json
import logging
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from infra.store import ObjectStore
from pipelines.dedup.clusters import assign_nodes, cluster_size_histogram, resolve_clusters
from pipelines.dedup.config import DedupConfig
from pipelines.dedup.fingerprints import MinHasher
from pipelines.dedup.index import NODE_SHIFT, load_index, partition_version, table_arrays
from pipelines.dedup.job import EngineResult, PartitionJob
from pipelines.dedup.shards import (
    FINGERPRINT_SCHEMA,
    PLAN_SCHEMA,
    PartitionLayout,
    apply_shard,
    fingerprint_row,
    iter_shard_documents,
    shard_stem,
)

log = logging.getLogger(__name__)

_SHARD, _DIGEST, _LINE = "dedup_shard", "dedup_shard_digest", "dedup_line"
_BATCH_ROWS = 4096


class _StoreStep(PipelineStep):
    """A step holding an object store. The executor deep-copies steps per task; the store is shared instead
    (an S3 client cannot be copied). Worker processes (workers > 1) need a picklable store."""

    def __deepcopy__(self, memo: dict) -> _StoreStep:
        clone = copy.copy(self)
        clone.stats = copy.deepcopy(self.stats, memo)
        return clone


class StoreShardReader(_StoreStep):
    """Reads this task's share of JSONL.gz shards from the object store as Documents (position in metadata)."""

    type = "📖 - READER"
    name = "🗄️ store shards"

    def __init__(self, store: ObjectStore, shard_keys: list[str]):
        super().__init__()
        self.store = store
        self.shard_keys = shard_keys

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for key in self.shard_keys[rank::world_size]:
            self.stat_update("shards")
            for line, doc, digest in iter_shard_documents(self.store, key):
                self.stat_update("documents")
                meta = dict(doc.get("metadata") or {})
                meta.update({_SHARD: key, _DIGEST: digest, _LINE: line})
                yield Document(text=doc.get("text") or "", id=doc.get("id"), metadata=meta)


class MinhashFingerprinter(PipelineStep):
    """Fingerprints every document (tokens, exact keys, MinHash bands, signature) into `<out_dir>/<rank>.parquet`."""

    type = "🫂 - DEDUP"
    name = "🔏 fingerprints"

    def __init__(self, config: DedupConfig, snapshot: str, out_dir: str):
        super().__init__()
        self.config = config
        self.snapshot = snapshot
        self.out_dir = out_dir

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        hasher = MinHasher(self.config)
        rows: list[dict] = []
        with pq.ParquetWriter(f"{self.out_dir}/{rank:05d}.parquet", FINGERPRINT_SCHEMA) as writer:
            for doc in data:
                meta = doc.metadata
                with self.track_time():
                    row = fingerprint_row(
                        hasher,
                        doc.text,
                        doc.id,
                        meta,
                        meta[_SHARD],
                        meta[_DIGEST],
                        meta[_LINE],
                        self.snapshot,
                    )
                rows.append(row)
                self.stat_update("fingerprinted")
                self.stat_update("tokens", value=row["tokens"])
                if len(rows) == _BATCH_ROWS:  # bounded memory per task, whatever the shard sizes
                    writer.write_table(pa.Table.from_pylist(rows, schema=FINGERPRINT_SCHEMA))
                    rows = []
            writer.write_table(pa.Table.from_pylist(rows, schema=FINGERPRINT_SCHEMA))
        yield from ()


class DedupShardWriter(_StoreStep):
    """Applies each shard's plan: kept documents, index part and cluster rows to the store; counts to disk."""

    type = "🫂 - DEDUP"
    name = "💾 apply dedup plan"

    def __init__(
        self,
        store: ObjectStore,
        layout: PartitionLayout,
        shard_keys: list[str],
        work_dir: str,
        gzip_level: int,
    ):
        super().__init__()
        self.store = store
        self.layout = layout
        self.shard_keys = shard_keys
        self.work_dir = work_dir
        self.gzip_level = gzip_level

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for key in self.shard_keys[rank::world_size]:
            plan = pq.read_table(f"{self.work_dir}/plans/{shard_stem(key)}.parquet")
            with self.track_time():
                stats = apply_shard(self.store, self.layout, key, plan, self.gzip_level)
            self.stat_update("documents", value=stats["docs_in"])
            self.stat_update("dropped", value=stats["docs_in"] - stats["docs_out"])
            Path(f"{self.work_dir}/stats/{shard_stem(key)}.json").write_text(json.dumps(stats))
        yield from ()


def _execute(pipeline: list[PipelineStep], config: DedupConfig, n_shards: int, logs: Path) -> None:
    tasks = max(1, min(config.tasks, n_shards))
    if tasks == 1:
        # One task: pipe the steps here, as the executor's _run_for_rank would in this same process, without
        # importing the executor (~0.5 s: it pulls in huggingface_hub) or writing its logs to the temp dir.
        data = None
        for step in pipeline:
            data = step(data, 0, 1)
        deque(data or (), maxlen=0)
        return
    from datatrove.executor import LocalPipelineExecutor

    LocalPipelineExecutor(
        pipeline=pipeline,
        tasks=tasks,
        workers=min(config.workers, tasks),
        logging_dir=str(logs),
        skip_completed=False,
    ).run()


def _plan_tables(table: pa.Table, decisions, job: PartitionJob, index) -> Iterator[tuple[str, pa.Table]]:
    """(shard, PLAN_SCHEMA table sorted by line) for each shard of the partition, one at a time: the
    partition-wide columns are Arrow arrays over the fingerprint table's buffers (no per-row Python objects),
    and only one shard's rows are copied out at once."""
    base = np.int64(job.seq) << np.int64(NODE_SHIFT)
    root = decisions.root
    own = root >= base
    # root_doc_id: this partition's doc_id column, then the index documents that are roots, taken by position
    index_pos = np.searchsorted(index.node, root[~own])
    index_roots, where = np.unique(index_pos, return_inverse=True)
    doc_ids = pa.concat_arrays(
        [
            table.column("doc_id").combine_chunks(),
            pa.array(index.doc_id[index_roots].tolist(), pa.string()),
        ]
    )
    pick = np.empty(len(root), dtype=np.int64)
    pick[own] = root[own] - base
    pick[~own] = table.num_rows + where
    seqs, seq_idx = np.unique(root >> np.int64(NODE_SHIFT), return_inverse=True)
    by_seq = job.snapshot_by_seq
    snapshots = pa.array([by_seq[int(q)] for q in seqs], pa.string())
    reasons, reason_idx = np.unique(decisions.reason.astype(str), return_inverse=True)
    plan = pa.table(
        {
            "line": table.column("line"),
            "node": table.column("node"),
            "doc_id": table.column("doc_id"),
            "tokens": table.column("tokens"),
            "content_hash": table.column("content_hash"),
            "url_hash": table.column("url_hash"),
            "bands": table.column("bands"),
            "sig": table.column("sig"),
            "kept": pa.array(decisions.kept, pa.bool_()),
            "reason": pa.array(reason_idx.astype(np.int32)),
            "root": pa.array(root, pa.int64()),
            "root_doc_id": pa.array(pick),
            "root_snapshot": pa.array(seq_idx.astype(np.int32)),
            "cluster_size": pa.array(decisions.cluster_size, pa.int64()),
        }
    )
    order = pc.sort_indices(
        pa.table({"shard": table.column("shard"), "line": table.column("line")}),
        sort_keys=[("shard", "ascending"), ("line", "ascending")],
    )
    shards = table.column("shard").take(order).to_numpy(zero_copy_only=False)
    reasons = pa.array(reasons.tolist(), pa.string())
    for key in job.shard_keys:
        lo, hi = np.searchsorted(shards, key, "left"), np.searchsorted(shards, key, "right")
        part = plan.take(order[lo:hi])
        columns = dict(zip(part.column_names, part.columns, strict=True))
        columns["reason"] = reasons.take(columns["reason"])
        columns["root_doc_id"] = doc_ids.take(columns["root_doc_id"])
        columns["root_snapshot"] = snapshots.take(columns["root_snapshot"])
        yield key, pa.table(columns).cast(PLAN_SCHEMA)


def run_local(store: ObjectStore, job: PartitionJob, scratch: Path | None = None) -> EngineResult:
    """Fingerprint (datatrove tasks) -> cluster (numpy, this process) -> apply (datatrove tasks)."""
    cfg = job.config
    with tempfile.TemporaryDirectory(prefix="dedup-", dir=scratch) as tmp:
        work = Path(tmp)
        for sub in ("fingerprints", "plans", "stats"):
            (work / sub).mkdir()
        _execute(
            [
                StoreShardReader(store, job.shard_keys),
                MinhashFingerprinter(cfg, job.layout.snapshot, str(work / "fingerprints")),
            ],
            cfg,
            len(job.shard_keys),
            work / "logs-fingerprint",
        )
        parts = [pq.read_table(p) for p in sorted((work / "fingerprints").glob("*.parquet"))]
        fingerprints = pa.concat_tables(parts) if parts else FINGERPRINT_SCHEMA.empty_table()
        digests = fingerprints.group_by("shard").aggregate([("shard_digest", "min")])
        digest_map = dict(
            zip(
                digests.column("shard").to_pylist(),
                digests.column("shard_digest_min").to_pylist(),
                strict=True,
            )
        )
        version = partition_version(cfg.fingerprint(), job.shard_keys, digest_map, job.earlier)
        job = replace(job, layout=replace(job.layout, version=version))

        table = assign_nodes(fingerprints, job.seq)
        del parts, fingerprints  # the sorted copy is all that is needed from here
        arrays = table_arrays(table, cfg.num_bands, cfg.num_perm)
        arrays["node"] = table.column("node").to_numpy()
        index = load_index(store, job.earlier, cfg.num_bands, cfg.num_perm)
        log.info(
            "dedup %s: %d documents against %d indexed", job.layout.snapshot, table.num_rows, len(index.node)
        )
        decisions = resolve_clusters(arrays, index, job.seq, cfg.verify_threshold, cfg.url_dedup)
        del arrays

        for key, plan in _plan_tables(table, decisions, job, index):
            pq.write_table(plan, work / "plans" / f"{shard_stem(key)}.parquet")
        del table, index
        _execute(
            [DedupShardWriter(store, job.layout, job.shard_keys, str(work), cfg.gzip_level)],
            cfg,
            len(job.shard_keys),
            work / "logs-apply",
        )
        stats = [json.loads((work / "stats" / f"{shard_stem(k)}.json").read_text()) for k in job.shard_keys]
    return EngineResult(
        version=version,
        shard_stats=stats,
        histogram=cluster_size_histogram(decisions.root, decisions.cluster_size),
        counts=decisions.counts,
    )
