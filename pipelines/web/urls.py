"""URL normalisation and link extraction for the crawler."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlencode, urljoin, urlsplit, urlunsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_BARE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"


def _normalise_escapes(path: str) -> str:
    """Decode escaped unreserved characters, uppercase other escapes, escape what must be (RFC 3986 6.2.2)."""

    def fix(match: re.Match) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in _UNRESERVED else "%" + match.group(1).upper()

    path = _BARE_PERCENT.sub("%25", path)
    return quote(_ESCAPE.sub(fix, path), safe=_PATH_SAFE)


def _remove_dot_segments(path: str) -> str:
    """Resolve '.' and '..' path segments (RFC 3986 5.2.4)."""
    out: list[str] = []
    segments = path.split("/")
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == ".":
            if last:
                out.append("")
        elif seg == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(seg)
    return "/".join(out) if out and out[0] == "" else "/" + "/".join(out)


def normalise_url(url: str, base: str | None = None) -> str | None:
    """Canonical form of an http(s) URL (resolved against `base`), or None if it is not crawlable.

    Lowercases scheme and host, drops the fragment, the default port and empty query, resolves dot segments,
    makes an empty path '/', sorts query parameters and normalises percent-escapes, so that spellings of the
    same page de-duplicate.
    """
    url = url.strip()
    if base:
        url = urljoin(base, url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    host = parts.hostname.lower().rstrip(".")
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    path = _remove_dot_segments(_normalise_escapes(parts.path or "/"))
    query = ""
    if parts.query:
        pairs = sorted(parse_qsl(parts.query, keep_blank_values=True))
        query = urlencode(pairs, doseq=True)
    return urlunsplit((scheme, netloc, path, query, ""))


def origin(url: str) -> str:
    """`scheme://host[:port]` of a normalised URL: the unit robots.txt and politeness apply to."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or DEFAULT_PORTS.get(parts.scheme, 80)


def extract_links(html: bytes, page_url: str) -> list[str]:
    """Raw `<a href>` targets of a page, resolved against `<base href>` or the page URL (not normalised)."""
    import lxml.html

    try:
        doc = lxml.html.document_fromstring(html)
    except (ValueError, lxml.etree.ParserError):
        return []
    base = page_url
    for href in doc.xpath("//base/@href")[:1]:
        base = urljoin(page_url, href.strip())
    for content in doc.xpath("//meta[translate(@name,'ROBTS','robts')='robots']/@content"):
        if "nofollow" in content.lower():
            return []  # the page asks crawlers not to follow its links
    links = []
    for anchor in doc.xpath("//a[@href]"):
        if "nofollow" in (anchor.get("rel") or "").lower():
            continue
        links.append(urljoin(base, anchor.get("href").strip()))
    return links
