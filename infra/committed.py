"""Committed outputs: how every stage publishes its data so that a reader sees a whole version or nothing.

A stage writes a new version under `<prefix>/v-<version>/` (the version is the content hash of its files),
then switches the small pointer `<prefix>/_committed.json` last. Readers resolve the pointer, check that every
listed file exists with its size (and its sha256 when they download it), and fail with a clear error
otherwise. A kill at any moment leaves the previous pointer, and so the previous version, readable; older
versions are deleted only after the switch (the one before the new version is kept for readers mid-read).

Every pointer names its producer (asset, partition, MLflow run) and every read is recorded on the store
handle (`store.reads`), so a stage's lineage is what it actually read, not what Dagster saw last.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from infra.packaged import file_sha256
from infra.store import ObjectStore, StoreError

log = logging.getLogger(__name__)

POINTER = "_committed.json"
VERSION_DIR = "v-"


class CommitError(StoreError):
    """A committed output is missing, unreadable or does not match its manifest."""


class CommittedFile(BaseModel):
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Producer(BaseModel):
    """Who wrote a version: lets a reader record the exact upstream run it consumed."""

    asset: str = ""
    partition: str = ""
    mlflow_run_id: str = ""
    dagster_run_id: str = ""


class CommittedOutput(BaseModel):
    """The pointer object: one version of one output prefix, with every file's size and hash."""

    schema_version: Literal[1] = 1
    prefix: str
    version: str = Field(pattern=r"^[0-9a-f]{16,64}$")
    files: dict[str, CommittedFile]
    producer: Producer = Field(default_factory=Producer)
    meta: dict[str, Any] = Field(default_factory=dict)
    committed_at: float = 0.0

    @property
    def version_prefix(self) -> str:
        return f"{self.prefix}/{VERSION_DIR}{self.version}"

    def key(self, name: str) -> str:
        """The store key of one listed file (KeyError for a name the version does not have)."""
        if name not in self.files:
            raise KeyError(f"{name!r} is not part of {self.prefix} version {self.version}")
        return f"{self.version_prefix}/{name}"

    def names(self, suffix: str | tuple[str, ...] = "", under: str = "") -> list[str]:
        """Listed file names (relative to the version), sorted, optionally filtered."""
        under = under.rstrip("/") + "/" if under else ""
        return sorted(n for n in self.files if n.startswith(under) and n.endswith(suffix))

    def keys(self, suffix: str | tuple[str, ...] = "", under: str = "") -> list[str]:
        return [self.key(n) for n in self.names(suffix, under)]


def content_version(files: Mapping[str, CommittedFile | dict]) -> str:
    """Content hash of a set of files: sorted names with their sizes and hashes (the stage's data version)."""
    h = hashlib.sha256()
    for name in sorted(files):
        entry = files[name]
        size, sha = (
            (entry.bytes, entry.sha256)
            if isinstance(entry, CommittedFile)
            else (entry["bytes"], entry["sha256"])
        )
        h.update(f"{name}\t{size}\t{sha}\n".encode())
    return h.hexdigest()


def _normalise_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    if not prefix:
        raise CommitError("a committed output needs a non-empty prefix")
    return prefix


