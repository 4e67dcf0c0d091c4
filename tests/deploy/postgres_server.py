"""A real, throwaway PostgreSQL server (Debian's binaries) on 127.0.0.1 for the deployment tests.

initdb refuses to run as root, so under root the cluster belongs to Debian's `postgres` user (or `nobody`
where the package did not create it) and lives in a directory of its own under /tmp (pytest's root-owned temp dirs are closed to other users). Password auth over TCP, like a
managed Postgres; fsync off, since the data is thrown away.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "apt-get install postgresql-15 (Debian) puts initdb/postgres in /usr/lib/postgresql/15/bin"
USER = "crucible"


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    password: str

    def url(self, db: str) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{db}"

    def connect(self, db: str = "postgres"):
        import psycopg2

        return psycopg2.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, dbname=db
        )

    def create_database(self, name: str) -> str:
        """CREATE DATABASE name; returns its URL."""
        conn = self.connect()
        conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
        try:
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)


def postgres_bin_dir() -> Path | None:
    """Where initdb and postgres are: on PATH, else the newest /usr/lib/postgresql/<major>/bin."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("postgres"):
        return Path(initdb).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(server: Postgres, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    import psycopg2

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            server.connect().close()
            return
        except psycopg2.OperationalError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"postgres not ready after {timeout_s}s:\n{log.read_text()[-2000:]}"
                ) from None
            time.sleep(0.2)


def _server_user() -> pwd.struct_passwd:
    """Debian's `postgres` user, else `nobody` (initdb refuses root)."""
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return pwd.getpwnam("nobody")


@contextmanager
def postgres_server(timeout_s: float = 30.0) -> Iterator[Postgres]:
    """initdb + postgres on a free 127.0.0.1 port; yields the connection facts; fast shutdown at the end.
    Raises FileNotFoundError (with the Debian package to install) when the binaries are missing."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise FileNotFoundError(f"PostgreSQL server binaries not found: {INSTALL_HINT}")
    as_root = os.geteuid() == 0
    owner = _server_user() if as_root else None
    run_as = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []} if owner else {}
    work = Path(tempfile.mkdtemp(prefix="crucible-pg-"))
    password = secrets.token_hex(12)
    (work / "pwfile").write_text(password + "\n")
    if owner:
        os.chown(work, owner.pw_uid, owner.pw_gid)
        os.chown(work / "pwfile", owner.pw_uid, owner.pw_gid)
    data, log = work / "data", work / "postgres.log"
    proc = None
    try:
        subprocess.run(
            [
                str(bin_dir / "initdb"),
                "--pgdata",
                str(data),
                "--username",
                USER,
                "--pwfile",
                str(work / "pwfile"),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            cwd=work,
            timeout=120,
            **run_as,
        )
        (work / "pwfile").unlink()
        port = _free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    str(bin_dir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    str(work),  # the unix socket stays out of /var/run/postgresql
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work,
                start_new_session=True,
                **run_as,
            )
        server = Postgres("127.0.0.1", port, USER, password)
        _wait_ready(server, proc, log, timeout_s)
        yield server
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # "fast" shutdown: roll back clients, exit
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        shutil.rmtree(work, ignore_errors=True)
