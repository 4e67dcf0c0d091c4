"""The production MLflow server command line (infra/mlflow_server.py), run for real: a Postgres backend
(Debian's PostgreSQL) and artifacts proxied to S3 (the loopback moto endpoint). The project's Tracker logs
over HTTP; the rows must land in Postgres and the artifact bytes in the bucket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import kubernetes.client
import pytest
import requests
import yaml
from k8s_schema import k8s_object  # tests/deploy is on sys.path
from local_servers import stop_process_group

from infra.mlflow_server import (
    PRODUCTION,
    ServerSpec,
    backend_store_uri,
    manifest,
    render,
    server_argv,
    server_env,
)
from infra.settings import REPO_ROOT
from infra.tracking import Tracker

BIN = Path(sys.executable).parent


@pytest.fixture
def mlflow_server(postgres, postgres_db, s3_bucket, port, tmp_path):
    """`mlflow server` (the production argv, on 127.0.0.1 with one worker) until /health answers."""
    endpoint, bucket = s3_bucket
    spec = ServerSpec(artifacts_destination=f"s3://{bucket}/mlflow", host="127.0.0.1", port=port, workers=1)
    argv = server_argv(spec, mlflow_bin=str(BIN / "mlflow"))
    db = postgres_db.rsplit("/", 1)[1]
    backend = backend_store_uri(postgres.user, postgres.password, postgres.host, postgres.port, db)
    log_path = tmp_path / "mlflow-server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **server_env(backend, s3_endpoint_url=endpoint)},
            cwd=tmp_path,  # nothing may fall back to ./mlruns or ./mlartifacts unnoticed
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers die with the group
        )
    url = f"http://127.0.0.1:{spec.port}"
    try:
        deadline = time.monotonic() + 60  # the first start migrates an empty Postgres schema
        while True:
            assert proc.poll() is None, f"mlflow server exited:\n{log_path.read_text()[-3000:]}"
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:  # not listening yet, or slow under load
                pass
            assert time.monotonic() < deadline, f"no /health in 60 s:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.3)
        yield url, argv, bucket, endpoint, log_path
    finally:
        stop_process_group(proc)


def test_server_keeps_runs_in_postgres_and_artifacts_in_s3(mlflow_server, postgres, postgres_db, tmp_path):
    url, argv, bucket, endpoint, log_path = mlflow_server
    assert postgres.password not in " ".join(argv)  # the backend URI travels in the environment only

    tracker = Tracker(url, experiment_prefix="crucible")
    report = tmp_path / "report.json"
    report.write_text('{"docs_out": 41}\n')
    with tracker.stage_run(
        "deploy", "smoke", tags={"dagster.asset_key": "smoke"}, params={"lr": 0.003}
    ) as run:
        run.log_history([{"step": s, "loss": 4.0 / (s + 1)} for s in range(5)])
        run.log_artifact(report)
        run.log_text("weights", "model/weights.txt")
    version = tracker.register_model("crucible-smoke", run.run_id, "model", tags={"stage": "smoke"})

    # read back over HTTP
    got = tracker.get_run(run.run_id)
    assert got.info.status == "FINISHED" and got.data.params == {"lr": "0.003"}
    history = tracker.client.get_metric_history(run.run_id, "loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (s, 4.0 / (s + 1)) for s in range(5)
    ]
    assert got.info.artifact_uri.startswith("mlflow-artifacts:/")  # proxied: clients hold no S3 keys
    fetched = tracker.client.download_artifacts(run.run_id, "report.json", str(tmp_path / "back"))
    assert Path(fetched).read_text() == '{"docs_out": 41}\n'
    assert version.version == "1"
    assert tracker.model_version_run_id("crucible-smoke", "1") == run.run_id

    # the bytes are in the bucket under the server's destination prefix
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="mlflow/").get("Contents", [])}
    prefix = f"mlflow/{run.experiment_id}/{run.run_id}/artifacts"
    assert keys == {f"{prefix}/report.json", f"{prefix}/model/weights.txt"}
    body = s3.get_object(Bucket=bucket, Key=f"{prefix}/report.json")["Body"].read()
    assert body == b'{"docs_out": 41}\n'

    # the rows are in Postgres
    with postgres.connect(postgres_db.rsplit("/", 1)[1]) as conn, conn.cursor() as cur:
        cur.execute("SELECT status, name FROM runs WHERE run_uuid = %s", (run.run_id,))
        assert cur.fetchone() == ("FINISHED", "smoke")
        cur.execute("SELECT key, value FROM params WHERE run_uuid = %s", (run.run_id,))
        assert cur.fetchall() == [("lr", "0.003")]
        cur.execute(
            "SELECT count(*), min(value) FROM metrics WHERE run_uuid = %s AND key = 'loss'", (run.run_id,)
        )
        assert cur.fetchone() == (5, pytest.approx(0.8))
        cur.execute("SELECT version, run_id FROM model_versions WHERE name = 'crucible-smoke'")
        assert cur.fetchall() == [(1, run.run_id)]
    assert postgres.password not in log_path.read_text()  # the server never logs its backend credentials


def test_deployed_manifest_runs_the_tested_command_line():
    """infra/deploy/mlflow.yaml is what infra/mlflow_server.py renders: the argv above, the secret by reference."""
    path = REPO_ROOT / "infra" / "deploy" / "mlflow.yaml"
    assert path.read_text() == render(manifest()), "regenerate: python -m infra.mlflow_server > " + str(path)
    deployment, service = yaml.safe_load_all(path.read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == server_argv(PRODUCTION)
    assert container["command"][:2] == ["mlflow", "server"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"] == {
        "name": "crucible-secrets",
        "key": "mlflow-backend-store-uri",
    }
    assert service["spec"]["ports"][0]["port"] == PRODUCTION.port
    # Kubernetes' schema (the python client's models, strictly: unknown keys and missing required fields fail)
    assert (
        k8s_object(kubernetes.client.V1Deployment, deployment).spec.template.spec.containers[0].name
        == "mlflow"
    )
    assert k8s_object(kubernetes.client.V1Service, service).spec.ports[0].target_port == "http"
    container["ports"][0]["containerPorts"] = 5000  # a typo is caught
    with pytest.raises(Exception, match="containerPorts"):
        k8s_object(kubernetes.client.V1Deployment, deployment)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # the Service's name is an allowed Host header (mlflow rejects other hosts: DNS-rebinding guard)
    assert f"mlflow.{deployment['metadata']['namespace']}:{PRODUCTION.port}" in PRODUCTION.allowed_hosts
