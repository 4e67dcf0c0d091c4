"""DP-aware routing: the consistent-hash ring is stable across processes, spreads keys evenly, moves only a
removed replica's keys (and brings them back on add), and its bounded-load rebalancing keeps every replica
under ceil(load_factor x mean); the round-robin baseline ignores the rollout id."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from infra.settings import REPO_ROOT
from training.agentic.routing import ConsistentHashRouter, NoReplica, RoundRobinRouter, stable_hash

REPLICAS = [f"replica-{i}" for i in range(4)]
KEYS = [f"rollout-{i}" for i in range(4000)]


def test_hash_is_stable_across_processes():
    # a fresh interpreter with another PYTHONHASHSEED: Python's hash() would differ, blake2b does not
    code = "from training.agentic.routing import *; r = ConsistentHashRouter(%r); print([r.route(k) for k in %r])"
    keys = KEYS[:50]
    out = subprocess.run(
        [sys.executable, "-c", code % (REPLICAS, keys)],
        cwd=REPO_ROOT,
        env={"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    router = ConsistentHashRouter(REPLICAS)
    assert out.strip() == str([router.route(k) for k in keys])
    assert stable_hash("rollout-0") == stable_hash("rollout-0") != stable_hash("rollout-1")


def test_keys_spread_evenly_and_every_turn_of_a_rollout_meets_one_replica():
    router = ConsistentHashRouter(REPLICAS, virtual_nodes=160)
    counts = collections.Counter(router.route(k) for k in KEYS)
    assert set(counts) == set(REPLICAS)
    share = [c / len(KEYS) for c in counts.values()]
    assert max(share) < 0.25 * 1.3 and min(share) > 0.25 * 0.7, counts  # 160 points each: within +-30%
    assert all(router.route(k) == router.route(k) for k in KEYS[:100])


def test_remove_moves_only_the_removed_replicas_keys_and_add_restores_them():
    router = ConsistentHashRouter(REPLICAS)
    before = {k: router.route(k) for k in KEYS}
    router.remove("replica-2")
    after = {k: router.route(k) for k in KEYS}
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == "replica-2"}  # exactly its keys, nothing else
    assert "replica-2" not in after.values()
    # its keys are spread over the survivors, not dumped on one
    assert len({after[k] for k in moved}) == 3
    router.add("replica-2")
    assert {k: router.route(k) for k in KEYS} == before
    router.add("replica-4")  # a new replica takes keys only for itself
    grown = {k: router.route(k) for k in KEYS}
    assert all(grown[k] in (before[k], "replica-4") for k in KEYS)
    assert 0.1 < sum(v == "replica-4" for v in grown.values()) / len(KEYS) < 0.3


@pytest.mark.parametrize("load_factor", [1.0, 1.25, 1.4])
def test_rebalancing_bounds_the_load(load_factor):
    """Place 400 concurrent requests from 8 hot rollouts (50 in flight each): pure affinity piles them where
    the hash says, the bounded router never exceeds ceil(load_factor x mean) on any replica."""
    keys = [f"hot-{i % 8}" for i in range(400)]
    affinity = ConsistentHashRouter(REPLICAS, load_factor=float("inf"))
    bounded = ConsistentHashRouter(REPLICAS, load_factor=load_factor)
    pure = collections.Counter(affinity.route(k) for k in keys)
    load: dict[str, int] = collections.Counter()
    moved = 0
    for k in keys:
        replica = bounded.route(k, load)
        assert load[replica] + 1 <= bounded.capacity(load)  # the bound holds at every step
        moved += replica != bounded.owner(k)
        load[replica] += 1
    cap = -(-load_factor * len(keys) // len(REPLICAS))
    assert max(load.values()) <= cap
    assert max(pure.values()) > cap  # the hash alone is too uneven here: the bound did the work
    assert moved < len(keys) * (0.5 if load_factor > 1 else 0.8)  # light: most requests keep their replica
    # with an even load nothing moves: affinity is kept
    even = dict.fromkeys(REPLICAS, 5)
    assert all(bounded.route(k, even) == bounded.owner(k) for k in KEYS[:200])


def test_round_robin_ignores_the_rollout_id_and_an_empty_ring_is_an_error():
    rr = RoundRobinRouter(REPLICAS[:2])
    assert [rr.route("same") for _ in range(4)] == ["replica-0", "replica-1"] * 2
    rr.remove("replica-0")
    assert {rr.route(k) for k in KEYS[:10]} == {"replica-1"}
    rr.remove("replica-1")
    with pytest.raises(NoReplica):
        rr.route("x")
    with pytest.raises(NoReplica):
        ConsistentHashRouter([]).route("x")
    with pytest.raises(ValueError, match="load_factor"):
        ConsistentHashRouter(REPLICAS, load_factor=0.5)
