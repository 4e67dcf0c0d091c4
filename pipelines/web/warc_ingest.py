"""Ingest existing (Common Crawl-style) WARC files into a crawl snapshot, dropping malformed records.

`ingest_warc(config, store, snapshot, out_prefix)` reads every `.warc.gz` / `.warc` file under
`config.warc_uri` (a local file or directory, or an s3:// prefix), splits it into records itself so one bad
record cannot take the rest of the file with it (a corrupt or truncated gzip member is skipped by searching for
the next member header; a bad record header by searching for the next `WARC/1.x` line), validates each record
with warcio (headers, HTTP headers, block and payload digests) and re-writes the valid ones, one gzip member
each, into `out_prefix/part-NNNNN.warc.gz`. Malformed records are counted by reason.
"""

from __future__ import annotations

import hashlib
import io
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

from infra.settings import StoreSettings
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore, open_uri
from pipelines.web.crawl import CrawlConfig
from pipelines.web.warc_files import WarcShardWriter

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b\x08"
WARC_SUFFIXES = (".warc.gz", ".warc")
MAX_RECORD_BYTES = (
    256 * 1024 * 1024
)  # a bigger record is treated as corrupt (Common Crawl caps payloads at 1 MiB)
MAX_HEADER_BYTES = 64 * 1024
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Malformed:
    """A stretch of a WARC file that is not a valid record, and why."""

    reason: str
    offset: int


class _Lines:
    """A binary stream read by lines and blocks, with one line of push-back (for resynchronising)."""

    def __init__(self, fh: BinaryIO):
        self.fh, self.pending, self.offset = fh, b"", 0

    def readline(self) -> bytes:
        line, self.pending = (
            (self.pending, b"") if self.pending else (self.fh.readline(MAX_HEADER_BYTES), b"")
        )
        self.offset += len(line)
        return line

    def unread(self, line: bytes) -> None:
        self.pending = line
        self.offset -= len(line)

    def read(self, n: int) -> bytes:
        data = self.fh.read(n)
        self.offset += len(data)
        return data


def _split_records(fh: BinaryIO) -> Iterator[bytes | Malformed]:
    """Split an uncompressed WARC stream into raw records (header + block + CRLFCRLF), or Malformed."""
    src = _Lines(fh)
    while True:
        line = src.readline()
        while line in (b"\r\n", b"\n"):
            line = src.readline()
        if not line:
            return
        start = src.offset - len(line)
        if not line.startswith(b"WARC/1."):
            yield Malformed("bad_record_header", start)
            while line and not line.startswith(b"WARC/1."):  # resync on the next record's version line
                line = src.readline()
            if line:
                src.unread(line)
            continue
        header = [line]
        while (line := src.readline()) not in (b"\r\n", b"\n", b""):
            header.append(line)
            if sum(map(len, header)) > MAX_HEADER_BYTES or line.startswith(b"WARC/1."):
                break
        length = _content_length(header)
        if line.startswith(b"WARC/1.") or length is None or length > MAX_RECORD_BYTES:
            yield Malformed("bad_record_header", start)
            if line.startswith(b"WARC/1."):
                src.unread(line)
            continue
        block = src.read(length)
        if len(block) < length:
            yield Malformed("truncated_record", start)
            return
        trailer = src.read(4)
        if trailer != b"\r\n\r\n":
            yield Malformed("bad_content_length", start)
            continue
        yield b"".join(header) + b"\r\n" + block + trailer


