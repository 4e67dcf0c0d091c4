"""Bad web input (issue 18 items 6-8, 10, 11; issue 25 item 6): broken WARC files, hostile servers, pages in
other encodings. What is recoverable is kept, what is not is counted by a fixed reason, a bug in our own code
fails the stage, and a stage that found nothing fails before it replaces the previous output."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import logging
import random
import re
import socket
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from infra.committed import commit, is_committed, read_committed
from infra.store import LocalStore
from pipelines.web.crawl import CrawlConfig, crawl_seeds
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
    if not is_committed(store, OUT):
        return {}
    out = read_committed(store, OUT)
    return {name: store.get_bytes(out.key(name)) for name in out.names()}


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
    odd_type = io.BytesIO()
    writer = WARCWriter(odd_type, gzip=False)
    writer.write_record(
        writer.create_warc_record("https://example.org/t", "a-type-nobody-knows-" + "y" * 100)
    )
    records.append(odd_type.getvalue())
    path = tmp_path / "in.warc.gz"
    path.write_bytes(b"".join(gzip.compress(r, mtime=0) for r in records))
    m = ingest(LocalStore(tmp_path / "store"), path).metrics
    assert m["pages_fetched"] == 2 and m["malformed/bad_http_status"] == 1 and m["kept/other"] == 1
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


# ---------------------------------------------------------------- 18.10: hostile servers on 127.0.0.1


class HostileSite:
    """An HTTP server on 127.0.0.1 (free port) whose routes write to the socket as slowly as they like.

    A route is a function of the request handler; `stop` ends every slow route when the test is over.
    """

    def __init__(self, routes: dict[str, Callable]):
        self.stop = threading.Event()
        self.requests: list[tuple[str, float]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                site.requests.append((self.path, time.monotonic()))
                route = routes.get(self.path)
                try:
                    if route is None:
                        self.send_error(404)
                    else:
                        route(self, site.stop)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the crawler gave up on us: expected

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def url(self, path: str = "/") -> str:
        return self.base + path

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile_site():
    sites: list[HostileSite] = []

    def make(routes: dict[str, Callable]) -> HostileSite:
        sites.append(HostileSite(routes))
        return sites[-1]

    yield make
    for site in sites:
        site.close()


def send(body: bytes, content_type: str = "text/html; charset=utf-8") -> Callable:
    def route(handler, stop):
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return route


def html_page(*links: str) -> Callable:
    anchors = "".join(f'<a href="{href}">{href}</a> ' for href in links)
    return send(f"<html><body><p>{anchors}</p></body></html>".encode())


def drip_body(handler, stop) -> None:
    """Headers at once, then the body one byte every 0.2 s (it claims 100 kB: 5.5 hours)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/html")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    while not stop.wait(0.2):
        handler.wfile.write(b"x")
        handler.wfile.flush()


def drip_headers(handler, stop) -> None:
    """The status line and headers themselves, one byte every 0.2 s, never ending."""
    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nX-Slow: " + b"a" * 10_000:
        if stop.wait(0.2):
            return
        handler.wfile.write(bytes([byte]))
        handler.wfile.flush()


