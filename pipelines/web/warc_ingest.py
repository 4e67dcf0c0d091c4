"""Ingest existing (Common Crawl-style) WARC files into a crawl snapshot, dropping malformed records.

`ingest_warc(config, store, snapshot, out_prefix)` reads every `.warc.gz` / `.warc` file under
`config.warc_uri` (a local file or directory, or an s3:// prefix), splits it into records itself so one bad
record cannot take the rest of the file with it, validates each record with warcio (headers, HTTP headers,
block and payload digests) and re-writes the valid ones, one gzip member each, into
`out_prefix/part-NNNNN.warc.gz`. What is recoverable is kept (`warc_files.iter_raw_records`: the records
before a truncation, and after a corrupt gzip member, a bad header or a wrong `Content-Length`); every
malformed stretch is counted once, by a reason from MALFORMED_REASONS.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm
from warcio.archiveiterator import ArchiveIterator

from infra.settings import StoreSettings
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore, open_uri
from pipelines.web.crawl import CrawlConfig
from pipelines.web.warc_files import (
    MALFORMED_REASONS,
    WARCIO_ERRORS,
    Malformed,
    WarcShardWriter,
    iter_raw_records,
)

__all__ = [
    "MALFORMED_REASONS",
    "Malformed",
    "RecordRejected",
    "ingest_warc",
    "iter_raw_records",
    "validate_record",
]

log = logging.getLogger(__name__)

WARC_SUFFIXES = (".warc.gz", ".warc")


# WARC-Type values of WARC 1.1 (a record of another type is counted as `kept/other`).
WARC_TYPES = (
    "warcinfo",
    "response",
    "resource",
    "request",
    "metadata",
    "revisit",
    "conversion",
    "continuation",
)


class RecordRejected(ValueError):
    """warcio rejected a record; `reason` is one of MALFORMED_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


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

    try:
        iterator = ArchiveIterator(io.BytesIO(raw), check_digests="raise")
        record = next(iterator)
        record.raw_stream.read()  # reading the block is what checks the digests
    except StopIteration:
        raise RecordRejected("empty_record") from None
    except WARCIO_ERRORS as exc:
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
        run.stats[f"kept/{info['type'] if info['type'] in WARC_TYPES else 'other'}"] += 1
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
    writer = WarcShardWriter(store, out_prefix, config.records_per_warc_file, allow_empty=config.allow_empty)
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
