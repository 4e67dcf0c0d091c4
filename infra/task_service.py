"""A task service: one agentic task family (an `Environment`, training/agentic/protocol.py) behind HTTP, and
`TaskServiceClient`, the `Environment` that talks to it, so the RL loop cannot tell local from remote.

Routes (JSON bodies):
- `POST /episodes {task, episode_id?}` -> `{episode_id}`: opens an episode. A client-chosen `episode_id` (32
  hex chars) makes the call idempotent: a retry after a lost answer gets the same episode, not a second one.
- `POST /episodes/<id>/tool {payload}` -> `{observation}`: one tool call (the JSON between <tool_call> tags).
- `POST /episodes/<id>/finish {response}` -> `{reward, reason, partial, found}`: scores and closes the episode.
- `DELETE /episodes/<id>` -> `{closed}`: closes without scoring (idempotent).
- `GET /health` -> `{domain, version, in_flight, served}`.
A malformed body or id is a 400 naming the field, an unknown episode a 404, an `EnvironmentCrash` inside the
family a 503 with its reason (type `environment_crash`), any other failure a 500.

    python -m infra.task_service --family terminal --orchestrator http://127.0.0.1:8700 [--port 0]
    python -m infra.task_service --family search --factory-arg facts=facts.json --factory-arg latency_mean_s=0.2
    python -m infra.task_service --family demo --factory package.module:make --factory-arg key=value

prints `listening on http://HOST:PORT`, registers with the orchestrator and sends a heartbeat every
`--heartbeat-s` seconds (registering again whenever the orchestrator no longer knows it).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from infra.json_http import (
    BadRequest,
    HttpCallFailed,
    HttpRefused,
    JsonHandler,
    call_json,
    field_of,
    json_session,
)
from training.agentic.protocol import Environment, EnvironmentCrash, Episode
from training.tasks.base import Task, Verdict

log = logging.getLogger(__name__)

DEFAULT_FACTORY = "infra.task_service:agentic_environment"
_EPISODE_ID = re.compile(r"^[0-9a-f]{32}$")
_ROUTE = re.compile(r"^/episodes/([^/]+)(?:/(tool|finish))?$")


@dataclass
class _OpenEpisode:
    episode: Episode
    task_id: str
    last_used: float  # monotonic time of the last call
    lock: threading.Lock = field(default_factory=threading.Lock)  # one call at a time per episode


class TaskServer(ThreadingHTTPServer):
    """Serves one Environment; episodes idle for longer than `episode_ttl_s` are closed (their client died)."""

    daemon_threads = True

    def __init__(self, env: Environment, host: str = "127.0.0.1", port: int = 0, episode_ttl_s: float = 1800):
        super().__init__((host, port), _TaskHandler)
        self.env = env
        self.episode_ttl_s = episode_ttl_s
        self.episodes: dict[str, _OpenEpisode] = {}
        self.served = 0  # episodes finished with a verdict
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def health(self) -> dict:
        with self.lock:
            return {
                "domain": self.env.domain,
                "version": self.env.version,
                "in_flight": len(self.episodes),
                "served": self.served,
            }

    def close_idle(self) -> None:
        now = time.monotonic()
        with self.lock:
            idle = [i for i, e in self.episodes.items() if now - e.last_used > self.episode_ttl_s]
            stale = [self.episodes.pop(i) for i in idle]
        for open_episode in stale:
            log.warning(
                "closing episode of task %s: idle for over %.0f s", open_episode.task_id, self.episode_ttl_s
            )
            _close_quietly(open_episode.episode)


def _close_quietly(episode: Episode) -> None:
    try:
        episode.close()
    except Exception:  # closing is best effort: the episode is gone either way
        log.exception("closing an episode failed")


def parse_task(body: dict, domain: str) -> Task:
    """The `task` field as a Task of this service's family; BadRequest naming the field otherwise."""
    row = field_of(body, "task", dict)
    try:
        task = Task.from_json(row)
    except TypeError as exc:
        raise BadRequest(f"task: not a Task ({exc}); send Task.to_json()") from exc
    for name in ("id", "domain", "prompt", "answer"):
        if not isinstance(getattr(task, name), str):
            raise BadRequest(f"task.{name}: must be a string")
    if task.domain != domain:
        raise BadRequest(f"task.domain: this service serves {domain!r}, not {task.domain!r}")
    return task


