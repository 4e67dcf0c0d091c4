"""Cluster resolution on one machine (numpy): the reference the Spark engine must match exactly.

A partition's documents go through three phases; each only sees the survivors of the one before, plus every
document of the earlier partitions in the index:

1. exact: documents with the same normalised-content hash form a group;
2. url (web): documents with the same normalised URL form a group;
3. near: for every LSH band, documents with the same band key form a bucket; each bucket links its members
   to its smallest node (a star), and the link is kept only if the two signatures agree on at least
   `verify_threshold` of their values (estimated Jaccard). Connected components of these links are the
   near-duplicate clusters.

In every group / component the smallest node id wins: the keep rule (`KEEP_ORDER`) is baked into node
ids, and documents of earlier partitions have smaller ids than any document of this one. Links between two
index documents are never built: they cannot change what this partition keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.dedup.fingerprints import estimated_jaccard, passes_verification
from pipelines.dedup.index import NODE_SHIFT, IndexArrays

# The keep rule, best first: highest quality score, then oldest snapshot, then smallest id (then position).
KEEP_ORDER = [
    ("quality", "descending"),
    ("snapshot", "ascending"),
    ("doc_id", "ascending"),
    ("shard", "ascending"),
    ("line", "ascending"),
]


def keep_ranks(fingerprints: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(order, rank) of a partition's fingerprint rows under the keep rule: `order[r]` is the row at rank r,
    `rank[row]` its inverse; a row's node is `seq << NODE_SHIFT | rank`. Only the key columns are sorted."""
    keys = fingerprints.select([name for name, _ in KEEP_ORDER])
    order = pc.sort_indices(keys, sort_keys=KEEP_ORDER).to_numpy()
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    return order, rank


@dataclass
class Decisions:
    """Per document of the partition (in node order) and partition-wide counts."""

    kept: np.ndarray
    reason: np.ndarray  # object: "", "exact", "url", "near"
    root: np.ndarray  # int64 node of the document that represents its cluster
    cluster_size: np.ndarray  # int64, documents in the cluster (an earlier partition's root counts once)
    counts: dict[str, int] = field(default_factory=dict)


