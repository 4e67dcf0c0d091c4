"""Partitions: web assets by crawl snapshot, code assets by code-source snapshot (both dynamic)."""

import dagster as dg

from infra.partition_keys import validate_partition_key

web_snapshots = dg.DynamicPartitionsDefinition(name="web_snapshot")
code_snapshots = dg.DynamicPartitionsDefinition(name="code_snapshot")

# One run per backfill: `dagster asset materialize --partition-range a...b` and UI backfills run the
# partitions in a single process; every asset loops over `context.partition_keys` (assets/tracked.py).
single_run = dg.BackfillPolicy.single_run()


def add_partition(instance: dg.DagsterInstance, partitions_name: str, key: str) -> None:
    """Add `key` to a dynamic partitions definition unless it is there; a key is a store path segment, so an
    unsafe one raises `InvalidPartitionKey` before Dagster records it."""
    validate_partition_key(key)
    if key not in instance.get_dynamic_partitions(partitions_name):
        instance.add_dynamic_partitions(partitions_name, [key])
