"""WARC ingest: valid records are copied, malformed ones counted and skipped, the rest of the file kept."""

from __future__ import annotations

import gzip
import io
from collections import Counter

import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from infra.committed import read_committed
from infra.settings import StoreSettings
from infra.store import LocalStore, S3Store
from pipelines.web.crawl import CrawlConfig, crawl_web
from pipelines.web.warc_files import iter_warc_records
from pipelines.web.warc_ingest import Malformed, ingest_warc, iter_raw_records


def record_bytes(url: str, html: str, rec_type: str = "response") -> bytes:
    """One uncompressed WARC record, as Common Crawl writes them."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    if rec_type == "warcinfo":
        record = writer.create_warcinfo_record("cc.warc.gz", {"software": "test", "isPartOf": "CC-TEST"})
    elif rec_type == "request":
        headers = StatusAndHeaders("GET / HTTP/1.1", [("Host", "example.org")], is_http_request=True)
        record = writer.create_warc_record(url, "request", http_headers=headers)
    else:
        body = html.encode()
        headers = StatusAndHeaders(
            "200 OK", [("Content-Type", "text/html"), ("Content-Length", str(len(body)))], protocol="HTTP/1.1"
        )
        record = writer.create_warc_record(
            url,
            "response",
            payload=io.BytesIO(body),
            length=len(body),
            http_headers=headers,
            warc_headers_dict={"WARC-Identified-Payload-Type": "text/html"},
        )
    writer.write_record(record)
    return out.getvalue()


def pages(n: int, start: int = 0) -> list[bytes]:
    recs = []
    for i in range(start, start + n):
        url = f"https://example.org/page{i}"
        recs += [
            record_bytes(url, "", "request"),
            record_bytes(url, f"<html><body><p>Page {i} " + "text " * 50 + "</p></body></html>"),
        ]
    return recs


def gz(raw: bytes) -> bytes:
    return gzip.compress(raw, mtime=0)


def corrupt_middle(member: bytes) -> bytes:
    data = bytearray(member)
    for i in range(len(data) // 2, len(data) // 2 + 8):
        data[i] ^= 0xFF
    return bytes(data)


@pytest.fixture
def damaged_warc(tmp_path):
    """A gzipped WARC of warcinfo + 6 pages where 4 records are damaged in different ways."""
    recs = [record_bytes("", "", "warcinfo"), *pages(6)]  # 13 records: info, (req, resp) x 6
    members = [gz(r) for r in recs]
    members[4] = corrupt_middle(members[4])  # page1 response: corrupt deflate data
    members[6] = gz(recs[6].replace(b"Page 2", b"Pag3 2"))  # page2 response: payload digest mismatch
    members[7] = gz(recs[7].replace(b"WARC/1.", b"WARX/1.", 1))  # page3 request: bad version line
    members[12] = members[12][: len(members[12]) // 2]  # page5 response: truncated last member
    path = tmp_path / "in" / "CC-TEST-00000.warc.gz"
    path.parent.mkdir()
    path.write_bytes(b"".join(members))
    return path


def ingest(tmp_path, uri, **overrides):
    store = LocalStore(tmp_path / "store")
    result = ingest_warc(
        CrawlConfig(source="warc", warc_uri=str(uri), **overrides), store, "snap", "web/warc/snap"
    )
    records = [
        r
        for k in read_committed(store, "web/warc/snap").keys()
        for r in iter_warc_records(store.local_path(k), types=())
    ]
    return result, records


def test_malformed_records_are_counted_and_skipped_and_the_rest_kept(tmp_path, damaged_warc):
    result, records = ingest(tmp_path, damaged_warc)
    m = result.metrics
    assert m["malformed/bad_gzip"] == 1
    assert m["malformed/digest_mismatch"] == 1
    assert m["malformed/bad_record_header"] == 1
    assert m["malformed/truncated_gzip"] == 1
    assert m["malformed_records"] == 4
    assert Counter(r["type"] for r in records) == {"warcinfo": 1, "request": 5, "response": 3}
    assert m["records_kept"] == 9 and m["pages_fetched"] == 3
    assert sorted(r["url"] for r in records if r["type"] == "response") == [
        "https://example.org/page0",
        "https://example.org/page3",
        "https://example.org/page4",
    ]
    assert "malformed/bad_gzip" in result.report_md


def test_ingested_warc_is_readable_by_datatrove(tmp_path, damaged_warc):
    from datatrove.pipeline.readers import WarcReader

    ingest(tmp_path, damaged_warc)
    out = read_committed(LocalStore(tmp_path / "store"), "web/warc/snap")
    docs = list(WarcReader(str(tmp_path / "store" / out.version_prefix), glob_pattern="*.warc.gz").run())
    assert sorted(d.metadata["url"] for d in docs) == [f"https://example.org/page{i}" for i in (0, 3, 4)]


def test_plain_warc_with_garbage_between_records(tmp_path):
    recs = pages(3)
    path = tmp_path / "plain.warc"
    path.write_bytes(b"".join(recs[:2]) + b"this is not a record\r\n\r\n" + b"".join(recs[2:]))
    with open(path, "rb") as fh:
        items = list(iter_raw_records(fh))
    assert [type(i).__name__ for i in items].count("Malformed") == 1
    assert sum(isinstance(i, bytes) for i in items) == 6
    assert isinstance(items[2], Malformed) and items[2].reason == "bad_record_header"
    result, records = ingest(tmp_path, path)
    assert result.metrics["pages_fetched"] == 3 and result.metrics["malformed_records"] == 1


def test_wrong_content_length_loses_only_that_record(tmp_path):
    recs = pages(3)
    recs[1] = recs[1].replace(b"Content-Length: ", b"Content-Length: 1", 1)  # claims 10x the real length
    path = tmp_path / "bad-length.warc.gz"
    path.write_bytes(b"".join(gz(r) for r in recs))
    result, records = ingest(tmp_path, path)
    assert result.metrics["pages_fetched"] == 2
    assert result.metrics["malformed_records"] == 1


def test_directory_input_rotation_and_max_pages(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.warc.gz").write_bytes(b"".join(gz(r) for r in pages(4)))
    (src / "b.warc.gz").write_bytes(b"".join(gz(r) for r in pages(4, start=4)))
    (src / "notes.txt").write_text("not a WARC")
    result, records = ingest(tmp_path, src, records_per_warc_file=6)
    assert result.metrics["input_files"] == 2 and result.metrics["pages_fetched"] == 8
    assert result.metrics["warc_files"] == 3  # 16 records, 6 per file
    result, records = ingest(tmp_path, src, max_pages=5)
    assert result.metrics["pages_fetched"] == 5
    assert Counter(r["type"] for r in records)["response"] == 5


def test_ingest_from_s3_prefix(tmp_path, s3_bucket):
    endpoint, bucket = s3_bucket
    settings = StoreSettings(url=f"s3://{bucket}", endpoint_url=endpoint)
    incoming = S3Store(f"s3://{bucket}/cc/2026-47", settings)
    incoming.put_bytes("segment-0/CC-0.warc.gz", b"".join(gz(r) for r in pages(3)))
    store = LocalStore(tmp_path / "store")
    config = CrawlConfig(source="warc", warc_uri=f"s3://{bucket}/cc/2026-47")
    result = ingest_warc(config, store, "cc-2026-47", "web/warc/cc-2026-47", source_settings=settings)
    assert result.metrics["pages_fetched"] == 3 and result.metrics["malformed_records"] == 0
    # the same snapshot staged inside the pipeline's own store (what the sensor passes) needs no settings
    s3_store = S3Store(f"s3://{bucket}/data", settings)
    s3_store.put_bytes("incoming/warc/s2/x.warc.gz", b"".join(gz(r) for r in pages(2)))
    result = crawl_web(
        CrawlConfig(source="warc", warc_uri=s3_store.uri("incoming/warc/s2")), s3_store, "s2", "web/warc/s2"
    )
    assert result.metrics["pages_fetched"] == 2
    assert read_committed(s3_store, "web/warc/s2").names() == ["part-00000.warc.gz"]


def test_missing_input_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no .warc.gz"):
        ingest(tmp_path, empty)


def test_shard_writer_publishes_nothing_for_a_failed_block_and_replaces_on_success(tmp_path):
    from pipelines.web.warc_files import WarcShardWriter

    store = LocalStore(tmp_path / "store")
    raw = pages(1)[0]
    with WarcShardWriter(store, "web/warc/s", 10) as writer:
        writer.write_raw(raw)
    old = read_committed(store, "web/warc/s")
    with pytest.raises(KeyError), WarcShardWriter(store, "web/warc/s", 10) as writer:
        writer.write_raw(raw)
        raise KeyError("crawl failed")
    assert read_committed(store, "web/warc/s") == old  # old data kept, nothing partial
    with WarcShardWriter(store, "web/warc/s", 1) as writer:
        writer.write_raw(raw)
        writer.write_raw(raw)
    new = read_committed(store, "web/warc/s")
    assert new.names() == ["part-00000.warc.gz", "part-00001.warc.gz"] and new.version != old.version
