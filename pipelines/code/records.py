"""Code file records (the shared contract) and their JSONL.gz shards in the store."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterable, Iterator
from typing import Any

from infra.store import ObjectStore


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def record_id(source: str, package: str, version: str, path: str) -> str:
    return hashlib.sha1(f"{source}\x00{package}\x00{version}\x00{path}".encode()).hexdigest()[:20]


def make_record(text: str, source: str, package: str, version: str, path: str, size: int, sha256: str,
                license: str, declared_language: str | None, language: str | None, language_source: str,
                snapshot: str) -> dict[str, Any]:  # fmt: skip
    """A record as the shared contract defines it: text, id and metadata."""
    return {
        "text": text,
        "id": record_id(source, package, version, path),
        "metadata": {
            "source": source, "package": package, "version": version, "path": path, "size": size,
            "sha256": sha256, "license": license, "language": language, "declared_language": declared_language,
            "language_source": language_source, "snapshot": snapshot,
        },
    }  # fmt: skip


def shard_key(prefix: str, index: int) -> str:
    return f"{prefix.rstrip('/')}/part-{index:05d}.jsonl.gz"


def write_shards(store: ObjectStore, prefix: str, records: Iterable[dict], shard_records: int) -> list[str]:
    """Write records as gzip JSONL shards of at most `shard_records` lines; returns the keys written."""
    keys: list[str] = []
    buf: list[str] = []

    def flush() -> None:
        raw = io.BytesIO()
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:  # mtime=0: same bytes for the same records
            gz.write("".join(buf).encode())
        key = shard_key(prefix, len(keys))
        store.put_bytes(key, raw.getvalue())
        keys.append(key)
        buf.clear()

    for rec in records:
        buf.append(json.dumps(rec, ensure_ascii=False) + "\n")
        if len(buf) >= shard_records:
            flush()
    if buf:
        flush()
    # a previous, larger run may have left more shards under the prefix: they are not part of this output
    written, base = set(keys), prefix.rstrip("/") + "/"
    for key in store.list(base):
        rel = key[len(base) :]
        if "/" not in rel and rel.startswith("part-") and rel.endswith(".jsonl.gz") and key not in written:
            store.delete(key)
    return keys


def read_shards(store: ObjectStore, prefix: str) -> Iterator[dict]:
    """All records under `prefix` (shards `part-*.jsonl.gz`, in key order)."""
    for key in store.list(prefix.rstrip("/") + "/"):
        name = key.rsplit("/", 1)[-1]
        if not (name.startswith("part-") and name.endswith(".jsonl.gz")):
            continue
        # split on "\n" only: str.splitlines also breaks at U+2028, \x1c, \x85 inside JSON strings
        for line in gzip.decompress(store.get_bytes(key)).decode().split("\n"):
            if line.strip():
                yield json.loads(line)


def data_version(records_digest: Iterable[str]) -> str:
    h = hashlib.sha256()
    for item in records_digest:
        h.update(item.encode())
    return h.hexdigest()[:16]
