"""Shared fixtures: every test runs on the `micro` profile with its state in a temp dir; servers that tests
need (S3 endpoint) start on 127.0.0.1 with a free port and stop when the test session ends."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from infra.signals import keep_children_stoppable

# A pytest-xdist worker ignores SIGINT; after a test's in-process Dagster run every process the worker started
# then ignored SIGTERM too (infra/signals.py): each LLM-server fixture waited 10 s for its SIGKILL.
keep_children_stoppable()

os.environ.setdefault("CRUCIBLE_PROFILE", "micro")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# MLflow caches one SQLAlchemy engine per database URI for the life of the process, and its default pool keeps
# connections open: every test has its own MLflow database, so a test worker would hold two file descriptors
# per test it ran and, near the end of the suite, hit the open-file limit ("unable to open database file").
# NullPool closes each connection when its session ends.
os.environ.setdefault("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
# One intra-op thread for torch (and BLAS) in the tests and every process they start, before torch is
# imported: the models here are micro-sized, and on a 2-core box two threads that spin against another busy
# process run ~10x slower than one (measured: the micro post_training_report took 162 s with two threads next
# to a training run, 16 s with one).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Each test gets its own state dir; the packaged model files are shared so they are fetched once per machine.
_REPO_STATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".crucible")
os.environ.setdefault(
    "CRUCIBLE_MODELS_DIR", os.path.join(os.environ.get("CRUCIBLE_STATE_DIR", _REPO_STATE), "models")
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def port() -> int:
    """A free TCP port on 127.0.0.1."""
    return free_port()


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    """Isolate every test's state (store, MLflow, Dagster) unless a test sets its own."""
    monkeypatch.setenv("CRUCIBLE_PROFILE", "micro")
    monkeypatch.setenv("CRUCIBLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield


@pytest.fixture(scope="session", autouse=True)
def _artifact_root(tmp_path_factory):
    """Stages called directly (not through an asset, which removes them once logged) leave their artifact
    dirs under pytest's temp dir, not in /tmp."""
    import infra.figures

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(infra.figures, "ARTIFACT_ROOT", tmp_path_factory.mktemp("artifacts"))
        yield


@pytest.fixture
def dagster_home(tmp_path, monkeypatch):
    """A fresh DAGSTER_HOME holding the instance config we ship (dagster.yaml)."""
    import shutil

    from infra.settings import REPO_ROOT

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 HTTP endpoint (moto server) on 127.0.0.1 with dummy credentials."""
    from moto.server import ThreadedMotoServer

    creds = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in creds}
    os.environ.update(creds)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A fresh bucket on the loopback endpoint; yields (endpoint, bucket name)."""
    import boto3

    name = f"crucible-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return s3_endpoint, name


def pytest_collection_modifyitems(config, items):
    """Whole-graph and UI tests (`e2e`, the longest modules) first: `make test` runs two pytest-xdist workers,
    and a 10-minute module scheduled last would run alone at the end."""
    items.sort(
        key=lambda item: (item.get_closest_marker("e2e") is None, item.path.name != "test_whole_graph.py")
    )