class _TaskHandler(JsonHandler):
    server: TaskServer

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health":
            self.send_json(200, self.server.health())
        else:
            self.send_error_json(404, f"{self.path}: no such route (GET /health)")

    def do_POST(self) -> None:  # noqa: N802
        try:
            body = self.read_body()
            if self.path == "/episodes":
                self.send_json(200, self._open(body))
                return
            episode_id, action = self._route()
            if action == "tool":
                payload = field_of(body, "payload", str)
                self.send_json(200, {"observation": self._call(episode_id, lambda e: e.tool(payload))})
            elif action == "finish":
                response = field_of(body, "response", str)
                verdict = self._call(episode_id, lambda e: e.finish(response), close=True)
                self.send_json(
                    200,
                    {
                        "reward": verdict.reward,
                        "reason": verdict.reason,
                        "partial": verdict.partial,
                        "found": verdict.found,
                    },
                )
            else:
                self.send_error_json(
                    404, f"POST {self.path}: use /episodes/<id>/tool or /episodes/<id>/finish"
                )
        except BadRequest as exc:
            self.send_error_json(400, str(exc))
        except KeyError as exc:
            self.send_error_json(404, str(exc.args[0]), "unknown_episode")
        except EnvironmentCrash as exc:
            self.send_error_json(503, f"{self.server.env.domain}: {exc}", "environment_crash")
        except Exception as exc:  # a bug in the family is the client's 500, not a dead server
            log.exception("task service request failed")
            self.send_error_json(500, f"{type(exc).__name__}: {exc}", "internal_error")

    def do_DELETE(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))  # drain: keep the connection usable
        try:
            episode_id, action = self._route()
            if action:
                raise BadRequest(f"DELETE {self.path}: use DELETE /episodes/<id>")
        except BadRequest as exc:
            self.send_error_json(400, str(exc))
            return
        with self.server.lock:
            open_episode = self.server.episodes.pop(episode_id, None)
        if open_episode is not None:
            with open_episode.lock:
                _close_quietly(open_episode.episode)
        self.send_json(200, {"closed": open_episode is not None})

    def _route(self) -> tuple[str, str | None]:
        match = _ROUTE.match(self.path)
        if not match:
            raise BadRequest(f"path {self.path!r}: expected /episodes/<episode_id>[/tool|/finish]")
        if not _EPISODE_ID.match(match.group(1)):
            raise BadRequest(f"episode_id: {match.group(1)[:40]!r} is not 32 lowercase hex characters")
        return match.group(1), match.group(2)

    def _open(self, body: dict) -> dict:
        task = parse_task(body, self.server.env.domain)
        episode_id = field_of(body, "episode_id", str, required=False) or uuid.uuid4().hex
        if not _EPISODE_ID.match(episode_id):
            raise BadRequest(f"episode_id: {episode_id[:40]!r} is not 32 lowercase hex characters")
        self.server.close_idle()
        with self.server.lock:
            existing = self.server.episodes.get(episode_id)
        if existing is not None:  # a retried open: the same episode, if it is the same task
            if existing.task_id != task.id:
                raise BadRequest(f"episode_id: {episode_id} is already open for task {existing.task_id}")
            return {"episode_id": episode_id}
        episode = self.server.env.open(task)  # may take a while (a sandbox starting): outside the lock
        with self.server.lock:
            if episode_id in self.server.episodes:  # a concurrent retry won the race: keep one
                _close_quietly(episode)
            else:
                self.server.episodes[episode_id] = _OpenEpisode(episode, task.id, time.monotonic())
        return {"episode_id": episode_id}

    def _call(self, episode_id: str, fn, close: bool = False) -> Any:
        with self.server.lock:
            open_episode = self.server.episodes.get(episode_id)
        if open_episode is None:
            raise KeyError(
                f"episode {episode_id} is not open on this service (finished, closed or never opened)"
            )
        with open_episode.lock:
            open_episode.last_used = time.monotonic()
            try:
                result = fn(open_episode.episode)
            finally:
                if close:
                    with self.server.lock:
                        self.server.episodes.pop(episode_id, None)
                    _close_quietly(open_episode.episode)
            if close:
                with self.server.lock:
                    self.server.served += 1
            return result


class ServiceUnreachable(EnvironmentCrash):
    """The task service could not be reached (dead, hung or restarting): take it out of rotation."""


def _crash(exc: HttpCallFailed | HttpRefused, what: str) -> EnvironmentCrash:
    if isinstance(exc, HttpCallFailed) and exc.status is None:
        return ServiceUnreachable(f"{what}: {exc}")
    return EnvironmentCrash(f"{what}: {exc}")


