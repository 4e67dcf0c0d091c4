"""The README and docs/ are all a user who clones the repository has: their links and the repository paths they
name must exist, so moving a file or a section cannot leave a reader at a dead end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# The measurement log keeps each entry as it was written, naming files that later commits removed.
HISTORY = {REPO / "docs" / "post_training_results.md"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
# each segment ends at its "/", so a back-quoted text that is no path fails at once instead of backtracking
CODE_PATH = re.compile(r"`([A-Za-z0-9_.-]+/(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]*)`")
TOP_DIRS = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}


def relative_links(text: str) -> list[str]:
    links = (m.group(1).split("#")[0] for m in LINK.finditer(text))
    return [link for link in links if link and not re.match(r"[a-z]+:", link)]


def repo_paths(text: str) -> list[str]:
    """Back-quoted paths under a top-level directory of the repository (`training/rl/loop.py`); state-dir and
    MLflow paths (`plots/x.png`, `<state>/runs/...`) start elsewhere or hold a placeholder."""
    found = (m.group(1) for m in CODE_PATH.finditer(text))
    return [p for p in found if p.split("/")[0] in TOP_DIRS]


def test_the_checks_find_links_and_paths_and_skip_urls_and_state_paths():
    text = (
        "See [the design](docs/architecture.md#layers), [PyPI](https://pypi.org/) and [mail](mailto:a@b.c); "
        "code in `training/rl/loop.py` and `infra/`, artifacts in `plots/curves.png` and `<state>/runs/x`."
    )
    assert relative_links(text) == ["docs/architecture.md"]
    assert repo_paths(text) == ["training/rl/loop.py", "infra/"]
    assert "docs/post_training.md" in relative_links((REPO / "README.md").read_text())


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(doc: Path):
    missing = [link for link in relative_links(doc.read_text()) if not (doc.parent / link).exists()]
    assert not missing, f"{doc.relative_to(REPO)} links to missing files: {missing}"


@pytest.mark.parametrize("doc", sorted(set(DOCS) - HISTORY), ids=lambda d: d.relative_to(REPO).as_posix())
def test_every_named_repository_path_exists(doc: Path):
    missing = [p for p in repo_paths(doc.read_text()) if not (REPO / p).exists()]
    assert not missing, f"{doc.relative_to(REPO)} names paths that do not exist: {missing}"
