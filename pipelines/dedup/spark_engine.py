"""The PySpark engine (`cluster`; tested on local[2]). Same fingerprints as the datatrove engine (the map side
calls `fingerprints.py` / `shards.py`), same phases and the same smallest-node-wins rule as `clusters.py`, so
both keep exactly the same documents. Nothing document-sized reaches the driver: shards are read and written
by tasks through the store, grouping is done with DataFrame joins and aggregations, and connected components
use the large-star / small-star iteration (Kiveris et al., 2014). Rows cross between the JVM and the Python
workers only as Arrow batches (mapInArrow / applyInArrow), never pickled one by one. The driver only collects
per-shard digests and counts, and the cluster-size histogram.

The store object is shipped to tasks, so it must be picklable (LocalStore is; on a cluster pass a store
whose client is created lazily on the executors)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import replace
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq

from infra.store import ObjectStore
from pipelines.dedup.config import DedupConfig
from pipelines.dedup.fingerprints import MinHasher, estimated_jaccard, passes_verification
from pipelines.dedup.index import NODE_SHIFT, partition_version, sig_rows
from pipelines.dedup.job import EngineResult, PartitionJob
from pipelines.dedup.shards import FINGERPRINT_SCHEMA, PLAN_SCHEMA, apply_shard, fingerprint_shard

log = logging.getLogger(__name__)

_INDEX_FIELDS = ["node", "doc_id", "content_hash", "url_hash", "bands", "sig"]
_MAX_CC_ROUNDS = 64
_ARROW_BATCH = 4096  # rows per Arrow batch between the Python workers and the JVM


def spark_session(config: DedupConfig):
    """A SparkSession for `config.spark_master` (None: the already active or submitted session)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("crucible-dedup")
    if config.spark_master:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors must import this project
        builder = builder.master(config.spark_master).config("spark.ui.enabled", "false")
    return builder.config("spark.sql.shuffle.partitions", str(config.spark_shuffle_partitions)).getOrCreate()


def _schemas():
    from pyspark.sql import types as T

    fingerprint = T.StructType(
        [
            T.StructField("shard", T.StringType(), False),
            T.StructField("shard_digest", T.StringType(), False),
            T.StructField("line", T.IntegerType(), False),
            T.StructField("doc_id", T.StringType(), False),
            T.StructField("snapshot", T.StringType(), False),
            T.StructField("quality", T.DoubleType(), False),
            T.StructField("tokens", T.LongType(), False),
            T.StructField("content_hash", T.LongType(), False),
            T.StructField("url_hash", T.LongType(), True),
            T.StructField("bands", T.ArrayType(T.LongType(), False), False),
            T.StructField("sig", T.BinaryType(), False),
        ]
    )
    ranked = T.StructType(fingerprint.fields + [T.StructField("node", T.LongType(), False)])
    index = T.StructType([ranked[name] for name in _INDEX_FIELDS])
    edges = T.StructType(
        [T.StructField("src", T.LongType(), False), T.StructField("dst", T.LongType(), False)]
    )
    return fingerprint, index, edges


def _index_batches(store: ObjectStore, batches):
    """mapInArrow: index part keys -> their rows (_INDEX_FIELDS) as Arrow batches."""
    for batch in batches:
        for key in batch.column(0).to_pylist():
            with store.local_copy(key) as path:
                table = pq.read_table(path, columns=_INDEX_FIELDS)
            yield from table.to_batches(max_chunksize=_ARROW_BATCH)


def _fingerprint_batches(store: ObjectStore, hasher: MinHasher, snapshot: str, batches):
    """mapInArrow: shard keys -> FINGERPRINT_SCHEMA batches (columnar to the JVM, no per-row pickling)."""
    for batch in batches:
        for key in batch.column(0).to_pylist():
            rows: list[dict] = []
            for row in fingerprint_shard(store, key, hasher, snapshot):
                rows.append(row)
                if len(rows) == _ARROW_BATCH:
                    yield pa.RecordBatch.from_pylist(rows, schema=FINGERPRINT_SCHEMA)
                    rows = []
            if rows:
                yield pa.RecordBatch.from_pylist(rows, schema=FINGERPRINT_SCHEMA)


