"""The production Dagster instance (infra/deploy/dagster.yaml) on a real PostgreSQL: its storage section,
with the credentials coming from the environment as in the cluster, keeps runs, event logs and asset
materializations where a second instance in another DAGSTER_HOME reads them back.

Kubernetes is not here, so the run launcher section is dropped (the default launcher; the K8sRunLauncher
section is validated against Dagster's schema in tests/assets/test_instance_config.py); the S3 compute log
manager writes to the loopback S3 endpoint instead of AWS."""

from __future__ import annotations

import boto3
import dagster as dg
import yaml
from dagster._core.instance.config import dagster_instance_config

from infra.settings import REPO_ROOT

DEPLOY = REPO_ROOT / "infra" / "deploy" / "dagster.yaml"


def _home(tmp_path, name: str, postgres, db: str, s3_bucket: tuple[str, str]):
    """A DAGSTER_HOME holding the production instance config, pointed at the test Postgres and S3 bucket."""
    config = yaml.safe_load(DEPLOY.read_text())
    del config["run_launcher"]  # K8sRunLauncher: no cluster here
    endpoint, bucket = s3_bucket
    config["compute_logs"]["config"].update(
        bucket=bucket, endpoint_url=endpoint, local_dir=str(tmp_path / name / "logs")
    )
    pg = config["storage"]["postgres"]["postgres_db"]
    assert pg["password"] == {"env": "DAGSTER_PG_PASSWORD"}  # the secret stays an env ref
    pg.update(port=postgres.port, db_name=db)
    home = tmp_path / name
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return home


@dg.asset(key_prefix=["deploy"])
def tokens() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"docs_out": 41, "tokens_out": 9000})


def test_runs_and_materializations_live_in_postgres(tmp_path, monkeypatch, postgres, postgres_db, s3_bucket):
    db = postgres_db.rsplit("/", 1)[1]
    monkeypatch.setenv("DAGSTER_PG_HOST", postgres.host)
    monkeypatch.setenv("DAGSTER_PG_USER", postgres.user)
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", postgres.password)
    writer_home = _home(tmp_path, "writer", postgres, db, s3_bucket)
    config, _ = dagster_instance_config(str(writer_home))  # Dagster's own validator, env refs resolved
    assert config["storage"]["postgres"]["postgres_db"]["port"] == postgres.port

    with dg.DagsterInstance.from_config(str(writer_home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        result = dg.materialize([tokens], instance=instance, tags={"crucible/resource": "cpu"})
        assert result.success
        run_id = result.run_id

    # another process's view: a fresh instance from another home, sharing only the database
    reader_home = _home(tmp_path, "reader", postgres, db, s3_bucket)
    with dg.DagsterInstance.from_config(str(reader_home)) as reader:
        run = reader.get_run_by_id(run_id)
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags["crucible/resource"] == "cpu"
        event = reader.get_latest_materialization_event(dg.AssetKey(["deploy", "tokens"]))
        assert event.run_id == run_id
        metadata = event.asset_materialization.metadata
        assert (metadata["docs_out"].value, metadata["tokens_out"].value) == (41, 9000)
        types = [e.dagster_event_type.name for e in reader.all_logs(run_id) if e.is_dagster_event]
        for expected in ("RUN_START", "STEP_START", "ASSET_MATERIALIZATION", "STEP_SUCCESS", "RUN_SUCCESS"):
            assert expected in types, types
        assert types.index("RUN_START") < types.index("ASSET_MATERIALIZATION") < types.index("RUN_SUCCESS")

    # and the rows are in PostgreSQL itself
    with postgres.connect(db) as conn, conn.cursor() as cur:
        cur.execute("SELECT status FROM runs WHERE run_id = %s", (run_id,))
        assert cur.fetchone() == ("SUCCESS",)
        cur.execute(
            "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
            (run_id,),
        )
        assert cur.fetchone() == (1,)
    conn.close()

    # the step's stdout/stderr went to the bucket under the production prefix
    endpoint, bucket = s3_bucket
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys and all(k.startswith("compute-logs/storage/") for k in keys), keys
    assert any(k.endswith(".err") for k in keys), keys
    assert not list((reader_home).glob("history/**/*.db"))  # nothing fell back to sqlite in the homes
    assert not list((writer_home).glob("**/*.db"))