def endless_robots(handler, stop) -> None:
    """A robots.txt without Content-Length that never ends: 1 kB of comments every 50 ms (20 kB/s)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(b"User-agent: *\nAllow: /\n")
    while not stop.wait(0.05):
        handler.wfile.write(b"#" * 1023 + b"\n")
        handler.wfile.flush()


ROBOTS_OK = send(b"User-agent: *\nAllow: /\n", "text/plain")
FAST = dict(requests_per_second_per_host=200.0, retry_backoff_s=0.01)
METRIC_KEY = re.compile(r"^[a-z0-9_]+(/[a-z0-9_]+)?$")


def crawl_sites(tmp_path, seeds: list[str], **overrides):
    store = LocalStore(tmp_path / "store")
    config = CrawlConfig(source="seeds", seeds=seeds, **{**FAST, **overrides})
    started = time.monotonic()
    result = crawl_seeds(config, store, SNAPSHOT, OUT, seeds)
    return result, time.monotonic() - started


@pytest.mark.timeout(60)
def test_slow_drip_pages_are_cut_at_the_deadline_and_counted(tmp_path, hostile_site):
    site = hostile_site(
        {
            "/robots.txt": ROBOTS_OK,
            "/": html_page("/drip", "/drip-headers", "/ok"),
            "/drip": drip_body,
            "/drip-headers": drip_headers,
            "/ok": html_page(),
        }
    )
    result, elapsed = crawl_sites(tmp_path, [site.url("/")], timeout_s=1.0, retries=2)
    m = result.metrics
    assert m["pages_fetched"] == 2  # / and /ok
    assert m["fetch_error"] == 2 and m["fetch_error/deadline"] == 2
    assert elapsed < 1.0 + 3.0  # one deadline (the two drips run side by side) plus a margin
    assert all(METRIC_KEY.match(k) and len(k) <= 40 for k in m), sorted(m)


@pytest.mark.timeout(60)
def test_robots_txt_fetches_have_a_deadline(tmp_path, hostile_site):
    dripping = hostile_site({"/robots.txt": drip_body, "/": html_page()})
    endless = hostile_site({"/robots.txt": endless_robots, "/": html_page()})
    fine = hostile_site({"/robots.txt": ROBOTS_OK, "/": html_page()})
    seeds = [dripping.url("/"), endless.url("/"), fine.url("/")]
    result, elapsed = crawl_sites(tmp_path, seeds, timeout_s=1.0, scope="any")
    m = result.metrics
    assert m["robots_unreachable/deadline"] == 2
    assert m["robots_disallowed"] == 2  # unreachable robots.txt: the origin is not crawled (RFC 9309)
    assert m["pages_fetched"] == 1
    assert elapsed < 1.0 + 3.0


@pytest.mark.timeout(60)
def test_crawl_delay_is_capped_and_the_host_counted(tmp_path, hostile_site):
    site = hostile_site(
        {
            "/robots.txt": send(b"User-agent: *\nCrawl-delay: 100000\n", "text/plain"),
            "/": html_page("/a", "/b"),
            "/a": html_page(),
            "/b": html_page(),
        }
    )
    result, elapsed = crawl_sites(tmp_path, [site.url("/")], max_crawl_delay_s=0.3)
    m = result.metrics
    assert m["pages_fetched"] == 3 and m["crawl_delay_capped_hosts"] == 1
    times = sorted(t for path, t in site.requests if path != "/robots.txt")
    assert min(b - a for a, b in itertools.pairwise(times)) >= 0.25  # the capped delay is still honoured
    assert elapsed < 3 * 0.3 + 3.0


# ---------------------------------------------------------------- 25.6 / 18.6: crawler errors and empty crawls


def test_network_errors_are_counted_by_reason_and_a_bug_fails_the_crawl(tmp_path, hostile_site, monkeypatch):
    import pipelines.web.crawl as crawl

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    site = hostile_site({"/robots.txt": ROBOTS_OK, "/": html_page("/a"), "/a": html_page()})
    result, _ = crawl_sites(tmp_path, [dead, site.url("/")], scope="any", retries=0)
    m = result.metrics
    assert m["pages_fetched"] == 2 and m["robots_unreachable/connection"] == 1

    def broken_links(html, url):
        raise TypeError("a bug in our link extraction")

    monkeypatch.setattr(crawl, "extract_links", broken_links)
    with pytest.raises(TypeError, match="a bug in our link extraction"):
        crawl_sites(tmp_path / "again", [site.url("/")])


def test_a_crawl_that_finds_nothing_fails_and_keeps_the_previous_output(tmp_path, hostile_site):
    site = hostile_site({"/robots.txt": ROBOTS_OK, "/": html_page("/a"), "/a": html_page()})
    first, _ = crawl_sites(tmp_path, [site.url("/")])
    store = LocalStore(tmp_path / "store")
    before = output_bytes(store)
    assert first.metrics["pages_fetched"] == 2 and before

    gone = hostile_site({"/robots.txt": send(b"User-agent: *\nDisallow: /\n", "text/plain")})
    with pytest.raises(ValueError, match=r"no page.*'snap'.*allow_empty"):
        crawl_sites(tmp_path, [gone.url("/")])
    assert output_bytes(store) == before


# ---------------------------------------------------------------- 18.8 / 25.6: extraction of hostile pages

WARC = f"web/warc/{SNAPSHOT}"
DOCS = f"web/extract/{SNAPSHOT}"


def commit_warc(store: LocalStore, tmp_path, data: bytes) -> None:
    """Publish one WARC file the way the crawl does (a committed version of web/warc/<snapshot>)."""
    (tmp_path / "part-00000.warc.gz").write_bytes(data)
    commit(store, WARC, {"part-00000.warc.gz": tmp_path / "part-00000.warc.gz"})


CAFE = (
    "The best café in town serves a crème brûlée that every visitor remembers. Our chef trained in Zürich "
    "and Málaga before opening this small place near the station, and the menu changes every season."
)
MOSCOW = (
    "Москва — столица России, крупнейший по численности населения город страны. В городе много музеев, "
    "театров и парков, а метро считается одним из самых красивых в мире."
)
TOKYO = (
    "東京は日本の首都であり、世界最大の都市圏の一つです。多くの企業や大学が集まっています。"
    "電車の路線も多く、毎日たくさんの人が通勤しています。"
)


def article_html(text: str, head: str = "") -> str:
    paragraphs = "".join(f"<p>{text}</p>" for _ in range(3))
    return f"<!DOCTYPE html><html><head>{head}<title>Page</title></head><body><article>{paragraphs}</article></body></html>"


def warc_of(responses: list[tuple[str, str, bytes]]) -> bytes:
    """A gzipped WARC of (url, HTTP Content-Type, payload) response records."""
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True)
    for url, content_type, body in responses:
        http = StatusAndHeaders("200 OK", [("Content-Type", content_type)], protocol="HTTP/1.1")
        writer.write_record(
            writer.create_warc_record(
                url, "response", payload=io.BytesIO(body), length=len(body), http_headers=http
            )
        )
    return out.getvalue()


def unparseable_response(url: str) -> bytes:
    """A response record whose HTTP status line is free text, not `HTTP/1.1 200 OK`, gzipped."""
    status = b"GARBAGE Internal-error-" + b"x" * 200
    block = status + b"\r\nno colon in this header\r\n\r\n<html><body>hello</body></html>"
    head = (
        "WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-000000000099>\r\n"
        f"WARC-Date: 2026-01-01T00:00:00Z\r\nWARC-Target-URI: {url}\r\n"
        f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(block)}\r\n\r\n"
    )
    return gzip.compress(head.encode() + block + b"\r\n\r\n", mtime=0)


def extracted_docs(store: LocalStore, part: str) -> dict[str, dict]:
    """Documents by URL in the shards of the extract output's `part` (`kept`, `dropped/read`)."""
    docs = {}
    for key in store.list(DOCS + "/"):
        if f"/{part}/" in key and key.endswith(".jsonl.gz"):
            for line in gzip.decompress(store.get_bytes(key)).decode().splitlines():
                doc = json.loads(line)
                docs[doc["metadata"]["url"]] = doc
    return docs


