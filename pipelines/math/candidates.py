"""Math & science candidate documents: crawled web documents plus math/science sources.

Every candidate is a datatrove-style document `{"text", "id", "metadata": {"source", ...}}`; web documents
keep their metadata (url, snapshot, language) and get `source = "web"`.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from pathlib import Path

from infra.local_web import fetch_doc_package
from infra.store import ObjectStore
from pipelines.knowledge.document_shards import read_documents
from pipelines.math.doc_pages import MATH_DOC_PACKAGES, champ_problems, doc_page_paths, iter_doc_pages

log = logging.getLogger(__name__)


def web_candidates(store: ObjectStore, prefixes: list[str], min_chars: int, stats: Counter) -> list[dict]:
    out = []
    for prefix in prefixes:
        for doc in read_documents(store, prefix):
            if len(doc.get("text", "")) < min_chars:
                stats["dropped/candidates/too_short"] += 1
                continue
            doc["metadata"]["source"] = "web"
            out.append(doc)
    return out


def doc_package_candidates(
    package: str, min_chars: int, max_docs: int | None = None, seed: int = 0, cache_dir: Path | None = None
) -> list[dict]:
    """Main text of HTML pages of a Debian math documentation package (see MATH_DOC_PACKAGES): a seeded
    sample of at most `max_docs` pages, parsed lazily so a small sample stays cheap."""
    root = fetch_doc_package(package, cache_dir)
    html_root = root / MATH_DOC_PACKAGES[package]
    paths = doc_page_paths(html_root)
    random.Random(seed).shuffle(paths)
    out = []
    for page in iter_doc_pages(html_root, min_chars=min_chars, paths=paths):
        rel = str(Path(page.path).relative_to(html_root))
        out.append(
            {
                "text": page.main_text,
                "id": f"{package}:{rel}",
                "metadata": {"source": package, "path": rel, "title": page.title},
            }
        )
        if max_docs is not None and len(out) >= max_docs:
            break
    return out


def champ_candidates() -> list[dict]:
    """Competition problems with worked solutions (PyPI champ-dataset)."""
    return [
        {
            "text": f"Problem: {p['problem']}\n\nSolution: {p['solution']}",
            "id": f"champ:{p['id']}",
            "metadata": {"source": "champ-dataset", "category": p["category"]},
        }
        for p in champ_problems()
    ]


def gather_candidates(
    store: ObjectStore,
    web_prefixes: list[str],
    doc_packages: list[str],
    use_champ: bool,
    min_chars: int,
    max_per_source: int | None,
    seed: int,
    stats: Counter,
    cache_dir: Path | None = None,
) -> list[dict]:
    """All candidates, at most `max_per_source` per source (a seeded sample), counted per source."""
    by_source: dict[str, list[dict]] = {"web": web_candidates(store, web_prefixes, min_chars, stats)}
    for package in doc_packages:
        by_source[package] = doc_package_candidates(package, min_chars, max_per_source, seed, cache_dir)
    if use_champ:
        by_source["champ-dataset"] = champ_candidates()
    out = []
    for source, docs in by_source.items():
        if max_per_source is not None and len(docs) > max_per_source:
            docs = random.Random(seed).sample(docs, max_per_source)
        stats[f"candidates/{source}"] += len(docs)
        out += docs
    log.info("math candidates: %s", {k: v for k, v in stats.items() if k.startswith("candidates/")})
    return out