def _content_length(header: list[bytes]) -> int | None:
    for line in header[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            value = value.strip()
            return int(value) if value.isdigit() else None
    return None


def _gzip_members(fh: BinaryIO) -> Iterator[tuple[int, bytes] | Malformed]:
    """Decompress a multi-member gzip stream member by member: (offset, data) or Malformed.

    A corrupt member is skipped by searching for the next gzip header after its start, so the members after
    it are kept; a truncated last member is reported as such.
    """
    buf = bytearray()  # compressed bytes from the start of the current member
    offset = 0  # file offset of buf[0]
    eof = False

    def refill() -> bool:
        nonlocal eof
        more = b"" if eof else fh.read(_CHUNK)
        eof = eof or not more
        buf.extend(more)
        return bool(more)

    while buf or refill():
        decomp, fed, out, size, error = zlib.decompressobj(31), 0, [], 0, ""
        while True:
            if fed == len(buf) and not refill():
                error = "truncated_gzip" if fed else ""
                break
            try:
                chunk = decomp.decompress(memoryview(buf)[fed:])
            except zlib.error:
                error = "bad_gzip"
                break
            fed = len(buf)
            out.append(chunk)
            size += len(chunk)
            if size > MAX_RECORD_BYTES:
                error = "record_too_large"
                break
            if decomp.eof:
                break
        if not error and decomp.eof:
            used = len(buf) - len(decomp.unused_data)
            yield offset, b"".join(out)
            del buf[:used]
            offset += used
            continue
        if not error:  # only whitespace/padding after the last member
            return
        yield Malformed(error, offset)
        if error == "truncated_gzip":
            return
        while (nxt := buf.find(GZIP_MAGIC, 1)) < 0:  # resync on the next member header
            keep = buf[-2:] if len(buf) > 2 else buf[1:]
            offset += len(buf) - len(keep)
            buf[:] = keep
            if not refill():
                return
        del buf[:nxt]
        offset += nxt


def iter_raw_records(fh: BinaryIO) -> Iterator[bytes | Malformed]:
    """Raw uncompressed WARC records of a gzipped or plain WARC stream, with Malformed for what is not one."""
    head = fh.read(3)
    stream = io.BufferedReader(_Prepend(head, fh))
    if head.startswith(b"\x1f\x8b"):
        for member in _gzip_members(stream):
            if isinstance(member, Malformed):
                yield member
                continue
            offset, data = member
            for record in _split_records(io.BytesIO(data)):
                # offsets inside a member are of decompressed bytes: report the member's file offset
                yield Malformed(record.reason, offset) if isinstance(record, Malformed) else record
    else:
        yield from _split_records(stream)


class _Prepend(io.RawIOBase):
    """A raw stream that replays `head` before the rest of `fh` (so the format can be sniffed)."""

    def __init__(self, head: bytes, fh: BinaryIO):
        self.head, self.fh = head, fh

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.head:
            n = min(len(buffer), len(self.head))
            buffer[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.fh.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def validate_record(raw: bytes) -> dict:
    """Parse one raw record with warcio (headers, HTTP headers, digests); returns its type, URL and status.

    Raises ValueError with a short reason if warcio rejects it.
    """
    try:
        iterator = ArchiveIterator(io.BytesIO(raw), check_digests="raise")
        record = next(iterator)
        record.raw_stream.read()  # reading the block is what checks the digests
    except StopIteration:
        raise ValueError("empty_record") from None
    except Exception as exc:  # warcio raises several types for malformed input
        reason = "digest_mismatch" if "digest" in str(exc).lower() else "invalid_record"
        raise ValueError(reason) from exc
    http = record.http_headers
    return {
        "type": record.rec_type,
        "url": record.rec_headers.get_header("WARC-Target-URI"),
        "status": int(http.get_statuscode() or 0) if http and record.rec_type == "response" else None,
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


def ingest_warc(
    config: CrawlConfig,
    store: ObjectStore,
    snapshot: str,
    out_prefix: str,
    source_settings: StoreSettings | None = None,
) -> StageResult:
    """Copy the valid records of the WARC files at `config.warc_uri` into `out_prefix` (replaced on success).

    Stops after `config.max_pages` response records. Returns counts of records kept (by type) and malformed
    (by reason); `source_settings` is the S3 endpoint/credentials for an s3:// URI outside `store`.
    """
    if not config.warc_uri:
        raise ValueError("web_crawl: source=warc needs `warc_uri` (a WARC file, directory or s3:// prefix)")
    source, keys = _source_files(config.warc_uri, store, source_settings)
    if not keys:
        raise ValueError(f"web_crawl: no .warc.gz / .warc files under {config.warc_uri}")
    started = time.monotonic()
    stats: Counter[str] = Counter()
    sample: list[dict] = []
    digests: list[str] = []
    pages = 0
    writer = WarcShardWriter(store, out_prefix, config.records_per_warc_file)
    with writer, tqdm(total=config.max_pages, unit="page", desc=f"ingest {snapshot}", mininterval=2.0) as bar:
        for key in keys:
            if pages >= config.max_pages:
                break
            stats["files"] += 1
            with source.local_copy(key) as path, open(path, "rb") as fh:
                for item in iter_raw_records(fh):
                    if isinstance(item, Malformed):
                        stats[f"malformed/{item.reason}"] += 1
                        log.warning(
                            "%s: malformed WARC data at offset %d (%s)", key, item.offset, item.reason
                        )
                        continue
                    try:
                        info = validate_record(item)
                    except ValueError as exc:
                        stats[f"malformed/{exc}"] += 1
                        log.warning("%s: invalid WARC record (%s: %s)", key, exc, exc.__cause__)
                        continue
                    writer.write_raw(item)
                    stats[f"kept/{info['type']}"] += 1
                    if info["type"] == "response":
                        pages += 1
                        bar.update(1)
                        digests.append(f"{info['url']} {info['payload_digest']}")
                        if len(sample) < 10:
                            sample.append({k: info[k] for k in ("url", "status", "content_type")})
                        if pages >= config.max_pages:
                            break
    elapsed = time.monotonic() - started
    malformed = sum(v for k, v in stats.items() if k.startswith("malformed/"))
    kept = sum(v for k, v in stats.items() if k.startswith("kept/"))
    metrics = {
        "pages_fetched": pages,
        "records_kept": kept,
        "malformed_records": malformed,
        "warc_files": len(writer.keys),
        "input_files": stats["files"],
        "elapsed_s": round(elapsed, 2),
        "pages_per_s": round(pages / elapsed, 2) if elapsed else 0.0,
        **{k: v for k, v in sorted(stats.items()) if "/" in k},
    }
    rows = [{"records": k, "count": v} for k, v in sorted(stats.items()) if "/" in k]
    report = (
        f"### WARC ingest of `{config.warc_uri}` into `{store.uri(out_prefix)}`\n\n"
        + markdown_table(
            [
                {"metric": k, "value": metrics[k]}
                for k in ("input_files", "pages_fetched", "records_kept", "malformed_records", "warc_files")
            ]
        )
        + "\n\n"
        + markdown_table(rows)
    )
    return StageResult(
        metrics=metrics,
        outputs={"warc_prefix": store.uri(out_prefix)},
        report_md=report,
        sample=sample,
        data_version=hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()[:16],
        extra={"warc_keys": list(writer.keys), "source_keys": keys},
    )
