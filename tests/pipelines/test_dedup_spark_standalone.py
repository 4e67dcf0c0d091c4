"""The Spark dedup engine on a Spark standalone cluster (a master and a worker JVM on 127.0.0.1, not local[*])
with the store on the loopback S3 endpoint: executors read the shards and the earlier partitions' index and
write the outputs through the project's S3 store (boto3, not Hadoop's s3a), and the result is byte for byte
what the datatrove engine writes on a local disk (which test_dedup_spark.py shows equals Spark local mode)."""

from __future__ import annotations

import os
import sys

import pytest
from conftest_dedup import (  # tests/pipelines is on sys.path (prepend import mode)
    A_DROPPED,
    B_DROPPED,
    read_kept_ids,
    snapshot_a,
    snapshot_b,
    tree_bytes,
    write_shards,
)
from spark_standalone import spark_standalone  # tests/ is on sys.path

from infra.settings import StoreSettings, load_profile, validate_stage
from infra.store import LocalStore, S3Store
from pipelines.dedup import DedupConfig, dedup_partition

pytestmark = pytest.mark.spark
A, B = "2024-10", "2024-05"
METRICS = (
    "docs_out",
    "tokens_out",
    "exact_dups",
    "url_dups",
    "near_dups",
    "clusters",
    "cross_partition_dups",
)


def _upload(local: LocalStore, s3: S3Store, prefix: str) -> None:
    for path in sorted((local.root / prefix).rglob("*")):
        if path.is_file():
            s3.put_file(path.relative_to(local.root).as_posix(), path)


def test_standalone_cluster_on_s3_writes_what_the_local_engine_writes(s3_bucket, tmp_path):
    endpoint, bucket = s3_bucket
    local_cfg = validate_stage(load_profile("micro"), "dedup_web", DedupConfig)
    a_docs = snapshot_a()
    b_docs = snapshot_b(a_docs)
    local = LocalStore(tmp_path / "local")
    write_shards(local.root, f"web/filtered/{A}/kept", a_docs, shards=4)
    write_shards(local.root, f"web/filtered/{B}/kept", b_docs, shards=2)
    url = f"s3://{bucket}/prod"
    s3 = S3Store(url, StoreSettings(url=url, endpoint_url=endpoint))
    _upload(local, s3, "web/filtered")

    reference = {p: dedup_partition(local_cfg, local, p, scratch=tmp_path) for p in (A, B)}
    # 2024-10 by the datatrove engine on S3 (engines mix partition by partition), then the backfilled 2024-05
    # on the cluster: its executors read the shards and the 2024-10 index from S3 and write outputs there
    a_on_s3 = dedup_partition(local_cfg, s3, A, scratch=tmp_path)
    assert a_on_s3.data_version == reference[A].data_version

    os.environ["PYSPARK_PYTHON"] = sys.executable
    with spark_standalone(tmp_path / "spark") as master:
        cluster_cfg = local_cfg.model_copy(update={"engine": "spark", "spark_master": master})
        from pipelines.dedup.spark_engine import spark_session

        spark = spark_session(cluster_cfg)
        try:
            assert spark.sparkContext.master == master
            b_cluster = dedup_partition(cluster_cfg, s3, B, spark=spark, scratch=tmp_path)
            # after the job: the driver and the worker's executor (tasks ran outside the driver JVM)
            executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        finally:
            spark.stop()
    assert executors == 2

    assert b_cluster.data_version == reference[B].data_version
    for name in METRICS:
        assert b_cluster.metrics.get(name) == reference[B].metrics.get(name), name
    assert b_cluster.metrics["cross_partition_dups"] == 12  # matched against the 2024-10 index read from S3

    # every output object in the bucket equals the local engine's file (pointers hold their commit time)
    on_s3 = {k: s3.get_bytes(k) for k in s3.list("dedup")}
    on_s3 = {k: v for k, v in on_s3.items() if not k.endswith("_committed.json")}
    assert on_s3 == tree_bytes(local.root, "dedup")
    mirror = tmp_path / "mirror"
    for key in s3.list("dedup"):
        s3.download(key, mirror / key)
    kept_a = set(read_kept_ids(mirror, f"dedup/web/{A}/kept"))
    kept_b = set(read_kept_ids(mirror, f"dedup/web/{B}/kept"))
    assert kept_a == {d["id"] for d in a_docs} - A_DROPPED
    assert kept_b == {d["id"] for d in b_docs} - B_DROPPED
