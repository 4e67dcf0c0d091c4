"""Partitions: web assets by crawl snapshot, code assets by code-source snapshot (both dynamic)."""

import dagster as dg

web_snapshots = dg.DynamicPartitionsDefinition(name="web_snapshot")
code_snapshots = dg.DynamicPartitionsDefinition(name="code_snapshot")

# One run per backfill: `dagster asset materialize --partition-range a...b` and UI backfills run the
# partitions in a single process; every asset loops over `context.partition_keys` (assets/tracked.py).
single_run = dg.BackfillPolicy.single_run()
