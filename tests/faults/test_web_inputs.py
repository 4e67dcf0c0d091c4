"""Bad web input (issue 18 items 6-8, 10, 11; issue 25 item 6): broken WARC files, hostile servers, pages in
other encodings. What is recoverable is kept, what is not is counted by a fixed reason, a bug in our own code
fails the stage, and a stage that found nothing fails before it replaces the previous output."""

from __future__ import annotations

import gzip
import io
import logging
import re
import zlib

import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from infra.store import LocalStore
from pipelines.web.crawl import CrawlConfig
from pipelines.web.warc_ingest import ingest_warc

SNAPSHOT = "snap"
OUT = f"web/warc/{SNAPSHOT}"


# ---------------------------------------------------------------- WARC files built here


def response_record(url: str, body: bytes, content_type: str = "text/html", status: str = "200 OK") -> bytes:
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    http = StatusAndHeaders(
        status, [("Content-Type", content_type), ("Content-Length", str(len(body)))], protocol="HTTP/1.1"
    )
    record = writer.create_warc_record(
        url, "response", payload=io.BytesIO(body), length=len(body), http_headers=http
    )
    writer.write_record(record)
    return out.getvalue()


def request_record(url: str) -> bytes:
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    http = StatusAndHeaders("GET / HTTP/1.1", [("Host", "example.org")], is_http_request=True)
    writer.write_record(writer.create_warc_record(url, "request", http_headers=http))
    return out.getvalue()


def page_records(n: int, start: int = 0) -> list[bytes]:
    """Request + response records of `n` pages (2n records)."""
    records = []
    for i in range(start, start + n):
        url = f"https://example.org/page{i}"
        body = f"<html><body><p>Page {i} " + "text " * 50 + "</p></body></html>"
        records += [request_record(url), response_record(url, body.encode())]
    return records


def with_content_length(record: bytes, delta: int) -> bytes:
    """The record with its WARC Content-Length off by `delta` (the first Content-Length is the WARC one)."""
    length = int(re.search(rb"Content-Length: (\d+)", record).group(1))
    return record.replace(b"Content-Length: %d" % length, b"Content-Length: %d" % (length + delta), 1)


def ingest(store: LocalStore, path, **overrides):
    return ingest_warc(CrawlConfig(source="warc", warc_uri=str(path), **overrides), store, SNAPSHOT, OUT)


def output_bytes(store: LocalStore) -> dict[str, bytes]:
    return {key: store.get_bytes(key) for key in store.list(OUT + "/")}


# ---------------------------------------------------------------- 18.6: empty or broken re-ingest


@pytest.mark.parametrize(
    "content", [b"", b"this is not a WARC file at all\r\n" * 50], ids=["empty", "garbage"]
)
def test_reingest_that_yields_nothing_fails_and_keeps_the_previous_output(tmp_path, content):
    store = LocalStore(tmp_path / "store")
    good = tmp_path / "good" / "CC-0.warc.gz"
    good.parent.mkdir()
    good.write_bytes(b"".join(gzip.compress(r, mtime=0) for r in page_records(3)))
    assert ingest(store, good.parent).metrics["pages_fetched"] == 3
    before = output_bytes(store)
    assert len(before) == 1

    bad = tmp_path / "bad" / "CC-1.warc.gz"
    bad.parent.mkdir()
    bad.write_bytes(content)
    with pytest.raises(ValueError, match=r"CC-1\.warc\.gz.*'snap'.*allow_empty"):
        ingest(store, bad.parent)
    assert output_bytes(store) == before  # the previous good output is still there, byte for byte

    # asked for explicitly, an empty snapshot is published (and replaces the old one)
    result = ingest(store, bad.parent, allow_empty=True)
    assert result.metrics["pages_fetched"] == 0 and output_bytes(store) == {}


# ---------------------------------------------------------------- 18.7: damaged WARC files


def complete_prefix_records(records: list[bytes], compressed: bytes) -> int:
    """How many records lie entirely inside what zlib can decompress of a truncated gzip stream."""
    decomp = zlib.decompressobj(31)
    available = len(decomp.decompress(compressed) + decomp.flush())
    ends, total = [], 0
    for record in records:
        total += len(record)
        ends.append(total)
    return sum(1 for end in ends if end <= available)