def extract(store: LocalStore):
    from pipelines.web.extract import ExtractConfig, extract_documents

    config = ExtractConfig(tasks=1, languages=["en", "ru", "ja"], language_threshold=0.3, min_doc_chars=50)
    return extract_documents(config, store, SNAPSHOT, WARC, DOCS)


def test_pages_are_decoded_with_their_declared_charset_or_dropped_as_undecodable(tmp_path):
    rng = random.Random(0)
    noise = bytes(rng.randrange(256) for _ in range(3000))  # binary sent as text/html
    pages = [
        ("http://site.test/cafe", "text/html; charset=ISO-8859-1", article_html(CAFE).encode("latin-1")),
        ("http://site.test/moscow", "text/html; charset=windows-1251", article_html(MOSCOW).encode("cp1251")),
        (
            "http://site.test/tokyo",
            "text/html",
            article_html(
                TOKYO, '<meta http-equiv="Content-Type" content="text/html; charset=Shift_JIS">'
            ).encode("shift_jis"),
        ),
        ("http://site.test/noise", "text/html", noise),
    ]
    store = LocalStore(tmp_path / "store")
    commit_warc(store, tmp_path, warc_of(pages))
    result = extract(store)
    kept = extracted_docs(store, "kept")
    assert CAFE in kept["http://site.test/cafe"]["text"]
    assert MOSCOW in kept["http://site.test/moscow"]["text"]
    assert TOKYO in kept["http://site.test/tokyo"]["text"]
    assert [kept[f"http://site.test/{p}"]["metadata"]["charset"] for p in ("cafe", "moscow", "tokyo")] == [
        "cp1252",
        "cp1251",
        "cp932",
    ]
    dropped = extracted_docs(store, "dropped/read")
    assert dropped["http://site.test/noise"]["metadata"]["drop_reason"] == "undecodable"
    m = result.metrics
    assert m["dropped/read/undecodable"] == 1 and m["docs_out"] == 3
    assert (m["decoded/http_header"], m["decoded/meta"]) == (2, 1)