def _local_files(local: Path | Mapping[str, Path]) -> dict[str, Path]:
    if isinstance(local, Mapping):
        return {str(name): Path(path) for name, path in local.items()}
    root = Path(local)
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def commit(
    store: ObjectStore,
    prefix: str,
    local: Path | Mapping[str, Path],
    meta: dict[str, Any] | None = None,
    allow_empty: bool = False,
) -> CommittedOutput:
    """Publish a directory (or {name: local path}) as a new version of `prefix`, then switch the pointer.

    The producer is taken from `store.producer` (set by the asset layer for each stage run)."""
    prefix = _normalise_prefix(prefix)
    paths = _local_files(local)
    if not paths and not allow_empty:
        raise CommitError(f"refusing to commit an empty output to {store.uri(prefix)}")
    files = {name: CommittedFile(bytes=p.stat().st_size, sha256=file_sha256(p)) for name, p in paths.items()}
    out = CommittedOutput(
        prefix=prefix,
        version=content_version(files)[:32],
        files=files,
        producer=getattr(store, "producer", None) or Producer(),
        meta=meta or {},
        committed_at=time.time(),
    )
    previous = _read_pointer(store, prefix)
    store.cleanup_orphans(prefix)  # multipart uploads an earlier, killed writer of this prefix left open
    for name, path in paths.items():
        store.put_file(out.key(name), path)
    store.put_bytes(f"{prefix}/{POINTER}", out.model_dump_json(indent=1).encode())  # the commit point
    _collect_garbage(store, prefix, keep={out.version, previous.version if previous else ""})
    log.info("committed %s version %s (%d files)", store.uri(prefix), out.version, len(files))
    return out


def commit_uploaded(
    store: ObjectStore,
    prefix: str,
    version: str,
    files: Mapping[str, CommittedFile],
    meta: dict[str, Any] | None = None,
    allow_empty: bool = False,
) -> CommittedOutput:
    """Switch the pointer of `prefix` to files a stage's workers already wrote under `<prefix>/v-<version>/`
    (Spark tasks on a cluster write straight to the store); `files` are their sizes and hashes as written.
    The version names the inputs (a deterministic output of them), so a rerun rewrites the same bytes.
    Every file must be there with its size before the switch; older versions are collected as in `commit`."""
    prefix = _normalise_prefix(prefix)
    if not files and not allow_empty:
        raise CommitError(f"refusing to commit an empty output to {store.uri(prefix)}")
    out = CommittedOutput(
        prefix=prefix,
        version=version,
        files=dict(files),
        producer=getattr(store, "producer", None) or Producer(),
        meta=meta or {},
        committed_at=time.time(),
    )
    for name, entry in out.files.items():
        if store.size(out.key(name)) != entry.bytes:
            raise CommitError(
                f"{store.uri(out.key(name))} is missing or not {entry.bytes} bytes: not committing"
            )
    previous = _read_pointer(store, prefix)
    store.put_bytes(f"{prefix}/{POINTER}", out.model_dump_json(indent=1).encode())  # the commit point
    _collect_garbage(store, prefix, keep={out.version, previous.version if previous else ""})
    log.info("committed %s version %s (%d files)", store.uri(prefix), out.version, len(files))
    return out


def committed_keys(store: ObjectStore, prefix: str, suffix: str | tuple[str, ...] = "") -> list[str] | None:
    """Store keys of the committed files under `prefix`, where `prefix` is a committed output or a folder of
    one (`dedup/web/s1/kept/` of the output `dedup/web/s1`); None if no enclosing output is committed."""
    parts = [p for p in prefix.strip("/").split("/") if p]
    for depth in range(len(parts), 0, -1):
        root = "/".join(parts[:depth])
        if is_committed(store, root):
            return read_committed(store, root).keys(suffix, under="/".join(parts[depth:]))
    return None


def _collect_garbage(store: ObjectStore, prefix: str, keep: Iterable[str]) -> None:
    keep_dirs = {f"{VERSION_DIR}{v}" for v in keep if v}
    for child in store.list_prefixes(prefix):
        if child.startswith(VERSION_DIR) and child not in keep_dirs:
            store.delete_prefix(f"{prefix}/{child}/")


def _read_pointer(store: ObjectStore, prefix: str) -> CommittedOutput | None:
    key = f"{prefix}/{POINTER}"
    try:
        raw = store.get_bytes(key)
    except StoreError:
        if store.exists(key):
            raise
        return None
    try:
        out = CommittedOutput.model_validate_json(raw)
    except ValidationError as exc:
        raise CommitError(f"{store.uri(key)} is not a valid commit pointer: {exc}") from None
    if out.prefix != prefix:
        raise CommitError(f"{store.uri(key)} names prefix {out.prefix!r}, expected {prefix!r}")
    return out


