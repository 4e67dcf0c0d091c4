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


def _fuzz_texts(seed: int, count: int) -> list[str]:
    """Random strings over digits, separators, datatrove's punctuation, spaces, accents (precomposed and
    combining), scripts of 1-, 2- and 3-byte UTF-8, and the characters the C pass must refuse."""
    from datatrove.utils.text import PUNCTUATION_TRANS

    rng = random.Random(seed)
    pool = [chr(k) for k in PUNCTUATION_TRANS] + list("0123456789٠١٢.,،٫⎖ \t\n\u00a0\u2003")
    pool += list("abcXYZéÉßİΣσςДжא中文한국ｱ\u0301\u0308\u037e\u1fef\u2000ΩÅ\ufb01") + ["😀", "\U0002f800"]
    pool += [chr(rng.randrange(0x20, 0x3000)) for _ in range(300)]
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 80))) for _ in range(count)]


@pytest.mark.parametrize("kind", ["web", "code"])
def test_c_normalisation_gives_the_reference_tokens(kind):
    """`MinHasher.simplified` (one C pass) == " ".join(tokens()) wherever it answers; it answers for ordinary
    text (so the fast path is really taken) and refuses what only the reference handles."""
    overrides = (
        {} if kind == "web" else {"tokenizer": "datatrove", "strip_accents": False, "lowercase": False}
    )
    hasher = MinHasher(DedupConfig(**overrides))
    answered = 0
    for text in _fuzz_texts(11, 4000):
        fast = hasher.simplified(text)
        if fast is None:
            continue
        answered += 1
        tokens = hasher.tokens(text)
        assert fast == (" ".join(tokens).encode(), len(tokens)), repr(text)
    assert answered > 1000
    ordinary = "Ça coûte 3,50 € — «vraiment»? Naïve façade_d’été… 1.5x faster¶ (see §2). ΣΊΣΥΦΟΣ 中文 1,000.5"
    assert hasher.simplified(ordinary) is not None
    assert hasher.simplified("emoji 😀 here") is None  # outside the BMP: the reference path
    if kind == "web":  # NFD of U+037E is ';': the digit/punctuation rules must see it first
        assert hasher.simplified("a\u037eb é") is None
        assert hasher.tokens("a\u037eb é") == ["a;b", "e"]


def test_fingerprint_fast_path_equals_the_reference_pipeline():
    hasher = MinHasher(DedupConfig())
    for text in _fuzz_texts(12, 1500) + [" ".join(words(random.Random(3), 400))]:
        fp = hasher.fingerprint(text, "https://x.org/a")
        tokens = hasher.tokens(text)
        sig = hasher._signature_py(hasher._shingle_hashes_py(tokens))
        assert fp.tokens == len(tokens) and fp.content_hash == hasher.content_hash(text, tokens)
        assert np.array_equal(fp.bands, hasher.band_keys(sig)), repr(text)
        assert fp.sig == (sig & np.uint64(0xFFFFFFFF)).astype("<u4").tobytes()


@pytest.mark.parametrize("bands,rows", [(14, 8), (3, 5), (1, 1), (2, 7)])
def test_vector_minhash_handles_permutation_counts_not_a_multiple_of_four(bands, rows):
    hasher = MinHasher(DedupConfig(num_bands=bands, rows_per_band=rows))
    rng = np.random.default_rng(bands * 10 + rows)
    for n in (1, 2, 7, 500):
        x = rng.integers(0, 2**64, size=n, dtype=np.uint64)
        x[0] = np.uint64(2**64 - 1)  # the largest shingle hash
        assert np.array_equal(hasher.signature(x), hasher._signature_py(x))


def test_component_min_equals_scipy_connected_components():
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from pipelines.dedup.clusters import component_min

    rng = np.random.default_rng(4)
    for n, m in [(1, 0), (5, 0), (50, 30), (2000, 1500), (2000, 4000), (300, 299)]:
        u, v = rng.integers(0, n, m), rng.integers(0, n, m)
        if (n, m) == (300, 299):  # a long path in shuffled vertex order: the worst case for label hooking
            perm = rng.permutation(n)
            u, v = perm[:-1], perm[1:]
        got = component_min(n, u, v)
        _, comp = connected_components(coo_matrix((np.ones(m), (u, v)), shape=(n, n)), directed=False)
        first = np.full(comp.max() + 1, n)
        np.minimum.at(first, comp, np.arange(n))
        assert np.array_equal(got, first[comp]), (n, m)
