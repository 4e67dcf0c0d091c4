"""Moving a web stage's files between the object store and the local directory datatrove works in, and
describing its output (samples).

A stage reads its input through the producer's committed output (`infra.committed`), never by listing a
prefix, and publishes its own output with `commit`: files under `<prefix>/v-<version>/`, pointer last."""

from __future__ import annotations

import gzip
import itertools
import json
import posixpath
import random
from collections.abc import Iterator
from pathlib import Path

from infra.committed import committed_keys, committed_shards
from infra.store import LocalStore, ObjectStore


def stage_inputs(
    store: ObjectStore, prefix: str, suffixes: tuple[str, ...], scratch: Path, require_commit: bool = True
) -> tuple[Path, Path]:
    """(folder, paths file) listing the input files under `prefix` that end in `suffixes`, sorted.

    The files are those of the committed output holding `prefix` (CommitError if none). Without
    `require_commit` (WARC files: a crawl or an upload does not commit) a prefix no output holds is listed.
    A LocalStore's files are read in place; other stores are copied to `scratch` first.
    """
    prefix = prefix.rstrip("/") + "/"
    keys = (
        committed_shards(store, prefix, suffixes)
        if require_commit
        else committed_keys(store, prefix, suffixes)
    )
    if keys is None:
        keys = [k for k in store.list(prefix) if k.endswith(suffixes)]
    if not keys:
        raise FileNotFoundError(f"no {'/'.join(suffixes)} files under {store.uri(prefix)}")
    root = posixpath.commonpath([k.rsplit("/", 1)[0] for k in keys]) + "/"
    rel = [k[len(root) :] for k in keys]
    if isinstance(store, LocalStore):
        folder = store.local_path(root.rstrip("/"))
    else:
        folder = scratch / "input"
        for key, name in zip(keys, rel, strict=True):
            store.download(key, folder / name)
    paths_file = scratch / "input_files.txt"
    paths_file.write_text("".join(f"{name}\n" for name in rel))
    return folder, paths_file


def zero_gzip_mtime(path: Path) -> None:
    """Zero the gzip header's timestamp so identical content gives identical bytes (it is outside the CRC)."""
    with open(path, "r+b") as fh:
        head = fh.read(4)
        if head[:2] == b"\x1f\x8b":
            fh.seek(4)
            fh.write(b"\0\0\0\0")


def output_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def iter_docs(paths: list[Path]) -> Iterator[dict]:
    for path in paths:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                yield json.loads(line)


def sample_docs(paths: list[Path], size: int, seed: int, pool: int = 1000) -> list[dict]:
    """`size` documents drawn with `seed` from the first `pool` documents of the shards (in shard order)."""
    docs = list(itertools.islice(iter_docs(paths), pool))
    return random.Random(seed).sample(docs, min(size, len(docs)))


def first_per_reason(paths: list[Path], per_reason: int = 1, scan: int = 2000) -> list[dict]:
    """Up to `per_reason` dropped documents per drop reason, from the first `scan` documents."""
    seen: dict[str, int] = {}
    out = []
    for doc in itertools.islice(iter_docs(paths), scan):
        reason = doc.get("metadata", {}).get("drop_reason", "unknown")
        if seen.get(reason, 0) < per_reason:
            seen[reason] = seen.get(reason, 0) + 1
            out.append(doc)
    return out
