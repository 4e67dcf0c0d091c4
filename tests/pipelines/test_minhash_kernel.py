"""The C fingerprint loop (pipelines/dedup/_minhash.c) against its Python/numpy reference and xxhash itself:
the same shingle hashes and the same signatures, so an index written with one is read by the other."""

from __future__ import annotations

import random

import numpy as np
import pytest
import xxhash
from conftest_dedup import words  # tests/pipelines is on sys.path (prepend import mode)

from pipelines.dedup import DedupConfig
from pipelines.dedup.fingerprints import MinHasher

_minhash = pytest.importorskip(
    "pipelines.dedup._minhash", reason="the C MinHash loop was not built (pip install -e .)"
)


def test_xxh64_matches_xxhash_at_every_length_and_on_unicode():
    rng = random.Random(1)
    alphabet = "abcdefghij0 éß€😀\u0301"
    for length in list(range(0, 80)) + [127, 128, 129, 1000]:
        token = "".join(rng.choice(alphabet) for _ in range(length))
        got = np.frombuffer(_minhash.shingle_hashes([token], 1), dtype=np.uint64)
        assert got.tolist() == [xxhash.xxh64_intdigest(token)], length


@pytest.mark.parametrize("ngram", [1, 3, 5])
def test_shingle_hashes_and_signatures_equal_the_reference(ngram):
    hasher = MinHasher(DedupConfig(ngram_size=ngram))
    rng = random.Random(ngram)
    docs = [[], ["one"], words(rng, ngram), words(rng, ngram + 1), words(rng, 300)]
    docs.append(hasher.tokens("Ça coûte 3,50 € — «vraiment»? Naïve façade_d’été… 😀 1.5x faster¶ " * 20))
    for tokens in docs:
        ref = hasher._shingle_hashes_py(tokens)
        fast = hasher.shingle_hashes(tokens)
        assert fast.dtype == np.uint64 and np.array_equal(fast, ref)
        sig_ref = hasher._signature_py(ref)
        assert np.array_equal(hasher.signature(ref), sig_ref)
        assert np.array_equal(hasher.token_signature(tokens), sig_ref)


def test_kernel_rejects_bad_input():
    with pytest.raises(TypeError):
        _minhash.shingle_hashes(["a", 3], 2)
    with pytest.raises(ValueError):
        _minhash.shingle_hashes(["a"], 0)
    with pytest.raises(ValueError):
        _minhash.minhash(np.zeros(3, np.uint64), np.zeros(4, np.uint64), np.zeros(5, np.uint64))


def test_fast_punctuation_pass_equals_datatrove_translate():
    """The character-class / bytes.translate punctuation pass gives datatrove's str.translate tokens."""
    import unicodedata

    import regex
    from datatrove.utils.text import NUMBERS_PATTERN, PUNCTUATION_TRANS

    marks = regex.compile(r"\p{Mn}+")

    def reference(text: str) -> list[str]:
        text = NUMBERS_PATTERN.sub("0", text.lower()).translate(PUNCTUATION_TRANS)
        if not text.isascii():
            text = marks.sub("", unicodedata.normalize("NFD", text))
        return text.split()

    hasher = MinHasher(DedupConfig())
    rng = random.Random(7)
    pool = [chr(k) for k in PUNCTUATION_TRANS] + list("abcXYZ 019\t\n_-.,é\u0301ßİ😀¶—") + [" word "] * 5
    for _ in range(300):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 60)))
        assert hasher.tokens(text) == reference(text), text
