"""WARC files: a rotating writer of gzipped shards in the object store, a simple reader, and a tolerant
splitter of damaged files into raw records.

`iter_raw_records` keeps what is recoverable: gzip is decompressed as a stream, so the records before a
truncated or corrupt stretch survive (also when the whole file is one gzip member); a corrupt member is
skipped by searching for the next member header; a bad record header or a wrong `Content-Length` by searching
for the next `WARC/1.x` line. Every damaged stretch is reported once, as a `Malformed` with a reason.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import tempfile
import threading
import zlib
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from warcio.archiveiterator import ArchiveIterator
from warcio.bufferedreaders import ChunkedDataException
from warcio.exceptions import ArchiveLoadFailed
from warcio.recordloader import ArcWarcRecord
from warcio.statusandheaders import StatusAndHeadersParserException
from warcio.warcwriter import WARCWriter

from infra.committed import commit
from infra.store import LocalStore, ObjectStore

log = logging.getLogger(__name__)

WARC_SUFFIX = ".warc.gz"


def shard_key(prefix: str, index: int) -> str:
    return f"{prefix.rstrip('/')}/part-{index:05d}{WARC_SUFFIX}"


class WarcShardWriter:
    """Writes WARC records into `prefix/part-NNNNN.warc.gz`, rotating every `records_per_file` records.

    Shards are staged in a local directory; a successful close commits them as one version of `prefix`
    (infra/committed.py), so readers see the previous snapshot or the whole new one, never a mix. If the block
    using the writer raises, nothing is published. Thread-safe: records passed in one call stay together in
    one shard (a request with its response). After the close, `keys` are the committed store keys.
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        records_per_file: int,
        warcinfo: dict | None = None,
        allow_empty: bool = False,
    ):
        self.store, self.prefix, self.records_per_file = store, prefix.rstrip("/"), records_per_file
        self.warcinfo, self.allow_empty = warcinfo, allow_empty
        self._staging_dir = Path(tempfile.mkdtemp(prefix="crucible-warc-"))
        self._staging = LocalStore(self._staging_dir / "out")
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
        try:
            with self._lock:
                self._finish_shard(publish=exc_type is None)
            if exc_type is None:
                files = {Path(k).name: self._staging.local_path(k) for k in self.keys}
                out = commit(self.store, self.prefix, files, meta={"records": self.records_written},
                             allow_empty=self.allow_empty)  # fmt: skip
                self.keys = [out.key(Path(k).name) for k in self.keys]
        finally:
            shutil.rmtree(self._staging_dir, ignore_errors=True)

    def _open_shard(self) -> None:
        key = shard_key("", len(self.keys)).lstrip("/")
        self._stack = ExitStack()
        path: Path = self._stack.enter_context(self._staging.writer(key, suffix=WARC_SUFFIX))
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
            stack.close()  # closes the file, then the staging store keeps it
            log.info("staged %s (%d records)", self.keys[-1], self._in_shard)
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


# ---------------------------------------------------------------- reading damaged files

GZIP_MAGIC = b"\x1f\x8b\x08"
# a bigger record is treated as corrupt (Common Crawl caps payloads at 1 MiB)
MAX_RECORD_BYTES = 256 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
_CHUNK = 1024 * 1024
_VERSION = b"WARC/1."
_END = b"\r\n\r\n"
# Why a stretch of input is not a record (the only words after `malformed/` in the metrics).
MALFORMED_REASONS = (
    "bad_gzip",
    "truncated_gzip",
    "bad_record_header",
    "bad_content_length",
    "truncated_record",
    "empty_record",
    "digest_mismatch",
    "invalid_record",
    "bad_http_status",
)
# What warcio raises on a malformed record; anything else is a bug and fails the stage.
WARCIO_ERRORS = (
    ArchiveLoadFailed,
    StatusAndHeadersParserException,
    ChunkedDataException,
    EOFError,
    ValueError,
    UnicodeDecodeError,
    zlib.error,
)


@dataclass(frozen=True)
class Malformed:
    """A stretch of a WARC file that is not a valid record, and why (one of MALFORMED_REASONS)."""

    reason: str
    offset: int


