"""The persistent dedup index: per processed partition, the fingerprints (band keys, signature, exact-match
keys) of all its documents, so later partitions are deduplicated against it.

Layout in the store, per kind:

    dedup/<kind>/index/_log/0000000000.json               the commit log: one record per committed entry
    dedup/<kind>/index/<snapshot>/v-<version>/<shard>.parquet   one part per input shard

A partition's `seq` is its position in processing order, assigned on its first commit and kept by reruns.
Document node ids are `seq << 40 | rank` where `rank` orders the partition's documents by the keep rule,
so "smaller node id" means "wins the cluster" everywhere. The current entry of a snapshot is its latest
log record. A record is appended only with a create-only write (`put_bytes_if_absent`) at the log's next
position, after validating that the log still says what the entry was computed from (its seq and the
versions of the entries before it): two runs can never take the same seq, and a run that loses the race
recomputes against the winner. Parts are written before the record and listed in it with their sizes;
readers check them. Parts of an unfinished run sit in a version directory no record names (later deleted).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from infra.committed import CommitError
from infra.store import ObjectStore

NODE_SHIFT = 40  # up to 2^40 documents per partition, 2^23 partitions
LOG = "_log"
_MAX_APPENDS = 50  # log appends lost to other runs before giving up (each loss is another run's commit)


class IndexMismatchError(ValueError):
    """The index was built with a different dedup config; mixing them would compare unlike signatures."""


class IndexConflictError(RuntimeError):
    """Other runs kept committing to the index while this one tried to: rerun the stage."""


@dataclass
class IndexEntry:
    """One processed partition in the index."""

    snapshot: str
    seq: int
    version: str
    config: str  # DedupConfig.index_fingerprint()
    parts: list[str] = field(default_factory=list)
    part_bytes: list[int] = field(default_factory=list)  # size of each part, checked by readers
    docs: int = 0
    kept: int = 0
    deduped_against: list[dict] = field(default_factory=list)  # [{snapshot, seq, version}] of earlier entries

    @property
    def ref(self) -> dict:
        return {"snapshot": self.snapshot, "seq": self.seq, "version": self.version}

    def record(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()


@dataclass
class IndexLog:
    """The index as its log says now: the current entry per snapshot and where the next record goes."""

    current: dict[str, IndexEntry] = field(default_factory=dict)
    next_position: int = 0

    @property
    def entries(self) -> list[IndexEntry]:
        return sorted(self.current.values(), key=lambda e: e.seq)


def log_key(index_prefix: str, position: int) -> str:
    return f"{index_prefix}/{LOG}/{position:010d}.json"


def read_index(store: ObjectStore, index_prefix: str, known: IndexLog | None = None) -> IndexLog:
    """Replay the commit log (a snapshot's latest record is its entry); with `known`, read only the records
    appended after it (one listing, then a GET per new record)."""
    state = IndexLog(dict(known.current), known.next_position) if known else IndexLog()
    keys = sorted(store.list(f"{index_prefix}/{LOG}/"))
    if not keys:
        _refuse_legacy_index(store, index_prefix)
    for key in keys:
        position = int(key.rsplit("/", 1)[1].split(".")[0])
        if position >= state.next_position:
            entry = IndexEntry(**json.loads(store.get_bytes(key)))
            state.current[entry.snapshot] = entry
            state.next_position = position + 1
    return state


def _refuse_legacy_index(store: ObjectStore, index_prefix: str) -> None:
    """An index written before the log (per-snapshot manifest.json) would be silently ignored: refuse it."""
    legacy = [
        s for s in store.list_prefixes(index_prefix) if store.exists(f"{index_prefix}/{s}/manifest.json")
    ]
    if legacy:
        raise IndexMismatchError(
            f"{store.uri(index_prefix)} holds entries of the old layout (manifest.json per snapshot: {legacy}) "
            f"that new runs cannot see; delete {store.uri(index_prefix.rsplit('/', 1)[0])} and rerun dedup "
            "for those snapshots"
        )


def list_entries(store: ObjectStore, index_prefix: str) -> list[IndexEntry]:
    """Committed entries, by seq."""
    return read_index(store, index_prefix).entries


def check_compatible(entries: list[IndexEntry], config_fingerprint: str, index_prefix: str) -> None:
    bad = [e.snapshot for e in entries if e.config != config_fingerprint]
    if bad:
        raise IndexMismatchError(
            f"{index_prefix}: snapshots {bad} were fingerprinted with another config (index fingerprint is not "
            f"{config_fingerprint}); use the same ngram/bands/rows/seed/normalisation, or a new index_prefix"
        )


def verify_parts(store: ObjectStore, entries: list[IndexEntry], index_prefix: str) -> None:
    """Every part of `entries` must exist with the size its record lists (else the index is damaged)."""
    for entry in entries:
        if len(entry.part_bytes) != len(entry.parts):
            raise CommitError(f"{index_prefix}: the entry of {entry.snapshot} lists parts without sizes")
        for key, size in zip(entry.parts, entry.part_bytes, strict=True):
            found = store.size(key)
            if found != size:
                raise CommitError(
                    f"{store.uri(key)}: {'missing' if found is None else f'{found} bytes'}, the index entry "
                    f"of {entry.snapshot} says {size} bytes: the dedup index is damaged; rerun dedup of "
                    f"{entry.snapshot}"
                )


def assign_seq(entries: list[IndexEntry], snapshot: str) -> int:
    """A rerun keeps its partition's seq; a new partition comes after every committed one."""
    for entry in entries:
        if entry.snapshot == snapshot:
            return entry.seq
    return max((e.seq for e in entries), default=-1) + 1


def earlier_entries(entries: list[IndexEntry], seq: int) -> list[IndexEntry]:
    return [e for e in entries if e.seq < seq]


def partition_version(
    config_fingerprint: str, shard_keys: list[str], shard_digests: dict[str, str], earlier: list[IndexEntry]
) -> str:
    """Content hash of everything that decides a partition's output: config, input shards, earlier index."""
    payload = {
        "config": config_fingerprint,
        "shards": sorted(shard_keys),
        "digests": sorted(shard_digests.items()),
        "earlier": [e.ref for e in sorted(earlier, key=lambda e: e.seq)],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def stale_partitions(entries: list[IndexEntry], snapshot: str, new_version: str) -> list[str]:
    """Later partitions that were deduplicated against another version of `snapshot` (they should rerun)."""
    stale = []
    for entry in entries:
        for ref in entry.deduped_against:
            if ref["snapshot"] == snapshot and ref["version"] != new_version:
                stale.append(entry.snapshot)
    return sorted(set(stale))


def commit_entry(store: ObjectStore, index_prefix: str, entry: IndexEntry) -> tuple[bool, IndexEntry | None]:
    """Append `entry` to the log if the log still agrees with what it was computed from.

    Returns (True, the snapshot's previous entry or None) once committed, or (False, None) if the index
    changed under it (another partition took its seq, or an entry before it has a new version): recompute.
    An identical entry is not appended again (a rerun with the same inputs changes nothing)."""
    state = None
    for _ in range(_MAX_APPENDS):
        state = read_index(store, index_prefix, state)
        previous = next((e for e in state.entries if e.snapshot == entry.snapshot), None)
        if assign_seq(state.entries, entry.snapshot) != entry.seq:
            return False, None
        if [e.ref for e in earlier_entries(state.entries, entry.seq)] != entry.deduped_against:
            return False, None
        if previous == entry:
            return True, previous
        key, record = log_key(index_prefix, state.next_position), entry.record()
        # a lost response can make a retried PUT find its own record: that is a commit too
        if store.put_bytes_if_absent(key, record) or store.get_bytes(key) == record:
            _drop_other_versions(store, index_prefix, entry, previous)
            return True, previous
    raise IndexConflictError(
        f"{store.uri(index_prefix)}: {_MAX_APPENDS} other commits landed while {entry.snapshot} tried to commit"
    )


def _drop_other_versions(
    store: ObjectStore, index_prefix: str, entry: IndexEntry, previous: IndexEntry | None
) -> None:
    """Delete this snapshot's parts of versions other than the new and the previous one (readers mid-read)."""
    keep = {f"v-{entry.version}", f"v-{previous.version}" if previous else ""}
    prefix = f"{index_prefix}/{entry.snapshot}"
    for child in store.list_prefixes(prefix):
        if child not in keep:
            store.delete_prefix(f"{prefix}/{child}/")


@dataclass
class IndexArrays:
    """Columns of all earlier partitions' documents, sorted by node (the local engine's view)."""

    node: np.ndarray  # int64
    doc_id: np.ndarray  # object (str)
    content_hash: np.ndarray  # int64
    url_hash: np.ndarray  # int64, valid where has_url
    has_url: np.ndarray  # bool
    bands: np.ndarray  # (n, num_bands) int64
    sig: np.ndarray  # (n, num_perm) uint32

    @classmethod
    def empty(cls, num_bands: int, num_perm: int) -> IndexArrays:
        return cls(
            node=np.zeros(0, np.int64),
            doc_id=np.zeros(0, object),
            content_hash=np.zeros(0, np.int64),
            url_hash=np.zeros(0, np.int64),
            has_url=np.zeros(0, bool),
            bands=np.zeros((0, num_bands), np.int64),
            sig=np.zeros((0, num_perm), np.uint32),
        )


def band_rows(bands: pa.Array | pa.ChunkedArray, num_bands: int) -> np.ndarray:
    """(n, num_bands) int64 from a list<int64> column; fails if a row has another number of bands."""
    if isinstance(bands, pa.ChunkedArray):
        bands = bands.combine_chunks()
    flat = bands.flatten().to_numpy()
    if len(flat) != len(bands) * num_bands:
        raise ValueError(f"band rows do not all hold num_bands={num_bands} keys")
    return flat.reshape(len(bands), num_bands)


def sig_rows(sig: pa.Array | pa.ChunkedArray, num_perm: int) -> np.ndarray:
    """(n, num_perm) uint32 over a binary column's buffer (one copy into fixed-size rows; the cast fails if
    a signature has another length)."""
    if isinstance(sig, pa.ChunkedArray):
        sig = sig.combine_chunks()
    fixed = sig.cast(pa.binary(4 * num_perm))
    n = len(fixed)
    if n == 0:
        return np.zeros((0, num_perm), np.uint32)
    flat = np.frombuffer(
        fixed.buffers()[1], dtype="<u4", count=n * num_perm, offset=fixed.offset * 4 * num_perm
    )
    return flat.reshape(n, num_perm)


def band_column(bands: np.ndarray) -> pa.Array:
    """The list<int64> column of an (n, num_bands) matrix (inverse of `band_rows`)."""
    flat = pa.array(np.ascontiguousarray(bands, dtype=np.int64).ravel())
    return pa.FixedSizeListArray.from_arrays(flat, bands.shape[1]).cast(pa.list_(pa.int64()))


def sig_column(sig: np.ndarray) -> pa.Array:
    """The binary column of an (n, num_perm) uint32 matrix (inverse of `sig_rows`)."""
    rows = np.ascontiguousarray(sig, dtype="<u4")
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(4 * sig.shape[1]), len(rows), [None, pa.py_buffer(rows)]
    )
    return fixed.cast(pa.binary())


def table_arrays(table: pa.Table, num_bands: int, num_perm: int) -> dict[str, np.ndarray]:
    """doc_id/content_hash/url_hash/has_url/bands/sig numpy arrays from a fingerprint-like table."""
    url = table.column("url_hash")
    return {
        "doc_id": np.array(table.column("doc_id").to_pylist(), dtype=object),
        "content_hash": table.column("content_hash").to_numpy(),
        "url_hash": url.fill_null(0).to_numpy(),
        "has_url": url.is_valid().to_numpy(zero_copy_only=False),
        "bands": band_rows(table.column("bands"), num_bands),
        "sig": sig_rows(table.column("sig"), num_perm),
    }


def load_index(store: ObjectStore, entries: list[IndexEntry], num_bands: int, num_perm: int) -> IndexArrays:
    """Read the parts of `entries` into memory: ~(8 * num_bands + 4 * num_perm + 40) bytes per document."""
    tables = []
    for entry in entries:
        for key in entry.parts:
            with store.local_copy(key) as path:
                tables.append(
                    pq.read_table(
                        path, columns=["node", "doc_id", "content_hash", "url_hash", "bands", "sig"]
                    )
                )
    if not tables:
        return IndexArrays.empty(num_bands, num_perm)
    table = pa.concat_tables(tables).sort_by("node")
    return IndexArrays(node=table.column("node").to_numpy(), **table_arrays(table, num_bands, num_perm))
