"""Read and write datatrove-style JSONL.gz document shards in the object store.

A document is `{"text", "id", "metadata": {...}}`, one per line; a shard is `<prefix>/<name>.jsonl.gz`.
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import json
from collections.abc import Iterable, Iterator

from infra.store import ObjectStore


def shard_keys(store: ObjectStore, prefix: str) -> list[str]:
    """JSONL(.gz) shard keys under `prefix`; `*` in the prefix matches one path level (e.g. snapshots)."""
    if "*" not in prefix:
        return [k for k in store.list(prefix) if k.endswith((".jsonl.gz", ".jsonl"))]
    root = prefix.split("*", 1)[0].rsplit("/", 1)[0]
    pattern = prefix.rstrip("/") + "/*"
    return [
        k for k in store.list(root) if k.endswith((".jsonl.gz", ".jsonl")) and fnmatch.fnmatch(k, pattern)
    ]


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


def write_documents(store: ObjectStore, key: str, docs: Iterable[dict]) -> int:
    """Publish `docs` as one gzip JSONL shard under `key` (atomically); returns the count written."""
    buf = io.BytesIO()
    n = 0
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:  # mtime=0: same docs, same bytes
        for doc in docs:
            gz.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    store.put_bytes(key, buf.getvalue())
    return n
