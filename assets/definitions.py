"""The Crucible asset graph: `dagster dev -m assets.definitions` (or `make ui`)."""

import dagster as dg

from assets import web_crawl, web_extract
from assets.resources import resources_for
from assets.sensors import web_snapshot_sensor
from infra.settings import load_profile

PROFILE = load_profile()

web_assets = [web_crawl.web_warc, web_extract.web_documents, web_extract.web_filtered]

# Run tags drive the queue limits in dagster.yaml (`crucible/resource`).
web_corpus = dg.define_asset_job(
    "web_corpus", selection=dg.AssetSelection.assets(*web_assets), tags={"crucible/resource": "cpu"}
)

defs = dg.Definitions(
    assets=[*web_assets],
    jobs=[web_corpus],
    sensors=[web_snapshot_sensor],
    resources=resources_for(PROFILE),
    executor=dg.in_process_executor,
)
