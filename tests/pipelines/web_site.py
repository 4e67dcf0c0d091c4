"""A scriptable HTTP site on 127.0.0.1 (a real server on a free port) that records every request it
receives: what the web-crawl tests crawl."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)
    send_length: bool = True  # False: no Content-Length, the body ends when the connection closes


Route = Reply | Callable[[int], Reply]  # a callable gets how many times the path was requested before


def page(*links: str, title: str = "page") -> Reply:
    anchors = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    return Reply(
        body=f"<html><head><title>{title}</title></head><body><p>{title}</p><ul>{anchors}</ul>"
        f"</body></html>".encode()
    )


def redirect(location: str, status: int = 302) -> Reply:
    return Reply(status=status, headers={"Location": location}, body=b"moved")


class Site:
    """A test web site: `routes` maps a path (with query) to a Reply; `requests` logs (path, time)."""

    def __init__(self, routes: dict[str, Route], robots: str | None = "User-agent: *\nAllow: /\n"):
        self.routes = dict(routes)
        if robots is not None:
            self.routes.setdefault("/robots.txt", Reply(body=robots.encode(), content_type="text/plain"))
        self.requests: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                with site._lock:
                    seen = sum(1 for p, _ in site.requests if p == self.path)
                    site.requests.append((self.path, time.monotonic()))
                route = site.routes.get(self.path, Reply(status=404, body=b"not found"))
                reply = route(seen) if callable(route) else route
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if reply.send_length:
                    self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                try:
                    self.wfile.write(reply.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the crawler stopped reading (oversize): expected

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def url(self, path: str = "/") -> str:
        return self.base + path

    def hits(self, path: str) -> int:
        return sum(1 for p, _ in self.requests if p == path)

    def times(self, exclude: tuple[str, ...] = ()) -> list[float]:
        return sorted(t for p, t in self.requests if p not in exclude)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