def is_committed(store: ObjectStore, prefix: str) -> bool:
    return store.exists(f"{_normalise_prefix(prefix)}/{POINTER}")


def read_committed(store: ObjectStore, prefix: str, verify: bool = True) -> CommittedOutput:
    """The committed version of `prefix`; with `verify`, every listed file must exist with its size.

    Records the read on the store handle for lineage. Raises CommitError naming the prefix and what to do."""
    prefix = _normalise_prefix(prefix)
    out = _read_pointer(store, prefix)
    if out is None:
        raise CommitError(
            f"{store.uri(prefix)} has no committed output ({POINTER} missing): materialize its asset first"
        )
    if verify:
        for name, entry in out.files.items():
            size = store.size(out.key(name))
            if size != entry.bytes:
                found = "missing" if size is None else f"{size} bytes"
                raise CommitError(
                    f"{store.uri(out.key(name))}: {found}, the committed manifest says {entry.bytes} bytes; "
                    f"the output of {prefix} is damaged: rematerialize its asset"
                )
    record_read(store, out)
    return out


def fetch_file(store: ObjectStore, out: CommittedOutput, name: str, dest: Path) -> Path:
    """Download one listed file to `dest` and check its sha256 against the manifest."""
    path = store.download(out.key(name), dest)
    digest = file_sha256(path)
    if digest != out.files[name].sha256:
        path.unlink(missing_ok=True)
        raise CommitError(
            f"{store.uri(out.key(name))}: sha256 {digest[:12]} does not match the committed "
            f"{out.files[name].sha256[:12]}: rematerialize the asset that writes {out.prefix}"
        )
    return path


def fetch_committed(store: ObjectStore, prefix: str, local_dir: Path) -> tuple[CommittedOutput, Path]:
    """Download a committed version into `local_dir` (hash-checked); returns (manifest, local_dir).

    `local_dir` then holds exactly the version's files: they are downloaded into a fresh directory beside it
    that replaces it whole, so files an earlier fetch left there are gone and a failed fetch changes nothing."""
    out = read_committed(store, prefix)
    local_dir = Path(local_dir)
    fresh = local_dir.with_name(f".{local_dir.name}-fetch-{uuid.uuid4().hex}")
    fresh.mkdir(parents=True)  # not mkdtemp: its 0700 mode would become the cache directory's
    try:
        for name in out.names():
            fetch_file(store, out, name, fresh / name)
        _replace_dir(fresh, local_dir)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return out, local_dir


def _replace_dir(fresh: Path, target: Path) -> None:
    """Rename `fresh` to `target`. A rename only replaces a missing or empty directory, so a filled `target`
    is first renamed aside and deleted after; retried if a concurrent fetch put its own tree there."""
    while True:
        try:
            os.rename(fresh, target)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        stale = target.with_name(f".{target.name}-stale-{uuid.uuid4().hex}")
        try:
            os.rename(target, stale)
        except FileNotFoundError:  # another fetch moved it aside first
            continue
        shutil.rmtree(stale, ignore_errors=True)


def record_read(store: ObjectStore, out: CommittedOutput) -> None:
    reads = getattr(store, "reads", None)
    if reads is not None:
        reads[out.prefix] = out


def committed_shards(store: ObjectStore, path: str, suffix: str | tuple[str, ...] = "") -> list[str]:
    """Like `committed_keys`, but a path that no committed output holds is an error (readers of stage
    outputs never fall back to listing: a listing would also see a killed writer's partial files)."""
    keys = committed_keys(store, path, suffix)
    if keys is None:
        raise CommitError(
            f"{store.uri(path.strip('/'))}: no committed output holds this path ({POINTER} missing): "
            "materialize the asset that writes it first"
        )
    return keys