def _group_min(
    keys_new: np.ndarray, nodes_new: np.ndarray, keys_idx: np.ndarray, nodes_idx: np.ndarray
) -> np.ndarray:
    """For each new document, the smallest node among all documents (new + index) with its key."""
    if len(keys_new) == 0:
        return nodes_new.copy()
    keys = np.concatenate([keys_new, keys_idx])
    nodes = np.concatenate([nodes_new, nodes_idx])
    uniq, inverse = np.unique(keys, return_inverse=True)
    mins = np.full(len(uniq), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(mins, inverse, nodes)
    return mins[inverse[: len(keys_new)]]


def _band_edges(bands_new: np.ndarray, nodes_new: np.ndarray, bands_idx: np.ndarray, nodes_idx: np.ndarray):
    """(center, member) links of every bucket, one band at a time: members are new documents."""
    centers, members = [], []
    n_new = len(nodes_new)
    nodes = np.concatenate([nodes_new, nodes_idx])
    is_new = np.zeros(len(nodes), dtype=bool)
    is_new[:n_new] = True
    for band in range(bands_new.shape[1]):
        keys = np.concatenate([bands_new[:, band], bands_idx[:, band]])
        order = np.lexsort((nodes, keys))
        k, nd, new = keys[order], nodes[order], is_new[order]
        starts = np.ones(len(k), dtype=bool)
        starts[1:] = k[1:] != k[:-1]
        group_first = np.flatnonzero(starts)[np.cumsum(starts) - 1]
        link = ~starts & new
        centers.append(nd[group_first[link]])
        members.append(nd[link])
    if not centers:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pairs = np.unique(np.stack([np.concatenate(centers), np.concatenate(members)], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def component_min(n: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """For each of `n` vertices, the smallest vertex of its connected component under the undirected edges
    (u[i], v[i]). Numpy only (scipy's connected_components gives the same partition; a test compares them, and
    importing scipy.sparse cost more than the whole clustering): roots hook onto the smaller label across
    every edge, then pointer jumping flattens the forest; labels only decrease and always name a vertex of
    the same component, so at the fixed point each component is labelled by its minimum."""
    label = np.arange(n, dtype=np.int64)
    if len(u) == 0:
        return label
    while True:
        lu, lv = label[u], label[v]
        if np.array_equal(lu, lv):
            return label
        low = np.minimum(lu, lv)
        np.minimum.at(label, lu, low)
        np.minimum.at(label, lv, low)
        while True:
            jumped = label[label]
            if np.array_equal(jumped, label):
                break
            label = jumped


_VERIFY_CHUNK = 1 << 16  # candidate pairs compared at once: bounds the gathered signature rows


def _verified(
    ci: np.ndarray, mi: np.ndarray, sig_idx: np.ndarray, sig_new: np.ndarray, threshold: float
) -> np.ndarray:
    """passes_verification for each (center, member) position pair over index rows then new rows, in chunks
    and without concatenating the two signature matrices."""
    n_idx = len(sig_idx)

    def rows(pos: np.ndarray) -> np.ndarray:
        out = np.empty((len(pos), sig_new.shape[1]), dtype=np.uint32)
        old = pos < n_idx
        out[old] = sig_idx[pos[old]]
        out[~old] = sig_new[pos[~old] - n_idx]
        return out

    ok = np.zeros(len(ci), dtype=bool)
    for lo in range(0, len(ci), _VERIFY_CHUNK):
        hi = lo + _VERIFY_CHUNK
        ok[lo:hi] = passes_verification(estimated_jaccard(rows(ci[lo:hi]), rows(mi[lo:hi])), threshold)
    return ok


def resolve_clusters(
    new: dict[str, np.ndarray], index: IndexArrays, seq: int, verify_threshold: float, url_dedup: bool
) -> Decisions:
    """Exact -> URL -> near phases for a partition whose arrays (`new`: node, content_hash, url_hash,
    has_url, bands, sig) are in node order, against the earlier partitions in `index`."""
    node = new["node"]
    n = len(node)
    base = np.int64(seq) << np.int64(NODE_SHIFT)

    def rank(x: np.ndarray) -> np.ndarray:
        return x - base

    def is_new(x: np.ndarray) -> np.ndarray:
        return x >= base

    exact = _group_min(new["content_hash"], node, index.content_hash, index.node)
    s1 = exact == node
    url = node.copy()
    if url_dedup:
        m = s1 & new["has_url"]
        url[m] = _group_min(
            new["url_hash"][m], node[m], index.url_hash[index.has_url], index.node[index.has_url]
        )
    s2 = s1 & (url == node)

    # near: links from shared band keys, verified on signatures, then connected components
    centers, members = _band_edges(new["bands"][s2], node[s2], index.bands, index.node)
    all_nodes = np.concatenate([index.node, node])  # sorted: index nodes < this partition's nodes
    ci, mi = np.searchsorted(all_nodes, centers), np.searchsorted(all_nodes, members)
    ok = _verified(ci, mi, index.sig, new["sig"], verify_threshold)
    ci, mi = ci[ok], mi[ok]
    near = all_nodes[component_min(len(all_nodes), ci, mi)[len(index.node) :]]  # all_nodes is sorted
    near[~s2] = node[~s2]

    # a removed document's cluster root: follow exact -> url -> near; earlier partitions' nodes are roots
    root = exact.copy()
    m = is_new(root)
    root[m] = url[rank(root[m])]
    m = is_new(root)
    root[m] = near[rank(root[m])]

    kept = s2 & (near == node)
    reason = np.full(n, "", dtype=object)
    reason[~s1] = "exact"
    reason[s1 & ~s2] = "url"
    reason[s2 & ~kept] = "near"
    roots, inverse, counts = np.unique(root, return_inverse=True, return_counts=True)
    sizes = counts + (~is_new(roots)).astype(np.int64)
    cluster_size = sizes[inverse] if n else np.zeros(0, np.int64)
    return Decisions(
        kept=kept,
        reason=reason,
        root=root,
        cluster_size=cluster_size,
        counts={"candidate_pairs": int(len(ok)), "verified_pairs": int(ok.sum())},
    )


def cluster_size_histogram(root: np.ndarray, cluster_size: np.ndarray) -> dict[int, int]:
    """{cluster size: number of clusters} over clusters with at least two documents."""
    _, first = np.unique(root, return_index=True)
    sizes, counts = np.unique(cluster_size[first], return_counts=True)
    return {int(s): int(c) for s, c in zip(sizes, counts, strict=True) if s > 1}
