"""Task services over real HTTP on 127.0.0.1 (services as subprocesses, the orchestrator server on a thread):
same verdicts as in process, 400s naming the field, heartbeat reaping and replacement, and a task service
SIGKILLed mid-run while episodes go through ServicePool: every episode ends once, ok or env_failure."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from infra.orchestrator_server import OrchestratorClient, orchestrator_server
from infra.service_pool import ServicePool, orchestrated_environments
from infra.task_service import TaskServiceClient, TaskServiceFleet, task_service_process
from training.agentic.orchestrator import NoServiceAvailable, Orchestrator
from training.agentic.protocol import EnvironmentCrash
from training.tasks.base import Task, Verdict

FACTORY = "tests.agentic.test_task_services:counter_environment"


class CounterEpisode:
    """State: a running total. Tool `{"name": "add", "arguments": {"n": 3}}` adds; `{"name": "crash"}` is an
    environment failure; the verdict checks the response's last number against the answer and the total."""

    def __init__(self, task: Task, tool_delay_s: float):
        self.task, self.total, self.tool_delay_s, self.closed = task, 0, tool_delay_s, False

    def tool(self, payload: str) -> str:
        time.sleep(self.tool_delay_s)
        try:
            call = json.loads(payload)
        except ValueError as exc:
            return f"error: tool call is not JSON ({exc})"
        if call.get("name") == "crash":
            raise EnvironmentCrash("sandbox died")
        if call.get("name") != "add":
            return f"error: unknown tool {call.get('name')!r}"
        self.total += int(call["arguments"]["n"])
        return f"total={self.total}"

    def finish(self, response: str) -> Verdict:
        words = [w for w in response.replace(".", " ").split() if w.lstrip("-").isdigit()]
        if not words:
            return Verdict(0.0, "no_answer")
        if words[-1] != self.task.answer:
            return Verdict(0.0, "wrong_answer")
        if self.total != int(self.task.answer):
            return Verdict(0.0, "tools_not_used")
        return Verdict(1.0, "correct")

    def close(self) -> None:
        self.closed = True


class CounterEnvironment:
    version = "counter-1"

    def __init__(self, domain: str = "counter", tool_delay_s: float = 0.0):
        self.domain, self.tool_delay_s = domain, tool_delay_s

    def open(self, task: Task) -> CounterEpisode:
        return CounterEpisode(task, self.tool_delay_s)


def counter_environment(family: str, tool_delay_s: str = "0") -> CounterEnvironment:
    """The factory the task-service subprocesses load (`--factory`)."""
    return CounterEnvironment(family, float(tool_delay_s))


def counter_task(i: int, numbers=(3, 4, 5), domain: str = "counter") -> Task:
    prompt = f"#{i}: add {' and '.join(map(str, numbers))} with the add tool"
    return Task(f"{domain}-{i}", domain, prompt, str(sum(numbers)), 1, "train", {"numbers": list(numbers)})


def run_episode(open_episode, task: Task, response: str | None = None) -> tuple[list[str], Verdict]:
    """Add the task's numbers with the tool, make one malformed call, answer; `open_episode(task)` opens it."""
    episode = open_episode(task)
    try:
        observations = [
            episode.tool(json.dumps({"name": "add", "arguments": {"n": n}})) for n in task.meta["numbers"]
        ]
        observations.append(episode.tool("{not json"))
        return observations, episode.finish(
            response if response is not None else f"The sum is {task.answer}."
        )
    finally:
        episode.close()


@pytest.fixture(scope="module")
def counter_service():
    with task_service_process("counter", "--factory", FACTORY) as service:
        yield service


def test_an_episode_over_http_gives_the_in_process_verdict(counter_service):
    remote = TaskServiceClient(counter_service.url, timeout_s=10)
    assert (remote.domain, remote.version) == ("counter", "counter-1")
    local = CounterEnvironment()
    for i, response in enumerate([None, "The sum is 11.", "I give up"]):
        task = counter_task(i)
        assert run_episode(remote.open, task, response) == run_episode(local.open, task, response)
    observations, verdict = run_episode(remote.open, counter_task(9))
    assert observations[:3] == ["total=3", "total=7", "total=12"] and observations[3].startswith(
        "error: tool"
    )
    assert verdict == Verdict(1.0, "correct")
    health = remote.health()
    assert (health["in_flight"], health["served"]) == (0, 4)  # finish closed every episode


