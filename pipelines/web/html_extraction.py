"""Reading HTML responses out of WARC files and extracting their main text, counting and recording every
record that does not make it (non-HTML, HTTP errors, undecodable bytes, extraction failures) with a reason.

datatrove's WarcReader and Trafilatura step skip such records silently; these subclasses keep their logic and
send the losers to an exclusion writer instead.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
from multiprocessing import Pipe
from typing import TYPE_CHECKING

from datatrove.data import Document, DocumentsPipeline
from datatrove.io import DataFileLike, DataFolderLike
from datatrove.pipeline.extractors import Trafilatura
from datatrove.pipeline.extractors.base import ExtractorSandbox
from datatrove.pipeline.readers import WarcReader
from datatrove.pipeline.writers.disk_base import DiskWriter
from datatrove.utils.logging import logger

if TYPE_CHECKING:
    from warcio.recordloader import ArcWarcRecord

HTML_TYPES = ("text/html", "application/xhtml+xml")


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
    body = record.content_stream().read()
    record.raw_stream.read()  # drain what the content decoder left, so `limit` says if bytes are missing
    if getattr(record.raw_stream, "limit", 0) > 0:
        return fields, "truncated_record"
    if http is not None and record.rec_type == "response":
        status = http.get_statuscode()
        if not str(status).startswith("2"):
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
    try:
        html = body.decode("utf-8")
    except UnicodeDecodeError:
        import cchardet

        encoding = cchardet.detect(body)["encoding"]
        try:
            html = body.decode(encoding) if encoding else None
        except (UnicodeDecodeError, LookupError):
            html = None
        if html is None:
            return fields, "undecodable"
    return {**fields, "text": html}, None


class HtmlWarcReader(WarcReader):
    """WarcReader that sends non-HTML, non-2xx and undecodable responses to `exclusion_writer` with a reason.

    Every document gets metadata `url`, `date`, `snapshot` and `warc_file` (path relative to the snapshot). A file that stops parsing mid-way (truncated or
    malformed record) keeps the documents read so far and counts `dropped_truncated_record` or
    `dropped_malformed_warc`.
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

    def read_file(self, filepath: str):
        from warcio.archiveiterator import ArchiveIterator

        with self.data_folder.open(filepath, "rb", compression=self.compression) as f:
            records = iter(ArchiveIterator(f))
            index = 0
            while True:
                try:
                    with self.track_time():
                        record = next(records, None)
                        if record is None:
                            break
                        fields, reason = html_payload(record)
                except Exception as exc:  # warcio raises several types on a malformed record; none can resync
                    logger.warning(f"{filepath}: stopped reading at record {index}: {exc!r}")
                    self.stat_update("total")
                    self._drop(None, "malformed_warc", filepath, index)
                    break
                index += 1
                if reason == "not_a_response":
                    self.stat_update("records_not_response")
                    continue
                self.stat_update("total")
                if reason:
                    self._drop(fields, reason, filepath, index - 1)
                    continue
                document = self.get_document_from_dict({**fields, "warc_file": filepath}, filepath, index - 1)
                if document is None:
                    continue
                self.stat_update("forwarded")
                yield document


class ForkingExtractorSandbox(ExtractorSandbox):
    """datatrove's extraction sandbox, always forked: a process that was itself spawned (a Dagster run worker)
    inherits the `spawn` start method, which cannot pickle the extractor and its writers."""

    def _quiet_worker(self, conn, extract_fn):
        # the fork inherits the parent's SIGTERM handler (Dagster raises on it): die quietly when terminated
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._worker(conn, extract_fn)

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
            self.parent_conn.recv()  # the worker's "ready" after its warm-up
        else:
            self._cleanup_process()
            raise TimeoutError(f"extraction worker did not start within {self.timeout} s")


class TrafilaturaWithDrops(Trafilatura):
    """datatrove's Trafilatura step (same sandboxed extraction) that records failures with a reason:
    `no_text_extracted`, `extraction_timeout`, `extraction_error`, `extractor_crashed`.

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
                    except Exception as exc:
                        logger.warning(f"extraction failed for {doc.metadata.get('url')}: {exc!r}")
                        reason = "extraction_error"
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