def _verify_batches(num_perm: int, threshold: float, batches):
    """mapInArrow: (center, member, center_sig, member_sig) -> the (src, dst) links that pass verification,
    compared as (n, num_perm) matrices over the batch's buffers."""
    for batch in batches:
        est = estimated_jaccard(
            sig_rows(batch.column("center_sig"), num_perm), sig_rows(batch.column("member_sig"), num_perm)
        )
        ok = pa.array(passes_verification(est, threshold))
        yield pa.record_batch(
            [batch.column("center").filter(ok), batch.column("member").filter(ok)], names=["src", "dst"]
        )


def _apply_group(store: ObjectStore, layout, gzip_level: int, table: pa.Table) -> pa.Table:
    """applyInArrow: one shard's plan rows -> its outputs written, its counts as one JSON row."""
    key = table.column("shard")[0].as_py()
    plan = table.select(PLAN_SCHEMA.names).cast(PLAN_SCHEMA).sort_by("line")
    stats = apply_shard(store, layout, key, plan, gzip_level)
    return pa.table({"stats": [json.dumps(stats)]})


def _is_star_forest(e) -> bool:
    """True when every component is a star around its minimum: each u has one link, no link target has one."""
    from pyspark.sql import functions as F

    multi = e.groupBy("u").count().where("count > 1").select("u")
    chained = e.join(e.select(F.col("u").alias("v")), "v", "left_semi").select("u")
    return multi.unionByName(chained).limit(1).count() == 0


def connected_components(edges):
    """(src, dst) edges -> (node, label) for every node on an edge; label = smallest node of its component.

    Alternates large-star and small-star (Kiveris et al., 2014) until every component is a star around its
    minimum. LSH links already point at their bucket's minimum, so this often holds before the first round.
    """
    from pyspark.sql import functions as F

    e = edges.select(F.greatest("src", "dst").alias("u"), F.least("src", "dst").alias("v")).where("u != v")
    e = e.distinct().localCheckpoint()
    for round_no in range(_MAX_CC_ROUNDS + 1):
        if _is_star_forest(e):
            log.info("connected components converged after %d rounds", round_no)
            return e.select(F.col("u").alias("node"), F.col("v").alias("label"))
        # large-star: every neighbour larger than u links to the smallest of u's closed neighbourhood
        adj = e.unionByName(e.select(F.col("v").alias("u"), F.col("u").alias("v")))
        low = adj.groupBy("u").agg(F.least(F.min("v"), F.col("u")).alias("m"))
        large = adj.join(low, "u").where(F.col("v") > F.col("u")).select(F.col("v").alias("u"), "m")
        large = large.select("u", F.col("m").alias("v")).where("u != v").distinct()
        # small-star: u and its smaller neighbours link to the smallest of them
        low2 = large.groupBy("u").agg(F.min("v").alias("m"))
        small = (
            large.join(low2, "u")
            .select(F.col("v").alias("a"), "m")
            .unionByName(low2.select(F.col("u").alias("a"), "m"))
        )
        e = small.select(F.greatest("a", "m").alias("u"), F.least("a", "m").alias("v")).where("u != v")
        e = e.distinct().localCheckpoint()
    raise RuntimeError(f"connected components did not converge in {_MAX_CC_ROUNDS} rounds")