def test_bad_requests_get_400_naming_the_field(counter_service):
    url = counter_service.url
    post = lambda route, body: requests.post(f"{url}{route}", json=body, timeout=10)  # noqa: E731
    task = counter_task(0).to_json()

    def error(resp, status):
        assert resp.status_code == status, resp.text
        return resp.json()["error"]["message"]

    assert error(post("/episodes", {}), 400).startswith("task: required")
    assert error(post("/episodes", {"task": "add 3"}), 400).startswith("task: must be dict")
    assert error(post("/episodes", {"task": {"id": "x"}}), 400).startswith("task: not a Task")
    assert error(post("/episodes", {"task": {**task, "domain": "search"}}), 400).startswith("task.domain")
    assert error(post("/episodes", {"task": task, "episode_id": "../etc"}), 400).startswith("episode_id")
    resp = requests.post(f"{url}/episodes", data=b"[1, 2", timeout=10)
    assert error(resp, 400).startswith("body: not JSON")
    episode_id = post("/episodes", {"task": task}).json()["episode_id"]
    assert error(post(f"/episodes/{episode_id}/tool", {"payload": {"name": "add"}}), 400).startswith(
        "payload"
    )
    assert error(post(f"/episodes/{episode_id}/finish", {}), 400).startswith("response: required")
    assert error(post("/episodes/NOT-AN-ID/tool", {"payload": "{}"}), 400).startswith("episode_id")
    assert "not open" in error(post(f"/episodes/{'0' * 32}/tool", {"payload": "{}"}), 404)
    # an environment crash is a 503 with the family's reason, and the client raises it as EnvironmentCrash
    assert (
        error(post(f"/episodes/{episode_id}/tool", {"payload": '{"name": "crash"}'}), 503)
        == "counter: sandbox died"
    )
    episode = TaskServiceClient(url).open(counter_task(1))
    with pytest.raises(EnvironmentCrash, match="sandbox died"):
        episode.tool('{"name": "crash"}')
    episode.close()
    assert requests.delete(f"{url}/episodes/{episode_id}", timeout=10).json() == {"closed": True}
    assert requests.delete(f"{url}/episodes/{episode_id}", timeout=10).json() == {"closed": False}


def test_a_dead_service_is_an_environment_crash_naming_the_url():
    with task_service_process("counter", "--factory", FACTORY) as service:
        client = TaskServiceClient(service.url, timeout_s=5, retries=1, backoff_s=0.05)
        episode = client.open(counter_task(0))
        service.kill()
    with pytest.raises(EnvironmentCrash, match=service.url):
        episode.tool('{"name": "add", "arguments": {"n": 1}}')
    with pytest.raises(EnvironmentCrash, match=f"{service.url}/episodes failed after 2 attempts"):
        client.open(counter_task(1))


def test_a_killed_service_leaves_no_episode_dir_behind():
    from training.agentic.episodes import ExtraLatency
    from training.agentic.families import agentic_suites

    task = agentic_suites([], ExtraLatency())["terminal"].generate("train", 1, 0, 1)[0]
    with task_service_process("terminal") as service:
        scratch = service.scratch
        TaskServiceClient(service.url).open(task)  # never closed: the service dies mid-episode
        episode_dirs = list(scratch.glob("crucible-terminal-*"))
        assert [sorted(p.name for p in d.iterdir()) for d in episode_dirs] == [sorted(task.meta["files"])]
        service.kill()
        assert service.scratch is None and not scratch.exists()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as stat:  # reaped by init soon; a zombie no longer serves
        return stat.read().split(") ", 1)[1].startswith("Z")


def test_a_service_whose_launcher_is_sigkilled_exits_instead_of_serving_on():
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import time; from infra.task_service import TaskServiceProcess as P; "
         f"s = P('counter', ('--factory', '{FACTORY}')).start(); print(s.pid, s.url, s.scratch, flush=True); "
         "time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pid, url, scratch = launcher.stdout.readline().split()
        assert TaskServiceClient(url, timeout_s=5).health() and os.path.isdir(scratch)
        launcher.kill()  # no finally, no atexit: only the service itself can notice
        launcher.wait()
        wait_for(lambda: _gone(int(pid)), timeout_s=10, what="the orphaned service to exit")
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{url}/health", timeout=2)
        assert not os.path.exists(scratch)  # the service removed its own scratch dir on the way out
    finally:
        launcher.kill()


