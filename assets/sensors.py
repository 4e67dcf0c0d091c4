"""Sensors: a new WARC snapshot prefix landing in the store adds a web partition and ingests it."""

import dagster as dg

from assets.partitions import web_snapshots
from assets.resources import ObjectStoreResource
from infra.partition_keys import InvalidPartitionKey, validate_partition_key

INCOMING_WARC = "incoming/warc"


@dg.sensor(job_name="web_corpus", minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING)
def web_snapshot_sensor(context: dg.SensorEvaluationContext, store: ObjectStoreResource):
    """Each `incoming/warc/<snapshot>/` prefix holding .warc.gz files becomes a `web_snapshot` partition,
    and a run ingests it (source=warc) and extracts and filters it."""
    object_store = store.open()
    known = set(context.instance.get_dynamic_partitions(web_snapshots.name))
    new, refused = [], []
    for snapshot in object_store.list_prefixes(INCOMING_WARC):
        if snapshot in known:
            continue
        try:
            validate_partition_key(snapshot)
        except InvalidPartitionKey as exc:
            refused.append(str(exc))  # a bad name must not stop the good snapshots
            continue
        if any(k.endswith((".warc.gz", ".warc")) for k in object_store.list(f"{INCOMING_WARC}/{snapshot}/")):
            new.append(snapshot)
    for reason in refused:
        context.log.warning("%s: %s", object_store.uri(INCOMING_WARC), reason)
    if not new:
        return dg.SkipReason(
            f"no new snapshot under {object_store.uri(INCOMING_WARC)}" + "".join(f"; {r}" for r in refused)
        )
    return dg.SensorResult(
        dynamic_partitions_requests=[web_snapshots.build_add_request(new)],
        run_requests=[
            dg.RunRequest(
                run_key=f"ingest-{snapshot}",
                partition_key=snapshot,
                run_config={
                    "ops": {
                        "web_warc": {
                            "config": {
                                "source": "warc",
                                "warc_uri": object_store.uri(f"{INCOMING_WARC}/{snapshot}"),
                            }
                        }
                    }
                },
            )
            for snapshot in new
        ],
    )