class _Window:
    """A byte stream read from an iterator of chunks through a buffer: look ahead, search, consume."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks = chunks
        self.buf = bytearray()
        self.pos = 0  # buf[pos:] is not consumed yet
        self.consumed = 0  # stream offset of buf[pos]
        self.eof = False

    def available(self) -> int:
        return len(self.buf) - self.pos

    def fill(self, n: int) -> bool:
        """Make at least `n` unconsumed bytes available; False if the stream ends first."""
        while self.available() < n and not self.eof:
            chunk = next(self._chunks, None)
            if chunk is None:
                self.eof = True
                break
            if self.pos > len(self.buf) // 2:  # compact now and then, not on every record
                del self.buf[: self.pos]
                self.pos = 0
            self.buf += chunk
        return self.available() >= n

    def peek(self, start: int, end: int) -> bytes:
        return bytes(self.buf[self.pos + start : self.pos + end])

    def find(self, needle: bytes, start: int, limit: int) -> int:
        """Offset (from the unconsumed start) of `needle` in [start, limit), reading more as needed; -1."""
        scan = start
        while True:
            found = self.buf.find(needle, self.pos + scan, self.pos + limit)
            if found >= 0:
                return found - self.pos
            searched = self.available()
            if searched >= limit or not self.fill(searched + 1):
                return -1
            scan = max(start, searched - len(needle) + 1)

    def consume(self, n: int) -> None:
        self.pos += n
        self.consumed += n

    def skip_to_next_record(self, start: int) -> bool:
        """Consume up to the next `WARC/1.` line at or after `start`, keeping memory bounded; False at EOF."""
        while True:
            found = self.find(b"\n" + _VERSION, start, self.available())
            if found >= 0:
                self.consume(found + 1)
                return True
            if self.eof and not self.fill(self.available() + 1):
                self.consume(self.available())
                return False
            keep = len(_VERSION)  # a version line may straddle the next chunk
            self.consume(max(0, self.available() - keep))
            start = 0
            self.fill(self.available() + 1)


def _content_length(header: bytes) -> int | None:
    for line in header.split(b"\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() else None
    return None


def _split_records(chunks: Iterator[bytes]) -> Iterator[bytes | Malformed]:
    """Split an uncompressed WARC stream into raw records (header + block + CRLFCRLF), or Malformed.

    Returns (generator return value) the stream offset of trailing bytes that form no complete record, or
    None: the caller knows whether that is a truncated record or the tail of a damaged gzip member.
    """
    src = _Window(chunks)
    while True:
        while src.fill(1) and src.peek(0, 1) in (b"\r", b"\n"):  # blank lines between records
            src.consume(1)
        if not src.fill(len(_VERSION)):
            return src.consumed if src.available() else None
        start = src.consumed
        if src.peek(0, len(_VERSION)) != _VERSION:
            yield Malformed("bad_record_header", start)
            if not src.skip_to_next_record(1):
                return None
            continue
        header_end = src.find(_END, 0, MAX_HEADER_BYTES)
        if header_end < 0:
            if src.eof and src.find(b"\n" + _VERSION, 1, src.available()) < 0:
                return start  # the stream ends inside this header
            yield Malformed("bad_record_header", start)
            if not src.skip_to_next_record(1):
                return None
            continue
        header = src.peek(0, header_end + 2)
        length = _content_length(header)
        if b"\n" + _VERSION in header or length is None or length > MAX_RECORD_BYTES:
            yield Malformed("bad_record_header", start)
            if not src.skip_to_next_record(1):
                return None
            continue
        end = header_end + len(_END) + length
        complete = src.fill(end + len(_END))
        if complete and src.peek(end, end + len(_END)) == _END:
            yield src.peek(0, end + len(_END))
            src.consume(end + len(_END))
            continue
        # the block does not end where Content-Length says: a wrong length, or the stream ends inside it
        if not complete and src.find(b"\n" + _VERSION, header_end, src.available()) < 0:
            return start
        yield Malformed("bad_content_length", start)
        if not src.skip_to_next_record(header_end):
            return None


class _GzipMembers:
    """A multi-member gzip stream decompressed member by member, in bounded chunks."""

    def __init__(self, fh: BinaryIO):
        self.fh = fh
        self.buf = bytearray()  # compressed bytes not consumed yet
        self.offset = 0  # file offset of buf[0]
        self.error = ""  # why the last member ended early ('' if it ended cleanly)

    def _refill(self) -> bool:
        more = self.fh.read(_CHUNK)
        self.buf += more
        return bool(more)

    def more(self) -> bool:
        return bool(self.buf) or self._refill()

    def member(self) -> Iterator[bytes]:
        """The decompressed bytes of the member at `offset`; sets `error` if it is corrupt or truncated."""
        decomp, self.error = zlib.decompressobj(31), ""
        while not decomp.eof:
            if not self.buf and not self._refill():
                self.error = "truncated_gzip"
                yield decomp.flush()  # what the compressor still holds of the intact part
                return
            try:
                with memoryview(self.buf) as view:
                    out = decomp.decompress(view, _CHUNK)
            except zlib.error:
                self.error = "bad_gzip"
                return
            used = len(self.buf) - len(decomp.unconsumed_tail) - len(decomp.unused_data)
            del self.buf[:used]
            self.offset += used
            if out:
                yield out

    def skip_to_next_member(self) -> bool:
        """Drop bytes up to the next gzip header after the current position; False at EOF."""
        start = 1
        while (found := self.buf.find(GZIP_MAGIC, start)) < 0:
            keep = min(len(self.buf), len(GZIP_MAGIC) - 1)
            self.offset += len(self.buf) - keep
            del self.buf[: len(self.buf) - keep]
            start = 0
            if not self._refill():
                return False
        del self.buf[:found]
        self.offset += found
        return True


def _file_chunks(fh: BinaryIO, head: bytes) -> Iterator[bytes]:
    yield head
    while chunk := fh.read(_CHUNK):
        yield chunk


def iter_raw_records(fh: BinaryIO) -> Iterator[bytes | Malformed]:
    """Raw uncompressed WARC records of a gzipped or plain WARC stream, with Malformed for what is not one.

    Each damaged stretch gives one Malformed; the records before and after it are kept.
    """
    head = fh.read(3)
    if not head.startswith(b"\x1f\x8b"):
        tail = yield from _split_records(_file_chunks(fh, head))
        if tail is not None:
            yield Malformed("truncated_record", tail)
        return
    members = _GzipMembers(fh)
    members.buf += head
    while members.more():
        offset = members.offset
        tail = yield from _split_records(members.member())
        # offsets inside a member are of decompressed bytes: report the member's file offset
        if members.error:
            yield Malformed(members.error, offset)
            if members.error == "truncated_gzip" or not members.skip_to_next_member():
                return
        elif tail is not None:
            yield Malformed("truncated_record", offset)
