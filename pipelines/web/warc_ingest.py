"""Ingest existing (Common Crawl-style) WARC files into a crawl snapshot, dropping malformed records.

`ingest_warc(config, store, snapshot, out_prefix)` reads every `.warc.gz` / `.warc` file under
`config.warc_uri` (a local file or directory, or an s3:// prefix), splits it into records itself so one bad
record cannot take the rest of the file with it, validates each record with warcio (headers, HTTP headers,
block and payload digests) and re-writes the valid ones, one gzip member each, into
`out_prefix/part-NNNNN.warc.gz`. What is recoverable is kept: gzip is decompressed as a stream, so the records
before a truncated or corrupt stretch survive (also when the whole file is one gzip member); a corrupt member
is skipped by searching for the next member header; a bad record header or a wrong `Content-Length` by
searching for the next `WARC/1.x` line. Every malformed stretch is counted once, by reason.
"""

from __future__ import annotations

import hashlib
import logging
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm
from warcio.archiveiterator import ArchiveIterator
from warcio.bufferedreaders import ChunkedDataException
from warcio.exceptions import ArchiveLoadFailed
from warcio.statusandheaders import StatusAndHeadersParserException

from infra.settings import StoreSettings
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore, open_uri
from pipelines.web.crawl import CrawlConfig
from pipelines.web.warc_files import WarcShardWriter

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b\x08"
WARC_SUFFIXES = (".warc.gz", ".warc")
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
_WARCIO_ERRORS = (
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


class RecordRejected(ValueError):
    """warcio rejected a record; `reason` is one of MALFORMED_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


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


def _http_status(record) -> int | None:
    """The numeric HTTP status of a response record, None for other records; RecordRejected if not a number."""
    http = record.http_headers
    if not http or record.rec_type != "response":
        return None
    code = http.get_statuscode() or ""
    if not (len(code) == 3 and code.isdigit()):
        raise RecordRejected("bad_http_status", repr(code[:40]))
    return int(code)


def validate_record(raw: bytes) -> dict:
    """Parse one raw record with warcio (headers, HTTP headers, digests); returns its type, URL and status.

    Raises RecordRejected (a ValueError) with a reason from MALFORMED_REASONS if warcio rejects it.
    """
    import io

    try:
        iterator = ArchiveIterator(io.BytesIO(raw), check_digests="raise")
        record = next(iterator)
        record.raw_stream.read()  # reading the block is what checks the digests
    except StopIteration:
        raise RecordRejected("empty_record") from None
    except _WARCIO_ERRORS as exc:
        reason = "digest_mismatch" if "digest" in str(exc).lower() else "invalid_record"
        raise RecordRejected(reason, str(exc)[:200]) from exc
    http = record.http_headers
    return {
        "type": record.rec_type,
        "url": record.rec_headers.get_header("WARC-Target-URI"),
        "status": _http_status(record),
        "content_type": (http.get_header("Content-Type") or "").split(";")[0] if http else "",
        "payload_digest": record.rec_headers.get_header("WARC-Payload-Digest") or "",
    }


def _source_files(
    uri: str, store: ObjectStore, settings: StoreSettings | None
) -> tuple[ObjectStore, list[str]]:
    """The store holding the WARC files under `uri` and their keys (a single file works too)."""
    root = store.uri("")
    if uri.startswith(root):
        source, prefix = store, uri[len(root) :].strip("/")
        keys = [k for k in store.list(prefix + "/" if prefix else "") if k.endswith(WARC_SUFFIXES)]
        if not keys and prefix and store.exists(prefix):
            keys = [prefix]
        return source, keys
    if not uri.startswith("s3://"):
        path = Path(uri.removeprefix("file://"))
        if path.is_file():
            return open_uri(str(path.parent)), [path.name]
    if uri.startswith("s3://") and settings is None:
        from infra.settings import load_profile

        settings = load_profile().store  # endpoint, region and credentials of the profile's S3
    source = open_uri(uri, settings)
    keys = [k for k in source.list("") if k.endswith(WARC_SUFFIXES)]
    if not keys and uri.startswith("s3://"):
        parent, _, name = uri.rstrip("/").rpartition("/")
        parent_store = open_uri(parent, settings)
        if name.endswith(WARC_SUFFIXES) and parent_store.exists(name):
            return parent_store, [name]
    return source, keys


@dataclass
class _Ingest:
    """What one ingest read, wrote and rejected."""

    stats: Counter
    sample: list[dict]
    digests: list[str]
    pages: int = 0
    records_seen: int = 0  # complete raw records read from the input, valid or not
    records_capped: int = 0  # of those, read after `max_pages` was reached and not ingested
    files_skipped: int = 0  # input files not opened because `max_pages` was reached


def _ingest_file(key: str, fh: BinaryIO, writer: WarcShardWriter, run: _Ingest, max_pages: int, bar) -> None:
    for item in iter_raw_records(fh):
        if isinstance(item, Malformed):
            run.stats[f"malformed/{item.reason}"] += 1
            log.warning("%s: malformed WARC data at offset %d (%s)", key, item.offset, item.reason)
            continue
        run.records_seen += 1
        if run.pages >= max_pages:
            run.records_capped += 1  # counted, not validated: the rest of this file is only read
            continue
        try:
            info = validate_record(item)
        except RecordRejected as exc:
            run.stats[f"malformed/{exc.reason}"] += 1
            log.warning("%s: invalid WARC record (%s)", key, exc)
            continue
        writer.write_raw(item)
        run.stats[f"kept/{info['type']}"] += 1
        if info["type"] == "response":
            run.pages += 1
            bar.update(1)
            run.digests.append(f"{info['url']} {info['payload_digest']}")
            if len(run.sample) < 10:
                run.sample.append({k: info[k] for k in ("url", "status", "content_type")})


def _empty_input_error(config: CrawlConfig, snapshot: str, keys: list[str], run: _Ingest) -> ValueError:
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    rejected = {k: v for k, v in sorted(run.stats.items()) if "/" in k}
    return ValueError(
        f"web_crawl: the WARC input {config.warc_uri} ({shown}) gave no valid response record for snapshot "
        f"{snapshot!r} (records {rejected or 'none'}); nothing was published and the snapshot's previous "
        "output is left as it was. Set allow_empty=true to publish an empty snapshot."
    )


def ingest_warc(
    config: CrawlConfig,
    store: ObjectStore,
    snapshot: str,
    out_prefix: str,
    source_settings: StoreSettings | None = None,
) -> StageResult:
    """Copy the valid records of the WARC files at `config.warc_uri` into `out_prefix` (replaced on success).

    Stops ingesting after `config.max_pages` response records (the rest of that file is read and counted as
    `records_capped`, later files as `input_files_skipped`). Returns counts of records kept (by type) and
    malformed (by reason); `source_settings` is the S3 endpoint/credentials for an s3:// URI outside `store`.
    Raises ValueError, publishing nothing, if no valid response record was found (unless `allow_empty`).
    """
    if not config.warc_uri:
        raise ValueError("web_crawl: source=warc needs `warc_uri` (a WARC file, directory or s3:// prefix)")
    source, keys = _source_files(config.warc_uri, store, source_settings)
    if not keys:
        raise ValueError(f"web_crawl: no .warc.gz / .warc files under {config.warc_uri}")
    started = time.monotonic()
    run = _Ingest(Counter(), [], [])
    writer = WarcShardWriter(store, out_prefix, config.records_per_warc_file)
    with writer, tqdm(total=config.max_pages, unit="page", desc=f"ingest {snapshot}", mininterval=2.0) as bar:
        for i, key in enumerate(keys):
            if run.pages >= config.max_pages:
                run.files_skipped = len(keys) - i
                break
            run.stats["files"] += 1
            with source.local_copy(key) as path, open(path, "rb") as fh:
                _ingest_file(key, fh, writer, run, config.max_pages, bar)
        if run.pages == 0 and not config.allow_empty:
            raise _empty_input_error(config, snapshot, keys, run)  # before the writer replaces anything
    if run.records_capped or run.files_skipped:
        log.warning(
            "%s: stopped at max_pages=%d; %d more records read and %d input files not opened were not ingested",
            snapshot,
            config.max_pages,
            run.records_capped,
            run.files_skipped,
        )
    return _ingest_result(config, store, out_prefix, keys, writer, run, time.monotonic() - started)


def _ingest_result(
    config: CrawlConfig,
    store: ObjectStore,
    out_prefix: str,
    keys: list[str],
    writer: WarcShardWriter,
    run: _Ingest,
    elapsed: float,
) -> StageResult:
    stats = run.stats
    metrics = {
        "pages_fetched": run.pages,
        "records_kept": sum(v for k, v in stats.items() if k.startswith("kept/")),
        "malformed_records": sum(v for k, v in stats.items() if k.startswith("malformed/")),
        "records_total_seen": run.records_seen,
        "records_capped": run.records_capped,
        "input_files_skipped": run.files_skipped,
        "warc_files": len(writer.keys),
        "input_files": stats["files"],
        "elapsed_s": round(elapsed, 2),
        "pages_per_s": round(run.pages / elapsed, 2) if elapsed else 0.0,
        **{k: v for k, v in sorted(stats.items()) if "/" in k},
    }
    summary = (
        "input_files",
        "pages_fetched",
        "records_kept",
        "malformed_records",
        "records_total_seen",
        "records_capped",
        "input_files_skipped",
        "warc_files",
    )
    capped = (
        f"\n\n**Capped at max_pages={config.max_pages}**: {run.records_capped} records read and "
        f"{run.files_skipped} input files were not ingested.\n"
        if run.records_capped or run.files_skipped
        else ""
    )
    report = (
        f"### WARC ingest of `{config.warc_uri}` into `{store.uri(out_prefix)}`\n\n"
        + markdown_table([{"metric": k, "value": metrics[k]} for k in summary])
        + capped
        + "\n\n"
        + markdown_table([{"records": k, "count": v} for k, v in sorted(stats.items()) if "/" in k])
    )
    return StageResult(
        metrics=metrics,
        outputs={"warc_prefix": store.uri(out_prefix)},
        report_md=report,
        sample=run.sample,
        data_version=hashlib.sha256("\n".join(sorted(run.digests)).encode()).hexdigest()[:16],
        extra={"warc_keys": list(writer.keys), "source_keys": keys},
    )
