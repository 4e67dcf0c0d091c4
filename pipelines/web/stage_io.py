"""Moving a web stage's files between the object store and the local directory datatrove works in, and
describing its output (content hash, samples)."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path

from infra.packaged import file_sha256
from infra.store import LocalStore, ObjectStore


def stage_inputs(
    store: ObjectStore, prefix: str, suffixes: tuple[str, ...], scratch: Path
) -> tuple[Path, Path]:
    """(folder, paths file) listing the store's objects under `prefix` that end in `suffixes`, sorted.

    A LocalStore's directory is read in place; other stores are copied to `scratch` first.
    """
    prefix = prefix.rstrip("/") + "/"
    keys = [k for k in store.list(prefix) if k.endswith(suffixes)]
    if not keys:
        raise FileNotFoundError(f"no {'/'.join(suffixes)} files under {store.uri(prefix)}")
    rel = [k[len(prefix) :] for k in keys]
    if isinstance(store, LocalStore):
        folder = store.local_path(prefix.rstrip("/"))
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


def shard_manifest(root: Path) -> dict[str, dict]:
    """{relative name: {bytes, sha256}} of every file under `root`, sorted by name."""
    return {
        p.relative_to(root).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in output_files(root)
    }


def data_version(manifest: dict[str, dict]) -> str:
    """Content hash of a stage's output: sorted shard names with their sizes and hashes."""
    h = hashlib.sha256()
    for name in sorted(manifest):
        h.update(f"{name}\t{manifest[name]['bytes']}\t{manifest[name]['sha256']}\n".encode())
    return h.hexdigest()


def publish(store: ObjectStore, root: Path, out_prefix: str, manifest: dict) -> dict[str, str]:
    """Replace everything under `out_prefix` with the files under `root`, then write `manifest.json` last
    (its presence marks a complete output). Returns {relative name: key}."""
    out_prefix = out_prefix.rstrip("/")
    store.delete_prefix(out_prefix + "/")
    keys = {}
    for path in output_files(root):
        name = path.relative_to(root).as_posix()
        keys[name] = f"{out_prefix}/{name}"
        store.put_file(keys[name], path)
    store.put_json(f"{out_prefix}/manifest.json", manifest)
    return keys


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
