"""Read and write datatrove-style JSONL.gz document shards.

A document is `{"text", "id", "metadata": {...}}`, one per line. Readers take store paths of committed outputs
(`infra.committed`: `web/filtered/s1/kept/` is the `kept/` folder of the output `web/filtered/s1`); writers
write local files that the stage then commits as one version.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from infra.committed import committed_keys, committed_shards
from infra.store import ObjectStore

DOC_SUFFIXES = (".jsonl.gz", ".jsonl")


def shard_keys(store: ObjectStore, prefix: str) -> list[str]:
    """JSONL(.gz) keys of the committed output(s) holding `prefix` (CommitError if none does); one `*` path
    segment matches every child that holds a committed output (e.g. `web/filtered/*/kept/`: every snapshot
    committed so far; a snapshot whose first run was killed before its commit has none and is skipped)."""
    if "*" not in prefix:
        return committed_shards(store, prefix, DOC_SUFFIXES)
    head, _, tail = prefix.partition("*")
    if not head.endswith("/") or not (tail == "" or tail.startswith("/")) or "*" in tail:
        raise ValueError(f"{prefix!r}: '*' must be one whole path segment, e.g. 'web/filtered/*/kept/'")
    keys = []
    for child in store.list_prefixes(head):
        keys += committed_keys(store, f"{head}{child}{tail}", DOC_SUFFIXES) or []
    return keys


def read_documents(store: ObjectStore, prefix: str, limit: int | None = None) -> Iterator[dict]:
    """Documents of every shard under `prefix`, in key order; each gets `metadata.shard` = its key."""
    n = 0
    for key in shard_keys(store, prefix):
        data = store.get_bytes(key)
        stream = (
            gzip.open(io.BytesIO(data), "rt", encoding="utf-8")
            if key.endswith(".gz")
            else io.StringIO(data.decode("utf-8"))
        )
        with stream:
            for line in stream:
                if not line.strip():
                    continue
                doc = json.loads(line)
                doc.setdefault("metadata", {})["shard"] = key
                yield doc
                n += 1
                if limit is not None and n >= limit:
                    return


def write_documents(path: str | Path, docs: Iterable[dict]) -> int:
    """Write `docs` as one gzip JSONL shard at local `path` (same docs, same bytes); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", filename="", mtime=0) as gz:
        for doc in docs:
            gz.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    return n
