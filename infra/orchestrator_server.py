"""The rollout orchestrator (training/agentic/orchestrator.py) behind HTTP, and `OrchestratorClient`, which
has the same calls as the in-process `Orchestrator`, so `ServicePool` (infra/service_pool.py) takes either.

Routes (JSON bodies):
- `POST /register {domain, url, version}` -> `{registered, heartbeat_timeout_s}`
- `POST /heartbeat {url}` -> `{known}` (false: register again)
- `POST /deregister {url}`, `POST /mark_failed {url, reason}`
- `POST /acquire {domain?}` -> `{lease, domain, url}`; 409 (type `no_service`) when no live service has room
- `POST /release {lease, outcome, reason?}` -> `{outcome, reason}` (the recorded ones)
- `GET /next_domain` -> `{domain}` (null when none can take an episode), `GET /stats`, `GET /health`
A reaper thread takes silent services out of rotation every quarter of the heartbeat timeout.

    python -m infra.orchestrator_server --ratio terminal=1 --ratio codefix=1 --ratio search=1 \
        [--max-concurrency terminal=8] [--heartbeat-timeout-s 10] [--port 0]
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer

from infra.json_http import BadRequest, HttpRefused, JsonHandler, call_json, field_of, json_session
from training.agentic.orchestrator import OUTCOMES, Lease, NoServiceAvailable, Orchestrator

log = logging.getLogger(__name__)


class OrchestratorServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, orchestrator: Orchestrator, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _OrchestratorHandler)
        self.orchestrator = orchestrator
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_forever, name="reaper", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def _reap_forever(self) -> None:
        while not self._stop.wait(self.orchestrator.heartbeat_timeout_s / 4):
            self.orchestrator.reap()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        if not self._reaper.is_alive():
            self._reaper.start()
        super().serve_forever(poll_interval)

    def shutdown(self) -> None:
        self._stop.set()
        super().shutdown()


class _OrchestratorHandler(JsonHandler):
    server: OrchestratorServer

    def do_GET(self) -> None:  # noqa: N802
        orchestrator = self.server.orchestrator
        if self.path == "/stats":
            self.send_json(200, orchestrator.stats())
        elif self.path == "/next_domain":
            self.send_json(200, {"domain": orchestrator.next_task_domain()})
        elif self.path == "/health":
            self.send_json(200, {"ok": True, "domains": sorted(orchestrator.ratios)})
        else:
            self.send_error_json(404, f"GET {self.path}: no such route (/stats, /next_domain, /health)")

    def do_POST(self) -> None:  # noqa: N802
        orchestrator = self.server.orchestrator
        try:
            body = self.read_body()
            if self.path == "/register":
                orchestrator.register(
                    field_of(body, "domain", str), field_of(body, "url", str), field_of(body, "version", str)
                )
                self.send_json(
                    200, {"registered": True, "heartbeat_timeout_s": orchestrator.heartbeat_timeout_s}
                )
            elif self.path == "/heartbeat":
                self.send_json(200, {"known": orchestrator.heartbeat(field_of(body, "url", str))})
            elif self.path == "/deregister":
                orchestrator.deregister(field_of(body, "url", str))
                self.send_json(200, {"deregistered": True})
            elif self.path == "/mark_failed":
                orchestrator.mark_failed(field_of(body, "url", str), field_of(body, "reason", str))
                self.send_json(200, {"marked": True})
            elif self.path == "/acquire":
                lease = orchestrator.acquire(field_of(body, "domain", str, required=False))
                self.send_json(200, {"lease": lease.id, "domain": lease.domain, "url": lease.url})
            elif self.path == "/release":
                outcome = field_of(body, "outcome", str)
                if outcome not in OUTCOMES:
                    raise BadRequest(f"outcome: {outcome!r} is not one of {OUTCOMES}")
                recorded, reason = orchestrator.release(
                    field_of(body, "lease", str), outcome, field_of(body, "reason", str, required=False) or ""
                )
                self.send_json(200, {"outcome": recorded, "reason": reason})
            else:
                self.send_error_json(404, f"POST {self.path}: no such route")
        except NoServiceAvailable as exc:
            self.send_error_json(409, str(exc), "no_service")
        except KeyError as exc:
            self.send_error_json(404, str(exc.args[0]), "unknown_lease")
        except ValueError as exc:  # BadRequest and the orchestrator's own validation both name the field
            self.send_error_json(400, str(exc))


class OrchestratorClient:
    """The `Orchestrator` calls over HTTP. Reads (stats, next domain) and idempotent calls (register,
    heartbeat, mark_failed, release: releasing twice returns the recorded outcome) are retried; acquire is
    not (a lost answer would leak a lease). Failures raise infra.json_http.HttpCallFailed naming the URL."""

    def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 3, backoff_s: float = 0.2):
        self.url = url.rstrip("/")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.session = json_session()

    def _call(self, method: str, route: str, body: dict | None = None, retry: bool = True) -> dict:
        retries = self.retries if retry else 0
        try:
            return call_json(
                self.session, method, f"{self.url}{route}", body, self.timeout_s, retries, self.backoff_s
            )
        except HttpRefused as exc:
            if exc.error_type == "no_service":
                raise NoServiceAvailable(str(exc)) from exc
            if exc.error_type == "unknown_lease":
                raise KeyError(str(exc)) from exc
            raise ValueError(str(exc)) from exc

    def register(self, domain: str, url: str, version: str) -> None:
        self._call("POST", "/register", {"domain": domain, "url": url, "version": version})

    def heartbeat(self, url: str) -> bool:
        return bool(self._call("POST", "/heartbeat", {"url": url})["known"])

    def deregister(self, url: str) -> None:
        self._call("POST", "/deregister", {"url": url})

    def mark_failed(self, url: str, reason: str) -> None:
        self._call("POST", "/mark_failed", {"url": url, "reason": reason})

    def next_task_domain(self) -> str | None:
        return self._call("GET", "/next_domain")["domain"]

    def acquire(self, domain: str | None = None) -> Lease:
        answer = self._call("POST", "/acquire", {"domain": domain} if domain else {}, retry=False)
        return Lease(answer["lease"], answer["domain"], answer["url"])

    def release(self, lease_id: str, outcome: str, reason: str = "") -> tuple[str, str]:
        answer = self._call("POST", "/release", {"lease": lease_id, "outcome": outcome, "reason": reason})
        return answer["outcome"], answer["reason"]

    def stats(self) -> dict:
        return self._call("GET", "/stats")


@contextmanager
def orchestrator_server(orchestrator: Orchestrator, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve `orchestrator` on a thread of this process; yields its URL, shuts it down on exit."""
    server = OrchestratorServer(orchestrator, host, port)
    thread = threading.Thread(target=server.serve_forever, name="orchestrator", daemon=True)
    thread.start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _pairs(values: list[str], flag: str, cast) -> dict:
    out = {}
    for value in values:
        key, sep, raw = value.partition("=")
        if not sep:
            raise SystemExit(f"{flag} takes DOMAIN=VALUE, got {value!r}")
        out[key] = cast(raw)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ratio", action="append", required=True, metavar="DOMAIN=WEIGHT", help="repeatable")
    parser.add_argument(
        "--max-concurrency", action="append", default=[], metavar="DOMAIN=N", help="repeatable"
    )
    parser.add_argument("--heartbeat-timeout-s", type=float, default=10.0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    orchestrator = Orchestrator(
        _pairs(args.ratio, "--ratio", float),
        _pairs(args.max_concurrency, "--max-concurrency", int),
        args.heartbeat_timeout_s,
    )
    server = OrchestratorServer(orchestrator, args.host, args.port)
    print(f"listening on {server.url}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
