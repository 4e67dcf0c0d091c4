"""Object store: one interface over a local directory and S3 (boto3).

Writes are atomic: a local object is written to a temp file and renamed into place; an S3 object is a single
PUT or a multipart upload, which S3 only makes visible under its key once the upload is completed. Nothing
half-written ever appears under a final key, and downloads land under their local path only when complete.

Prefixes are paths: `list("web/s1")` is the object `web/s1` (if any) and every key under `web/s1/`, never
`web/s10/...`; a prefix ending in `/` is a directory only. Both stores agree.

What a killed writer leaves (local temp files, `.part` downloads, S3 multipart uploads) is named after its
host and pid and removed by a later process (`cleanup_orphans`, run when a stage begins and before a commit).
S3 calls have connect / read timeouts and a bounded number of attempts; their errors name the endpoint.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from infra.settings import StoreSettings

log = logging.getLogger(__name__)

_TMP_DIR = ".tmp"
_PROCESS_START = time.time()  # (module import) S3 uploads begun before this belong to an earlier process
# Temp names carry their writer, so a later process can tell a dead writer's leftovers from a live one's.
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:64] or "host"


def _owner() -> str:
    return f"{_HOST}-{os.getpid()}"


def _owner_dead(owner: str) -> bool:
    """True if `owner` ('<host>-<pid>') is a process of this host that no longer runs."""
    host, _, pid = owner.rpartition("-")
    if host != _HOST or not pid.isdigit():
        return False  # another machine's writer (shared file system): not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _remove_dead_parts(path: Path) -> int:
    """Delete `<path>.<owner>.part*` files left by dead processes (downloads killed midway)."""
    removed = 0
    for part in glob.glob(f"{glob.escape(str(path))}.*.part*"):
        owner = part[len(str(path)) + 1 :].split(".part", 1)[0]
        if _owner_dead(owner):
            Path(part).unlink(missing_ok=True)
            removed += 1
    return removed


def atomic_download(path: str | Path, fetch) -> Path:
    """Run `fetch(tmp)` into a temp file next to `path`, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_parts(path)
    # Owner (host-pid) before `.part` for the dead-writer sweep; the thread after it, so that two threads of
    # one process downloading the same file never write into one temp file.
    tmp = path.with_name(f"{path.name}.{_owner()}.part{threading.get_ident()}")
    try:
        fetch(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class StoreError(RuntimeError):
    """An object-store operation failed; the message says which key and what to do."""


class ObjectNotFound(StoreError):
    """There is no object under the key (S3 404 / NoSuchKey / NotFound, or no such local file)."""


class ObjectStore(ABC):
    """Keys are '/'-separated relative paths, e.g. `web/warc/2026-11/part-00000.warc.gz`.

    A handle also carries its stage's lineage (infra/committed.py): `producer` is stamped on every version the
    stage commits, and `reads` collects every committed version it read, by prefix."""

    producer: Any = None
    reads: dict[str, Any] | None = None

    def begin_stage(self, producer: Any) -> None:
        """Start recording one stage run's lineage on this handle (and clear what killed writers left)."""
        self.producer, self.reads = producer, {}
        self.cleanup_orphans()

    def cleanup_orphans(self, prefix: str = "") -> int:
        """Remove what killed writers left (temp files, incomplete uploads), never what a live writer uses.
        Returns how many leftovers were removed."""
        return 0

    @abstractmethod
    def uri(self, key: str = "") -> str: ...

    @abstractmethod
    def put_file(self, key: str, path: str | Path) -> str:
        """Publish a local file under `key` atomically; returns the object's URI."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> str: ...

    @abstractmethod
    def put_bytes_if_absent(self, key: str, data: bytes) -> bool:
        """Create `key` with `data` only if no object has that key (compare-and-swap on absence): True if this
        call created it, False if it already existed. Two writers can never both succeed."""

    @abstractmethod
    def get_bytes(self, key: str) -> bytes: ...

    @abstractmethod
    def download(self, key: str, path: str | Path) -> Path: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def size(self, key: str) -> int | None:
        """The object's size in bytes, or None if there is no such object."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """The object `prefix` (if it exists) and every key below `prefix/`, recursive and sorted; with a
        trailing '/', only the keys below it. `list("a/s1")` never returns `a/s10/...`."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def list_prefixes(self, prefix: str = "") -> list[str]:
        """Immediate children of `prefix` that hold objects ("directories"), sorted, without trailing '/'."""
        prefix = _dir(prefix)
        children = {
            key[len(prefix) :].split("/", 1)[0] for key in self.list(prefix) if "/" in key[len(prefix) :]
        }
        return sorted(children)

    def put_json(self, key: str, obj: Any) -> str:
        return self.put_bytes(key, json.dumps(obj, indent=2, sort_keys=True, default=str).encode())

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    @contextmanager
    def writer(self, key: str, suffix: str = "") -> Iterator[Path]:
        """Yield a local temp path to write; it is published under `key` only if the block succeeds."""
        fd, tmp = tempfile.mkstemp(prefix="crucible-", suffix=suffix)
        os.close(fd)
        try:
            yield Path(tmp)
            self.put_file(key, tmp)
        finally:
            Path(tmp).unlink(missing_ok=True)

    @contextmanager
    def local_copy(self, key: str) -> Iterator[Path]:
        """Yield a local path holding the object (a temp copy for remote stores)."""
        tmpdir = tempfile.mkdtemp(prefix="crucible-")
        try:
            yield self.download(key, Path(tmpdir) / Path(key).name)
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _dir(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def _check_key(key: str) -> str:
    # every segment must name one child: '', '.', '..', '\\' or NUL would alias or escape the root / prefix
    bad_char = any(c == "\\" or ord(c) < 32 for c in key)
    if not key or bad_char or any(seg in ("", ".", "..") for seg in key.split("/")):
        raise StoreError(f"invalid object key {key!r}: use a relative path like 'web/warc/part-0.warc.gz'")
    return key


class LocalStore(ObjectStore):
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalStore({self.root})"

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def uri(self, key: str = "") -> str:
        return (self.root / key).as_uri() if key else self.root.as_uri()

    def local_path(self, key: str) -> Path:
        """The object's path on disk (local stores only; lets readers avoid a copy)."""
        return self._path(key)

    def _tmp_path(self, dest: Path) -> Path:
        """A temp file in the store's `.tmp/`, named after its writer (see `cleanup_orphans`)."""
        tmp_dir = self.root / _TMP_DIR
        tmp_dir.mkdir(exist_ok=True)
        return tmp_dir / f"{_owner()}-{uuid.uuid4().hex}-{dest.name}"

    def _publish(self, key: str, write) -> str:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._tmp_path(dest)
        try:
            write(tmp)
            os.replace(tmp, dest)  # atomic on one file system
        finally:
            tmp.unlink(missing_ok=True)
        return self.uri(key)

    def put_file(self, key: str, path: str | Path) -> str:
        return self._publish(key, lambda tmp: shutil.copyfile(path, tmp))

    def put_bytes(self, key: str, data: bytes) -> str:
        return self._publish(key, lambda tmp: tmp.write_bytes(data))

    def put_bytes_if_absent(self, key: str, data: bytes) -> bool:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._tmp_path(dest)
        try:
            tmp.write_bytes(data)
            os.link(tmp, dest)  # atomic, fails if dest exists: the object appears whole or not at all
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFound(f"no object {self.uri(key)}") from None

    def download(self, key: str, path: str | Path) -> Path:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(f"no object {self.uri(key)}")
        return atomic_download(path, lambda tmp: shutil.copyfile(src, tmp))

    @contextmanager
    def local_copy(self, key: str) -> Iterator[Path]:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFound(f"no object {self.uri(key)}")
        yield path

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int | None:
        path = self._path(key)
        return path.stat().st_size if path.is_file() else None

    def list(self, prefix: str = "") -> list[str]:
        base = self.root / prefix.rstrip("/") if prefix.strip("/") else self.root
        keys = [prefix] if prefix and not prefix.endswith("/") and base.is_file() else []
        if base.is_dir():
            for path in base.rglob("*"):
                rel = path.relative_to(self.root).as_posix()
                if path.is_file() and not rel.startswith(_TMP_DIR + "/"):
                    keys.append(rel)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        """As the base class, then the directories left empty below `prefix` (and it), deepest first; a
        directory a concurrent writer has just filled is kept (rmdir refuses a non-empty one)."""
        n = super().delete_prefix(prefix)
        base = self.root / prefix.rstrip("/") if prefix.strip("/") else None
        if base is not None and base.is_dir():
            for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [base]:
                try:
                    d.rmdir()
                except OSError:
                    pass
        return n

    def cleanup_orphans(self, prefix: str = "") -> int:
        """Delete temp files of writers on this host that no longer run (a SIGKILL skips their cleanup)."""
        tmp_dir, removed = self.root / _TMP_DIR, 0
        for path in list(tmp_dir.iterdir()) if tmp_dir.is_dir() else []:
            host, pid = (path.name.split("-", 2) + ["", ""])[:2]
            if _owner_dead(f"{host}-{pid}"):
                path.unlink(missing_ok=True)
                removed += 1
        if removed:
            log.info("removed %d temp files of dead writers from %s", removed, tmp_dir)
        return removed


class S3Store(ObjectStore):
    """S3 (or an S3-compatible endpoint) under `s3://bucket/prefix`, with retries and multipart uploads."""

    def __init__(self, url: str, settings: StoreSettings | None = None):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        settings = settings or StoreSettings(url=url)
        self._init_args = (url, settings)
        if not url.startswith("s3://"):
            raise StoreError(f"S3 store URL must look like s3://bucket/prefix, got {url!r}")
        bucket, _, prefix = url[len("s3://") :].partition("/")
        self.bucket, self.prefix = bucket, _dir(prefix.strip("/")) if prefix.strip("/") else ""
        session = boto3.session.Session(profile_name=settings.aws_profile, region_name=settings.region)
        # A hung endpoint costs at most max_attempts x (connect or read timeout) plus backoff per call.
        config = Config(
            retries={"total_max_attempts": settings.max_attempts, "mode": "standard"},  # exponential backoff
            s3={"addressing_style": "path"} if settings.endpoint_url else {},
            connect_timeout=settings.connect_timeout_s,
            read_timeout=settings.read_timeout_s,
        )
        self.client = session.client("s3", endpoint_url=settings.endpoint_url, config=config)
        self.endpoint = settings.endpoint_url or f"AWS S3 ({settings.region})"
        self._budget = (
            f"{settings.max_attempts} attempts, connect timeout {settings.connect_timeout_s:g}s, "
            f"read timeout {settings.read_timeout_s:g}s"
        )
        mb = 1024 * 1024
        self.transfer = TransferConfig(
            multipart_threshold=settings.multipart_threshold_mb * mb,
            multipart_chunksize=max(5 * mb, settings.multipart_threshold_mb * mb // 4),
            use_threads=False,
            num_download_attempts=settings.max_attempts,
        )

    def __repr__(self) -> str:
        return f"S3Store({self.uri()})"

    def __getstate__(self) -> tuple:
        return self._init_args  # boto3 clients don't pickle: worker processes rebuild their own

    def __setstate__(self, state: tuple) -> None:
        self.__init__(*state)

    def _key(self, key: str) -> str:
        return self.prefix + _check_key(key)

    def uri(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def _call(self, what: str, key: str, fn, *args, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey", "NotFound"):
                raise ObjectNotFound(f"no object {self.uri(key)}") from None
            if code == "NoSuchBucket":
                raise StoreError(
                    f"bucket {self.bucket!r} does not exist at endpoint {self.endpoint}: create it or fix "
                    "store.url"
                ) from None
            raise StoreError(f"S3 {what} {self.uri(key)} failed at endpoint {self.endpoint}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(
                f"S3 {what} {self.uri(key)} failed: endpoint {self.endpoint} did not answer ({self._budget}): "
                f"{exc}"
            ) from exc

    def put_fileobj(self, key: str, fileobj: BinaryIO) -> str:
        """Stream an object; multipart above the threshold. s3transfer aborts the upload if it fails."""
        self._call(
            "upload",
            key,
            self.client.upload_fileobj,
            fileobj,
            self.bucket,
            self._key(key),
            Config=self.transfer,
        )
        return self.uri(key)

    def put_file(self, key: str, path: str | Path) -> str:
        with open(path, "rb") as fh:
            return self.put_fileobj(key, fh)

    def put_bytes(self, key: str, data: bytes) -> str:
        self._call("put", key, self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data)
        return self.uri(key)

    def put_bytes_if_absent(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        def put() -> bool:
            try:  # S3 conditional write: 412 if the key exists, 409 if another conditional PUT is in flight
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
                return True
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in (
                    "PreconditionFailed",
                    "ConditionalRequestConflict",
                ):
                    return False
                raise

        return self._call("conditional put", key, put)

    def get_bytes(self, key: str) -> bytes:
        resp = self._call("get", key, self.client.get_object, Bucket=self.bucket, Key=self._key(key))
        return resp["Body"].read()

    def download(self, key: str, path: str | Path) -> Path:
        def fetch(tmp: Path) -> None:
            self._call(
                "download",
                key,
                self.client.download_file,
                self.bucket,
                self._key(key),
                str(tmp),
                Config=self.transfer,
            )

        return atomic_download(path, fetch)

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        try:
            head = self._call("head", key, self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        except ObjectNotFound:  # decided by the error code, never by the message text
            return None
        return int(head["ContentLength"])

    def list(self, prefix: str = "") -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        keys = []
        below = _dir(prefix.rstrip("/")) if prefix.strip("/") else ""
        pages = self._call(
            "list", prefix, lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + below))
        )
        for page in pages:
            keys += [obj["Key"][len(self.prefix) :] for obj in page.get("Contents", [])]
        if prefix and not prefix.endswith("/") and self.size(prefix) is not None:
            keys.append(prefix)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._call("delete", key, self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def incomplete_uploads(self, prefix: str = "") -> list[dict]:
        resp = self._call(
            "list uploads",
            prefix,
            self.client.list_multipart_uploads,
            Bucket=self.bucket,
            Prefix=self.prefix + prefix,
        )
        return resp.get("Uploads", [])

    def abort_incomplete_uploads(self, prefix: str = "", started_before: float | None = None) -> int:
        """Abort multipart uploads left by crashed writers (they never became visible objects); with
        `started_before` (a Unix time), only those initiated earlier."""
        uploads = [
            up
            for up in self.incomplete_uploads(prefix)
            if started_before is None or up["Initiated"].timestamp() < started_before
        ]
        for up in uploads:
            self._call(
                "abort upload",
                up["Key"][len(self.prefix) :],
                self.client.abort_multipart_upload,
                Bucket=self.bucket,
                Key=up["Key"],
                UploadId=up["UploadId"],
            )
        return len(uploads)

    def cleanup_orphans(self, prefix: str = "") -> int:
        """Abort multipart uploads under `prefix` that an earlier process began (a stage's own prefix has one
        writer at a time). A store-wide sweep (no prefix) is skipped: it could hit another stage's live upload."""
        if not prefix.strip("/"):
            return 0
        n = self.abort_incomplete_uploads(_dir(prefix.strip("/")), started_before=_PROCESS_START)
        if n:
            log.info("aborted %d incomplete uploads of earlier writers under %s", n, self.uri(prefix))
        return n


def open_store(settings: StoreSettings, state_dir: Path) -> ObjectStore:
    """The store a profile describes: `s3://...` -> S3Store, anything else -> a local directory."""
    if settings.url.startswith("s3://"):
        return S3Store(settings.url, settings)
    root = Path(settings.url)
    return LocalStore(root if root.is_absolute() else state_dir / root)


def open_uri(uri: str, settings: StoreSettings | None = None) -> ObjectStore:
    """A store rooted at any local directory or s3:// prefix (e.g. WARC files to ingest)."""
    if uri.startswith("s3://"):
        base = settings.model_copy(update={"url": uri}) if settings else StoreSettings(url=uri)
        return S3Store(uri, base)
    path = Path(uri.removeprefix("file://"))
    if not path.exists():
        raise StoreError(f"{uri}: no such directory; give a local path or an s3://bucket/prefix")
    return LocalStore(path)
