"""What an engine is asked to do for one partition, and what it hands back."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.dedup.config import DedupConfig
from pipelines.dedup.index import IndexEntry
from pipelines.dedup.shards import PartitionLayout


@dataclass
class PartitionJob:
    """Dedup `shard_keys` (one snapshot) as partition number `seq` against the `earlier` index entries."""

    config: DedupConfig
    layout: PartitionLayout
    seq: int
    shard_keys: list[str]
    earlier: list[IndexEntry]

    @property
    def snapshot_by_seq(self) -> dict[int, str]:
        return {e.seq: e.snapshot for e in self.earlier} | {self.seq: self.layout.snapshot}


@dataclass
class EngineResult:
    """Per-shard counts from `apply_shard`, the cluster-size histogram, pair counts and the output version."""

    version: str
    shard_stats: list[dict]
    histogram: dict[int, int]
    counts: dict[str, int] = field(default_factory=dict)