class RemoteEpisode:
    """An episode living in a task service; every failure of the service raises EnvironmentCrash."""

    def __init__(self, client: TaskServiceClient, episode_id: str):
        self.client = client
        self.episode_id = episode_id
        self.closed = False

    def _post(self, action: str, body: dict) -> dict:
        if self.closed:
            raise EnvironmentCrash(f"episode {self.episode_id} on {self.client.url} is already closed")
        url = f"{self.client.url}/episodes/{self.episode_id}/{action}"
        try:  # not retried: a tool call changes the episode's state, and a lost answer may have applied it
            return call_json(self.client.session, "POST", url, body, self.client.timeout_s)
        except HttpRefused as exc:
            if exc.status == 404:  # the service restarted and lost the episode
                raise EnvironmentCrash(f"task service lost the episode: {exc}") from exc
            raise ValueError(f"task service refused the call: {exc}") from exc
        except HttpCallFailed as exc:
            raise _crash(exc, "task service call failed") from exc

    def tool(self, payload: str) -> str:
        return str(self._post("tool", {"payload": payload})["observation"])

    def finish(self, response: str) -> Verdict:
        try:
            answer = self._post("finish", {"response": response})
        finally:
            self.closed = True  # the service closes it whether scoring worked or not

        def credit(key: str) -> float:  # a credit in [0, 1], whatever a service sends
            return min(1.0, max(0.0, float(answer.get(key, 0.0))))

        return Verdict(float(answer["reward"]), str(answer["reason"]), credit("partial"), credit("found"))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            call_json(
                self.client.session,
                "DELETE",
                f"{self.client.url}/episodes/{self.episode_id}",
                timeout_s=self.client.timeout_s,
            )
        except (HttpCallFailed, HttpRefused) as exc:  # a dead service has closed it already
            log.info("closing episode %s: %s", self.episode_id, exc)


