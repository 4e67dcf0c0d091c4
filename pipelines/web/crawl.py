"""Live web crawl of one snapshot into gzipped WARC files in the object store.

`crawl_web(config, store, snapshot, out_prefix)` is the stage entry point: `source: local_docs` serves Debian
HTML documentation on 127.0.0.1 for the duration of the crawl and crawls it, `source: seeds` crawls from
`config.seeds`, `source: warc` ingests existing WARC files (`pipelines.web.warc_ingest`).

The crawler is polite and defensive: robots.txt per origin (Disallow, Crawl-delay), a minimum interval and a
concurrency cap per origin, limits on pages / depth / bytes per page, a content-type allowlist, URL
normalisation and de-duplication, redirects followed one hop at a time through the frontier (each hop is
re-checked against robots.txt, the address policy and the rate limit; loops are detected), retries with
exponential backoff, and an address policy that refuses private / loopback / link-local / reserved
addresses unless allowlisted. Every fetch (robots.txt included) has a wall-clock deadline, `timeout_s`, and a
robots.txt Crawl-delay is capped at `max_crawl_delay_s`. Everything it drops is counted by a reason from a fixed
vocabulary (metric keys never carry exception text: that goes to the log and the report); a failure that is
not the web's fault (a bug in this code) stops the crawl with its traceback.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import random
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from io import BytesIO
from typing import Literal
from urllib.parse import urlsplit

import requests
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tqdm import tqdm
from urllib3.exceptions import NameResolutionError
from warcio.recordbuilder import RecordBuilder
from warcio.statusandheaders import StatusAndHeaders
from warcio.timeutils import datetime_to_iso_date

from infra.net import AddressPolicy, AddressRefused, PolicySession, RequestDeadline, peer_ip, policy_session
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.web.robots import MAX_ROBOTS_BYTES, RobotsRules, robots_url, rules_from_fetch
from pipelines.web.urls import extract_links, host_port, normalise_url, origin
from pipelines.web.warc_files import WarcShardWriter

log = logging.getLogger(__name__)

# Why a URL was not written to the WARC (the metrics always carry all of them, zeros included).
DROP_REASONS = (
    "robots_disallowed",
    "redirect_loop",
    "too_many_redirects",
    "oversize",
    "bad_content_type",
    "private_address_refused",
    "http_error",
    "fetch_error",
    "duplicate_url",
    "max_depth",
    "out_of_scope",
    "unsupported_url",
)
# Why a fetch failed (`fetch_error/<kind>`, and `robots_unreachable/<kind>` for robots.txt).
FETCH_ERROR_KINDS = (
    "deadline",
    "timeout",
    "connection",
    "dns",
    "tls",
    "protocol",
    "too_many_redirects",
    "invalid_request",
)
HTTP_ERROR_CLASSES = ("3xx", "4xx", "5xx", "other")
ROBOTS_FAILURES = (*FETCH_ERROR_KINDS, *HTTP_ERROR_CLASSES, "private_address")
# What the crawler did, besides dropping.
ACTIVITY_COUNTS = (
    "requests",
    "retries",
    "redirects_followed",
    "rate_limited_waits",
    "robots_fetched",
    "crawl_delay_capped_hosts",
)
# Every metric key the crawler counts (the metrics always carry all of them, zeros included).
COUNTER_KEYS = (
    *DROP_REASONS,
    *ACTIVITY_COUNTS,
    *(f"fetch_error/{kind}" for kind in FETCH_ERROR_KINDS),
    *(f"http_error/{kind}" for kind in HTTP_ERROR_CLASSES),
    *(f"robots_unreachable/{kind}" for kind in ROBOTS_FAILURES),
)
# Response headers that describe the wire encoding, not the stored (decoded) payload; kept renamed, as
# Common Crawl does, so WARC readers do not try to decode the payload again.
_WIRE_HEADERS = {"content-encoding", "transfer-encoding", "content-length"}
_REDIRECT_STATUSES = {301, 302, 303, 307, 308}


class CrawlConfig(BaseModel):
    """Config of the `web_crawl` stage (defaults = the `tiny` profile)."""

    model_config = ConfigDict(extra="forbid")

    source: Literal["local_docs", "seeds", "warc"] = Field(
        "local_docs",
        description="local_docs: crawl Debian HTML docs served on 127.0.0.1; seeds: crawl from `seeds`; "
        "warc: ingest existing WARC files from `warc_uri`",
    )
    seeds: list[str] = Field(default_factory=list, description="Start URLs (http/https) for source=seeds")
    doc_packages: list[str] = Field(
        default_factory=lambda: ["python3.11-doc", "postgresql-doc-15"],
        description="Debian packages whose HTML docs form the local web (source=local_docs), one host each",
    )
    warc_uri: str | None = Field(
        None, description="WARC file, directory or s3:// prefix to ingest (source=warc)"
    )
    # Both default packages whole (~1,700 HTML pages): at 600, ~80% of pages failed the quality filters and
    # tiny's web source was ~110 documents, which pretraining and midtraining replayed a dozen times over.
    max_pages: int = Field(2000, ge=1, description="Stop after this many pages are written to the WARC")
    max_depth: int = Field(10, ge=0, description="Maximum link depth from a seed (seeds are depth 0)")
    max_bytes_per_page: int = Field(
        1_048_576, ge=1024, description="Pages larger than this (decoded bytes) are skipped as oversize"
    )
    requests_per_second_per_host: float = Field(
        20.0, gt=0, description="Rate limit per origin (robots.txt Crawl-delay can only slow it further)"
    )
    concurrency_per_host: int = Field(2, ge=1, description="Requests in flight per origin at most")
    total_concurrency: int = Field(4, ge=1, description="Fetcher threads (requests in flight overall)")
    allowed_content_types: list[str] = Field(
        default_factory=lambda: ["text/html", "application/xhtml+xml"],
        description="MIME types kept; other responses are counted as bad_content_type and not stored",
    )
    allow_private_networks: list[str] = Field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"],
        description="CIDRs of private/loopback/link-local addresses the crawler may fetch from; "
        "empty = public addresses only",
    )
    scope: Literal["seed_hosts", "any"] = Field(
        "seed_hosts", description="seed_hosts: follow links only to the seeds' host names; any: follow all"
    )
    max_redirects: int = Field(5, ge=0, description="Redirect hops followed from one URL")
    retries: int = Field(2, ge=0, description="Retries after a connection error, 5xx or 429")
    retry_backoff_s: float = Field(0.5, ge=0, description="First retry delay; doubles per attempt (+jitter)")
    timeout_s: float = Field(
        10.0,
        gt=0,
        description="Wall-clock limit per fetch (page or robots.txt: connect, headers, body and retries)",
    )
    user_agent: str = Field(
        "CrucibleBot/0.1 (research crawler)",
        description="User-Agent header (add a contact URL for real crawls); its first token is matched "
        "against robots.txt groups",
    )
    records_per_warc_file: int = Field(
        1000, ge=2, description="WARC records per output file (a crawled page is two: request + response)"
    )
    allow_empty: bool = Field(
        False,
        description="Publish a snapshot with no pages; off: a crawl or WARC input that yields no page fails "
        "the stage and the snapshot's previous output stays",
    )
    max_crawl_delay_s: float = Field(
        30.0,
        gt=0,
        description="Cap on a robots.txt Crawl-delay / Request-rate interval (hosts over it are counted)",
    )
    seed: int = Field(0, description="Seed for retry jitter")
    local_web_port: int = Field(
        18080,
        ge=0,
        le=65535,
        description="127.0.0.1 port of the local web (source=local_docs): fixed, so page URLs and the document "
        "ids and held-out split derived from them are the same in every run; 0 or a busy port = any free port",
    )
    ordered: bool = Field(
        True,
        description="Crawl in breadth-first waves in a fixed order (each wave sorted by where its URLs were "
        "found, pages written in that order): the same site and budget give the same pages in the same WARC "
        "order on every run. Off: a free-running frontier, faster across many hosts, whose cut at max_pages "
        "depends on fetch timing",
    )

    @field_validator("allow_private_networks")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a CIDR like '127.0.0.0/8' or '10.0.0.0/8'") from None
        return value

    @field_validator("seeds")
    @classmethod
    def _seed_urls(cls, value: list[str]) -> list[str]:
        bad = [url for url in value if normalise_url(url) is None]
        if bad:
            raise ValueError(f"not http(s) URLs: {bad}")
        return value

    @field_validator("allowed_content_types")
    @classmethod
    def _lower(cls, value: list[str]) -> list[str]:
        return [v.strip().lower() for v in value]


class CrawlDrop(Exception):
    """A URL is dropped; `reason` is one of DROP_REASONS, `kind` (if any) one of its breakdown keys."""

    def __init__(self, reason: str, detail: str = "", kind: str = ""):
        super().__init__(f"{reason}/{kind}: {detail}" if kind else f"{reason}: {detail}")
        self.reason, self.kind, self.detail = reason, kind, detail

    @property
    def key(self) -> str:
        return f"{self.reason}/{self.kind}" if self.kind else self.reason


def fetch_error_kind(exc: requests.RequestException, deadline: RequestDeadline | None = None) -> str:
    """Which of FETCH_ERROR_KINDS a requests exception is (a passed deadline explains any of them)."""
    if deadline is not None and deadline.expired:
        return "deadline"
    if isinstance(exc, requests.exceptions.SSLError):
        return "tls"
    if isinstance(exc, requests.exceptions.Timeout):
        return "timeout"
    if isinstance(exc, requests.exceptions.TooManyRedirects):
        return "too_many_redirects"
    if isinstance(exc, requests.exceptions.ConnectionError):
        reason = getattr(exc.args[0], "reason", None) if exc.args else None
        return "dns" if isinstance(reason, NameResolutionError) else "connection"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError | requests.exceptions.ContentDecodingError):
        return "protocol"
    return "invalid_request"


def http_error_class(status: int) -> str:
    return f"{status // 100}xx" if 300 <= status < 600 else "other"


@dataclass(frozen=True)
class CrawlItem:
    url: str
    depth: int
    redirected_from: tuple[str, ...] = ()  # the chain of URLs that redirected to this one
    rank: int = 0  # ordered crawl: its position in its wave


@dataclass
class HostState:
    """One origin's queue, politeness state and robots.txt rules."""

    origin: str
    interval: float
    queue: deque = field(default_factory=deque)
    active: int = 0
    next_time: float = 0.0  # monotonic time of the next allowed request
    state: Literal["new", "preparing", "ready", "failed"] = "new"
    rules: RobotsRules | None = None
    failure: str = ""  # drop reason for every URL of a failed origin
    pages: int = 0