def test_truncated_whole_file_gzip_keeps_every_record_before_the_cut(tmp_path):
    records = page_records(20)  # 40 records in one gzip member, as some tools write them
    whole = gzip.compress(b"".join(records), mtime=0)
    cut = whole[: int(len(whole) * 0.6)]
    path = tmp_path / "whole.warc.gz"
    path.write_bytes(cut)
    complete = complete_prefix_records(records, cut)
    assert complete >= 10  # the cut is well inside the file

    result = ingest(LocalStore(tmp_path / "store"), path)
    m = result.metrics
    assert m["records_kept"] == complete
    assert m["pages_fetched"] == complete // 2
    assert m["malformed/truncated_gzip"] == 1 and m["malformed_records"] == 1


@pytest.mark.parametrize("delta", [+123, -40], ids=["too_long", "too_short"])
@pytest.mark.parametrize("compression", ["plain", "whole_gzip", "member_gzip"])
def test_wrong_content_length_loses_only_that_record_and_is_counted_once(tmp_path, delta, compression):
    records = page_records(5)
    records[3] = with_content_length(records[3], delta)  # page1's response
    data = {
        "plain": lambda: b"".join(records),
        "whole_gzip": lambda: gzip.compress(b"".join(records), mtime=0),
        "member_gzip": lambda: b"".join(gzip.compress(r, mtime=0) for r in records),
    }[compression]()
    path = tmp_path / ("in.warc" if compression == "plain" else "in.warc.gz")
    path.write_bytes(data)

    m = ingest(LocalStore(tmp_path / "store"), path).metrics
    assert m["pages_fetched"] == 4 and m["records_kept"] == 9
    assert m["malformed_records"] == 1
    assert sum(v for k, v in m.items() if k.startswith("malformed/")) == 1


def test_a_warc_over_max_pages_says_it_was_capped(tmp_path, caplog):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.warc.gz").write_bytes(b"".join(gzip.compress(r, mtime=0) for r in page_records(5000)))
    (src / "b.warc.gz").write_bytes(b"".join(gzip.compress(r, mtime=0) for r in page_records(2)))
    with caplog.at_level(logging.WARNING, logger="pipelines.web.warc_ingest"):
        result = ingest(LocalStore(tmp_path / "store"), src, max_pages=50)
    m = result.metrics
    assert m["pages_fetched"] == 50
    assert m["records_total_seen"] == 10_000  # every record of a.warc.gz was read
    assert m["records_capped"] == 10_000 - 100  # the 50 pages are the first 100 records
    assert m["input_files_skipped"] == 1
    assert "Capped at max_pages=50" in result.report_md
    assert any("max_pages=50" in r.getMessage() and "9900" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- 18.11 / 25.6: reasons, not free text


def test_a_free_text_status_line_is_counted_under_a_fixed_key(tmp_path):
    records = page_records(2)
    status = "Internal-error-" + "x" * 200 + " OK"
    records.append(response_record("https://example.org/odd", b"<html>odd</html>", status=status))
    path = tmp_path / "in.warc.gz"
    path.write_bytes(b"".join(gzip.compress(r, mtime=0) for r in records))
    m = ingest(LocalStore(tmp_path / "store"), path).metrics
    assert m["pages_fetched"] == 2 and m["malformed/bad_http_status"] == 1
    assert max(len(k) for k in m) <= 40


def test_a_bug_in_record_validation_fails_the_ingest(tmp_path, monkeypatch):
    import pipelines.web.warc_ingest as warc_ingest

    def broken(*args, **kwargs):
        raise TypeError("a bug in our code, not a malformed record")

    path = tmp_path / "in.warc.gz"
    path.write_bytes(b"".join(gzip.compress(r, mtime=0) for r in page_records(2)))
    monkeypatch.setattr(warc_ingest, "ArchiveIterator", broken)
    store = LocalStore(tmp_path / "store")
    with pytest.raises(TypeError, match="a bug in our code"):
        ingest(store, path)
    assert store.list(OUT + "/") == []
