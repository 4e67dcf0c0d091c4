"""Outbound address policy for crawlers: which IP addresses a fetch may connect to.

A host is allowed only if EVERY address it resolves to is public (globally routable) or inside an allowlisted
CIDR; private, loopback, link-local, reserved, multicast and unspecified addresses are refused otherwise.
`policy_session` returns a `requests.Session` whose connections go only to addresses the policy vetted (the
resolution is done once per host and pinned), so a redirect, a retry or a DNS answer that changes between the
check and the connect cannot reach a refused address. `PolicySession.deadline(seconds)` puts a wall-clock limit
on everything a fetch does (connect, headers, body, retries): socket timeouts only bound each read, so a server
sending one byte at a time would otherwise hold the fetch forever.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[..., list]


class AddressRefused(ValueError):
    """A host resolves to an address the policy refuses (not an OSError, so HTTP clients do not retry it)."""

    def __init__(self, host: str, reason: str):
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason


def address_kind(ip: IPAddress) -> str:
    """A short name for why an address is not public ('' if it is public)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "link_local", "private", "multicast", "unspecified", "reserved"):
        if getattr(ip, f"is_{kind}"):
            return kind
    return "" if ip.is_global else "not_global"


class AddressPolicy:
    """Resolve hosts and decide whether a crawler may connect to them; results are cached per host."""

    def __init__(self, allow_cidrs: Iterable[str] = (), resolver: Resolver = socket.getaddrinfo):
        self.allow = [ipaddress.ip_network(c, strict=False) for c in allow_cidrs]
        self._resolve = resolver
        self._cache: dict[tuple[str, int], list[tuple[int, str]] | AddressRefused] = {}
        self._lock = threading.Lock()

    def allows_ip(self, ip: IPAddress) -> bool:
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        if any(ip in net or (mapped is not None and mapped in net) for net in self.allow):
            return True
        return not address_kind(ip)

    def vet(self, host: str, port: int) -> list[tuple[int, str]]:
        """The (family, ip) pairs `host` may be reached at; raises AddressRefused or socket.gaierror."""
        key = (host.lower(), port)
        with self._lock:
            cached = self._cache.get(key)
        if isinstance(cached, AddressRefused):
            raise cached
        if cached is not None:
            return cached
        infos = self._resolve(host, port, type=socket.SOCK_STREAM)
        addrs: list[tuple[int, str]] = []
        refused: AddressRefused | None = None
        for family, _, _, _, sockaddr in infos:
            ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if not self.allows_ip(ip):
                refused = AddressRefused(
                    host, f"resolves to {ip} ({address_kind(ip)}), not in allow_private_networks"
                )
                break
            if (family, str(sockaddr[0])) not in addrs:
                addrs.append((family, str(sockaddr[0])))
        result: list[tuple[int, str]] | AddressRefused = refused or addrs
        if not addrs and not refused:
            result = AddressRefused(host, "resolves to no address")
        with self._lock:
            self._cache[key] = result
        if isinstance(result, AddressRefused):
            raise result
        return result


def _connect_vetted(conn: HTTPConnection, policy: AddressPolicy) -> socket.socket:
    """Like urllib3's `_new_conn`, but only to the addresses the policy vetted for this host."""
    try:
        addrs = policy.vet(conn.host, conn.port)
    except socket.gaierror as exc:
        raise NameResolutionError(conn.host, conn, exc) from exc
    last: OSError | None = None
    for family, ip in addrs:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            for opt in conn.socket_options or []:
                sock.setsockopt(*opt)
            if isinstance(conn.timeout, int | float):
                sock.settimeout(conn.timeout)
            if conn.source_address:
                sock.bind(conn.source_address)
            sock.connect((ip, conn.port))
            conn.vetted_ip = ip  # http.client drops `sock` on Connection: close; keep the peer for the WARC
            return sock
        except TimeoutError as exc:
            sock.close()
            raise ConnectTimeoutError(conn, f"Connection to {conn.host} ({ip}) timed out") from exc
        except OSError as exc:
            sock.close()
            last = exc
    raise NewConnectionError(conn, f"Failed to establish a new connection: {last}")


class RequestDeadline:
    """A wall-clock limit on one fetch: when it passes, every socket the fetch used is shut down, so a read
    blocked on a slow server returns at once (and the fetch fails with a connection or protocol error)."""

    def __init__(self, seconds: float):
        self.expires_at = time.monotonic() + seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def remaining(self) -> float:
        return max(0.0, self.expires_at - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            if not self.expired:
                self._sockets.append(sock)
                return
        _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shutdown(sock)

    def __enter__(self) -> RequestDeadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        with self._lock:
            self._sockets.clear()


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed, or a plain socket detached by the TLS wrapper


class PolicySession(requests.Session):
    """A requests.Session whose connections obey an AddressPolicy and the current `deadline`."""

    current_deadline: RequestDeadline | None = None

    @contextmanager
    def deadline(self, seconds: float) -> Iterator[RequestDeadline]:
        """Limit everything this session does inside the block (one thread's fetch) to `seconds`."""
        with RequestDeadline(seconds) as limit:
            self.current_deadline = limit
            try:
                yield limit
            finally:
                self.current_deadline = None

    def watch(self, sock: socket.socket | None) -> None:
        if sock is not None and self.current_deadline is not None:
            self.current_deadline.watch(sock)


class _PolicyAdapter(HTTPAdapter):
    """An HTTPAdapter whose connection pools connect only to vetted addresses and let the session's deadline
    shut down the socket of every request (new and pooled connections alike)."""

    def __init__(self, policy: AddressPolicy, session: PolicySession, **kwargs):
        class PolicyHTTPConnection(HTTPConnection):
            def _new_conn(self) -> socket.socket:
                sock = _connect_vetted(self, policy)
                session.watch(sock)
                return sock

            def request(self, *args, **kwargs) -> None:
                session.watch(self.sock)  # a pooled connection: its socket is already open
                super().request(*args, **kwargs)

        class PolicyHTTPSConnection(HTTPSConnection):
            def _new_conn(self) -> socket.socket:
                sock = _connect_vetted(self, policy)  # TLS SNI and cert checks still use the host name
                session.watch(sock)
                return sock

            def connect(self) -> None:
                super().connect()
                session.watch(self.sock)  # the TLS socket that replaced the plain one

            def request(self, *args, **kwargs) -> None:
                session.watch(self.sock)
                super().request(*args, **kwargs)

        class PolicyHTTPPool(HTTPConnectionPool):
            ConnectionCls = PolicyHTTPConnection

        class PolicyHTTPSPool(HTTPSConnectionPool):
            ConnectionCls = PolicyHTTPSConnection

        self._pool_classes = {"http": PolicyHTTPPool, "https": PolicyHTTPSPool}
        super().__init__(**kwargs)

    def init_poolmanager(self, *args, **kwargs):
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = self._pool_classes


def peer_ip(response: requests.Response) -> str:
    """The IP address a streamed response came from ('' if unknown)."""
    return getattr(getattr(response.raw, "_connection", None), "vetted_ip", "")


def policy_session(policy: AddressPolicy, user_agent: str, pool_size: int = 4) -> PolicySession:
    """A requests.Session that refuses addresses outside `policy` on every connection (redirects included)
    and whose `deadline(seconds)` bounds a whole fetch in wall-clock time."""
    session = PolicySession()
    session.trust_env = False  # an environment proxy would connect on our behalf, bypassing the policy
    session.headers["User-Agent"] = user_agent
    adapter = _PolicyAdapter(
        policy, session, pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0
    )
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
