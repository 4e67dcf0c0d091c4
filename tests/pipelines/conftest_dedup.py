"""A planted-duplicate corpus for the dedup tests (imported by test_dedup*.py; tests/pipelines is on sys.path).

Documents are 200 seeded pseudo-words, so unrelated documents share no 5-gram. Two snapshots:

`2024-10` (processed first), 166 documents in 4 shards:
  - base-000..119   120 originals (quality 0.5)
  - exact-00..09    10 copies of base-000..009 that differ only in case, punctuation and whitespace
  - url-00..05      6 new texts under the URL of base-010..015 (upper-case host, #fragment)
  - near-00..11     12 copies of base-020..031 with 2 word substitutions (Jaccard ~0.9)
  - far-00..07      8 copies of base-040..047 with 60 substitutions (Jaccard ~0.2): not duplicates
  - best-00..03     4 copies of base-050..053 with 2 substitutions and quality 0.9: they win their cluster
  - chain-0..1      copies of base-060 (2 substitutions) and of chain-0 (2 more): one cluster of 3
  - solo-0..3       4 originals of their own
`2024-05` (an older snapshot, backfilled after it), 76 documents in 2 shards:
  - old-000..059    60 originals
  - bexact-0..4     exact copies of base-070..074
  - bnear-0..4      near copies (2 substitutions) of base-080..084
  - bdropped-0..1   exact copies of near-00 and exact-00, which 2024-10 itself dropped
  - bself-0..3      near copies of old-000..003 (equal quality: the smaller id bself-* is kept)
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow.parquet as pq

from infra.committed import committed_keys
from infra.store import LocalStore

WORDS = 200
_rng_vocab = random.Random(1234)
VOCAB = sorted(
    {
        "".join(_rng_vocab.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_rng_vocab.randint(3, 9)))
        for _ in range(6000)
    }
)


def words(rng: random.Random, n: int = WORDS) -> list[str]:
    return [rng.choice(VOCAB) for _ in range(n)]


def substitute(rng: random.Random, text: str, edits: int) -> str:
    toks = text.split()
    for i in rng.sample(range(len(toks)), edits):
        toks[i] = rng.choice(VOCAB) + "q"  # "q" suffix: never equal to the word it replaces
    return " ".join(toks)


def exact_variant(text: str) -> str:
    """Same words, different case, punctuation and spacing: equal after normalisation."""
    toks = text.split()
    toks[0] = toks[0].upper()
    toks[5] = toks[5] + ","
    return "  ".join(toks) + " !\n"


def doc(doc_id: str, text: str, snapshot: str, url: str, quality: float = 0.5) -> dict:
    return {
        "text": text,
        "id": doc_id,
        "metadata": {"url": url, "snapshot": snapshot, "quality_score": quality, "language": "en"},
    }


def snapshot_a(seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    snap = "2024-10"
    base = [
        doc(f"base-{i:03d}", " ".join(words(rng)), snap, f"https://site{i}.example/page") for i in range(120)
    ]
    docs = list(base)
    docs += [
        doc(f"exact-{i:02d}", exact_variant(base[i]["text"]), snap, f"https://copy.example/{i}")
        for i in range(10)
    ]
    docs += [
        doc(f"url-{i:02d}", " ".join(words(rng)), snap, f"HTTPS://SITE{10 + i}.example/page#top")
        for i in range(6)
    ]
    docs += [
        doc(f"near-{i:02d}", substitute(rng, base[20 + i]["text"], 2), snap, f"https://near.example/{i}")
        for i in range(12)
    ]
    docs += [
        doc(f"far-{i:02d}", substitute(rng, base[40 + i]["text"], 60), snap, f"https://far.example/{i}")
        for i in range(8)
    ]
    docs += [
        doc(f"best-{i:02d}", substitute(rng, base[50 + i]["text"], 2), snap, f"https://best.example/{i}", 0.9)
        for i in range(4)
    ]
    chain0 = substitute(rng, base[60]["text"], 2)
    docs += [
        doc("chain-0", chain0, snap, "https://chain.example/0"),
        doc("chain-1", substitute(rng, chain0, 2), snap, "https://chain.example/1"),
    ]
    docs += [doc(f"solo-{i}", " ".join(words(rng)), snap, f"https://solo.example/{i}") for i in range(4)]
    return docs


def snapshot_b(a_docs: list[dict], seed: int = 8) -> list[dict]:
    rng = random.Random(seed)
    snap = "2024-05"
    by_id = {d["id"]: d for d in a_docs}
    old = [doc(f"old-{i:03d}", " ".join(words(rng)), snap, f"https://old.example/{i}") for i in range(60)]
    docs = list(old)
    docs += [
        doc(f"bexact-{i}", by_id[f"base-{70 + i:03d}"]["text"], snap, f"https://b.example/e{i}")
        for i in range(5)
    ]
    docs += [
        doc(
            f"bnear-{i}",
            substitute(rng, by_id[f"base-{80 + i:03d}"]["text"], 2),
            snap,
            f"https://b.example/n{i}",
        )
        for i in range(5)
    ]
    docs += [
        doc("bdropped-0", by_id["near-00"]["text"], snap, "https://b.example/d0"),
        doc("bdropped-1", by_id["exact-00"]["text"], snap, "https://b.example/d1"),
    ]
    docs += [
        doc(f"bself-{i}", substitute(rng, old[i]["text"], 2), snap, f"https://b.example/s{i}")
        for i in range(4)
    ]
    return docs


def write_shards(root: Path, prefix: str, docs: list[dict], shards: int) -> list[str]:
    """Write `docs` round-robin into `shards` JSONL.gz files (fixed gzip mtime: identical bytes every time)."""
    keys = []
    for s in range(shards):
        key = f"{prefix}/{s:05d}.jsonl.gz"
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            for d in docs[s::shards]:
                gz.write((json.dumps(d) + "\n").encode())
        keys.append(key)
    return keys


def committed_files(root: Path, prefix: str, suffix: str) -> list[Path]:
    """Local paths of the committed files under `prefix` (a folder of a committed output), checked sizes."""
    keys = committed_keys(LocalStore(root), prefix, suffix)
    assert keys is not None, f"{prefix}: no committed output"
    return [root / key for key in keys]


def read_kept_ids(root: Path, prefix: str) -> list[str]:
    ids = []
    for path in committed_files(root, prefix, ".jsonl.gz"):
        with gzip.open(path, "rt") as fh:
            ids += [json.loads(line)["id"] for line in fh]
    return ids


def cluster_rows(root: Path, prefix: str) -> dict[str, dict]:
    """{doc_id: row} of the committed cluster files under `prefix`."""
    rows = {}
    for path in committed_files(root, prefix, ".parquet"):
        rows.update({r["doc_id"]: r for r in pq.read_table(path).to_pylist()})
    return rows


def tree_bytes(root: Path, prefix: str, skip: tuple[str, ...] = ("_committed.json",)) -> dict[str, bytes]:
    """{relative path: bytes} of every file under root/prefix (minus files named in `skip`: a pointer holds
    its commit time)."""
    base = root / prefix
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and p.name not in skip
    }


# What the datatrove engine and the Spark engine must both keep.
A_DROPPED = (
    {f"exact-{i:02d}" for i in range(10)}
    | {f"url-{i:02d}" for i in range(6)}
    | {f"near-{i:02d}" for i in range(12)}
    | {f"base-{50 + i:03d}" for i in range(4)}  # lose to best-*, whose quality is higher
    | {"chain-0", "chain-1"}
)
B_DROPPED = (
    {f"bexact-{i}" for i in range(5)}
    | {f"bnear-{i}" for i in range(5)}
    | {"bdropped-0", "bdropped-1"}
    | {f"old-{i:03d}" for i in range(4)}  # same quality and snapshot: the smaller id "bself-*" wins
)