def test_orchestrator_server_refuses_bad_requests_naming_the_field():
    orchestrator = Orchestrator({"counter": 1.0, "search": 0.0}, {"counter": 1})
    with orchestrator_server(orchestrator) as url:
        post = lambda route, body: requests.post(f"{url}{route}", json=body, timeout=10)  # noqa: E731

        def error(resp, status):
            assert resp.status_code == status, resp.text
            return resp.json()["error"]

        assert (
            error(post("/register", {"domain": "counter", "version": "v1"}), 400)["message"]
            == "url: required"
        )
        assert (
            "domain 'terminal'"
            in error(post("/register", {"domain": "terminal", "url": "http://a:1", "version": "v"}), 400)[
                "message"
            ]
        )
        assert error(post("/acquire", {"domain": 3}), 400)["message"].startswith("domain: must be str")
        assert error(post("/acquire", {"domain": "counter"}), 409)["type"] == "no_service"
        client = OrchestratorClient(url)
        client.register("counter", "http://a:1", "v1")
        assert client.heartbeat("http://a:1") and not client.heartbeat("http://b:1")
        assert client.next_task_domain() == "counter"
        lease = client.acquire()
        assert (lease.domain, lease.url) == ("counter", "http://a:1")
        with pytest.raises(NoServiceAvailable, match="cap 1"):
            client.acquire("counter")  # at the family's concurrency cap
        assert client.next_task_domain() is None
        assert error(post("/release", {"lease": lease.id, "outcome": "meh"}), 400)["message"].startswith(
            "outcome"
        )
        assert error(post("/release", {"lease": "L77", "outcome": "ok"}), 404)["type"] == "unknown_lease"
        assert client.release(lease.id, "ok") == ("ok", "")
        assert client.release(lease.id, "env_failure") == ("ok", "")  # a retried release counts once
        assert client.stats()["domains"]["counter"]["finished"] == 1


