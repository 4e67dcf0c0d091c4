"""The single-machine engine: datatrove's LocalPipelineExecutor runs our steps over the shards in parallel
(fingerprints, then the kept/index/cluster writes; one task runs in this process, several run in worker
processes with a deadline, `pipelines.bounded_executor`); clustering in between is numpy (`clusters.py`).
In between, memory holds the band keys and signatures once, in node order, plus the small per-document
columns: about what the partition adds to the index."""

from __future__ import annotations

import copy
import json
import logging
import tempfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from infra.store import ObjectStore
from pipelines.dedup.clusters import cluster_size_histogram, keep_ranks, resolve_clusters
from pipelines.dedup.config import DedupConfig
from pipelines.dedup.fingerprints import MinHasher
from pipelines.dedup.index import (
    NODE_SHIFT,
    band_column,
    band_rows,
    load_index,
    partition_version,
    sig_column,
    sig_rows,
)
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


def _execute(
    pipeline: list[PipelineStep], config: DedupConfig, n_shards: int, logs: Path, stage: str
) -> None:
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

    from pipelines.bounded_executor import run_tasks_bounded

    workers = min(config.workers, tasks)
    executor = LocalPipelineExecutor(
        pipeline=pipeline, tasks=tasks, workers=workers, logging_dir=str(logs), skip_completed=False
    )
    if workers > 1:
        # our own spawned processes with a deadline (datatrove's pool can hang in teardown); they re-run a
        # calling *script* unless it has a __main__ guard (`python -m dagster`, console scripts are fine)
        run_tasks_bounded(executor, workers, config.task_deadline_s, stage=stage)
    else:
        executor.run()  # the tasks one after the other in this process: no pool to hang


@dataclass
class _Partition:
    """A partition's fingerprints as clustering needs them: the small columns as a table in file order, the
    band keys and signatures as matrices in node order (one copy each, nothing else holds them)."""

    meta: pa.Table  # FINGERPRINT_SCHEMA without bands / sig, file order
    order: np.ndarray  # order[rank] = row of meta
    rank: np.ndarray  # rank[row]; node = seq << NODE_SHIFT | rank
    bands: np.ndarray  # (n, num_bands) int64, node order
    sig: np.ndarray  # (n, num_perm) uint32, node order

    def cluster_arrays(self, seq: int) -> dict[str, np.ndarray]:
        url = self.meta.column("url_hash")
        return {
            "node": (np.int64(seq) << np.int64(NODE_SHIFT)) + np.arange(len(self.order), dtype=np.int64),
            "content_hash": self.meta.column("content_hash").to_numpy()[self.order],
            "url_hash": url.fill_null(0).to_numpy()[self.order],
            "has_url": url.is_valid().to_numpy()[self.order],
            "bands": self.bands,
            "sig": self.sig,
        }


_MATRIX_COLUMNS = ["bands", "sig"]
_META_SCHEMA = pa.schema([f for f in FINGERPRINT_SCHEMA if f.name not in _MATRIX_COLUMNS])


def _load_partition(files: list[Path], num_bands: int, num_perm: int) -> _Partition:
    """Two passes over the fingerprint files: the small columns first (to rank rows by the keep rule), then
    bands and signatures batch by batch straight into their node-order rows, so the full fingerprint table
    is never in memory twice (peak ~ the two matrices + one batch)."""
    parts = [pq.read_table(f, columns=_META_SCHEMA.names) for f in files]
    meta = pa.concat_tables(parts) if parts else _META_SCHEMA.empty_table()
    order, rank = keep_ranks(meta)
    n = meta.num_rows
    bands = np.empty((n, num_bands), np.int64)
    sig = np.empty((n, num_perm), np.uint32)
    row, pool = 0, pa.default_memory_pool()
    for f in files:
        # pre_buffer off: with it the reader held every column chunk it had read (+~1 KB per document)
        reader = pq.ParquetFile(f, pre_buffer=False)
        for batch in reader.iter_batches(batch_size=_BATCH_ROWS, columns=_MATRIX_COLUMNS):
            dest = rank[row : row + batch.num_rows]
            bands[dest] = band_rows(batch.column("bands"), num_bands)
            sig[dest] = sig_rows(batch.column("sig"), num_perm)
            row += batch.num_rows
            pool.release_unused()  # else the allocator keeps each batch's decode buffers (~1/3 of the peak)
    if row != n:
        raise RuntimeError(f"fingerprint files changed while read: {row} signature rows for {n} documents")
    return _Partition(meta=meta, order=order, rank=rank, bands=bands, sig=sig)


