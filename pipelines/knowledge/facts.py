"""(term, definition) facts from Debian's dictd dictionaries, for the knowledge task suite and SFT chats."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from pathlib import Path

from infra.local_web import fetch_doc_package
from pipelines.knowledge.dictd import dictd_databases, read_dictd

_TERM = re.compile(r"^[A-Za-z][A-Za-z -]{2,30}$")
_TAG = re.compile(r"<[^<>]{1,40}>")  # FOLDOC's subject tags, e.g. <architecture>


def _definition(headword: str, text: str) -> str:
    """The entry's first sentence after the headword line, whitespace collapsed."""
    body = " ".join(_TAG.sub(" ", text).split())
    if body.lower().startswith(headword.lower()):
        body = body[len(headword) :].lstrip(" :,.-")
    return body.split(". ")[0].strip()


def dictionary_facts(
    packages: Sequence[str], limit: int, seed: int, cache_dir: Path | None = None, min_chars: int = 40
) -> list[tuple[str, str]]:
    """Up to `limit` seeded facts over `packages`: plain-word headwords with a definition of >= `min_chars`."""
    facts: dict[str, str] = {}
    for package in packages:
        for index in dictd_databases(fetch_doc_package(package, cache_dir)):
            for entry in read_dictd(index):
                term = entry.headword.strip()
                if not _TERM.match(term) or term.lower() in facts:
                    continue
                definition = _definition(term, entry.text)
                if len(definition) >= min_chars and term.lower() not in definition.lower():
                    facts[term.lower()] = definition
    items = sorted(facts.items())
    random.Random(seed).shuffle(items)
    return items[:limit]
