"""Code file records (the shared contract) and their JSONL.gz shards, committed as one version per stage output."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from infra.committed import CommittedOutput, commit, committed_shards
from infra.store import ObjectStore

ORIGINS = "origins.jsonl.gz"  # the crawl's index of every text file with its sha256 (metadata fix checks it)
CRAWL_STATS = "crawl_stats.json"


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


def shard_name(index: int) -> str:
    return f"part-{index:05d}.jsonl.gz"


def write_shards(out_dir: str | Path, records: Iterable[dict], shard_records: int) -> list[Path]:
    """Write records as local gzip JSONL shards `part-NNNNN.jsonl.gz` of at most `shard_records` lines in
    `out_dir` (same records, same bytes); returns their paths. A stage then commits the directory."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    buf: list[str] = []

    def flush() -> None:
        path = out_dir / shard_name(len(paths))
        with open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", filename="", mtime=0) as gz:
            gz.write("".join(buf).encode())
        paths.append(path)
        buf.clear()

    for rec in records:
        buf.append(json.dumps(rec, ensure_ascii=False) + "\n")
        if len(buf) >= shard_records:
            flush()
    if buf:
        flush()
    return paths


def commit_records(
    store: ObjectStore,
    prefix: str,
    records: Iterable[dict],
    shard_records: int,
    extra: dict[str, bytes | Path] | None = None,
    meta: dict[str, Any] | None = None,
) -> CommittedOutput:
    """Commit records (as `part-*.jsonl.gz` shards) plus `extra` files ({name: bytes or local path}) as one
    version of the output `prefix` (`infra.committed`: nothing is readable until the pointer switches)."""
    with tempfile.TemporaryDirectory(prefix="crucible-records-") as tmp:
        root = Path(tmp)
        write_shards(root, records, shard_records)
        for name, data in (extra or {}).items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, bytes):
                (root / name).write_bytes(data)
            else:
                shutil.copyfile(data, root / name)
        return commit(store, prefix, root, meta=meta, allow_empty=True)


def read_shards(store: ObjectStore, prefix: str) -> Iterator[dict]:
    """All records of the `part-*.jsonl.gz` shards under `prefix` in the committed output that holds it (e.g.
    `code/raw/s1`, or `code/quality/s1/scores`), in key order; CommitError if none holds it."""
    for key in committed_shards(store, prefix, ".jsonl.gz"):
        if not key.rsplit("/", 1)[-1].startswith("part-"):
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
