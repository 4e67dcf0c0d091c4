"""Servers the tests start on 127.0.0.1 (real processes and sockets), each stopped when its block ends:
a static site for crawls and `dagster dev` in its own process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

BIN = Path(sys.executable).parent
ALLOW_ALL = "User-agent: *\nAllow: /\n"


@contextmanager
def static_site(pages: Mapping[str, str], robots: str = ALLOW_ALL) -> Iterator[str]:
    """Serve `pages` ({path: html}) and robots.txt; yields the base URL `http://127.0.0.1:PORT`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/robots.txt":
                body, ctype = robots.encode(), "text/plain"
            elif self.path in pages:
                body, ctype = pages[self.path].encode(), "text/html; charset=utf-8"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def graphql(url: str, query: str, variables: dict | None = None) -> dict:
    """POST a GraphQL query to a Dagster webserver; returns `data`, failing on GraphQL errors."""
    resp = requests.post(f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60)
    resp.raise_for_status()
    body = resp.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


@contextmanager
def dagster_dev(
    args: list[str], port: int, log_path: Path, cwd: Path, timeout_s: float = 120
) -> Iterator[str]:
    """`dagster dev ARGS -h 127.0.0.1 -p PORT` in its own process group (it ignores signals otherwise);
    yields its URL once /server_info answers, and kills the group on the way out."""
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [str(BIN / "dagster"), "dev", *args, "-h", "127.0.0.1", "-p", str(port)],
        cwd=cwd,
        env=os.environ.copy(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                if requests.get(f"{url}/server_info", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.time() > deadline:
                raise TimeoutError(f"dagster dev did not come up in {timeout_s:.0f} s (log: {log_path})")
            time.sleep(1)
        yield url
    finally:
        # a throwaway instance: a short grace, then SIGKILL (its daemon can take 30 s to stop on SIGTERM)
        stop_process_group(proc, grace_s=5)
        log.close()


def stop_process_group(proc: subprocess.Popen, grace_s: float = 15) -> None:
    """SIGTERM the process group of a server started with start_new_session=True, then SIGKILL it."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