def run_spark(spark, store: ObjectStore, job: PartitionJob) -> EngineResult:
    """Fingerprint (tasks) -> exact/URL/near phases and components (DataFrames) -> apply (tasks)."""
    from pyspark.sql import functions as F

    clock = [time.perf_counter()]

    def lap(what: str) -> None:
        now = time.perf_counter()
        log.info("spark dedup %s: %s took %.1fs", job.layout.snapshot, what, now - clock[0])
        clock[0] = now

    cfg = job.config
    sc = spark.sparkContext
    spark.conf.set("spark.sql.shuffle.partitions", str(cfg.spark_shuffle_partitions))
    fp_schema, index_schema, edge_schema = _schemas()
    hasher = MinHasher(cfg)
    snapshot = job.layout.snapshot
    n_shards = len(job.shard_keys)
    base = job.seq << NODE_SHIFT

    keys = spark.createDataFrame(sc.parallelize([(k,) for k in job.shard_keys], n_shards), "key string")
    fps = keys.mapInArrow(partial(_fingerprint_batches, store, hasher, snapshot), fp_schema).persist()
    digests = {r.shard: r.shard_digest for r in fps.select("shard", "shard_digest").distinct().collect()}
    version = partition_version(cfg.fingerprint(), job.shard_keys, digests, job.earlier)
    job = replace(job, layout=replace(job.layout, version=version))
    lap("fingerprints")

    # keep rule -> node ids: sort by (quality desc, snapshot, doc_id, shard, line), then number the rows
    # without leaving the JVM: a sorted partition's monotonically_increasing_id is (partition << 33) + its
    # position, so node = base + (rows in earlier partitions) + position. The keys are a total order, so
    # a recomputed partition gets the same numbers.
    ordered = (
        fps.orderBy(F.col("quality").desc(), "snapshot", "doc_id", "shard", "line")
        .withColumn("_mid", F.monotonically_increasing_id())
        .persist()
    )
    sizes = ordered.groupBy(F.shiftright("_mid", 33).alias("p")).count().collect()
    before, offsets = 0, {}
    for r in sorted(sizes, key=lambda r: r["p"]):
        offsets[int(r["p"])] = before
        before += int(r["count"])
    offset_of = F.create_map(*[F.lit(x) for kv in offsets.items() for x in kv]) if offsets else None
    position = F.col("_mid").bitwiseAND(F.lit((1 << 33) - 1))
    node = F.lit(base) + (offset_of[F.shiftright("_mid", 33)] if offsets else F.lit(0)) + position
    docs = ordered.withColumn("node", node.cast("long")).drop("_mid").persist()
    docs.count()  # materialise before the fingerprints are released
    ordered.unpersist()
    fps.unpersist()
    lap("ranks")

    parts = [key for entry in job.earlier for key in entry.parts]
    if parts:
        part_keys = spark.createDataFrame(sc.parallelize([(k,) for k in parts], len(parts)), "key string")
        idx = part_keys.mapInArrow(partial(_index_batches, store), index_schema).persist()
    else:
        idx = spark.createDataFrame([], index_schema)

    # exact, then URL: the smallest node with the same key wins
    def group_min(new, key: str, out: str):
        keyed = new.select("node", key).unionByName(idx.where(F.col(key).isNotNull()).select("node", key))
        mins = keyed.groupBy(key).agg(F.min("node").alias(out))
        return new.join(mins, key).select("node", out)

    exact = group_min(docs.select("node", "content_hash"), "content_hash", "exact").localCheckpoint()
    s1 = exact.where("exact = node").select("node")
    if cfg.url_dedup:
        with_url = docs.join(s1, "node").where(F.col("url_hash").isNotNull()).select("node", "url_hash")
        url = group_min(with_url, "url_hash", "url")
        url = s1.join(url, "node", "left").select("node", F.coalesce("url", "node").alias("url"))
    else:
        url = s1.select("node", F.col("node").alias("url"))
    url = url.localCheckpoint()
    lap("exact and url phases")
    s2 = url.where("url = node").select("node")

    # near: band buckets -> star links to the bucket's smallest node -> verified -> components
    new_b = docs.join(s2, "node").select("node", F.posexplode("bands").alias("band", "key"))
    idx_b = idx.select("node", F.posexplode("bands").alias("band", "key"))
    idx_b = idx_b.join(new_b.select("band", "key").distinct(), ["band", "key"], "left_semi")
    buckets = new_b.withColumn("new", F.lit(True)).unionByName(idx_b.withColumn("new", F.lit(False)))
    centers = buckets.groupBy("band", "key").agg(F.min("node").alias("center"))
    candidates = (
        buckets.where("new")
        .join(centers, ["band", "key"])
        .where("node != center")
        .select("center", F.col("node").alias("member"))
        .distinct()
    )
    sigs = docs.select("node", "sig").unionByName(idx.select("node", "sig"))
    paired = (
        candidates.join(
            sigs.select(F.col("node").alias("center"), F.col("sig").alias("center_sig")), "center"
        )
        .join(sigs.select(F.col("node").alias("member"), F.col("sig").alias("member_sig")), "member")
        .select("center", "member", "center_sig", "member_sig")
    )
    paired = paired.localCheckpoint()
    verify = partial(_verify_batches, cfg.num_perm, cfg.verify_threshold)
    verified = paired.mapInArrow(verify, edge_schema).localCheckpoint()
    counts = {"verified_pairs": verified.count(), "candidate_pairs": paired.count()}
    lap("lsh candidates and verification")
    if counts["verified_pairs"]:
        labels = connected_components(verified)
    else:
        labels = spark.createDataFrame([], "node long, label long")
    near = s2.join(labels, "node", "left").select("node", F.coalesce("label", "node").alias("near"))
    near = near.localCheckpoint()
    lap("connected components")

    # roots: follow exact -> url -> near; earlier partitions' nodes are roots
    roots = (
        exact.join(url.select(F.col("node").alias("exact"), F.col("url").alias("u1")), "exact", "left")
        .withColumn("r2", F.coalesce("u1", "exact"))
        .join(near.select(F.col("node").alias("r2"), F.col("near").alias("n2")), "r2", "left")
        .withColumn("root", F.coalesce("n2", "r2"))
        .join(url.select("node", "url"), "node", "left")
        .join(near, "node", "left")
        .select("node", "exact", "url", "near", "root")
        .localCheckpoint()
    )
    sizes = roots.groupBy("root").agg(
        (F.count("*") + F.when(F.col("root") < F.lit(base), 1).otherwise(0)).alias("cluster_size")
    )
    histogram = {
        int(r["cluster_size"]): int(r["count"])
        for r in sizes.where("cluster_size > 1").groupBy("cluster_size").count().collect()
    }
    by_seq = job.snapshot_by_seq
    seq_map = F.create_map(*[F.lit(x) for kv in by_seq.items() for x in kv])
    names_of = docs.select("node", "doc_id").unionByName(idx.select("node", "doc_id"))
    decisions = (
        roots.join(sizes, "root")
        .join(
            names_of.select(F.col("node").alias("root"), F.col("doc_id").alias("root_doc_id")), "root", "left"
        )
        .withColumn("root_snapshot", seq_map[F.shiftright("root", NODE_SHIFT).cast("int")])
        .withColumn(
            "kept",
            F.coalesce(
                (F.col("exact") == F.col("node"))
                & (F.col("url") == F.col("node"))
                & (F.col("near") == F.col("node")),
                F.lit(False),
            ),
        )
        .withColumn(
            "reason",
            F.when(F.col("exact") != F.col("node"), "exact")
            .when(F.col("url") != F.col("node"), "url")
            .when(F.col("near") != F.col("node"), "near")
            .otherwise(""),
        )
    )
    plan = docs.join(decisions, "node").select("shard", *PLAN_SCHEMA.names)

    lap("roots and cluster sizes")
    layout, gzip_level = job.layout, cfg.gzip_level

    def apply(table: pa.Table) -> pa.Table:  # applyInArrow picks its calling convention from these hints
        return _apply_group(store, layout, gzip_level, table)

    stats = [
        json.loads(r["stats"]) for r in plan.groupBy("shard").applyInArrow(apply, "stats string").collect()
    ]
    lap("apply")
    written = {s["shard"] for s in stats}
    for key in job.shard_keys:  # shards without documents still get (empty) outputs
        if key not in written:
            stats.append(apply_shard(store, job.layout, key, PLAN_SCHEMA.empty_table(), cfg.gzip_level))
    for frame in (docs, idx):
        frame.unpersist()
    return EngineResult(
        version=version,
        shard_stats=sorted(stats, key=lambda s: s["shard"]),
        histogram=histogram,
        counts={k: int(v) for k, v in counts.items()},
    )
