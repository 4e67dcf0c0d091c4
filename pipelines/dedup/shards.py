"""Per-shard work shared by both engines: fingerprint a JSONL.gz shard, and apply a shard's dedup plan
(write its kept documents, its index part and its cluster rows). Spark runs these inside tasks; the
datatrove engine inside PipelineSteps."""

from __future__ import annotations

import gzip
import hashlib
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from infra.store import ObjectStore
from pipelines.dedup.fingerprints import MinHasher
from pipelines.dedup.index import NODE_SHIFT

SHARD_SUFFIX = ".jsonl.gz"

# One row per input document: what the clustering needs (no text).
FINGERPRINT_SCHEMA = pa.schema(
    [
        ("shard", pa.string()),
        ("shard_digest", pa.string()),
        ("line", pa.int32()),
        ("doc_id", pa.string()),
        ("snapshot", pa.string()),
        ("quality", pa.float64()),
        ("tokens", pa.int64()),
        ("content_hash", pa.int64()),
        ("url_hash", pa.int64()),
        ("bands", pa.list_(pa.int64())),
        ("sig", pa.binary()),
    ]
)

# The dedup plan of one shard: a fingerprint row plus the decision (sorted by line).
PLAN_SCHEMA = pa.schema(
    [
        ("line", pa.int32()),
        ("node", pa.int64()),
        ("doc_id", pa.string()),
        ("tokens", pa.int64()),
        ("content_hash", pa.int64()),
        ("url_hash", pa.int64()),
        ("bands", pa.list_(pa.int64())),
        ("sig", pa.binary()),
        ("kept", pa.bool_()),
        ("reason", pa.string()),
        ("root", pa.int64()),
        ("root_doc_id", pa.string()),
        ("root_snapshot", pa.string()),
        ("cluster_size", pa.int64()),
    ]
)
INDEX_COLUMNS = ["node", "doc_id", "kept", "tokens", "content_hash", "url_hash", "bands", "sig"]
CLUSTER_COLUMNS = ["doc_id", "node", "kept", "reason", "root", "root_doc_id", "root_snapshot", "cluster_size"]


@dataclass(frozen=True)
class PartitionLayout:
    """Where one partition's outputs live in the store: everything under version directories that only a
    commit (index log record, output pointer `infra.committed`) makes visible."""

    kind: str
    snapshot: str
    out_prefix: str  # dedup/<kind>/<snapshot>: a committed output (kept/, clusters/)
    index_prefix: str  # dedup/<kind>/index
    version: str = ""

    @property
    def version_prefix(self) -> str:
        return f"{self.out_prefix}/v-{self.version}"

    @staticmethod
    def kept_name(shard_key: str) -> str:
        return f"kept/{PurePosixPath(shard_key).name}"

    @staticmethod
    def clusters_name(shard_key: str) -> str:
        return f"clusters/{shard_stem(shard_key)}.parquet"

    def kept_key(self, shard_key: str) -> str:
        return f"{self.version_prefix}/{self.kept_name(shard_key)}"

    def clusters_key(self, shard_key: str) -> str:
        return f"{self.version_prefix}/{self.clusters_name(shard_key)}"

    @property
    def entry_prefix(self) -> str:
        return f"{self.index_prefix}/{self.snapshot}"

    def index_part_key(self, shard_key: str) -> str:
        return f"{self.entry_prefix}/v-{self.version}/{shard_stem(shard_key)}.parquet"


def shard_stem(key: str) -> str:
    return PurePosixPath(key).name.removesuffix(SHARD_SUFFIX)


def read_shard_lines(store: ObjectStore, key: str) -> tuple[list[bytes], str]:
    """The non-blank JSON lines of a shard and the hash of its compressed bytes."""
    raw = store.get_bytes(key)
    lines = [line for line in gzip.decompress(raw).split(b"\n") if line.strip()]
    return lines, xxhash.xxh3_128_hexdigest(raw)


def _quality(metadata: dict, field: str) -> float:
    value = metadata.get(field)
    try:
        q = float(value)
    except (TypeError, ValueError):
        return -math.inf
    return -math.inf if math.isnan(q) else q + 0.0  # + 0.0 turns -0.0 into 0.0: both engines sort alike