class TaskServiceClient:
    """An `Environment` served by a task service at `url`. `domain` / `version` come from `GET /health` on
    first use unless given. `open` and `health` are retried `retries` times with backoff (open sends a
    client-chosen episode id, so a retry cannot open a second episode); episode calls are tried once."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        domain: str | None = None,
        version: str | None = None,
    ):
        self.url = url.rstrip("/")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._domain, self._version = domain, version
        self.session = json_session()

    def health(self) -> dict:
        try:
            return call_json(
                self.session, "GET", f"{self.url}/health", None, self.timeout_s, self.retries, self.backoff_s
            )
        except (HttpCallFailed, HttpRefused) as exc:
            raise _crash(exc, "task service health check failed") from exc

    @property
    def domain(self) -> str:
        if self._domain is None:
            self._domain = str(self.health()["domain"])
        return self._domain

    @property
    def version(self) -> str:
        if self._version is None:
            self._version = str(self.health()["version"])
        return self._version

    def open(self, task: Task) -> RemoteEpisode:
        body = {"task": task.to_json(), "episode_id": uuid.uuid4().hex}
        try:
            answer = call_json(
                self.session,
                "POST",
                f"{self.url}/episodes",
                body,
                self.timeout_s,
                self.retries,
                self.backoff_s,
            )
        except HttpRefused as exc:
            raise ValueError(f"task service refused the episode: {exc}") from exc
        except HttpCallFailed as exc:
            raise _crash(exc, "task service could not open an episode") from exc
        return RemoteEpisode(self, str(answer["episode_id"]))


# --- the process: a family behind HTTP, registered with the orchestrator ---------------------------------------


def agentic_environment(
    family: str,
    facts: str | None = None,
    latency_mean_s: str = "0",
    latency_sigma: str = "1",
    latency_seed: str = "0",
) -> Environment:
    """The default factory: an agentic family of training/agentic/families.py. `facts` is a JSON file of
    [term, definition] pairs (the search family's documents; required for search); `latency_*` set its
    ExtraLatency (the long-tail delay added to every tool call and finish)."""
    import json

    from training.agentic.episodes import ExtraLatency
    from training.agentic.families import agentic_suites

    if family == "search" and not facts:
        raise ValueError("--factory-arg facts=PATH is required for search: a JSON list of [term, definition]")
    pairs = [tuple(pair) for pair in json.loads(Path(facts).read_text())] if facts else []
    latency = ExtraLatency(mean_s=float(latency_mean_s), sigma=float(latency_sigma), seed=int(latency_seed))
    suites = agentic_suites(pairs, latency)
    if family not in suites:
        raise ValueError(f"--family {family!r}: the agentic families are {sorted(suites)}")
    return suites[family]


def load_environment(spec: str, family: str, **kwargs: str) -> Environment:
    """`module:callable` called as `callable(family, **kwargs)` -> the family's Environment."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"--factory {spec!r}: expected module:callable")
    env = getattr(importlib.import_module(module), attr)(family, **kwargs)
    if getattr(env, "domain", None) != family:
        raise ValueError(
            f"--factory {spec} built a {getattr(env, 'domain', None)!r} environment, not {family!r}"
        )
    return env


class Heartbeat:
    """Registers a service with the orchestrator and keeps it registered: a heartbeat every `interval_s`; when
    the orchestrator answers that it does not know the service (it was reaped or restarted), registers again."""

    def __init__(self, orchestrator_url: str, domain: str, url: str, version: str, interval_s: float = 1.0):
        self.orchestrator_url = orchestrator_url.rstrip("/")
        self.domain, self.url, self.version, self.interval_s = domain, url, version, interval_s
        self.session = json_session(pool_size=2)
        self.registered = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def _post(self, route: str, body: dict) -> dict:
        timeout = max(self.interval_s, 1.0)
        return call_json(self.session, "POST", f"{self.orchestrator_url}{route}", body, timeout, retries=2)

    def beat(self) -> None:
        """One heartbeat (or registration); errors are logged, the next beat tries again."""
        try:
            if self.registered and self._post("/heartbeat", {"url": self.url}).get("known"):
                return
            self._post("/register", {"domain": self.domain, "url": self.url, "version": self.version})
            self.registered = True
            log.info("registered %s (%s) with %s", self.url, self.domain, self.orchestrator_url)
        except (HttpCallFailed, HttpRefused) as exc:
            self.registered = False
            log.warning("orchestrator %s: %s", self.orchestrator_url, exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._stop.wait(self.interval_s)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self, deregister: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)
        if deregister and self.registered:
            try:
                self._post("/deregister", {"url": self.url})
            except (HttpCallFailed, HttpRefused) as exc:
                log.warning("deregistering from %s: %s", self.orchestrator_url, exc)


@dataclass
class TaskServiceProcess:
    """A task service running as a subprocess in its own process group: `start` waits until it is healthy,
    `stop` ends it politely (SIGTERM: it deregisters), `kill` crashes it (SIGKILL: no goodbye).

    Its temp files (episode dirs, sandbox dirs) go to a scratch dir of its own, which it removes when it exits
    and `stop` / `kill` remove after it has exited: a service killed mid-episode leaves nothing behind."""

    family: str
    args: tuple[str, ...] = ()
    orchestrator: str | None = None
    url: str = ""
    proc: subprocess.Popen | None = None
    scratch: Path | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, cwd: Path | None = None, startup_timeout_s: float = 60) -> TaskServiceProcess:
        from infra.settings import REPO_ROOT

        command = [
            sys.executable,
            "-m",
            "infra.task_service",
            "--family",
            self.family,
            "--port",
            "0",
            "--parent-pid",
            str(os.getpid()),
            *self.args,
        ]
        self._discard_scratch()  # a replacement's predecessor has exited
        self.scratch = Path(tempfile.mkdtemp(prefix=f"crucible-{self.family}-service-"))
        command += ["--scratch-dir", str(self.scratch)]
        if self.orchestrator:
            command += ["--orchestrator", self.orchestrator]
        self.proc = proc = subprocess.Popen(
            command,
            cwd=cwd or REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        timer = threading.Timer(startup_timeout_s, proc.kill)  # a service that never prints is killed
        timer.start()
        line = proc.stdout.readline() if proc.stdout else ""
        timer.cancel()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(
                f"infra.task_service --family {self.family} did not start (exit {proc.poll()}): {line!r}"
            )
        self.url = line.split("listening on ", 1)[1].strip()
        # keep reading: a family that prints would otherwise block on a full pipe
        threading.Thread(target=proc.stdout.read, name="task-service-stdout", daemon=True).start()
        TaskServiceClient(self.url, timeout_s=5, retries=5).health()
        return self

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait()
        self._discard_scratch()

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._discard_scratch()

    def _discard_scratch(self) -> None:
        if self.scratch is not None and not self.alive():
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


@contextmanager
def task_service_process(
    family: str,
    *args: str,
    orchestrator: str | None = None,
    cwd: Path | None = None,
    startup_timeout_s: float = 60,
) -> Iterator[TaskServiceProcess]:
    """Run `python -m infra.task_service --family FAMILY [--orchestrator URL] ARGS` on a free port; yields it
    once `GET /health` answers, and stops it (by pid: SIGTERM, then SIGKILL) on exit."""
    service = TaskServiceProcess(family, args, orchestrator)
    try:
        yield service.start(cwd, startup_timeout_s)
    finally:
        service.stop()


class TaskServiceFleet:
    """`replicas` task-service processes per family, registered with `orchestrator`; a watchdog thread starts
    a replacement for any that exits (crashed or killed), which registers and is used again. `restarts`
    counts them. Use as a context manager; leaving it stops every process."""

    def __init__(
        self,
        replicas: dict[str, int],
        orchestrator: str,
        args: tuple[str, ...] = (),
        check_s: float = 0.5,
    ):
        self.services = [
            TaskServiceProcess(family, args, orchestrator) for family, n in replicas.items() for _ in range(n)
        ]
        self.check_s = check_s
        self.restarts = 0
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="task-service-watchdog", daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.check_s):
            for service in self.services:
                if self._stop.is_set() or service.alive():
                    continue
                log.warning(
                    "task service %s (%s) exited; starting a replacement", service.url, service.family
                )
                try:
                    service.start()
                    self.restarts += 1
                except RuntimeError as exc:  # try again on the next check
                    log.warning("replacement failed: %s", exc)

    def __enter__(self) -> TaskServiceFleet:
        try:
            for service in self.services:
                service.start()
        except BaseException:
            self.__exit__()
            raise
        self._watchdog.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._watchdog.is_alive():
            self._watchdog.join(timeout=70)
        for service in self.services:
            service.stop()


