"""Training examples for the world-knowledge classifier, by source.

Positives: Wikipedia passages (MediaWiki dump), dictionary entries (Debian dict-* packages, short entries
joined into passages of consecutive headwords), and web documents an LLM judge labels as knowledge-rich.
Negatives: crawled web documents and low-value text (fortune cookies). Each example carries its source and
its split group, so the held-out split never shares an article, a dictionary passage or a page with training.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterable
from pathlib import Path

from classifiers.labelled_text import LabelledText
from infra.local_web import fetch_doc_package
from pipelines.knowledge.dictd import dictd_databases, read_dictd
from pipelines.knowledge.document_shards import read_documents
from pipelines.knowledge.fortunes import fortune_files, read_fortunes
from pipelines.knowledge.wikipedia_dump import read_wikipedia_articles, split_paragraph_passages

log = logging.getLogger(__name__)


def _cap(examples: list[LabelledText], limit: int | None, seed: int) -> list[LabelledText]:
    if limit is None or len(examples) <= limit:
        return examples
    return random.Random(seed).sample(examples, limit)


def wikipedia_examples(
    dump_path: Path,
    limit: int | None,
    seed: int,
    min_chars: int = 300,
    max_chars: int = 1500,
    max_articles: int | None = None,
    stats: dict | None = None,
) -> list[LabelledText]:
    """Passages of Wikipedia articles; the article title is the split group."""
    out = []
    for n, article in enumerate(read_wikipedia_articles(dump_path, stats=stats)):
        if max_articles is not None and n >= max_articles:
            break
        out += [
            LabelledText(p, 1, "wikipedia", article.title)
            for p in split_paragraph_passages(article.text, min_chars, max_chars)
        ]
    return _cap(out, limit, seed)


def dictionary_examples(
    package: str,
    limit: int | None,
    seed: int,
    min_chars: int = 300,
    max_chars: int = 1500,
    cache_dir: Path | None = None,
) -> list[LabelledText]:
    """Entries of one dict-* package; consecutive short entries are joined up to `min_chars`."""
    out: list[LabelledText] = []
    for index in dictd_databases(fetch_doc_package(package, cache_dir)):
        current: list[str] = []
        first = ""
        for entry in read_dictd(index):
            current.append(entry.text[:max_chars])
            first = first or entry.headword
            if sum(len(t) for t in current) >= min_chars:
                out.append(LabelledText("\n\n".join(current), 1, package, f"{index.stem}:{first}"))
                current, first = [], ""
    return _cap(out, limit, seed)


def fortune_examples(
    packages: Iterable[str], limit: int | None, seed: int, min_chars: int = 40, cache_dir: Path | None = None
) -> list[LabelledText]:
    """Fortune cookies (quotes, jokes, one-liners): low-value text."""
    out, seen = [], set()
    for package in packages:
        for path in fortune_files(fetch_doc_package(package, cache_dir)):
            for f in read_fortunes(path, min_chars=min_chars):
                if f.text not in seen:  # fortunes-min repeats part of fortunes
                    seen.add(f.text)
                    out.append(LabelledText(f.text, 0, "fortunes", f"{f.collection}:{f.index}"))
    return _cap(out, limit, seed)


def document_group(doc: dict) -> str:
    """A web document's split group: its URL, else its id."""
    return str(
        doc.get("metadata", {}).get("url")
        or doc.get("id")
        or hashlib.sha256(doc["text"].encode()).hexdigest()
    )


def web_examples(
    store, prefixes: list[str], source: str, limit: int | None, seed: int, min_chars: int = 200, accept=None
) -> list[LabelledText]:
    """Crawled web documents under store prefixes as negatives; `accept(doc)` can exclude some."""
    out = []
    for prefix in prefixes:
        for doc in read_documents(store, prefix):
            if len(doc.get("text", "")) >= min_chars and (accept is None or accept(doc)):
                out.append(LabelledText(doc["text"], 0, source, document_group(doc)))
    return _cap(out, limit, seed)