class Frontier:
    """Per-origin FIFO queues. `pop` hands out work only for an origin below its concurrency cap whose next
    polite request time has come, reserving that request slot; it blocks until work is ready and returns
    None when the queues are drained or the page budget is spent.

    `ordered`: breadth-first waves instead. URLs found while a wave runs wait for the next one, keyed by
    where they were found (the finder's rank in its wave, the link's index on the page; the smallest key
    wins for a URL found twice); when a wave is done the next is sorted by key and handed out strictly in
    that order (head-of-line waits for its origin's politeness). Which pages fall under `max_pages` is then
    the same on every run, whatever the fetch timing. `on_wave` runs before each new wave starts."""

    def __init__(
        self,
        max_pages: int,
        concurrency_per_host: int,
        interval: float,
        user_agent: str,
        max_crawl_delay_s: float = 30.0,
        ordered: bool = False,
        on_wave: Callable[[], None] | None = None,
    ):
        self.max_pages, self.concurrency, self.interval = max_pages, concurrency_per_host, interval
        self.user_agent = user_agent  # whose robots.txt Crawl-delay applies
        self.max_crawl_delay_s = max_crawl_delay_s
        self.hosts: dict[str, HostState] = {}
        self.pages_written = self.in_flight = self.queued = self.rate_limited_waits = 0
        self.crawl_delay_capped_hosts = 0
        self.ordered, self.on_wave, self.waves = ordered, on_wave, 0
        self.wave: deque[CrawlItem] = deque()
        self.next_wave: dict[str, tuple[tuple[int, ...], CrawlItem]] = {}
        self._cond = threading.Condition()
        self._closed = False

    def _host(self, item: CrawlItem) -> HostState:
        key = origin(item.url)
        host = self.hosts.get(key)
        if host is None:
            host = self.hosts[key] = HostState(origin=key, interval=self.interval)
        return host

    def push(self, item: CrawlItem, found_at: tuple[int, ...] = ()) -> str:
        """Queue an item (ordered: for the next wave, at `found_at`); returns a drop reason instead if its
        origin already failed."""
        with self._cond:
            host = self._host(item)
            if host.state == "failed":
                return host.failure
            self.queued += 1
            if self.ordered:
                self.next_wave[item.url] = (found_at, item)
            else:
                host.queue.append(item)
            self._cond.notify()
            return ""

    def found_again(self, item: CrawlItem, found_at: tuple[int, ...]) -> None:
        """Ordered: a URL already waiting for the next wave was found again; the earlier place wins."""
        with self._cond:
            waiting = self.next_wave.get(item.url)
            if waiting is not None and found_at < waiting[0]:
                self.next_wave[item.url] = (found_at, item)

    def _reserve_locked(self, host: HostState, now: float) -> float:
        start = max(now, host.next_time)
        host.next_time = start + host.interval
        return start - now

    def reserve(self, host: HostState) -> float:
        """Reserve the origin's next request slot; returns how long to sleep before sending."""
        with self._cond:
            return self._reserve_locked(host, time.monotonic())

    def pop(self) -> tuple[str, HostState, CrawlItem | None] | None:
        """("prepare", host, None) for a new origin (resolve + robots.txt), ("fetch", host, item), or None."""
        if self.ordered:
            return self._pop_ordered()
        waited_for_rate = False
        with self._cond:
            while True:
                if self._closed or self.pages_written >= self.max_pages:
                    return None
                now = time.monotonic()
                soonest = None
                if self.pages_written + self.in_flight < self.max_pages:
                    for host in self.hosts.values():
                        if not host.queue or host.active >= self.concurrency or host.state in ("preparing",):
                            continue
                        if host.next_time > now:
                            soonest = min(soonest or host.next_time, host.next_time)
                            continue
                        return self._hand_out(host, now, waited_for_rate, host.queue)
                if self.in_flight == 0 and (self.queued == 0 or soonest is None):
                    return None
                waited_for_rate = waited_for_rate or soonest is not None
                self._cond.wait(timeout=max(0.001, soonest - now) if soonest is not None else 1.0)

    def _hand_out(
        self, host: HostState, now: float, waited_for_rate: bool, queue: deque
    ) -> tuple[str, HostState, CrawlItem | None]:
        """Reserve the origin's request slot; a new origin is prepared first, otherwise `queue`'s next item."""
        self._reserve_locked(host, now)
        host.active += 1
        self.in_flight += 1
        self.rate_limited_waits += waited_for_rate
        if host.state == "new":
            host.state = "preparing"
            return "prepare", host, None
        self.queued -= 1
        return "fetch", host, queue.popleft()

    def _start_next_wave(self) -> None:
        if self.on_wave is not None:
            self.on_wave()
        found = sorted(self.next_wave.values(), key=lambda entry: entry[0])
        self.next_wave.clear()
        self.wave = deque(replace(item, rank=i) for i, (_, item) in enumerate(found))
        self.waves += 1

    def _pop_ordered(self) -> tuple[str, HostState, CrawlItem | None] | None:
        waited_for_rate = False
        with self._cond:
            while True:
                if self._closed or self.pages_written >= self.max_pages:
                    return None
                if not self.wave and self.in_flight == 0:
                    if not self.next_wave:
                        return None
                    self._start_next_wave()
                    continue
                now, timeout = time.monotonic(), 1.0
                if self.wave and self.pages_written + self.in_flight < self.max_pages:
                    host = self._host(self.wave[0])
                    if host.state == "new" or (
                        host.state == "ready" and host.active < self.concurrency and host.next_time <= now
                    ):
                        return self._hand_out(host, now, waited_for_rate, self.wave)
                    if host.state == "ready" and host.active < self.concurrency:
                        waited_for_rate, timeout = True, max(0.001, host.next_time - now)
                self._cond.wait(timeout=timeout)

    def prepared(self, host: HostState, rules: RobotsRules | None, failure: str = "") -> int:
        """Record an origin's robots.txt rules (or why it failed); returns how many queued URLs were dropped."""
        with self._cond:
            self._cond.notify_all()
            if failure:
                host.state, host.failure = "failed", failure
                mine = [item for item in self.wave if origin(item.url) == host.origin]
                self.wave = deque(item for item in self.wave if origin(item.url) != host.origin)
                for url in [url for url in self.next_wave if origin(url) == host.origin]:
                    mine.append(self.next_wave.pop(url)[1])
                dropped = len(host.queue) + len(mine)
                self.queued -= dropped
                host.queue.clear()
                return dropped
            host.state, host.rules = "ready", rules
            delay = rules.delay_s(self.user_agent) if rules is not None else 0.0
            if delay > self.max_crawl_delay_s:  # a host must not stall the crawl (Crawl-delay: 100000)
                log.warning(
                    "%s asks for a %gs crawl delay: capped at %gs", host.origin, delay, self.max_crawl_delay_s
                )
                self.crawl_delay_capped_hosts += 1
                delay = self.max_crawl_delay_s
            if delay > host.interval:
                host.interval = delay
                host.next_time = max(host.next_time, time.monotonic() + host.interval)  # since robots.txt
            return 0

    def done(self, host: HostState, wrote_page: bool) -> None:
        with self._cond:
            host.active -= 1
            self.in_flight -= 1
            if wrote_page:
                host.pages += 1
                self.pages_written += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Crawler:
    """Crawls from seed URLs into a `WarcShardWriter`; owns the frontier, the seen-URL set and the counters."""

    def __init__(
        self,
        config: CrawlConfig,
        writer: WarcShardWriter,
        policy: AddressPolicy | None = None,
        snapshot: str = "",
    ):
        self.config, self.snapshot = config, snapshot
        self.writer = writer
        self.policy = policy or AddressPolicy(config.allow_private_networks)
        self.frontier = Frontier(
            config.max_pages,
            config.concurrency_per_host,
            1.0 / config.requests_per_second_per_host,
            config.user_agent,
            config.max_crawl_delay_s,
            ordered=config.ordered,
            on_wave=self._flush_wave,
        )
        self._wave_pages: list[tuple[int, list, dict]] = []  # ordered: this wave's pages, written at its end
        self.stats: Counter[str] = Counter(dict.fromkeys(COUNTER_KEYS, 0))
        self.errors: dict[str, dict] = {}  # the first URL and message per failure key, for the report
        self.failure: BaseException | None = None  # a bug in a worker: stops the crawl, re-raised by run()
        self.sample: list[dict] = []
        self.digests: list[str] = []  # "url payload-digest" of every page written, for the data version
        self.bytes_written = 0
        self._seen: set[str] = set()
        self._too_deep: set[str] = set()
        self._scope: set[str] = set()
        self._lock = threading.Lock()
        self._rng = random.Random(config.seed)
        self._local = threading.local()
        self._records = RecordBuilder()
        self._progress: tqdm | None = None

    # -- bookkeeping -------------------------------------------------------------------------------------
    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.stats[key] += n

    def count_drop(self, drop: CrawlDrop, url: str, n: int = 1) -> None:
        """Count a drop under its reason and its breakdown key; keep the first message per key."""
        with self._lock:
            self.stats[drop.reason] += n
            if drop.kind:
                self.stats[drop.key] += n
            if drop.reason in ("fetch_error", "http_error") and drop.key not in self.errors:
                self.errors[drop.key] = {"url": url, "message": drop.detail[:300]}

    def _session(self) -> PolicySession:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = policy_session(
                self.policy, self.config.user_agent, pool_size=self.config.concurrency_per_host
            )
            session.max_redirects = 5  # robots.txt only; page redirects go through the frontier
        return session

    def enqueue(
        self,
        raw_url: str,
        depth: int,
        base: str | None = None,
        redirected_from: tuple = (),
        found_at: tuple[int, ...] = (),
    ) -> bool:
        """Normalise, scope-check and de-duplicate a URL, then queue it; returns whether it was queued.
        `found_at` orders an ordered crawl's next wave (the finder's rank, the link's index)."""
        url = normalise_url(raw_url, base)
        reason = ""
        if url is None:
            reason = "unsupported_url"
        elif self.config.scope == "seed_hosts" and urlsplit(url).hostname not in self._scope:
            reason = "out_of_scope"
        elif depth > self.config.max_depth:
            with self._lock:
                first = url not in self._too_deep and url not in self._seen
                self._too_deep.add(url)
            reason = "max_depth" if first else "duplicate_url"
        else:
            with self._lock:
                duplicate = url in self._seen
                self._seen.add(url)
            item = CrawlItem(url, depth, redirected_from)
            if duplicate and self.config.ordered:
                self.frontier.found_again(item, found_at)
            reason = "duplicate_url" if duplicate else self.frontier.push(item, found_at)
        if reason:
            self.count(reason)
        return not reason

    # -- the crawl ---------------------------------------------------------------------------------------
    def run(self, seeds: list[str]) -> None:
        """Crawl from `seeds` until the frontier drains or `max_pages` pages are written."""
        for seed in seeds:
            url = normalise_url(seed)
            if url:
                self._scope.add(urlsplit(url).hostname)
        for i, seed in enumerate(seeds):
            self.enqueue(seed, depth=0, found_at=(i,))
        self._progress = tqdm(total=self.config.max_pages, unit="page", desc="crawl", mininterval=2.0)
        workers = [
            threading.Thread(target=self._worker, name=f"crawl-{i}", daemon=True)
            for i in range(self.config.total_concurrency)
        ]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
        finally:
            self.frontier.close()
            for worker in workers:
                worker.join(timeout=self.config.timeout_s * 2)
            self._progress.close()
        if self.failure is None:
            self._flush_wave()  # the last wave's pages
        self.stats["rate_limited_waits"] += self.frontier.rate_limited_waits
        self.stats["crawl_delay_capped_hosts"] += self.frontier.crawl_delay_capped_hosts
        if self.failure is not None:
            raise self.failure

    def _worker(self) -> None:
        while (task := self.frontier.pop()) is not None:
            kind, host, item = task
            wrote = False
            try:
                if kind == "prepare":
                    self._prepare(host)
                else:
                    wrote = self._crawl(host, item)
            except CrawlDrop as drop:
                self.count_drop(drop, item.url if item else host.origin)
                log.debug("drop %s: %s", item.url if item else host.origin, drop)
            except BaseException as exc:  # not the web's fault: stop the crawl and fail with the traceback
                log.error("crawler bug on %s: stopping the crawl", item.url if item else host.origin)
                with self._lock:
                    self.failure = self.failure or exc
                self.frontier.close()
                return
            finally:
                self.frontier.done(host, wrote)
                if wrote:
                    self._progress.update(1)

    def _prepare(self, host: HostState) -> None:
        """Vet the origin's addresses, then fetch and parse its robots.txt (the slot pop reserved)."""
        name, port = host_port(host.origin)
        failure = ""
        rules = None
        try:
            self.policy.vet(name, port)
        except AddressRefused as exc:
            failure = "private_address_refused"
            log.warning("refusing %s: %s", host.origin, exc.reason)
        except OSError as exc:
            failure = "fetch_error/dns"
            log.warning("cannot resolve %s: %s", host.origin, exc)
        else:
            try:
                rules = self._fetch_robots(host)
            except BaseException:  # a bug: the origin must still leave "preparing" before the crawl stops
                self.frontier.prepared(host, None, "fetch_error")
                raise
        dropped = self.frontier.prepared(host, rules, failure)
        if failure:
            reason, _, kind = failure.partition("/")
            self.count_drop(CrawlDrop(reason, host.origin, kind), host.origin, dropped)

    def _fetch_robots(self, host: HostState) -> RobotsRules:
        self.count("robots_fetched")
        url = robots_url(host.origin)
        try:
            with self._session().deadline(self.config.timeout_s) as deadline:
                with self._get(host, url, deadline, reserved=True, follow=True) as resp:
                    ok = resp.ok
                    body = (
                        self._read_body(resp, url, deadline, MAX_ROBOTS_BYTES, truncate=True) if ok else b""
                    )
        except CrawlDrop as drop:
            log.warning("robots.txt of %s unreachable (%s): not crawling it", host.origin, drop)
            self.count(f"robots_unreachable/{drop.kind or drop.reason.removesuffix('_refused')}")
            return rules_from_fetch(None, b"")
        rules = rules_from_fetch(resp.status_code, body)
        log.info(
            "robots.txt %s: %s (crawl delay %.2fs)",
            host.origin,
            rules.source,
            rules.delay_s(self.config.user_agent),
        )
        return rules

    def _get(
        self, host: HostState, url: str, deadline: RequestDeadline, reserved: bool, follow: bool = False
    ) -> requests.Response:
        """GET with retries (exponential backoff + jitter) on connection errors, 5xx and 429, all within
        `deadline`; every attempt waits for the origin's rate limit. Raises CrawlDrop."""
        cfg = self.config
        last: CrawlDrop | None = None
        for attempt in range(cfg.retries + 1):
            if attempt:
                with self._lock:
                    jitter = 1 + 0.25 * self._rng.random()
                backoff = cfg.retry_backoff_s * 2 ** (attempt - 1) * jitter
                if backoff >= deadline.remaining():
                    raise last  # no time left for another attempt
                self.count("retries")
                time.sleep(backoff)
            if attempt or not reserved:
                wait = self.frontier.reserve(host)
                if wait >= deadline.remaining():
                    raise last or CrawlDrop("fetch_error", f"{url}: rate limit wait {wait:.1f}s", "deadline")
                if wait > 0:
                    self.count("rate_limited_waits")
                    time.sleep(wait)
            self.count("requests")
            timeout = max(0.001, min(cfg.timeout_s, deadline.remaining()))
            try:
                resp = self._session().get(
                    url, stream=True, allow_redirects=follow, timeout=(timeout, timeout)
                )
            except AddressRefused as exc:
                raise CrawlDrop("private_address_refused", str(exc)) from None
            except requests.RequestException as exc:
                last = CrawlDrop("fetch_error", f"{url}: {exc}", fetch_error_kind(exc, deadline))
                if attempt == cfg.retries or deadline.expired:
                    raise last from None
                continue
            status = resp.status_code
            if (status >= 500 or status == 429) and attempt < cfg.retries:
                resp.close()
                last = CrawlDrop("http_error", f"{url}: HTTP {status}", http_error_class(status))
                continue
            return resp
        raise AssertionError("unreachable")

    def _crawl(self, host: HostState, item: CrawlItem) -> bool:
        """Fetch one URL; store it if it is an allowed page, queue its links or its redirect target."""
        cfg = self.config
        if not host.rules.allows(item.url, cfg.user_agent):
            raise CrawlDrop("robots_disallowed", item.url)
        fetched_at = datetime.now(UTC)
        with self._session().deadline(cfg.timeout_s) as deadline:
            with self._get(host, item.url, deadline, reserved=True) as resp:
                if resp.status_code in _REDIRECT_STATUSES:
                    self._redirect(item, resp.headers.get("Location"))
                    return False
                if not 200 <= resp.status_code < 300:
                    status = resp.status_code
                    raise CrawlDrop("http_error", f"{item.url}: HTTP {status}", http_error_class(status))
                mime = resp.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
                if mime not in cfg.allowed_content_types:
                    raise CrawlDrop("bad_content_type", f"{item.url}: {mime or 'no content type'}")
                declared = resp.headers.get("Content-Length", "")
                if declared.isdigit() and int(declared) > cfg.max_bytes_per_page:
                    raise CrawlDrop("oversize", f"{item.url}: Content-Length {declared}")
                ip = peer_ip(resp)
                body = self._read_body(resp, item.url, deadline, cfg.max_bytes_per_page)
        self._write(item, resp, body, ip, mime, fetched_at)
        for i, link in enumerate(extract_links(body, item.url)):
            self.enqueue(link, item.depth + 1, found_at=(item.rank, i))
        return True

    def _read_body(
        self, resp: requests.Response, url: str, deadline: RequestDeadline, limit: int, truncate: bool = False
    ) -> bytes:
        """Stream the (decoded) body within `deadline` (which also interrupts a blocked read); over `limit`
        bytes it is dropped as oversize, or cut at `limit` if `truncate`."""
        body = bytearray()
        try:
            for chunk in resp.iter_content(chunk_size=64 * 1024):
                body += chunk
                if len(body) > limit:
                    if truncate:
                        return bytes(body[:limit])
                    raise CrawlDrop("oversize", f"{url}: more than {limit} bytes")
                if deadline.expired:
                    break
        except requests.RequestException as exc:
            raise CrawlDrop("fetch_error", f"{url}: {exc}", fetch_error_kind(exc, deadline)) from None
        if deadline.expired:
            raise CrawlDrop("fetch_error", f"{url}: not read within {self.config.timeout_s}s", "deadline")
        return bytes(body)

    def _redirect(self, item: CrawlItem, location: str | None) -> None:
        if not location:
            raise CrawlDrop("http_error", f"{item.url}: redirect without Location", "3xx")
        chain = (*item.redirected_from, item.url)
        target = normalise_url(location, item.url)
        if target is not None and target in chain:
            raise CrawlDrop("redirect_loop", " -> ".join((*chain, target)))
        if len(chain) > self.config.max_redirects:
            raise CrawlDrop("too_many_redirects", " -> ".join((*chain, location)))
        self.count("redirects_followed")
        self.enqueue(location, item.depth, base=item.url, redirected_from=chain, found_at=(item.rank, 0))

    def _write(
        self, item: CrawlItem, resp: requests.Response, body: bytes, ip: str, mime: str, fetched_at: datetime
    ) -> None:
        """Write the request and response records of one page (the payload stored decoded); an ordered crawl
        holds them until its wave is done and writes the wave in rank order."""
        url = item.url
        date = datetime_to_iso_date(fetched_at)
        headers = [
            (f"X-Crawler-{name}" if name.lower() in _WIRE_HEADERS else name, value)
            for name, value in resp.raw.headers.items()
        ]
        headers.append(("Content-Length", str(len(body))))
        version = {10: "HTTP/1.0", 11: "HTTP/1.1"}.get(getattr(resp.raw, "version", 11), "HTTP/1.1")
        http_headers = StatusAndHeaders(f"{resp.status_code} {resp.reason}", headers, protocol=version)
        body_sha = hashlib.sha256(body).hexdigest()
        warc_headers = {"WARC-Date": date, "WARC-Identified-Payload-Type": mime,
                        "WARC-Record-ID": record_id(self.snapshot, "response", url, body_sha)}  # fmt: skip
        if ip:
            warc_headers["WARC-IP-Address"] = ip
        response = self._records.create_warc_record(
            url,
            "response",
            payload=BytesIO(body),
            length=len(body),
            http_headers=http_headers,
            warc_headers_dict=warc_headers,
        )
        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        request_headers = [("Host", parts.netloc), *resp.request.headers.items()]
        request = self._records.create_warc_record(
            url,
            "request",
            payload=BytesIO(b""),
            length=0,
            http_headers=StatusAndHeaders(f"GET {target} HTTP/1.1", request_headers, is_http_request=True),
            warc_headers_dict={
                "WARC-Date": date,
                "WARC-Record-ID": record_id(self.snapshot, "request", url, body_sha),
                "WARC-Concurrent-To": response.rec_headers.get_header("WARC-Record-ID"),
            },
        )
        page = {"url": url, "status": resp.status_code, "content_type": mime, "bytes": len(body),
                "digest": response.rec_headers.get_header("WARC-Payload-Digest")}  # fmt: skip
        if self.config.ordered:
            with self._lock:
                self._wave_pages.append((item.rank, [request, response], page))
        else:
            self._emit([request, response], page)

    def _emit(self, records: list, page: dict) -> None:
        self.writer.write_records(records)
        with self._lock:
            self.bytes_written += page["bytes"]
            self.digests.append(f"{page['url']} {page['digest']}")
            if len(self.sample) < 10:
                self.sample.append({k: v for k, v in page.items() if k != "digest"})

    def _flush_wave(self) -> None:
        """Ordered: write the finished wave's pages in rank order (no fetch is running when it is called)."""
        with self._lock:
            pages, self._wave_pages = sorted(self._wave_pages, key=lambda p: p[0]), []
        for _, records, page in pages:
            self._emit(records, page)


