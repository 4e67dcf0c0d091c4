"""DP-aware routing of rollout requests over inference replicas (docs: issue 22, item 6).

All turns of one rollout should reach the same replica: a multi-turn rollout's next prompt is its previous
prompt + generation + observation, so the replica that served the previous turn holds that whole prefix in its
prefix cache. `ConsistentHashRouter` puts every replica on a hash ring at many virtual points (blake2b, stable
across processes, never Python's salted `hash()`) and sends a rollout id to the first point clockwise of its
own hash. Removing a replica moves only its own keys; adding it back restores them.

Light rebalancing (consistent hashing with bounded loads, Mirrokni et al. 2018): when the owner already has
more in-flight requests than `load_factor` x the mean (counting the new one), the request walks on to the
next replica on the ring that is below that bound. `RoundRobinRouter` has the same interface and ignores
the rollout id: the baseline the prefix-cache hit rate is measured against.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Protocol


def stable_hash(key: str) -> int:
    """A 64-bit hash of `key` that is the same in every process and Python version."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class NoReplica(RuntimeError):
    """No replica is in rotation."""


class Router(Protocol):
    @property
    def replicas(self) -> list[str]: ...

    def route(self, rollout_id: str, load: Mapping[str, int] | None = None) -> str: ...

    def add(self, replica: str) -> None: ...

    def remove(self, replica: str) -> None: ...


class ConsistentHashRouter:
    """A consistent-hash ring over replica ids with `virtual_nodes` points per replica.

    `route(rollout_id, load)` returns the ring owner of the rollout id, or, when `load` (in-flight requests per
    replica) puts the owner at or above `ceil(load_factor * (total + 1) / replicas)`, the next replica
    clockwise below that capacity. `load_factor=inf` (or no `load`) is pure affinity."""

    def __init__(self, replicas: Iterable[str] = (), virtual_nodes: int = 160, load_factor: float = 1.25):
        if virtual_nodes < 1:
            raise ValueError(f"virtual_nodes must be >= 1, got {virtual_nodes}")
        if load_factor < 1:
            raise ValueError(f"load_factor must be >= 1 (1 = perfectly even), got {load_factor}")
        self.virtual_nodes, self.load_factor = virtual_nodes, load_factor
        self._points: list[int] = []  # sorted hashes of the virtual nodes
        self._owner: dict[int, str] = {}
        self._replicas: list[str] = []
        for replica in replicas:
            self.add(replica)

    @property
    def replicas(self) -> list[str]:
        return list(self._replicas)

    def add(self, replica: str) -> None:
        if replica in self._replicas:
            return
        for v in range(self.virtual_nodes):
            point = stable_hash(f"{replica}#{v}")
            if point in self._owner:  # a 64-bit collision: astronomically rare, but never steal a point
                continue
            self._owner[point] = replica
            bisect.insort(self._points, point)
        self._replicas.append(replica)

    def remove(self, replica: str) -> None:
        if replica not in self._replicas:
            return
        self._replicas.remove(replica)
        self._points = [p for p in self._points if self._owner[p] != replica]
        self._owner = {p: r for p, r in self._owner.items() if r != replica}

    def ring_order(self, rollout_id: str) -> list[str]:
        """Every replica once, in the order the ring meets them clockwise from the rollout id's hash."""
        if not self._points:
            raise NoReplica("no replica in rotation")
        start = bisect.bisect(self._points, stable_hash(rollout_id))
        order: list[str] = []
        for i in range(len(self._points)):
            replica = self._owner[self._points[(start + i) % len(self._points)]]
            if replica not in order:
                order.append(replica)
                if len(order) == len(self._replicas):
                    break
        return order

    def owner(self, rollout_id: str) -> str:
        """The replica the ring assigns to `rollout_id` regardless of load."""
        return self.ring_order(rollout_id)[0]

    def capacity(self, load: Mapping[str, int]) -> int:
        """The most in-flight requests a replica may hold once the next request is placed."""
        total = sum(load.get(r, 0) for r in self._replicas) + 1
        return math.ceil(self.load_factor * total / len(self._replicas))

    def route(self, rollout_id: str, load: Mapping[str, int] | None = None) -> str:
        order = self.ring_order(rollout_id)
        if not load or math.isinf(self.load_factor):
            return order[0]
        cap = self.capacity(load)
        for replica in order:
            if load.get(replica, 0) + 1 <= cap:
                return replica
        return min(order, key=lambda r: load.get(r, 0))  # unreachable with load_factor >= 1; kept total


class RoundRobinRouter:
    """The baseline: requests go to the replicas in turn, whatever their rollout id."""

    def __init__(self, replicas: Iterable[str] = ()):
        self._replicas: list[str] = []
        self._next = 0
        for replica in replicas:
            self.add(replica)

    @property
    def replicas(self) -> list[str]:
        return list(self._replicas)

    def add(self, replica: str) -> None:
        if replica not in self._replicas:
            self._replicas.append(replica)

    def remove(self, replica: str) -> None:
        if replica in self._replicas:
            self._replicas.remove(replica)

    def route(self, rollout_id: str, load: Mapping[str, int] | None = None) -> str:
        if not self._replicas:
            raise NoReplica("no replica in rotation")
        replica = self._replicas[self._next % len(self._replicas)]
        self._next += 1
        return replica
