"""Reading HTML responses out of WARC files and extracting their main text, counting and recording every
record that does not make it (damaged records, non-HTML, HTTP errors, undecodable bytes, extraction failures)
with a reason.

datatrove's WarcReader and Trafilatura step skip such records silently; these subclasses keep their logic and
send the losers to an exclusion writer instead. Only failures caused by the input are counted: a bug in this
code (a TypeError, KeyError, ...) fails the stage with its traceback.

Pages are decoded with the charset they declare (HTTP Content-Type, then `<meta charset>` / http-equiv), then
as UTF-8, then with the charset `charset-normalizer` detects; a page none of these decode is dropped as
`undecodable`.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import multiprocessing
import re
import signal
import traceback
from multiprocessing import Pipe
from typing import TYPE_CHECKING

from datatrove.data import Document, DocumentsPipeline
from datatrove.io import DataFileLike, DataFolderLike
from datatrove.pipeline.extractors import Trafilatura
from datatrove.pipeline.extractors.base import ExtractorSandbox
from datatrove.pipeline.readers import WarcReader
from datatrove.pipeline.writers.disk_base import DiskWriter
from datatrove.utils.logging import logger
from lxml.etree import LxmlError
from warcio.archiveiterator import ArchiveIterator

from pipelines.web.warc_files import WARCIO_ERRORS, Malformed, iter_raw_records

if TYPE_CHECKING:
    from warcio.recordloader import ArcWarcRecord

HTML_TYPES = ("text/html", "application/xhtml+xml")
# How a page's text was decoded (stats `decoded_<how>`, metrics `decoded/<how>`).
DECODED_BY = ("bom", "http_header", "meta", "utf8", "detected")
_HTTP_CHARSET = re.compile(r"""charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_META_CHARSET = re.compile(rb"""<meta\b[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
# Labels browsers read as a superset (WHATWG Encoding Standard): the superset decodes what the page meant.
_SUPERSETS = {
    "iso8859-1": "cp1252",
    "ascii": "cp1252",
    "shift_jis": "cp932",
    "gb2312": "gb18030",
    "gbk": "gb18030",
}


def _codecs_for(label: str, where: str) -> list[str]:
    """Python codecs to try for a declared charset label (superset first), [] if the label is unknown."""
    try:
        name = codecs.lookup(label).name
    except LookupError:
        return []
    if where == "meta" and name.startswith("utf-16"):
        return ["utf-8"]  # a meta tag readable as ASCII cannot be UTF-16 (WHATWG: treat as UTF-8)
    return list(dict.fromkeys([_SUPERSETS.get(name, name), name]))


def decode_html(body: bytes, content_type: str | None) -> tuple[str | None, str, str]:
    """(text, codec, how) of an HTML payload; `how` is one of DECODED_BY, text None if nothing decodes it.

    Order: byte-order mark, the HTTP header's charset, `<meta charset>` / http-equiv in the first 4 KiB,
    UTF-8, then `charset-normalizer`'s detection. Every decode is strict (no replacement characters).
    """
    for bom, codec in _BOMS:
        if body.startswith(bom):
            with contextlib.suppress(UnicodeDecodeError):
                return body.decode(codec), codec, "bom"
    http = _HTTP_CHARSET.search(content_type or "")
    meta = _META_CHARSET.search(body[:4096])
    declared = [(http.group(1), "http_header")] if http else []
    declared += [(meta.group(1).decode("ascii"), "meta")] if meta else []
    for label, how in [*declared, ("utf-8", "utf8")]:
        for codec in _codecs_for(label, how):
            with contextlib.suppress(UnicodeDecodeError):
                return body.decode(codec), codec, how
    from charset_normalizer import from_bytes

    best = from_bytes(body).best()
    if best is None:
        return None, "", "undecodable"
    return str(best), best.encoding, "detected"


def html_payload(record: ArcWarcRecord) -> tuple[dict | None, str | None]:
    """(fields of the document, None) for an HTML response, else (fields or None, reason it is skipped).

    Reason `not_a_response` marks request/metadata/warcinfo records, which are not documents at all.
    """
    if record.rec_type not in ("response", "conversion"):
        return None, "not_a_response"
    headers = record.rec_headers
    fields = {
        "id": headers.get_header("WARC-Record-ID"),
        "url": headers.get_header("WARC-Target-URI"),
        "date": headers.get_header("WARC-Date"),
    }
    http = record.http_headers
    try:
        body = record.content_stream().read()
        record.raw_stream.read()  # drain what the content decoder left, so `limit` says if bytes are missing
    except WARCIO_ERRORS as exc:  # a chunked or content-encoded payload that does not decode
        logger.warning(f"{fields['url']}: payload cannot be read: {exc!r}")
        return fields, "unparseable_record"
    if getattr(record.raw_stream, "limit", 0) > 0:
        return fields, "truncated_record"
    if http is not None and record.rec_type == "response":
        status = str(http.get_statuscode() or "")
        if not (len(status) == 3 and status.isdigit()):
            return fields, "bad_http_status"  # free text from the page never becomes a metric key
        if not status.startswith("2"):
            return fields, f"http_status_{status}"
    mime = headers.get_header("WARC-Identified-Payload-Type")
    if mime is None and http is not None and http.get_header("Content-Type"):
        mime = http.get_header("Content-Type").split(";")[0].strip().lower()
    if mime is None:
        import magic

        mime = magic.from_buffer(body, mime=True)
    if mime not in HTML_TYPES and not (record.rec_type == "conversion" and mime == "text/plain"):
        return fields, "non_html"
    if not body.strip():
        return fields, "empty_body"
    html, codec, how = decode_html(body, http.get_header("Content-Type") if http is not None else None)
    if html is None:
        return fields, "undecodable"
    return {**fields, "text": html, "charset": codec, "decoded_by": how}, None


class HtmlWarcReader(WarcReader):
    """WarcReader that sends non-HTML, non-2xx and undecodable responses to `exclusion_writer` with a reason.

    Every document gets metadata `url`, `date`, `snapshot`, `warc_file` (path relative to the snapshot) and
    `charset` (the codec its text was decoded with; stats `decoded_<how>` say how it was chosen). Files are
    split with `warc_files.iter_raw_records`, so a damaged stretch costs only its own records: counted as
    `dropped_truncated_record`, `dropped_malformed_warc` (bad gzip, header or length) or
    `dropped_unparseable_record` (a record warcio cannot parse, e.g. a broken HTTP header block).
    """

    name = "🕷 Warc (HTML responses)"

    def __init__(
        self,
        data_folder: DataFolderLike,
        paths_file: DataFileLike,
        snapshot: str,
        exclusion_writer: DiskWriter | None = None,
        doc_progress: bool = False,
    ):
        # compression=None: warcio reads the per-record gzip members itself and, unlike a gzip stream around
        # the whole file, still yields the records before a truncated one
        super().__init__(
            data_folder,
            paths_file=paths_file,
            compression=None,
            default_metadata={"snapshot": snapshot},
            doc_progress=doc_progress,
        )
        self.add_file_path = False  # an absolute local path would differ between runs; see `warc_file`
        self.snapshot = snapshot
        self.exclusion_writer = exclusion_writer
        self._writer = None
        self._rank = 0

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.exclusion_writer if self.exclusion_writer else contextlib.nullcontext() as writer:
            self._writer, self._rank = writer, rank
            yield from super().run(data, rank, world_size)

    def _drop(self, fields: dict | None, reason: str, filepath: str, index: int) -> None:
        self.stat_update("dropped", f"dropped_{reason}")
        if self._writer is None:
            return
        fields = fields or {}
        metadata = {
            "snapshot": self.snapshot,
            "url": fields.get("url"),
            "date": fields.get("date"),
            "filter_reason": reason,
            "warc_file": filepath,
        }
        self._writer.write(
            Document(text="", id=fields.get("id") or f"{filepath}/{index}", metadata=metadata), self._rank
        )

    def _parse(self, raw: bytes | Malformed, filepath: str, index: int) -> tuple[dict | None, str | None]:
        """(fields, drop reason) of one raw record, as `html_payload`; damaged input gets its own reason."""
        if isinstance(raw, Malformed):
            logger.warning(f"{filepath}: damaged WARC data at offset {raw.offset} ({raw.reason})")
            return None, "truncated_record" if raw.reason.startswith("truncated") else "malformed_warc"
        try:
            record = next(iter(ArchiveIterator(io.BytesIO(raw))))
        except (StopIteration, *WARCIO_ERRORS) as exc:
            logger.warning(f"{filepath}: record {index} cannot be parsed: {exc!r}")
            return None, "unparseable_record"
        return html_payload(record)

    def read_file(self, filepath: str):
        with self.data_folder.open(filepath, "rb", compression=self.compression) as f:
            for index, raw in enumerate(iter_raw_records(f)):
                with self.track_time():
                    fields, reason = self._parse(raw, filepath, index)
                if reason == "not_a_response":
                    self.stat_update("records_not_response")
                    continue
                self.stat_update("total")
                if reason:
                    self._drop(fields, reason, filepath, index)
                    continue
                self.stat_update(f"decoded_{fields.pop('decoded_by')}")
                document = self.get_document_from_dict({**fields, "warc_file": filepath}, filepath, index)
                if document is None:
                    continue
                self.stat_update("forwarded")
                yield document


class DocumentParseError(Exception):
    """The extractor could not parse one document (counted as `extraction_error`; the stage goes on)."""


class ExtractorBug(Exception):
    """The extraction code itself failed (fails the stage); the message is the worker's traceback."""


# What a parser raises on a document it cannot handle; anything else is a bug.
DOCUMENT_PARSE_ERRORS = (LxmlError, ValueError, UnicodeError, RecursionError)


def _extract_one(extract_fn, text) -> object:
    """extract_fn(text), or the failure as an exception object the parent re-raises."""
    try:
        return extract_fn(text)
    except DOCUMENT_PARSE_ERRORS as exc:
        return DocumentParseError(f"{type(exc).__name__}: {exc}"[:300])
    except Exception:  # noqa: BLE001 - sent to the parent, which raises it
        return ExtractorBug(traceback.format_exc())


class ForkingExtractorSandbox(ExtractorSandbox):
    """datatrove's extraction sandbox, always forked (a process that was itself spawned, a Dagster run worker,
    inherits the `spawn` start method, which cannot pickle the extractor and its writers), whose worker sends
    failures back typed: a document the parser rejects, or a bug (datatrove's worker dies on any exception,
    which the parent could only count as a crash)."""

    def _quiet_worker(self, conn, extract_fn):
        # the fork inherits the parent's SIGTERM handler (Dagster raises on it): die quietly when terminated
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        warmup = _extract_one(extract_fn, self.warmup_text)
        conn.send(warmup if isinstance(warmup, ExtractorBug) else None)  # None: ready
        while True:
            try:
                text = conn.recv()
            except EOFError:
                break
            conn.send(_extract_one(extract_fn, text))

    def _ensure_process(self, extract_fn):
        if self.process is not None and self.process.is_alive():
            return
        if self.process is not None:
            self._cleanup_process()
        self.parent_conn, self.child_conn = Pipe()
        ctx = multiprocessing.get_context("fork")
        self.process = ctx.Process(target=self._quiet_worker, args=(self.child_conn, extract_fn), daemon=True)
        self.process.start()
        self.all_processes.append(self.process)
        if self.parent_conn.poll(self.timeout):
            ready = self.parent_conn.recv()  # None after the worker's warm-up, or the bug it hit
            if isinstance(ready, ExtractorBug):
                self._cleanup_process()
                raise ready
        else:
            self._cleanup_process()
            raise TimeoutError(f"extraction worker did not start within {self.timeout} s")


class TrafilaturaWithDrops(Trafilatura):
    """datatrove's Trafilatura step (same sandboxed extraction) that records failures with a reason:
    `no_text_extracted`, `extraction_timeout`, `extraction_error` (the parser rejected the document),
    `extractor_crashed` (the worker process died); a bug in the extraction code fails the stage.

    Dropped records keep the first `dropped_html_chars` characters of their HTML for inspection.
    """

    name = "⛏ Trafilatura (drops recorded)"

    def __init__(
        self,
        timeout: float,
        exclusion_writer: DiskWriter | None = None,
        dropped_html_chars: int = 2000,
        **kwargs,
    ):
        super().__init__(timeout=timeout, **kwargs)
        self.exclusion_writer = exclusion_writer
        self.dropped_html_chars = dropped_html_chars

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with (
            ForkingExtractorSandbox(timeout=self.timeout, warmup_text="") as extractor,
            self.exclusion_writer if self.exclusion_writer else contextlib.nullcontext() as writer,
        ):
            for doc in data:
                self.stat_update("total")
                html, text, reason = doc.text, None, None
                with self.track_time():
                    try:
                        text = extractor.process_document(html, self.extract)
                    except TimeoutError:
                        reason = "extraction_timeout"
                    except EOFError:
                        reason = "extractor_crashed"
                    except DocumentParseError as exc:
                        logger.warning(f"extraction failed for {doc.metadata.get('url')}: {exc}")
                        reason = "extraction_error"
                    except ExtractorBug as exc:
                        raise ExtractorBug(f"extracting {doc.metadata.get('url')} failed:\n{exc}") from None
                if reason is None and not (text and text.strip()):
                    reason = "no_text_extracted"
                if reason:
                    self.stat_update("dropped", f"dropped_{reason}")
                    if writer:
                        doc.text = html[: self.dropped_html_chars]
                        doc.metadata["filter_reason"] = reason
                        writer.write(doc, rank)
                    continue
                doc.text = text
                self.stat_update("forwarded")
                self.update_doc_stats(doc)
                yield doc
