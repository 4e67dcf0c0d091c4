"""The throwaway PostgreSQL the deployment tests use is a real server: password auth, SQL, its own database."""

from __future__ import annotations

import subprocess

import psycopg2
import pytest
from postgres_server import postgres_bin_dir


def test_server_runs_sql_with_password_auth(postgres, postgres_db):
    db = postgres_db.rsplit("/", 1)[1]
    with postgres.connect(db) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE t (k int PRIMARY KEY, v text)")
        cur.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
        cur.execute("SELECT sum(k), string_agg(v, ',' ORDER BY k), current_database() FROM t")
        assert cur.fetchone() == (3, "a,b", db)
        cur.execute("SHOW server_version_num")
        major = int(cur.fetchone()[0]) // 10000
    version = subprocess.run(
        [str(postgres_bin_dir() / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout  # "postgres (PostgreSQL) 15.x": the server is the binary we found
    assert version.split()[-1].split(".")[0] == str(major)
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(
            host=postgres.host, port=postgres.port, user=postgres.user, password="wrong", dbname=db
        )
