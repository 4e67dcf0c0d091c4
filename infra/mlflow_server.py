"""The MLflow tracking server of the `cluster` profile: Postgres backend, artifacts proxied to S3.

One source for its command line: `server_argv` builds the argv that tests/deploy/test_mlflow_server.py runs
against a real PostgreSQL and the loopback S3 endpoint, and that `manifest()` renders into the Kubernetes
manifest infra/deploy/mlflow.yaml (`python -m infra.mlflow_server > infra/deploy/mlflow.yaml`; a test checks
that the file is what this module renders). Secrets never enter the argv: the backend URI (with its password)
comes from the environment (`MLFLOW_BACKEND_STORE_URI`, a Kubernetes Secret in production).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from urllib.parse import quote

import yaml

NAMESPACE = "crucible"  # the namespace of infra/deploy/dagster.yaml's run launcher
SECRET = "crucible-secrets"  # the Secret dagster.yaml's env_secrets mounts into runs
BACKEND_URI_KEY = "mlflow-backend-store-uri"  # backend_store_uri(...) in SECRET
PORT = 5000


@dataclass(frozen=True)
class ServerSpec:
    """What the server command line holds (no secrets)."""

    artifacts_destination: str  # s3://bucket/prefix: clients upload through the server, need no S3 keys
    host: str = "0.0.0.0"
    port: int = PORT
    workers: int = 4
    allowed_hosts: tuple[str, ...] = ()  # Host headers besides localhost/private IPs (the Service name)


# Production: the Service `mlflow` in NAMESPACE; runs reach it as http://mlflow.crucible:5000
# (MLFLOW_TRACKING_URI in the `cluster` profile's environment).
PRODUCTION = ServerSpec(
    artifacts_destination="s3://crucible-mlflow/artifacts",
    allowed_hosts=(f"mlflow.{NAMESPACE}", f"mlflow.{NAMESPACE}:{PORT}", f"mlflow.{NAMESPACE}.svc:{PORT}"),
)


def backend_store_uri(user: str, password: str, host: str, port: int = 5432, db: str = "mlflow") -> str:
    """The SQLAlchemy URI of the Postgres backend. The driver is named: SQLAlchemy 2.1 maps a bare
    `postgresql://` to psycopg 3, and the image ships psycopg2 (with dagster-postgres)."""
    return f"postgresql+psycopg2://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/{db}"


def server_argv(spec: ServerSpec, mlflow_bin: str = "mlflow") -> list[str]:
    """`mlflow server ...` for `spec`; the backend store URI is read from MLFLOW_BACKEND_STORE_URI."""
    argv = [
        mlflow_bin,
        "server",
        "--serve-artifacts",
        "--artifacts-destination",
        spec.artifacts_destination,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--workers",
        str(spec.workers),
    ]
    if spec.allowed_hosts:
        argv += ["--allowed-hosts", ",".join(spec.allowed_hosts)]
    return argv


def server_env(backend_store_uri: str, s3_endpoint_url: str | None = None) -> dict[str, str]:
    """Environment the server needs besides AWS credentials (instance role / IRSA in production)."""
    env = {
        "MLFLOW_BACKEND_STORE_URI": backend_store_uri,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no background job workers (not used here)
    }
    if s3_endpoint_url:  # MinIO, moto; None = AWS
        env["MLFLOW_S3_ENDPOINT_URL"] = s3_endpoint_url
    return env


def manifest(spec: ServerSpec = PRODUCTION, image: str = "crucible:latest") -> list[dict]:
    """Deployment + Service for the server; the image is the project's (mlflow, psycopg2, boto3 installed)."""
    labels = {"app.kubernetes.io/name": "mlflow", "app.kubernetes.io/part-of": "crucible"}
    container = {
        "name": "mlflow",
        "image": image,
        "command": server_argv(spec),
        "env": [
            {
                "name": "MLFLOW_BACKEND_STORE_URI",
                "valueFrom": {"secretKeyRef": {"name": SECRET, "key": BACKEND_URI_KEY}},
            },
            {"name": "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "value": "false"},
        ],
        "ports": [{"name": "http", "containerPort": spec.port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "initialDelaySeconds": 60,  # the first start migrates the Postgres schema
            "periodSeconds": 30,
        },
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "mlflow", "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                # S3 access through the pod's service account (IRSA / workload identity), not keys
                "spec": {"serviceAccountName": "crucible-mlflow", "containers": [container]},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "mlflow", "namespace": NAMESPACE, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": spec.port, "targetPort": "http"}]},
    }
    return [deployment, service]


class _PlainDumper(yaml.SafeDumper):
    """No &anchors/*aliases for the repeated label maps: the manifest stays readable."""

    def ignore_aliases(self, data):
        return True


def render(docs: list[dict]) -> str:
    header = "# Generated by `python -m infra.mlflow_server` (infra/mlflow_server.py); do not edit by hand.\n"
    return header + yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False)


if __name__ == "__main__":
    sys.stdout.write(render(manifest()))
