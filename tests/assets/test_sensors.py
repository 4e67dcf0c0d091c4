from __future__ import annotations

import dagster as dg

from assets.resources import ObjectStoreResource
from assets.sensors import web_snapshot_sensor


def test_new_warc_prefix_adds_partition_and_requests_ingest(tmp_path):
    store = ObjectStoreResource(url=str(tmp_path / "store"))
    objects = store.open()
    objects.put_bytes("incoming/warc/cc-2026-40/part-0.warc.gz", b"x")
    objects.put_bytes("incoming/warc/notes/readme.txt", b"not a snapshot")
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(instance=instance, resources={"store": store})
        result = web_snapshot_sensor(ctx)
        assert [r.partition_keys for r in result.dynamic_partitions_requests] == [["cc-2026-40"]]
        (run,) = result.run_requests
        assert run.partition_key == "cc-2026-40"
        config = run.run_config["ops"]["web_warc"]["config"]
        assert config["source"] == "warc" and config["warc_uri"].endswith("incoming/warc/cc-2026-40")

        instance.add_dynamic_partitions("web_snapshot", ["cc-2026-40"])
        again = web_snapshot_sensor(dg.build_sensor_context(instance=instance, resources={"store": store}))
        assert isinstance(again, dg.SkipReason), "a known snapshot is not added twice"


HOSTILE_SNAPSHOTS = ["..", ".", "", "-x", "x" * 65, "a..b", "a b"]


def test_hostile_snapshot_prefixes_are_refused_naming_the_pattern(s3_bucket):
    """S3 keys may hold '..', '.' or empty segments; none of them may become a partition (a path in the store)."""
    endpoint, bucket = s3_bucket
    store = ObjectStoreResource(url=f"s3://{bucket}/crucible", endpoint_url=endpoint)
    for snapshot in HOSTILE_SNAPSHOTS:
        store.open().client.put_object(
            Bucket=bucket, Key=f"crucible/incoming/warc/{snapshot}/p.warc.gz", Body=b"x"
        )
    assert sorted(store.open().list_prefixes("incoming/warc")) == sorted(HOSTILE_SNAPSHOTS)
    with dg.instance_for_test() as instance:
        result = web_snapshot_sensor(dg.build_sensor_context(instance=instance, resources={"store": store}))
        assert isinstance(result, dg.SkipReason)
        assert "[A-Za-z0-9][A-Za-z0-9._-]{0,63}" in result.skip_message and "'-x'" in result.skip_message
        assert instance.get_dynamic_partitions("web_snapshot") == []

        store.open().put_bytes("incoming/warc/cc-2026-41/part-0.warc.gz", b"x")
        result = web_snapshot_sensor(dg.build_sensor_context(instance=instance, resources={"store": store}))
        assert [r.partition_keys for r in result.dynamic_partitions_requests] == [["cc-2026-41"]]
        assert [r.partition_key for r in result.run_requests] == ["cc-2026-41"]
