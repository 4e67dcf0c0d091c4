"""The rollout orchestrator's logic with a fake clock: ratios, concurrency caps, least-loaded services,
heartbeat reaping and re-registration, exactly-once lease accounting, throughput."""

from __future__ import annotations

import pytest

from training.agentic.orchestrator import NoServiceAvailable, Orchestrator


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(ratios=None, caps=None, timeout=5.0):
    clock = FakeClock()
    orch = Orchestrator(ratios or {"terminal": 0.5, "codefix": 0.3, "search": 0.2}, caps, timeout, clock)
    return orch, clock


def test_ratios_are_respected_over_300_picks():
    orch, _ = make()
    for domain in orch.ratios:
        orch.register(domain, f"http://{domain}:1", "v1")
    picks = {d: 0 for d in orch.ratios}
    for _ in range(300):
        lease = orch.acquire()  # no domain: the orchestrator's pick
        picks[lease.domain] += 1
        orch.release(lease.id, "ok")
    assert picks == {"terminal": 150, "codefix": 90, "search": 60}
    stats = orch.stats()["domains"]
    for domain, ratio in orch.ratios.items():
        assert abs(stats[domain]["share"] - ratio) < 0.02
        assert stats[domain]["started"] == stats[domain]["finished"] == picks[domain]


def test_a_family_without_a_live_service_is_skipped_and_the_rest_keep_their_relative_ratio():
    orch, _ = make({"terminal": 2, "codefix": 1, "search": 1})
    orch.register("terminal", "http://t:1", "v1")
    orch.register("codefix", "http://c:1", "v1")
    picks = {"terminal": 0, "codefix": 0}
    for _ in range(90):
        domain = orch.next_task_domain()
        lease = orch.acquire(domain)
        picks[domain] += 1
        orch.release(lease.id, "ok")
    assert picks["terminal"] == 2 * picks["codefix"]
    with pytest.raises(NoServiceAvailable, match="search: 0 live"):
        orch.acquire("search")


def test_concurrency_cap_and_least_in_flight_service():
    orch, _ = make({"terminal": 9, "search": 1}, caps={"terminal": 3})
    orch.register("terminal", "http://a:1", "v1")
    orch.register("terminal", "http://b:1", "v1")
    orch.register("search", "http://s:1", "v1")
    leases = [orch.acquire("terminal") for _ in range(3)]
    assert sorted(lease.url for lease in leases) == ["http://a:1", "http://a:1", "http://b:1"]
    with pytest.raises(NoServiceAvailable, match="3 episode"):
        orch.acquire("terminal")
    assert orch.next_task_domain() == "search"  # terminal is at its cap although below its share
    on_b = next(lease for lease in leases if lease.url == "http://b:1")
    orch.release(on_b.id, "ok")
    assert orch.next_task_domain() == "terminal"
    assert orch.acquire("terminal").url == "http://b:1"  # b has 0 in flight, a has 2


def test_heartbeat_timeout_reaps_and_a_reregistered_replacement_is_used_again():
    orch, clock = make({"terminal": 1}, timeout=5.0)
    orch.register("terminal", "http://a:1", "v1")
    orch.register("terminal", "http://b:1", "v1")
    on_a = [orch.acquire("terminal") for _ in range(4)]
    on_a = [lease for lease in on_a if lease.url == "http://a:1"]
    assert len(on_a) == 2
    clock.now += 3
    assert orch.heartbeat("http://b:1")
    clock.now += 3  # a silent for 6 s > 5 s, b for 3 s
    assert orch.reap() == {"http://a:1": 2}
    assert orch.reap() == {}  # reaped once
    domain = orch.stats()["domains"]["terminal"]
    assert domain["live_services"] == ["http://b:1"]
    assert (domain["started"], domain["env_failures"], domain["in_flight"]) == (4, 2, 2)
    # the caller finishing late gets the recorded failure and nothing is counted twice
    outcome, reason = orch.release(on_a[0].id, "ok")
    assert outcome == "env_failure" and "missed heartbeats" in reason
    assert orch.stats()["domains"]["terminal"]["finished"] == 0
    assert {orch.acquire("terminal").url for _ in range(3)} == {"http://b:1"}
    assert not orch.heartbeat("http://a:1")  # out of rotation: it must register again
    orch.register("terminal", "http://a:1", "v2")
    assert orch.acquire("terminal").url == "http://a:1"  # the least loaded again
    services = {s["url"]: s for s in orch.stats()["services"]}
    assert services["http://a:1"]["live"] and services["http://a:1"]["version"] == "v2"
    assert services["http://a:1"]["registrations"] == 2


def test_mark_failed_takes_a_service_out_until_it_registers():
    orch, _ = make({"codefix": 1})
    orch.register("codefix", "http://a:1", "v1")
    orch.mark_failed("http://a:1", "connection refused")
    with pytest.raises(NoServiceAvailable):
        orch.acquire("codefix")
    assert orch.next_task_domain() is None
    assert not orch.heartbeat("http://a:1")
    orch.register("codefix", "http://a:1", "v1")
    assert orch.acquire("codefix").url == "http://a:1"


def test_every_lease_is_counted_once_and_open_failures_do_not_count_as_started():
    orch, clock = make({"search": 1})
    orch.register("search", "http://a:1", "v1")
    outcomes = ["ok", "ok", "env_failure", "cancelled", "open_failed", "ok"]
    leases = [orch.acquire("search") for _ in outcomes]
    clock.now += 10
    orch.heartbeat("http://a:1")
    for lease, outcome in zip(leases, outcomes, strict=True):
        assert orch.release(lease.id, outcome) == (outcome, "")
        assert orch.release(lease.id, "ok") == (outcome, "")  # a second release returns the first
    s = orch.stats()["domains"]["search"]
    assert (s["started"], s["finished"], s["env_failures"], s["cancelled"], s["open_failures"]) == (
        5,
        3,
        1,
        1,
        1,
    )
    assert s["started"] == s["finished"] + s["env_failures"] + s["cancelled"] + s["in_flight"]
    assert s["throughput"] == pytest.approx(3 / 10)
    with pytest.raises(KeyError, match="never granted"):
        orch.release("L999", "ok")
    with pytest.raises(ValueError, match="outcome"):
        orch.release(leases[0].id, "great")


def test_bad_configuration_names_the_field():
    with pytest.raises(ValueError, match="ratios"):
        Orchestrator({"terminal": -1})
    with pytest.raises(ValueError, match="max_concurrency.*no ratio"):
        Orchestrator({"terminal": 1}, {"search": 2})
    with pytest.raises(ValueError, match="max_concurrency"):
        Orchestrator({"terminal": 1}, {"terminal": 0})
    orch = Orchestrator({"terminal": 1})
    with pytest.raises(ValueError, match="domain 'search'"):
        orch.register("search", "http://a:1", "v1")
    with pytest.raises(ValueError, match="url"):
        orch.register("terminal", "a:1", "v1")