def wait_for(predicate, timeout_s: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_heartbeat_timeout_takes_a_service_out_and_a_replacement_is_used_again():
    orchestrator = Orchestrator({"counter": 1.0}, heartbeat_timeout_s=1.5)
    with orchestrator_server(orchestrator) as orch_url:
        client = OrchestratorClient(orch_url)
        live = lambda: client.stats()["domains"]["counter"]["live_services"]  # noqa: E731
        with task_service_process(
            "counter", "--factory", FACTORY, "--heartbeat-s", "0.2", orchestrator=orch_url
        ) as first:
            assert wait_for(live, what="registration") == [first.url]
            os.kill(first.pid, signal.SIGSTOP)  # hung: no heartbeats
            wait_for(lambda: not live(), what="the reaper")
            os.kill(first.pid, signal.SIGCONT)  # back: its heartbeat is refused, so it registers again
            assert wait_for(live, what="re-registration") == [first.url]
            held = client.acquire("counter")  # an episode in flight when the service dies
            first.kill()
            wait_for(lambda: not live(), what="the reaper")
        with pytest.raises(NoServiceAvailable, match="counter: 0 live"):
            client.acquire("counter")
        assert client.release(held.id, "ok")[0] == "env_failure"  # reaped: recorded once, as a failure
        with task_service_process(
            "counter", "--factory", FACTORY, "--heartbeat-s", "0.2", orchestrator=orch_url
        ) as second:
            wait_for(live, what="the replacement")
            environment = orchestrated_environments(orch_url, ["counter"])["counter"]  # a rollout worker's
            assert environment.version == "counter-1"
            _, verdict = run_episode(environment.open, counter_task(1))
            assert verdict == Verdict(1.0, "correct")
            stats = client.stats()
        assert second.url not in {s["url"] for s in client.stats()["services"]}  # SIGTERM: deregistered
        services = {s["url"]: s for s in stats["services"]}
        assert not services[first.url]["live"] and "missed heartbeats" in services[first.url]["down_reason"]
        assert services[first.url]["registrations"] == 2
        assert services[second.url]["served"] == 1
        domain = stats["domains"]["counter"]
        assert (domain["started"], domain["finished"], domain["env_failures"]) == (2, 1, 1)


class MarkMidEpisode:
    """Wraps an episode: its id is in `mid` from the end of its first tool call until it finishes."""

    def __init__(self, episode, mid: set[int]):
        self.episode, self.mid = episode, mid

    def tool(self, payload: str) -> str:
        observation = self.episode.tool(payload)
        self.mid.add(id(self))
        return observation

    def finish(self, response: str) -> Verdict:
        self.mid.discard(id(self))
        return self.episode.finish(response)

    def close(self) -> None:
        self.mid.discard(id(self))
        self.episode.close()


def test_killing_a_task_service_mid_run_loses_and_double_counts_nothing():
    n_episodes, workers = 40, 4
    orchestrator = Orchestrator({"counter": 1.0}, {"counter": 8}, heartbeat_timeout_s=2.0)
    results: dict[str, list[tuple[str, str, str, float]]] = {}  # task id -> [(outcome, detail, url, ended)]
    lock = threading.Lock()
    with orchestrator_server(orchestrator) as orch_url:
        client = OrchestratorClient(orch_url)
        pool = ServicePool(client, timeout_s=5, acquire_wait_s=10)
        args = ("--factory", FACTORY, "--factory-arg", "tool_delay_s=0.1", "--heartbeat-s", "0.3")
        with (
            task_service_process("counter", *args, orchestrator=orch_url) as doomed,
            task_service_process("counter", *args, orchestrator=orch_url) as survivor,
        ):
            wait_for(
                lambda: len(client.stats()["domains"]["counter"]["live_services"]) == 2, what="registration"
            )
            todo = list(range(n_episodes))
            mid_episode: dict[str, set[int]] = {doomed.url: set(), survivor.url: set()}

            def worker():
                while True:
                    with lock:
                        if not todo:
                            return
                        i = todo.pop()
                    task = counter_task(i)
                    url = ""
                    try:
                        episode = pool.open_episode(task)
                        url = episode.url

                        def open_and_mark(_task, episode=episode, url=url):
                            return MarkMidEpisode(episode, mid_episode[url])

                        _, verdict = run_episode(open_and_mark, task)
                        outcome = ("ok", verdict.reason, url, time.monotonic())
                    except EnvironmentCrash as exc:
                        outcome = ("env_failure", str(exc), url, time.monotonic())
                    with lock:
                        results.setdefault(task.id, []).append(outcome)

            threads = [threading.Thread(target=worker) for _ in range(workers)]
            for thread in threads:
                thread.start()

            # kill while an episode on the doomed service is between tool calls (3 calls of 0.1 s still to go)
            wait_for(lambda: len(results) >= 8 and mid_episode[doomed.url], what="an episode mid-run")
            doomed.kill()
            killed_at = time.monotonic()
            for thread in threads:
                thread.join(timeout=60)
            assert not any(thread.is_alive() for thread in threads)

    assert sorted(results) == sorted(counter_task(i).id for i in range(n_episodes))  # none lost
    assert all(len(r) == 1 for r in results.values())  # none counted twice
    outcomes = [r[0] for r in results.values()]
    failures = [o for o in outcomes if o[0] == "env_failure"]
    ok = [o for o in outcomes if o[0] == "ok"]
    assert 1 <= len(failures) <= 8 and all(doomed.url in detail for _, detail, _, _ in failures)
    assert all(reason == "correct" for _, reason, _, _ in ok)
    # after the kill every episode ran on the survivor (open failures on the dead one were retried there)
    assert all(url == survivor.url for _, _, url, ended in ok if ended > killed_at + 1.0)
    assert sum(url == survivor.url for _, _, url, ended in ok if ended > killed_at) >= n_episodes // 2
    stats = orchestrator.stats()["domains"]["counter"]
    assert stats["started"] == stats["finished"] + stats["env_failures"] == n_episodes
    assert (stats["finished"], stats["env_failures"], stats["in_flight"]) == (len(ok), len(failures), 0)
    assert pool.stats["ok"] == len(ok) and pool.stats["env_failure"] == len(failures)
    assert stats["throughput"] > 0


def test_a_fleet_replaces_a_killed_service_and_the_replacement_serves():
    orchestrator = Orchestrator({"counter": 1.0}, heartbeat_timeout_s=1.5)
    with orchestrator_server(orchestrator) as orch_url:
        pool = ServicePool(orchestrator, timeout_s=5, acquire_wait_s=10)
        live = lambda: orchestrator.stats()["domains"]["counter"]["live_services"]  # noqa: E731
        args = ("--factory", FACTORY, "--heartbeat-s", "0.2")
        with TaskServiceFleet({"counter": 2}, orch_url, args, check_s=0.2) as fleet:
            first_urls = sorted(s.url for s in fleet.services)
            assert wait_for(lambda: live() == first_urls, what="registration")
            fleet.services[0].kill()
            dead = first_urls[0] if first_urls[0] != fleet.services[1].url else first_urls[1]
            wait_for(
                lambda: fleet.restarts == 1 and len(live()) == 2 and dead not in live(), what="replacement"
            )
            replacement = fleet.services[0].url
            assert replacement != dead and replacement in live()
            urls = set()
            for i in range(4):  # least in flight, then least served: the replacement gets its share
                episode = pool.open_episode(counter_task(i))
                urls.add(episode.url)
                assert run_episode(lambda _task: episode, counter_task(i))[1].reward == 1.0  # noqa: B023
            assert replacement in urls


def play_solution(open_episode, suite, task: Task) -> tuple[list[str], Verdict]:
    """The family's worked solution on an episode: its tool calls, then its assistant text as the response."""
    solution = suite.solution(task)
    episode = open_episode(task)
    try:
        calls = [m["tool_calls"][0] for m in solution if m["role"] == "assistant" and m.get("tool_calls")]
        observations = [episode.tool(json.dumps(call)) for call in calls]
        return observations, episode.finish(
            "\n".join(m["content"] for m in solution if m["role"] == "assistant")
        )
    finally:
        episode.close()


@pytest.mark.parametrize("family", ["search", "codefix"])
def test_a_real_family_over_http_gives_the_in_process_verdicts_and_partial_credit(family, tmp_path):
    from infra.sandbox import sandbox_available
    from training.agentic.families import agentic_suites

    if family == "codefix" and sandbox_available() is not None:
        pytest.skip(str(sandbox_available()))
    rng = random.Random(0)
    words = "river stone cloud metal glass paper signal engine circuit market garden winter harbor".split()
    terms = sorted(
        {"".join(rng.sample(["ka", "lo", "mi", "ra", "tu", "ve", "zo", "ne"], 3)) for _ in range(200)}
    )
    facts = [(t, "a device of " + " ".join(rng.sample(words, 8))) for t in terms[:50]]
    (tmp_path / "facts.json").write_text(json.dumps(facts))
    suite = agentic_suites(facts)[family]
    tasks = [suite.generate("heldout", 1, 0, level)[0] for level in (1, 2, 3)][
        : 3 if family == "search" else 1
    ]
    with task_service_process(family, "--factory-arg", f"facts={tmp_path / 'facts.json'}") as service:
        remote = TaskServiceClient(service.url, timeout_s=60)
        assert (remote.domain, remote.version) == (suite.domain, suite.version)
        for task in tasks:
            over_http = play_solution(remote.open, suite, task)
            assert over_http == play_solution(suite.open, suite, task)
            found = 1.0 if family == "search" else 0.0  # the solution's searches returned the answer
            assert over_http[1] == Verdict(1.0, "correct", found=found) and over_http[0]
            assert remote.open(task).finish("no idea").reward == 0.0
            # a near miss's partial credit crosses the wire too (the trainer's reward reads it)
            near = f'Answer: "{task.answer[:-1]}"' if family == "search" else "no idea"
            local = suite.open(task)
            try:
                in_process = local.finish(near)
            finally:
                local.close()
            assert remote.open(task).finish(near) == in_process
            if family == "search":
                assert 0.5 < in_process.partial < 1.0
                assert remote.open(task).finish(near).found == 0.0  # no search made: nothing found
        assert remote.health()["in_flight"] == 0
