"""The web slice of the graph through Dagster's CLI and a live webserver's GraphQL API, with MLflow lineage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.settings import REPO_ROOT, load_profile
from infra.tracking import UPSTREAM_RUNS_TAG, Tracker

BIN = Path(sys.executable).parent
WEB_ASSETS = ["web_warc", "web_documents", "web_filtered"]
SNAPSHOT_FILE = Path(__file__).with_name("asset_graph.json")


def _crawl_config(seed: str) -> dict:
    return {
        "ops": {
            "web_warc": {
                "config": {
                    "source": "seeds",
                    "seeds": [seed],
                    "max_pages": 20,
                    "allow_private_networks": ["127.0.0.0/8"],
                }
            }
        }
    }


def _graph() -> dict:
    from assets.definitions import defs

    graph = {}
    for node in defs.resolve_asset_graph().asset_nodes:
        graph[node.key.to_user_string()] = {
            "group": node.group_name,
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "partitions": getattr(node.partitions_def, "name", None) if node.partitions_def else None,
            "checks": sorted(c.name for c in node.check_keys),
        }
    return graph


def test_asset_graph_snapshot():
    """A change to the DAG is a visible diff (CRUCIBLE_UPDATE_SNAPSHOT=1 rewrites the file)."""
    graph = _graph()
    if os.environ.get("CRUCIBLE_UPDATE_SNAPSHOT"):
        SNAPSHOT_FILE.write_text(json.dumps(graph, indent=2, sort_keys=True) + "\n")
    assert graph == json.loads(SNAPSHOT_FILE.read_text())
    assert graph["web_filtered"]["deps"] == ["web_documents"]


def _runs_by_asset(partition: str) -> dict[str, object]:
    tracker = Tracker.from_profile(load_profile())
    runs = tracker.find_runs("web", f"tags.`dagster.partition_key` = '{partition}'")
    return {r.data.tags["dagster.asset_key"]: r for r in runs}


def _materialize(*args: str) -> subprocess.CompletedProcess:
    cmd = [
        str(BIN / "dagster"),
        "asset",
        "materialize",
        "-m",
        "assets.definitions",
        "--select",
        ",".join(WEB_ASSETS),
        *args,
    ]
    return subprocess.run(
        cmd, cwd=REPO_ROOT, env=os.environ.copy(), capture_output=True, text=True, timeout=600
    )


@pytest.mark.e2e
def test_cli_materialize_partition_and_backfill_range(dagster_home, docs_site):
    import dagster as dg

    instance = dg.DagsterInstance.get()
    instance.add_dynamic_partitions("web_snapshot", ["s1", "s2", "s3"])
    config = json.dumps(_crawl_config(docs_site))

    one = _materialize("--partition", "s1", "--config-json", config)
    assert one.returncode == 0, one.stderr[-4000:]
    runs = _runs_by_asset("s1")
    assert set(runs) == set(WEB_ASSETS)
    warc, docs, kept = (runs[a] for a in WEB_ASSETS)
    for run in runs.values():
        tags = run.data.tags
        assert run.info.status == "FINISHED"
        assert tags["crucible.profile"] == "micro" and tags["crucible.git_commit"]
        assert tags["crucible.code_version"] and tags["dagster.run_id"]
    assert docs.data.tags[UPSTREAM_RUNS_TAG] == warc.info.run_id
    assert kept.data.tags[UPSTREAM_RUNS_TAG] == docs.info.run_id
    assert warc.data.params["max_pages"] == "20"  # the launch config, not the profile default
    assert warc.data.metrics["pages_fetched"] >= 10 and kept.data.metrics["docs_out"] >= 1

    # Dagster metadata links back to the MLflow run
    event = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("web_filtered"), asset_partitions=["s1"]), limit=1
    ).records[0]
    metadata = event.asset_materialization.metadata
    assert metadata["mlflow_run_id"].value == kept.info.run_id
    assert "mlflow_run_url" not in metadata  # no MLflow UI answers during the test: no dead link

    backfill = _materialize("--partition-range", "s2...s3", "--config-json", config)
    assert backfill.returncode == 0, backfill.stderr[-4000:]
    for part in ("s2", "s3"):
        runs = _runs_by_asset(part)
        assert set(runs) == set(WEB_ASSETS), f"one MLflow run per asset and partition ({part})"
        assert runs["web_documents"].data.tags[UPSTREAM_RUNS_TAG] == runs["web_warc"].info.run_id
    assert instance.get_materialized_partitions(dg.AssetKey("web_filtered")) == {"s1", "s2", "s3"}


@pytest.mark.e2e
def test_graphql_launches_partitioned_run(dagster_webserver, docs_site, graphql):
    url = dagster_webserver
    repos = graphql(
        url, "{ repositoriesOrError { ... on RepositoryConnection { nodes { name location { name } } } } }"
    )
    repo = repos["repositoriesOrError"]["nodes"][0]
    selector = {"repositoryLocationName": repo["location"]["name"], "repositoryName": repo["name"]}
    added = graphql(
        url,
        """mutation($sel: RepositorySelector!, $key: String!) {
        addDynamicPartition(repositorySelector: $sel, partitionsDefName: "web_snapshot", partitionKey: $key) {
          __typename } }""",
        {"sel": selector, "key": "gql-1"},
    )
    assert added["addDynamicPartition"]["__typename"] == "AddDynamicPartitionSuccess"
    launched = graphql(
        url,
        """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
        __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
        ... on RunConfigValidationInvalid { errors { message } } } }""",
        {
            "p": {
                "selector": {**selector, "jobName": "web_corpus"},
                "runConfigData": _crawl_config(docs_site),
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "gql-1"}]},
            }
        },
    )
    assert launched["launchRun"]["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["launchRun"]["run"]["runId"]
    status, deadline = None, time.time() + 480
    while time.time() < deadline:
        status = graphql(
            url, "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", {"id": run_id}
        )["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(2)
    if status != "SUCCESS":
        logs = graphql(
            url,
            """query($id: ID!) { logsForRun(runId: $id) { ... on EventConnection { events {
            __typename ... on MessageEvent { message } ... on ErrorEvent { error { message cause { message stack } } } } } } }""",
            {"id": run_id},
        )
        pytest.fail(f"run {status}: {json.dumps(logs)[-4000:]}")
    assert set(_runs_by_asset("gql-1")) == set(WEB_ASSETS)