def record_id(snapshot: str, record_type: str, url: str, body_sha256: str) -> str:
    """A WARC-Record-ID named by what the record holds (uuid5), not drawn at random: the documents read from
    it keep their ids, and every choice keyed by id (the held-out split), in every crawl of the same pages.
    Unique within a snapshot: one page is written once."""
    name = "\n".join((snapshot, record_type, url, body_sha256))
    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, name)}>"


def _warcinfo(config: CrawlConfig, snapshot: str) -> dict:
    return {
        "software": "crucible-crawler",
        "format": "WARC File Format 1.0",
        "isPartOf": snapshot,
        "robots": "obey",
        "http-header-user-agent": config.user_agent,
    }


def crawl_seeds(
    config: CrawlConfig, store: ObjectStore, snapshot: str, out_prefix: str, seeds: list[str]
) -> StageResult:
    """Crawl `seeds` into gzipped WARC files under `out_prefix` (what was there is replaced on success)."""
    started = time.monotonic()
    writer = WarcShardWriter(
        store,
        out_prefix,
        config.records_per_warc_file,
        warcinfo=_warcinfo(config, snapshot),
        allow_empty=config.allow_empty,
    )
    crawler = Crawler(config, writer, snapshot=snapshot)
    with writer:
        crawler.run(seeds)
        if crawler.frontier.pages_written == 0 and not config.allow_empty:
            raise _empty_crawl_error(config, snapshot, seeds, crawler)  # before the writer replaces anything
    elapsed = time.monotonic() - started
    return _result(config, store, out_prefix, crawler, writer, elapsed)


