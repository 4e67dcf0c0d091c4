"""Small JSON-over-HTTP pieces shared by the task services and the orchestrator server: a request handler base
(JSON bodies in and out, errors as `{"error": {"message", "type", "code"}}`) and a client call with retries.

Only idempotent calls are retried (connection errors, timeouts and 5xx, with doubling backoff); a call that
changes state is tried once, because a lost answer does not mean the change did not happen.
"""

from __future__ import annotations

import json
import logging
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import requests
from requests.adapters import HTTPAdapter

log = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A request body or id the server refuses; the message names the field (a 400)."""


class HttpCallFailed(RuntimeError):
    """The server could not be reached or answered 5xx (after the retries allowed); names the URL."""

    def __init__(self, message: str, status: int | None = None, error_type: str = ""):
        super().__init__(message)
        self.status = status
        self.error_type = error_type


class HttpRefused(RuntimeError):
    """The server answered 4xx: the request is wrong (or names something the server does not know)."""

    def __init__(self, message: str, status: int, error_type: str = ""):
        super().__init__(message)
        self.status = status
        self.error_type = error_type


class JsonHandler(BaseHTTPRequestHandler):
    """Base for JSON routes: `send_json`, `send_error_json`, `read_body` (a dict, or BadRequest)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s " + fmt, self.address_string(), *args)

    def send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str, error_type: str = "invalid_request_error") -> None:
        self.send_json(status, {"error": {"message": message, "type": error_type, "code": status}})

    def read_body(self) -> dict:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise BadRequest(f"body: not JSON ({exc})") from exc
        if not isinstance(body, dict):
            raise BadRequest(f"body: must be a JSON object, got {type(body).__name__}")
        return body


def field_of(body: dict, name: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
    """`body[name]` checked against `kind`; BadRequest naming the field otherwise (None if optional, absent)."""
    value = body.get(name)
    if value is None:
        if required:
            raise BadRequest(f"{name}: required")
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRequest(f"{name}: must be {names}, got {type(value).__name__}")
    return value


def json_session(pool_size: int = 64) -> requests.Session:
    """A session for cluster-internal JSON services: no environment proxy, no transport-level retries (the
    caller decides what is safe to repeat), `pool_size` keep-alive connections per host for many threads."""
    session = requests.Session()
    session.trust_env = False
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=pool_size, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def call_json(
    session: requests.Session,
    method: str,
    url: str,
    body: dict | None = None,
    timeout_s: float = 30.0,
    retries: int = 0,
    backoff_s: float = 0.2,
    max_backoff_s: float = 4.0,
) -> dict:
    """One JSON call; connection errors, timeouts and 5xx are retried `retries` times with doubling backoff,
    then raise HttpCallFailed; a 4xx raises HttpRefused at once. Both carry the server's error message."""
    last, status, error_type = "", None, ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(backoff_s * 2 ** (attempt - 1), max_backoff_s))
        try:
            resp = session.request(method, url, json=body, timeout=timeout_s)
        except (requests.ConnectionError, requests.Timeout) as exc:
            last, status, error_type = f"{type(exc).__name__}: {exc}", None, "unreachable"
            log.debug("%s %s: %s (attempt %d of %d)", method, url, last, attempt + 1, retries + 1)
            continue
        try:
            answer = resp.json() if resp.content else {}
        except ValueError:
            answer = {"error": {"message": resp.text[:300]}}
        error = answer.get("error") if isinstance(answer, dict) else None
        message = error.get("message", "") if isinstance(error, dict) else ""
        kind = error.get("type", "") if isinstance(error, dict) else ""
        if resp.status_code >= 500:
            last, status, error_type = f"HTTP {resp.status_code}: {message}", resp.status_code, kind
            continue
        if resp.status_code >= 400:
            raise HttpRefused(f"{method} {url}: HTTP {resp.status_code}: {message}", resp.status_code, kind)
        if not isinstance(answer, dict):
            raise HttpCallFailed(f"{method} {url}: answer is not a JSON object: {resp.text[:200]!r}")
        return answer
    tries = f" after {retries + 1} attempts" if retries else ""
    raise HttpCallFailed(f"{method} {url} failed{tries}: {last}", status, error_type)
