"""Object store: one interface over a local directory and S3 (boto3).

Writes are atomic: a local object is written to a temp file and renamed into place; an S3 object is a single
PUT or a multipart upload, which S3 only makes visible under its key once the upload is completed. Nothing
half-written ever appears under a final key.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from infra.settings import StoreSettings

log = logging.getLogger(__name__)

_TMP_DIR = ".tmp"


class StoreError(RuntimeError):
    """An object-store operation failed; the message says which key and what to do."""


class ObjectStore(ABC):
    """Keys are '/'-separated relative paths, e.g. `web/warc/2026-11/part-00000.warc.gz`.

    A handle also carries its stage's lineage (infra/committed.py): `producer` is stamped on every version the
    stage commits, and `reads` collects every committed version it read, by prefix."""

    producer: Any = None
    reads: dict[str, Any] | None = None

    def begin_stage(self, producer: Any) -> None:
        """Start recording one stage run's lineage on this handle."""
        self.producer, self.reads = producer, {}

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
        """All keys under `prefix` (recursive), sorted."""

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

    def put_dir(self, prefix: str, local_dir: str | Path) -> str:
        """Publish every file of `local_dir` under `prefix`, then `_COMPLETE` last: readers that wait for the
        marker never see a half-copied directory (a checkpoint, a tokenizer)."""
        local_dir = Path(local_dir)
        self.delete(f"{prefix}/_COMPLETE")
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            self.put_file(f"{prefix}/{path.relative_to(local_dir).as_posix()}", path)
        self.put_bytes(f"{prefix}/_COMPLETE", b"")
        return self.uri(prefix)

    def get_dir(self, prefix: str, local_dir: str | Path) -> Path:
        """Copy a directory published with `put_dir` to `local_dir` (fails if it was never completed)."""
        if not self.exists(f"{prefix}/_COMPLETE"):
            raise StoreError(
                f"{self.uri(prefix)} is incomplete or missing (no _COMPLETE marker): rerun its asset"
            )
        local_dir = Path(local_dir)
        for key in self.list(prefix + "/"):
            if not key.endswith("/_COMPLETE"):
                self.download(key, local_dir / key[len(prefix) + 1 :])
        return local_dir

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

    def _publish(self, key: str, write) -> str:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = self.root / _TMP_DIR
        tmp_dir.mkdir(exist_ok=True)
        tmp = tmp_dir / f"{uuid.uuid4().hex}-{dest.name}"
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
        tmp_dir = self.root / _TMP_DIR
        tmp_dir.mkdir(exist_ok=True)
        tmp = tmp_dir / f"{uuid.uuid4().hex}-{dest.name}"
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
            raise StoreError(f"no object {self.uri(key)}") from None

    def download(self, key: str, path: str | Path) -> Path:
        src = self._path(key)
        if not src.exists():
            raise StoreError(f"no object {self.uri(key)}")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, path)
        return Path(path)

    @contextmanager
    def local_copy(self, key: str) -> Iterator[Path]:
        path = self._path(key)
        if not path.exists():
            raise StoreError(f"no object {self.uri(key)}")
        yield path

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def size(self, key: str) -> int | None:
        path = self._path(key)
        return path.stat().st_size if path.is_file() else None

    def list(self, prefix: str = "") -> list[str]:
        base = self.root / prefix if prefix else self.root
        scan = base if base.is_dir() else base.parent
        if not scan.exists():
            return []
        keys = []
        for path in scan.rglob("*"):
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and not rel.startswith(_TMP_DIR + "/") and rel.startswith(prefix):
                keys.append(rel)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


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
        config = Config(
            retries={"max_attempts": settings.max_attempts, "mode": "standard"},  # exponential backoff
            s3={"addressing_style": "path"} if settings.endpoint_url else {},
            connect_timeout=10,
            read_timeout=60,
        )
        self.client = session.client("s3", endpoint_url=settings.endpoint_url, config=config)
        mb = 1024 * 1024
        self.transfer = TransferConfig(
            multipart_threshold=settings.multipart_threshold_mb * mb,
            multipart_chunksize=max(5 * mb, settings.multipart_threshold_mb * mb // 4),
            use_threads=False,
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
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey"):
                raise StoreError(f"no object {self.uri(key)}") from None
            if code == "NoSuchBucket":
                raise StoreError(
                    f"bucket {self.bucket!r} does not exist: create it or fix store.url"
                ) from None
            raise StoreError(f"S3 {what} {self.uri(key)} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"S3 {what} {self.uri(key)} failed after retries: {exc}") from exc

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
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(f"{path}.part")
        self._call(
            "download",
            key,
            self.client.download_file,
            self.bucket,
            self._key(key),
            str(tmp),
            Config=self.transfer,
        )
        os.replace(tmp, path)
        return Path(path)

    def exists(self, key: str) -> bool:
        try:
            self._call("head", key, self.client.head_object, Bucket=self.bucket, Key=self._key(key))
            return True
        except StoreError as exc:
            if "no object" in str(exc):
                return False
            raise

    def size(self, key: str) -> int | None:
        try:
            head = self._call("head", key, self.client.head_object, Bucket=self.bucket, Key=self._key(key))
        except StoreError as exc:
            if "no object" in str(exc):
                return None
            raise
        return int(head["ContentLength"])

    def list(self, prefix: str = "") -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        keys = []
        pages = self._call(
            "list", prefix, lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix))
        )
        for page in pages:
            keys += [obj["Key"][len(self.prefix) :] for obj in page.get("Contents", [])]
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

    def abort_incomplete_uploads(self, prefix: str = "") -> int:
        """Abort multipart uploads left by crashed writers (they never became visible objects)."""
        uploads = self.incomplete_uploads(prefix)
        for up in uploads:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"])
        return len(uploads)


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