def _empty_crawl_error(config: CrawlConfig, snapshot: str, seeds: list[str], crawler: Crawler) -> ValueError:
    shown = ", ".join(seeds[:5]) + (f" and {len(seeds) - 5} more" if len(seeds) > 5 else "")
    counts = {k: v for k, v in sorted(crawler.stats.items()) if v}
    return ValueError(
        f"web_crawl: the crawl from {shown} wrote no page for snapshot {snapshot!r} ({counts}); nothing was "
        "published and the snapshot's previous output is left as it was. Set allow_empty=true to publish an "
        "empty snapshot."
    )


def _result(
    config: CrawlConfig,
    store: ObjectStore,
    out_prefix: str,
    crawler: Crawler,
    writer: WarcShardWriter,
    elapsed: float,
) -> StageResult:
    pages = crawler.frontier.pages_written
    hosts = crawler.frontier.hosts
    metrics = {
        "pages_fetched": pages,
        "bytes": crawler.bytes_written,
        "pages_per_s": round(pages / elapsed, 2) if elapsed else 0.0,
        "elapsed_s": round(elapsed, 2),
        "hosts": len(hosts),
        "warc_files": len(writer.keys),
        "warc_records": writer.records_written,
        **{key: crawler.stats[key] for key in sorted(crawler.stats)},
    }
    if pages == 0:
        log.warning("the crawl wrote no pages: %s", {k: v for k, v in crawler.stats.items() if v})
    errors = [
        {"failure": k, "first url": e["url"], "message": e["message"]}
        for k, e in sorted(crawler.errors.items())
    ]
    summary = [
        {"metric": k, "value": metrics[k]}
        for k in ("pages_fetched", "bytes", "pages_per_s", "hosts", "warc_files", *ACTIVITY_COUNTS)
        if k in metrics
    ]
    drops = [{"dropped because": r, "urls": crawler.stats[r]} for r in DROP_REASONS]
    per_host = [
        {
            "origin": h.origin,
            "pages": h.pages,
            "robots": h.rules.source if h.rules else h.failure or "-",
            "interval_s": round(h.interval, 3),
        }
        for h in list(hosts.values())[:20]
    ]
    report = "\n\n".join(
        [
            f"### Crawl of {len(hosts)} origin(s) into `{store.uri(out_prefix)}`",
            markdown_table(summary),
            markdown_table(drops),
            markdown_table(per_host),
            "**Fetch errors (first URL and message per reason)**",
            markdown_table(errors),
        ]
    )
    version = hashlib.sha256("\n".join(sorted(crawler.digests)).encode()).hexdigest()[:16]
    return StageResult(
        metrics=metrics,
        outputs={"warc_prefix": store.uri(out_prefix)},
        report_md=report,
        sample=crawler.sample,
        data_version=version,
        extra={"warc_keys": list(writer.keys)},
    )


def crawl_web(config: CrawlConfig, store: ObjectStore, snapshot: str, out_prefix: str) -> StageResult:
    """The `web_crawl` stage: write one snapshot's WARC files under `out_prefix` in `store`.

    local_docs serves `config.doc_packages` on 127.0.0.1 (fetched with apt, cached in the state dir) for the
    duration of the crawl; seeds crawls `config.seeds`; warc ingests `config.warc_uri`.
    """
    if config.source == "warc":
        from pipelines.web.warc_ingest import ingest_warc

        return ingest_warc(config, store, snapshot, out_prefix)
    if config.source == "seeds":
        if not config.seeds:
            raise ValueError(
                "web_crawl: source=seeds but `seeds` is empty; set stages.web_crawl.seeds (profile or launchpad) "
                "to start URLs, or use source=warc with warc_uri"
            )
        return crawl_seeds(config, store, snapshot, out_prefix, config.seeds)
    from infra.local_web import serve_doc_packages

    with serve_doc_packages(config.doc_packages, port=config.local_web_port) as seeds:
        log.info("local web: %s", ", ".join(seeds))
        return crawl_seeds(config, store, snapshot, out_prefix, seeds)
