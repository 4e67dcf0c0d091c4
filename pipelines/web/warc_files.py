"""Gzipped WARC shards in the object store: a rotating writer and a simple reader."""

from __future__ import annotations

import gzip
import logging
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, BinaryIO

from warcio.archiveiterator import ArchiveIterator
from warcio.recordloader import ArcWarcRecord
from warcio.warcwriter import WARCWriter

from infra.store import ObjectStore

log = logging.getLogger(__name__)

WARC_SUFFIX = ".warc.gz"


def shard_key(prefix: str, index: int) -> str:
    return f"{prefix.rstrip('/')}/part-{index:05d}{WARC_SUFFIX}"


class WarcShardWriter:
    """Writes WARC records into `prefix/part-NNNNN.warc.gz`, rotating every `records_per_file` records.

    Each shard is written to a local temp file and published to the store atomically when it is full or the
    writer closes; if the block using the writer raises, the shard being written is dropped, not published.
    Thread-safe: records passed in one call stay together in one shard (a request with its response).
    A successful close deletes objects under `prefix` it did not write (a rerun replaces the snapshot; a
    failed rerun leaves the previous one's other shards in place rather than deleting them up front).
    """

    def __init__(self, store: ObjectStore, prefix: str, records_per_file: int, warcinfo: dict | None = None):
        self.store, self.prefix, self.records_per_file = store, prefix, records_per_file
        self.warcinfo = warcinfo
        self.keys: list[str] = []
        self.records_written = 0
        self._lock = threading.Lock()
        self._stack: ExitStack | None = None
        self._fh: BinaryIO | None = None
        self._writer: WARCWriter | None = None
        self._in_shard = 0

    def __enter__(self) -> WarcShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        with self._lock:
            self._finish_shard(publish=exc_type is None)
        if exc_type is None:
            stale = [k for k in self.store.list(self.prefix.rstrip("/") + "/") if k not in self.keys]
            for key in stale:
                self.store.delete(key)
            if stale:
                log.info("deleted %d stale objects under %s", len(stale), self.store.uri(self.prefix))

    def _open_shard(self) -> None:
        key = shard_key(self.prefix, len(self.keys))
        self._stack = ExitStack()
        path: Path = self._stack.enter_context(self.store.writer(key, suffix=WARC_SUFFIX))
        self._fh = self._stack.enter_context(open(path, "wb"))
        self._writer = WARCWriter(self._fh, gzip=True)
        self.keys.append(key)
        self._in_shard = 0
        if self.warcinfo is not None:
            self._writer.write_record(self._writer.create_warcinfo_record(Path(key).name, self.warcinfo))

    def _finish_shard(self, publish: bool) -> None:
        if self._stack is None:
            return
        stack, self._stack = self._stack, None
        if publish:
            stack.close()  # closes the file, then store.writer publishes it
            log.info("published %s (%d records)", self.store.uri(self.keys[-1]), self._in_shard)
        else:
            self.keys.pop()
            stack.__exit__(RuntimeError, RuntimeError("aborted"), None)  # store.writer skips the publish
        self._fh = self._writer = None

    def _ready(self, n: int) -> None:
        if self._stack is not None and self._in_shard and self._in_shard + n > self.records_per_file:
            self._finish_shard(publish=True)
        if self._stack is None:
            self._open_shard()

    def write_records(self, records: list[ArcWarcRecord]) -> None:
        with self._lock:
            self._ready(len(records))
            for record in records:
                self._writer.write_record(record)
            self._in_shard += len(records)
            self.records_written += len(records)

    def write_raw(self, raw: bytes) -> None:
        """Write one already-serialised (uncompressed) WARC record as its own gzip member."""
        with self._lock:
            self._ready(1)
            self._fh.write(gzip.compress(raw, compresslevel=6, mtime=0))
            self._in_shard += 1
            self.records_written += 1


def iter_warc_records(path: str | Path, types: tuple[str, ...] = ("response",)) -> Iterator[dict[str, Any]]:
    """Records of a local WARC file (gzipped or not) as dicts: type, url, date, record_id, status,
    content_type, headers (WARC), body (the HTTP payload, content-decoded)."""
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh):
            if types and record.rec_type not in types:
                continue
            http = record.http_headers
            yield {
                "type": record.rec_type,
                "url": record.rec_headers.get_header("WARC-Target-URI"),
                "date": record.rec_headers.get_header("WARC-Date"),
                "record_id": record.rec_headers.get_header("WARC-Record-ID"),
                "status": int(http.get_statuscode()) if http and record.rec_type == "response" else None,
                "content_type": http.get_header("Content-Type") if http else None,
                "headers": dict(record.rec_headers.headers),
                "body": record.content_stream().read(),
            }
