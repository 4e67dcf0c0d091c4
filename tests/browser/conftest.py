"""Fixtures for the browser test: the stack a user opens with `make ui`, fresh, on 127.0.0.1.

Dagster webserver + daemon (separate processes, each in its own process group) on a fresh DAGSTER_HOME holding
the repo's dagster.yaml, the MLflow UI over the state dir's sqlite store, a small local site to crawl, and
Debian's headless Chromium driven by Playwright (no browser download). Screenshots go to ARTIFACTS.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from local_servers import graphql, static_site

from infra.settings import REPO_ROOT

BIN = Path(sys.executable).parent
CHROMIUM = os.environ.get("CRUCIBLE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("CRUCIBLE_BROWSER_ARTIFACTS", REPO_ROOT / ".crucible/test-artifacts/browser"))


def pytest_collection_modifyitems(config, items):
    """Without Chromium or Playwright the browser tests skip (before any server starts), saying why."""
    import importlib.util

    missing = None
    if not Path(CHROMIUM).exists():
        missing = f"no Chromium at {CHROMIUM}: `make browser-deps` (apt-get install chromium)"
    elif importlib.util.find_spec("playwright") is None:
        missing = "playwright is not installed: `pip install -e '.[dev]'`"
    if missing:
        here = Path(__file__).parent
        for item in items:
            if here in Path(item.path).parents:
                item.add_marker(pytest.mark.skip(reason=missing))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Stack:
    dagster_url: str
    mlflow_url: str
    tracking_uri: str
    state: Path
    dagster_home: Path
    logs: Path

    def graphql(self, query: str, variables: dict | None = None) -> dict:
        return graphql(self.dagster_url, query, variables)


def _start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "w") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:  # each leads its own process group (code servers and run processes included)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait_until(what: str, ready, procs: dict[str, tuple[subprocess.Popen, Path]], seconds: float) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        for name, (proc, log) in procs.items():
            assert proc.poll() is None, f"{name} exited:\n{log.read_text()[-3000:]}"
        try:
            if ready():
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    pytest.fail(f"{what} not ready within {seconds:.0f} s (logs in {next(iter(procs.values()))[1].parent})")


def _code_location_loaded(url: str) -> bool:
    nodes = graphql(url, "{ repositoriesOrError { ... on RepositoryConnection { nodes { name } } } }")
    return bool((nodes["repositoriesOrError"] or {}).get("nodes"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    """Dagster webserver + daemon and the MLflow UI on a fresh micro-profile state dir; stopped by pid."""
    root = tmp_path_factory.mktemp("browser_stack")
    state, logs = root / "state", root / "logs"
    home = state / "dagster"
    home.mkdir(parents=True)
    logs.mkdir()
    (state / "mlflow" / "artifacts").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    from dagster import DagsterInstance

    # create the sqlite storage once: webserver, daemon and their code servers creating it at the same moment
    # race on alembic's version table ("more than one head present", the code location then fails to load)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", str(home))  # dagster.yaml reads it
        DagsterInstance.get().dispose()
    dagster_url = f"http://127.0.0.1:{free_port()}"
    mlflow_port = free_port()
    mlflow_url = f"http://127.0.0.1:{mlflow_port}"
    tracking_uri = f"sqlite:///{state / 'mlflow' / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(
        CRUCIBLE_PROFILE="micro",
        CRUCIBLE_STATE_DIR=str(state),
        DAGSTER_HOME=str(home),
        CRUCIBLE_MLFLOW_UI_URL=mlflow_url,  # run links point here (infra/tracking.py ui_url)
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
    )
    dagster = ["-m", "assets.definitions"]
    mlflow_ui = [str(BIN / "mlflow"), "ui", "--backend-store-uri", tracking_uri, "--workers", "1"]
    mlflow_ui += ["--default-artifact-root", (state / "mlflow" / "artifacts").as_uri()]
    mlflow_ui += ["--host", "127.0.0.1", "--port", str(mlflow_port)]
    port = dagster_url.rsplit(":", 1)[1]
    commands = {
        "mlflow ui": mlflow_ui,
        "dagster-webserver": [str(BIN / "dagster-webserver"), *dagster, "-h", "127.0.0.1", "-p", port],
        "dagster-daemon": [str(BIN / "dagster-daemon"), "run", *dagster],
    }
    started = time.time()
    procs = {}
    for name, cmd in commands.items():
        log = logs / f"{name.replace(' ', '_')}.log"
        procs[name] = (_start(cmd, env, log), log)
    try:
        _wait_until("MLflow UI", lambda: requests.get(f"{mlflow_url}/health", timeout=2).ok, procs, 180)
        _wait_until(
            "Dagster webserver", lambda: requests.get(f"{dagster_url}/server_info", timeout=2).ok, procs, 180
        )
        _wait_until("Dagster code location", lambda: _code_location_loaded(dagster_url), procs, 180)
        graphql(dagster_url, "mutation { setNuxSeen }")  # the one-time pop-up would cover the page
        print(
            f"\nbrowser stack up in {time.time() - started:.0f} s: {dagster_url} {mlflow_url} (logs {logs})"
        )
        yield Stack(dagster_url, mlflow_url, tracking_uri, state, home, logs)
    finally:
        _stop([proc for proc, _ in procs.values()])


PAGES = {
    "/index.html": ("Crucible test site", ["crawl", "snapshot", "corpus", "filter"]),
    "/crawl.html": ("Crawling politely", ["index", "snapshot"]),
    "/snapshot.html": ("Snapshots", ["index", "corpus"]),
    "/corpus.html": ("Building a corpus", ["filter", "crawl"]),
    "/filter.html": ("Quality filters", ["index"]),
}
PROSE = (
    "A crawler fetches pages from the web, respects the robots file of every host, and stores what it "
    "fetched in WARC files so that later stages can extract, filter and deduplicate the text. "
)


@pytest.fixture(scope="module")
def site() -> str:
    """A five-page local web on 127.0.0.1 (robots.txt allows all); yields its seed URL."""
    pages = {}
    for path, (title, links) in PAGES.items():
        nav = " ".join(f'<a href="/{name}.html">{name}</a>' for name in links)
        body = f"<h1>{title}</h1><p>{PROSE * 6}</p><nav>{nav}</nav>"
        pages[path] = f"<html><head><title>{title}</title></head><body>{body}</body></html>"
    with static_site(pages) as base:
        yield f"{base}/index.html"


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """Where the screenshots go (printed); emptied at the start of the module."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    print(f"\nbrowser screenshots: {ARTIFACTS}")
    return ARTIFACTS


@pytest.fixture(scope="module")
def page():
    """A headless Debian Chromium page (1280x800) driven by Playwright."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        context.set_default_timeout(30_000)
        yield context.new_page()
        browser.close()