def fingerprint_row(
    hasher: MinHasher,
    text: str,
    doc_id: object,
    metadata: dict,
    shard: str,
    digest: str,
    line: int,
    default_snapshot: str,
) -> dict:
    """One FINGERPRINT_SCHEMA row for a document (datatrove fields: text, id, metadata)."""
    fp = hasher.fingerprint(text or "", metadata.get("url"))
    return {
        "shard": shard,
        "shard_digest": digest,
        "line": line,
        "doc_id": str(doc_id) if doc_id is not None else f"{shard_stem(shard)}/{line}",
        "snapshot": str(metadata.get("snapshot") or default_snapshot),
        "quality": _quality(metadata, hasher.config.quality_field),
        "tokens": fp.tokens,
        "content_hash": fp.content_hash,
        "url_hash": fp.url_hash,
        "bands": fp.bands.tolist(),
        "sig": fp.sig,
    }


def iter_shard_documents(store: ObjectStore, key: str) -> Iterator[tuple[int, dict, str]]:
    """(line number, parsed document, shard digest) for every document of a shard."""
    lines, digest = read_shard_lines(store, key)
    for line_no, line in enumerate(lines):
        yield line_no, orjson.loads(line), digest


def fingerprint_shard(store: ObjectStore, key: str, hasher: MinHasher, snapshot: str) -> Iterator[dict]:
    """FINGERPRINT_SCHEMA rows of every document of one shard (the Spark engine's map function)."""
    for line_no, doc, digest in iter_shard_documents(store, key):
        yield fingerprint_row(
            hasher, doc.get("text"), doc.get("id"), doc.get("metadata") or {}, key, digest, line_no, snapshot
        )


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def apply_shard(
    store: ObjectStore, layout: PartitionLayout, shard_key: str, plan: pa.Table, gzip_level: int
) -> dict:
    """Write a shard's kept documents (original lines, same order), its index part and its cluster rows.

    `plan` has PLAN_SCHEMA, one row per document of the shard, sorted by line. Returns per-shard counts.
    """
    lines, _ = read_shard_lines(store, shard_key)
    plan = plan.cast(
        PLAN_SCHEMA
    )  # one exact schema (list field names too): identical bytes from both engines
    if plan.num_rows != len(lines):
        raise RuntimeError(
            f"{shard_key}: plan has {plan.num_rows} rows for {len(lines)} documents; rerun the stage"
        )
    kept = plan.column("kept").to_pylist()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=gzip_level, mtime=0) as gz:
        gz.write(b"".join(line + b"\n" for line, keep in zip(lines, kept, strict=True) if keep))
    in_cluster = plan.filter(pc.greater(plan.column("cluster_size"), 1))
    outputs = {
        layout.kept_name(shard_key): buf.getvalue(),
        layout.clusters_name(shard_key): _parquet_bytes(in_cluster.select(CLUSTER_COLUMNS)),
    }
    for name, data in outputs.items():
        store.put_bytes(f"{layout.version_prefix}/{name}", data)
    index_part = _parquet_bytes(plan.select(INDEX_COLUMNS))
    store.put_bytes(layout.index_part_key(shard_key), index_part)

    tokens = plan.column("tokens").to_pylist()
    reasons = plan.column("reason").to_pylist()
    roots = plan.column("root").to_pylist()
    own_seq = plan.column("node")[0].as_py() >> NODE_SHIFT if plan.num_rows else 0
    return {
        "shard": shard_key,
        # what the stage's commit lists: sizes and hashes of the files as written
        "files": {n: {"bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in outputs.items()},
        "index_part_bytes": len(index_part),
        "docs_in": len(lines),
        "docs_out": sum(kept),
        "tokens_in": sum(tokens),
        "tokens_out": sum(t for t, k in zip(tokens, kept, strict=True) if k),
        "exact_dups": reasons.count("exact"),
        "url_dups": reasons.count("url"),
        "near_dups": reasons.count("near"),
        "cross_partition_dups": sum(
            1 for r, root in zip(reasons, roots, strict=True) if r and (root >> NODE_SHIFT) != own_seq
        ),
    }
