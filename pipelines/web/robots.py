"""robots.txt rules of one origin (RFC 9309 semantics for fetch failures)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.robotparser import RobotFileParser

MAX_ROBOTS_BYTES = 500 * 1024  # RFC 9309 2.5: parse at least 500 KiB, ignore the rest


@dataclass
class RobotsRules:
    """What one origin's robots.txt allows `agent` to fetch, and how slowly."""

    parser: RobotFileParser | None = None  # None: no usable rules (allow or disallow everything)
    disallow_all: bool = False
    source: str = "allow_all"

    def allows(self, url: str, agent: str) -> bool:
        if self.disallow_all:
            return False
        return self.parser is None or self.parser.can_fetch(agent, url)

    def delay_s(self, agent: str) -> float:
        """Minimum seconds between requests asked by Crawl-delay / Request-rate (0 if none)."""
        if self.parser is None:
            return 0.0
        delay = float(self.parser.crawl_delay(agent) or 0)
        rate = self.parser.request_rate(agent)
        if rate and rate.requests:
            delay = max(delay, rate.seconds / rate.requests)
        return delay


def robots_url(origin: str) -> str:
    return f"{origin}/robots.txt"


def rules_from_fetch(status: int | None, body: bytes) -> RobotsRules:
    """Rules from a robots.txt fetch: status None = unreachable.

    2xx: parse it. 4xx: no rules, crawl everything. 5xx or unreachable: assume a complete disallow (RFC 9309
    2.3.1.3-4), so an overloaded server is not crawled.
    """
    if status is None or status >= 500:
        return RobotsRules(disallow_all=True, source="unreachable" if status is None else f"http_{status}")
    if status >= 400 or status < 200:
        return RobotsRules(source=f"http_{status}")
    parser = RobotFileParser()
    parser.parse(body[:MAX_ROBOTS_BYTES].decode("utf-8", errors="replace").splitlines())
    return RobotsRules(parser=parser, source="parsed")
