"""Fixtures for the Dagster layer: an isolated DAGSTER_HOME and a live `dagster dev` (webserver + daemon)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from infra.settings import REPO_ROOT

BIN = Path(sys.executable).parent


@pytest.fixture
def dagster_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def _graphql(url: str, query: str, variables: dict | None = None) -> dict:
    resp = requests.post(f"{url}/graphql", json={"query": query, "variables": variables or {}}, timeout=60)
    resp.raise_for_status()
    body = resp.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


@pytest.fixture
def graphql():
    """POST a GraphQL query to a webserver; returns `data`, failing on GraphQL errors."""
    return _graphql


@pytest.fixture
def dagster_webserver(dagster_home, port):
    """`dagster dev` on 127.0.0.1 in its own process group (it ignores signals otherwise)."""
    log = open(dagster_home / "dagster_dev.log", "w")
    proc = subprocess.Popen(
        [str(BIN / "dagster"), "dev", "-m", "assets.definitions", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO_ROOT,
        env=os.environ.copy(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            assert proc.poll() is None, (dagster_home / "dagster_dev.log").read_text()[-3000:]
            try:
                if requests.get(f"{url}/server_info", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(1)
        else:
            pytest.fail("dagster webserver did not come up in 120 s")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _is_prose(paragraph: str) -> bool:
    words = paragraph.split()
    return len(words) >= 8 and sum(w.strip(".,;:()'\"").isalpha() for w in words) >= 0.9 * len(words)


def _docs_pages() -> dict[str, str]:
    """Interlinked HTML pages of real English prose: the docstrings of standard-library modules."""
    import html
    import importlib
    import inspect

    names = [
        "json",
        "argparse",
        "collections",
        "functools",
        "itertools",
        "pathlib",
        "subprocess",
        "logging",
        "threading",
        "unittest",
        "csv",
        "datetime",
        "decimal",
        "fractions",
        "statistics",
        "textwrap",
    ]
    pages = {}
    for i, name in enumerate(names):
        module = importlib.import_module(name)
        parts = [inspect.getdoc(module) or ""]
        for _, obj in inspect.getmembers(module, lambda o: inspect.isclass(o) or inspect.isfunction(o)):
            doc = inspect.getdoc(obj)
            if doc and len(doc) > 200:
                parts.append(doc)
            if sum(map(len, parts)) > 12000:
                break
        paragraphs = [" ".join(p.split()) for p in "\n\n".join(parts).split("\n\n")]
        body = "".join(f"<p>{html.escape(p)}</p>" for p in paragraphs if _is_prose(p))
        links = " ".join(f'<a href="/{n}.html">{n}</a>' for n in names[i + 1 : i + 4])
        pages[f"/{name}.html"] = (
            f"<html><head><title>{name}</title></head><body><h1>The {name} module</h1>"
            f"<article>{body}</article><nav>{links}</nav></body></html>"
        )
    pages["/index.html"] = (
        "<html><body>" + " ".join(f'<a href="/{n}.html">{n}</a>' for n in names) + "</body></html>"
    )
    return pages


@pytest.fixture(scope="session")
def docs_site():
    """A small local web on 127.0.0.1 (robots.txt allows all); yields the seed URL."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    pages = _docs_pages()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/robots.txt":
                body, ctype = b"User-agent: *\nAllow: /\n", "text/plain"
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
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
