"""Deduplication of web documents and code files: exact + MinHash LSH near-dedup, across snapshots.

Entry point: `dedup_partition(config, store, snapshot)` (stage.py) -> StageResult. Two engines give the same
result: `datatrove` (LocalPipelineExecutor, one machine) and `spark` (PySpark). Modules:

    config.py        DedupConfig (profile sections dedup_web / dedup_code)
    fingerprints.py  the shared core: normalise, tokenise, shingle, MinHash, bands, Jaccard estimates
    shards.py        per-shard work: fingerprint a shard, apply a shard's plan (kept docs, index part, clusters)
    clusters.py      exact -> URL -> near phases and connected components (numpy reference)
    index.py         the persistent cross-partition index and its manifests
    local_engine.py  datatrove engine;  spark_engine.py  Spark engine;  stage.py  orchestration and report

Which copy survives (the keep rule)
-----------------------------------
Within a cluster the document with the smallest node id survives. Node ids are `seq << 40 | rank`:
1. the earliest *processed* partition wins ("first processed wins"): every document of a partition already
   in the index beats every document of the partition being processed;
2. within a partition: highest quality score (`metadata[quality_field]`, missing = lowest), then oldest
   `metadata.snapshot`, then smallest document id (then shard and line, for ties).
Phases: exact duplicates (normalised content hash), then URL duplicates (web), then near duplicates (MinHash
LSH, bucket links verified by estimated Jaccard >= verify_threshold, connected components). Clusters are
transitive: a document linked to a dropped document of an earlier partition is dropped too.

Cross-snapshot, incremental, backfill
-------------------------------------
Each processed partition is committed to the index `dedup/<kind>/index/` with a `seq` (processing order)
that reruns keep. A partition is deduplicated against exactly the partitions with a smaller seq, so:
- a new snapshot is deduplicated against every snapshot processed before it;
- backfilling an OLDER snapshot after newer ones: the backfilled snapshot loses its copies of documents the
  newer, already processed snapshots kept ("first processed wins"). Published partitions never change
  retroactively, so nothing downstream has to rerun; the price is that the surviving copy of a page can be
  the newer crawl of it;
- rerunning a partition is idempotent: same seq, same earlier partitions, same output, and its index entry
  is replaced. If its input changed, later partitions that were deduplicated against the old version are
  reported as `stale_partitions` (metric, report, the output's meta) and should be rerun.
Concurrent runs of one kind (two Dagster runs, or `crucible run` in process beside one) are safe: the index
commit is a create-only append to a log (index.py), so two partitions never take the same seq, and a run
that loses the race is recomputed against the winner's documents (`attempts` metric).

Crash safety
------------
Shard outputs go to version directories (`v-<version>`, named by config, inputs and the earlier index), then
the index log record is appended, then the output pointer `dedup/<kind>/<snapshot>/_committed.json`
(`infra.committed`) is switched. Readers go through the pointer and the log, which list every file with its
size. A killed run leaves the previous version readable (or the new one, whole), and rerunning it writes the
same bytes an uninterrupted run writes (tests/faults/test_dedup_kill.py).
"""

from pipelines.dedup.config import DedupConfig
from pipelines.dedup.stage import DedupRateCheck, check_dedup_rate, dedup_partition, plot_cluster_sizes

__all__ = ["DedupConfig", "DedupRateCheck", "check_dedup_rate", "dedup_partition", "plot_cluster_sizes"]