def test_a_record_that_does_not_parse_is_counted_and_a_bug_in_extraction_fails_the_stage(
    tmp_path, monkeypatch
):
    from pipelines.web.html_extraction import TrafilaturaWithDrops

    store = LocalStore(tmp_path / "store")
    first = warc_of([("http://site.test/a", "text/html; charset=utf-8", article_html(CAFE).encode())])
    last = warc_of(
        [("http://site.test/b", "text/html; charset=utf-8", article_html(CAFE + " Again.").encode())]
    )
    commit_warc(store, tmp_path, first + unparseable_response("http://site.test/broken") + last)
    m = extract(store).metrics
    assert m["dropped/read/bad_http_status"] == 1
    assert max(len(k) for k in m) <= 40  # the status line's text is not a metric key
    assert m["docs_out"] == 2  # the record after the broken one is read too

    def buggy_extract(self, text):
        raise TypeError("a bug in our extractor")

    monkeypatch.setattr(TrafilaturaWithDrops, "extract", buggy_extract)
    with pytest.raises(Exception, match="TypeError: a bug in our extractor"):
        extract(store)


LIBRARY = (
    "The city library opened a new reading room this spring, with long oak tables, quiet corners for study "
    "and a small collection of rare maps that a family of sailors gave to the town last year."
)


def page_with_span_row(text: str, span: str) -> str:
    """A page that makes trafilatura (1.11) raise: with deduplication on (as datatrove calls it) its own pass
    drops the paragraphs repeated past its limit, the readability fallback it then keeps passes a TEI-style
    `<row span=...>` through, and its text output reads the span with int() after its own error handling
    (trafilatura issue #681): ValueError."""
    paragraph = f"<p>{text}</p>"
    return (
        f"<!DOCTYPE html><html><head><title>Page</title></head><body><article>{paragraph}"
        f'<row span="{span}"><cell>x</cell></row>{paragraph * 9}</article></body></html>'
    )


def test_a_page_the_extractor_cannot_parse_is_counted_and_the_others_come_out(tmp_path):
    store = LocalStore(tmp_path / "store")
    pages = [
        ("http://site.test/a", article_html(CAFE)),
        ("http://site.test/broken-ru", page_with_span_row(MOSCOW, "x")),
        ("http://site.test/broken-en", page_with_span_row(LIBRARY, "")),
        ("http://site.test/b", article_html(CAFE + " Again.")),
    ]
    commit_warc(
        store, tmp_path, warc_of([(url, "text/html; charset=utf-8", html.encode()) for url, html in pages])
    )
    m = extract(store).metrics
    assert m["dropped/extract/extraction_error"] == 2  # each page that raised, under the parser's reason
    assert m["dropped/extract"] == 2  # and under no other extract reason
    dropped = extracted_docs(store, "dropped/extract")
    assert {url: d["metadata"]["drop_reason"] for url, d in dropped.items()} == {
        "http://site.test/broken-ru": "extraction_error",
        "http://site.test/broken-en": "extraction_error",
    }
    assert set(extracted_docs(store, "kept")) == {"http://site.test/a", "http://site.test/b"}
    assert m["docs_out"] == 2
