"""The local engine's in-memory layout: fingerprints are read in two passes (small columns, then band keys and
signatures straight into node order) and must give exactly what sorting the whole table by the keep rule
gives; signature verification is chunked across the index / partition boundary without changing a result."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest_dedup import snapshot_a, write_shards  # tests/pipelines is on sys.path (prepend import mode)

import pipelines.dedup.clusters as clusters
from infra.store import LocalStore
from pipelines.dedup import DedupConfig
from pipelines.dedup.clusters import KEEP_ORDER
from pipelines.dedup.fingerprints import estimated_jaccard, passes_verification
from pipelines.dedup.index import band_column, band_rows, sig_column, sig_rows
from pipelines.dedup.local_engine import MinhashFingerprinter, StoreShardReader, _load_partition


def test_band_and_signature_columns_round_trip_and_reject_wrong_widths():
    rng = np.random.default_rng(0)
    bands = rng.integers(-(2**62), 2**62, size=(5, 3), dtype=np.int64)
    sig = rng.integers(0, 2**32, size=(5, 4), dtype=np.uint32)
    assert np.array_equal(band_rows(band_column(bands), 3), bands)
    assert np.array_equal(sig_rows(sig_column(sig), 4), sig)
    # sliced and chunked columns (what a batch or a concatenated table hands over) read the right rows
    chunked = pa.chunked_array([sig_column(sig[:2]), sig_column(sig[2:])])
    assert np.array_equal(sig_rows(chunked, 4), sig)
    assert np.array_equal(sig_rows(sig_column(sig).slice(3), 4), sig[3:])
    assert np.array_equal(band_rows(band_column(bands).slice(1, 2), 3), bands[1:3])
    with pytest.raises(ValueError, match="num_bands=4"):
        band_rows(band_column(bands), 4)
    with pytest.raises(pa.ArrowInvalid):
        sig_rows(pa.array([sig[0].tobytes(), b"\x00" * 12]), 4)


def _fingerprint_files(tmp_path, tasks: int) -> tuple[list, DedupConfig]:
    store = LocalStore(tmp_path / "store")
    keys = write_shards(store.root, "web/filtered/2024-10/kept", snapshot_a(), shards=5)
    cfg = DedupConfig()
    out = tmp_path / "fingerprints"
    out.mkdir()
    for rank in range(tasks):  # the steps as the executor runs them, one rank after the other
        docs = StoreShardReader(store, keys)(None, rank, tasks)
        for _ in MinhashFingerprinter(cfg, "2024-10", str(out))(docs, rank, tasks):
            pass
    return sorted(out.glob("*.parquet")), cfg


@pytest.mark.parametrize("tasks", [1, 3])
def test_two_pass_read_equals_sorting_the_whole_fingerprint_table(tmp_path, tasks):
    files, cfg = _fingerprint_files(tmp_path, tasks)
    part = _load_partition(files, cfg.num_bands, cfg.num_perm)

    table = pa.concat_tables([pq.read_table(f) for f in files])
    ranked = table.take(pc.sort_indices(table, sort_keys=KEEP_ORDER))
    assert part.meta.num_rows == table.num_rows > 50
    assert part.meta.equals(table.drop_columns(["bands", "sig"]))  # file order kept for the plans
    assert np.array_equal(part.order[part.rank], np.arange(table.num_rows))
    assert np.array_equal(part.bands, band_rows(ranked.column("bands"), cfg.num_bands))
    assert np.array_equal(part.sig, sig_rows(ranked.column("sig"), cfg.num_perm))
    arrays = part.cluster_arrays(seq=2)
    assert np.array_equal(arrays["content_hash"], ranked.column("content_hash").to_numpy())
    assert arrays["node"][0] == 2 << 40 and np.all(np.diff(arrays["node"]) == 1)
    # the keep rule really reorders this corpus (else the test would not tell file order from node order)
    assert not np.array_equal(part.order, np.arange(table.num_rows))


def test_chunked_verification_across_index_and_partition_rows_equals_the_direct_comparison(monkeypatch):
    rng = np.random.default_rng(3)
    sig_idx = rng.integers(0, 4, size=(7, 16), dtype=np.uint32)
    sig_new = rng.integers(0, 4, size=(9, 16), dtype=np.uint32)
    both = np.concatenate([sig_idx, sig_new])
    ci = rng.integers(0, 16, size=50)
    mi = rng.integers(7, 16, size=50)  # members are always this partition's documents
    expected = passes_verification(estimated_jaccard(both[ci], both[mi]), 0.3)
    assert 0 < expected.sum() < len(expected)
    monkeypatch.setattr(clusters, "_VERIFY_CHUNK", 4)
    assert np.array_equal(clusters._verified(ci, mi, sig_idx, sig_new, 0.3), expected)
    empty = np.zeros((0, 16), np.uint32)
    assert np.array_equal(clusters._verified(mi - 7, mi - 7, empty, sig_new, 0.3), np.ones(50, bool))
