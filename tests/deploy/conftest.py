"""Deployment tests: real servers on 127.0.0.1 standing in for the cluster's managed services."""

from __future__ import annotations

import uuid

import pytest
from postgres_server import (  # tests/deploy is on sys.path (prepend import mode)
    INSTALL_HINT,
    Postgres,
    postgres_bin_dir,
    postgres_server,
)


@pytest.fixture(scope="package")
def postgres() -> Postgres:
    """One PostgreSQL server for tests/deploy, stopped when they are done (skips, naming the Debian package,
    when it is not installed)."""
    if postgres_bin_dir() is None:
        pytest.skip(f"PostgreSQL server binaries not found: {INSTALL_HINT}")
    with postgres_server() as server:
        yield server


@pytest.fixture
def postgres_db(postgres) -> str:
    """A fresh database on the session's server; yields its URL (with the password)."""
    return postgres.create_database(f"t_{uuid.uuid4().hex[:12]}")
