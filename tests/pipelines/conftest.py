"""Fixtures for the web-crawl tests: test sites on 127.0.0.1 (see web_site.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from web_site import Route, Site  # tests/pipelines is on sys.path (prepend import mode)


@pytest.fixture
def make_site() -> Iterator[Callable[..., Site]]:
    """Start test sites on 127.0.0.1 (free ports); all are stopped when the test ends."""
    sites: list[Site] = []

    def make(routes: dict[str, Route], robots: str | None = "User-agent: *\nAllow: /\n") -> Site:
        sites.append(Site(routes, robots))
        return sites[-1]

    yield make
    for site in sites:
        site.close()