def exit_with_parent(parent: int, check_s: float = 0.5) -> threading.Thread:
    """End this process group once `parent` is gone (this process re-parented). A service runs in a session of
    its own so that it can be killed as a group, which also means a launcher killed by a signal (its `finally`
    never runs) would leave it serving forever."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(check_s)
        log.warning("task service: parent process %d exited; stopping", parent)
        os.killpg(os.getpgid(0), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", required=True, help="the task family (domain) to serve, e.g. terminal")
    parser.add_argument(
        "--factory", default=DEFAULT_FACTORY, help="module:callable(family, **kwargs) -> Environment"
    )
    parser.add_argument(
        "--factory-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument (a string) for the factory; repeatable",
    )
    parser.add_argument(
        "--orchestrator", default=None, help="orchestrator URL to register with (none: standalone)"
    )
    parser.add_argument("--heartbeat-s", type=float, default=1.0, help="seconds between heartbeats")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    parser.add_argument("--episode-ttl-s", type=float, default=1800, help="close episodes idle for longer")
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="exit once this process (the launcher, as TaskServiceProcess passes it) is no longer the parent",
    )
    parser.add_argument(
        "--scratch-dir",
        type=Path,
        default=None,
        help="an existing dir for this service's temp files (episode and sandbox dirs); removed on exit",
    )
    args = parser.parse_args(argv)
    if args.scratch_dir is not None:
        if not args.scratch_dir.is_dir():
            parser.error(f"--scratch-dir {args.scratch_dir}: not an existing directory")
        tempfile.tempdir = str(args.scratch_dir)
        os.environ["TMPDIR"] = str(args.scratch_dir)  # and for the processes it starts
    try:
        _serve(args, parser)
    finally:
        if args.scratch_dir is not None:
            shutil.rmtree(args.scratch_dir, ignore_errors=True)


def _serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    kwargs = dict(arg.split("=", 1) for arg in args.factory_arg if "=" in arg)
    if len(kwargs) != len(args.factory_arg):
        parser.error(f"--factory-arg takes KEY=VALUE, got {args.factory_arg}")
    env = load_environment(args.factory, args.family, **kwargs)
    server = TaskServer(env, args.host, args.port, episode_ttl_s=args.episode_ttl_s)
    print(f"listening on {server.url}", flush=True)
    heartbeat = None
    if args.orchestrator:
        heartbeat = Heartbeat(
            args.orchestrator, env.domain, server.url, env.version, args.heartbeat_s
        ).start()
    try:
        server.serve_forever()
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        server.server_close()


if __name__ == "__main__":
    # Run the importable module, not __main__, so the classes a factory sees are the handler's.
    from infra import task_service

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SIGTERM: deregister, then exit
    task_service.main()
