"""What the tokenizer and the token shards read: only committed outputs, and only their kept documents."""

from __future__ import annotations

from assets.pretraining import corpus_sources
from infra.committed import commit
from infra.store import LocalStore
from training.data import document_keys


def _output(root, names: list[str]):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    return root


def test_corpus_is_the_kept_documents_of_committed_outputs_only(tmp_path):
    """On 98a639e the math source was every folder holding shards, `math/filtered/all/dropped/` included, and a
    snapshot whose first run was killed mid-publish (shards, no manifest) was read for code and knowledge."""
    store = LocalStore(tmp_path / "store")
    math = commit(
        store, "math/filtered/all", _output(tmp_path / "m", ["kept/part-0.jsonl.gz", "dropped/p.jsonl.gz"])
    )
    commit(store, "web/filtered/s1", _output(tmp_path / "w", ["kept/0.jsonl.gz", "dropped/c4/0.jsonl.gz"]))
    commit(store, "code/files/c1", _output(tmp_path / "c", ["part-00000.jsonl.gz"]))
    for partial in ("web/filtered/s2/v-0/kept/0.jsonl.gz", "code/files/c2/part-00000.jsonl.gz"):
        store.put_bytes(partial, b"")  # what a writer killed before its first commit leaves
    store.put_bytes("knowledge/rescued/s1/part-00000.jsonl.gz", b"")
    sources = corpus_sources(store)
    assert sources == {
        "web": ["web/filtered/s1/kept/"],
        "code": ["code/files/c1/"],
        "math": ["math/filtered/all/kept/"],
    }
    assert document_keys(store, "math/filtered/all/kept/") == [
        f"math/filtered/all/v-{math.version}/kept/part-0.jsonl.gz"
    ]
