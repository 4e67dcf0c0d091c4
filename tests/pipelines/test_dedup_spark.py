"""The Spark engine (local[2]) keeps exactly what the datatrove engine keeps, within and across partitions,
and writes byte-identical outputs and index entries (so the engines can be mixed partition by partition)."""

from __future__ import annotations

import os
import random
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

from infra.settings import load_profile, validate_stage
from infra.store import LocalStore
from pipelines.dedup import DedupConfig, dedup_partition

pytestmark = pytest.mark.spark
A, B = "2024-10", "2024-05"


@pytest.fixture(scope="module")
def spark():
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pipelines.dedup.spark_engine import spark_session

    session = spark_session(
        validate_stage(load_profile("micro"), "dedup_web", DedupConfig, {"engine": "spark"})
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def test_spark_and_datatrove_engines_keep_the_same_documents(spark, tmp_path):
    local_cfg = validate_stage(load_profile("micro"), "dedup_web", DedupConfig)
    spark_cfg = local_cfg.model_copy(update={"engine": "spark"})
    a_docs = snapshot_a()
    b_docs = snapshot_b(a_docs)
    local, other = LocalStore(tmp_path / "local"), LocalStore(tmp_path / "spark")
    for store in (local, other):
        write_shards(store.root, f"web/filtered/{A}/kept", a_docs, shards=4)
        write_shards(store.root, f"web/filtered/{B}/kept", b_docs, shards=2)

    # one partition: clustering inside a snapshot
    a_local = dedup_partition(local_cfg, local, A, scratch=tmp_path)
    a_spark = dedup_partition(spark_cfg, other, A, spark=spark, scratch=tmp_path)
    assert set(read_kept_ids(other.root, f"dedup/web/{A}/kept")) == {d["id"] for d in a_docs} - A_DROPPED
    assert read_kept_ids(other.root, f"dedup/web/{A}/kept") == read_kept_ids(
        local.root, f"dedup/web/{A}/kept"
    )
    assert a_spark.data_version == a_local.data_version
    assert a_spark.extra["histogram"] == a_local.extra["histogram"] == {2: 32, 3: 1}
    for name in (
        "docs_out",
        "tokens_out",
        "exact_dups",
        "url_dups",
        "near_dups",
        "clusters",
        "verified_pairs",
    ):
        assert a_spark.metrics[name] == a_local.metrics[name], name
    assert tree_bytes(other.root, "dedup") == tree_bytes(local.root, "dedup")  # kept, clusters, index

    # across partitions: the backfilled 2024-05 on Spark against the index the datatrove engine wrote
    b_local = dedup_partition(local_cfg, local, B, scratch=tmp_path)
    local_b_tree = tree_bytes(local.root, "dedup")
    b_spark = dedup_partition(spark_cfg, local, B, spark=spark, scratch=tmp_path)
    assert set(read_kept_ids(local.root, f"dedup/web/{B}/kept")) == {d["id"] for d in b_docs} - B_DROPPED
    assert b_spark.metrics["cross_partition_dups"] == b_local.metrics["cross_partition_dups"] == 12
    assert b_spark.data_version == b_local.data_version
    assert tree_bytes(local.root, "dedup") == local_b_tree


def test_large_star_small_star_components_match_union_find(spark):
    """A long path in shuffled label order (many rounds), a star, a cycle and a pair."""
    from pipelines.dedup.spark_engine import connected_components

    rng = random.Random(0)
    path = rng.sample(range(1000, 1016), 16)
    edges = list(zip(path, path[1:], strict=False))
    edges += [(7, x) for x in (70, 71, 72)] + [(500, 501), (501, 502), (502, 500), (9, 8)]
    frame = spark.createDataFrame(edges, "src long, dst long")
    labels = {r["node"]: r["label"] for r in connected_components(frame).collect()}
    expected = {x: min(path) for x in path if x != min(path)}
    expected |= {70: 7, 71: 7, 72: 7, 501: 500, 502: 500, 9: 8}
    assert labels == expected  # roots are not listed: their label is themselves
