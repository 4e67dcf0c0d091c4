"""Fixtures for the Dagster layer: an isolated DAGSTER_HOME and a live `dagster dev` (webserver + daemon)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from local_servers import dagster_dev, static_site
from local_servers import graphql as run_graphql

from infra.settings import REPO_ROOT

BIN = Path(sys.executable).parent


@pytest.fixture
def graphql():
    """POST a GraphQL query to a webserver; returns `data`, failing on GraphQL errors."""
    return run_graphql


@pytest.fixture
def dagster_webserver(dagster_home, port):
    """`dagster dev` on 127.0.0.1 in its own process group (it ignores signals otherwise)."""
    with dagster_dev(["-m", "assets.definitions"], port, dagster_home / "dagster_dev.log", REPO_ROOT) as url:
        yield url


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
    with static_site(_docs_pages()) as base:
        yield f"{base}/index.html"
