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