def _plan_tables(part: _Partition, decisions, job: PartitionJob, index) -> Iterator[tuple[str, pa.Table]]:
    """(shard, PLAN_SCHEMA table sorted by line) for each shard of the partition, one at a time: strings are
    Arrow arrays taken by position (no per-row Python objects), and only one shard's rows are copied out."""
    meta = part.meta
    base = np.int64(job.seq) << np.int64(NODE_SHIFT)
    root = decisions.root
    own = root >= base
    # root_doc_id: this partition's doc_id column, then the index documents that are roots, taken by position
    index_pos = np.searchsorted(index.node, root[~own])
    index_roots, where = np.unique(index_pos, return_inverse=True)
    doc_ids = pa.concat_arrays(
        [meta.column("doc_id").combine_chunks(), pa.array(index.doc_id[index_roots].tolist(), pa.string())]
    )
    pick = np.empty(len(root), dtype=np.int64)
    pick[own] = part.order[root[own] - base]
    pick[~own] = meta.num_rows + where
    seqs, seq_idx = np.unique(root >> np.int64(NODE_SHIFT), return_inverse=True)
    by_seq = job.snapshot_by_seq
    snapshots = pa.array([by_seq[int(q)] for q in seqs], pa.string())
    reason_names, reason_idx = np.unique(decisions.reason.astype(str), return_inverse=True)
    reasons = pa.array(reason_names.tolist(), pa.string())
    carried = meta.select(["line", "doc_id", "tokens", "content_hash", "url_hash"])
    rows_by_line = pc.sort_indices(
        meta.select(["shard", "line"]), sort_keys=[("shard", "ascending"), ("line", "ascending")]
    ).to_numpy()
    shards = meta.column("shard").take(rows_by_line).to_numpy(zero_copy_only=False)
    for key in job.shard_keys:
        lo, hi = np.searchsorted(shards, key, "left"), np.searchsorted(shards, key, "right")
        rows = rows_by_line[lo:hi]
        ranks = part.rank[rows]
        columns = dict(zip(carried.column_names, carried.take(rows).columns, strict=True))
        columns.update(
            node=pa.array(base + ranks),
            bands=band_column(part.bands[ranks]),
            sig=sig_column(part.sig[ranks]),
            kept=pa.array(decisions.kept[ranks]),
            reason=reasons.take(reason_idx[ranks]),
            root=pa.array(root[ranks]),
            root_doc_id=doc_ids.take(pick[ranks]),
            root_snapshot=snapshots.take(seq_idx[ranks]),
            cluster_size=pa.array(decisions.cluster_size[ranks]),
        )
        yield key, pa.table({name: columns[name] for name in PLAN_SCHEMA.names}).cast(PLAN_SCHEMA)


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
            "dedup fingerprints",
        )
        part = _load_partition(sorted((work / "fingerprints").glob("*.parquet")), cfg.num_bands, cfg.num_perm)
        digests = part.meta.group_by("shard").aggregate([("shard_digest", "min")])
        digest_map = dict(
            zip(
                digests.column("shard").to_pylist(),
                digests.column("shard_digest_min").to_pylist(),
                strict=True,
            )
        )
        version = partition_version(cfg.fingerprint(), job.shard_keys, digest_map, job.earlier)
        job = replace(job, layout=replace(job.layout, version=version))

        index = load_index(store, job.earlier, cfg.num_bands, cfg.num_perm)
        log.info(
            "dedup %s: %d documents against %d indexed",
            job.layout.snapshot,
            part.meta.num_rows,
            len(index.node),
        )
        decisions = resolve_clusters(
            part.cluster_arrays(job.seq), index, job.seq, cfg.verify_threshold, cfg.url_dedup
        )
        for key, plan in _plan_tables(part, decisions, job, index):
            pq.write_table(plan, work / "plans" / f"{shard_stem(key)}.parquet")
        del part, index
        _execute(
            [DedupShardWriter(store, job.layout, job.shard_keys, str(work), cfg.gzip_level)],
            cfg,
            len(job.shard_keys),
            work / "logs-apply",
            "dedup apply",
        )
        stats = [json.loads((work / "stats" / f"{shard_stem(k)}.json").read_text()) for k in job.shard_keys]
    return EngineResult(
        version=version,
        shard_stats=stats,
        histogram=cluster_size_histogram(decisions.root, decisions.cluster_size),
        counts=decisions.counts,
    )
