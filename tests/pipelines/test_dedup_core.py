"""The shared dedup core: config, tokenisation, MinHash signatures, Jaccard estimates, rate check."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pyarrow as pa
import pytest
from conftest_dedup import VOCAB, substitute, words  # tests/pipelines is on sys.path (prepend import mode)
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
from datatrove.utils.text import simplify_text
from pydantic import ValidationError

from infra.settings import load_profile, validate_stage
from pipelines.dedup import DedupConfig, check_dedup_rate
from pipelines.dedup.fingerprints import MinHasher, estimated_jaccard, normalise_url
from pipelines.dedup.index import sig_rows


def true_jaccard(hasher: MinHasher, a: str, b: str) -> float:
    sa, sb = (
        set(hasher.shingle_hashes(hasher.tokens(a)).tolist()),
        set(hasher.shingle_hashes(hasher.tokens(b)).tolist()),
    )
    return len(sa & sb) / len(sa | sb)


def test_config_defaults_per_kind_and_profiles():
    web, code = DedupConfig(), DedupConfig(kind="code")
    assert (web.ngram_size, web.num_bands, web.rows_per_band, web.num_perm) == (5, 14, 8, 112)
    assert (code.num_bands, code.rows_per_band) == (12, 7)
    assert round(web.lsh_threshold, 3) == 0.719 and round(code.lsh_threshold, 3) == 0.701
    assert web.url_dedup and not code.url_dedup and code.exact_match_on == "whitespace" and not code.lowercase
    assert DedupConfig(num_bands=20).num_bands == 20  # explicit values beat the kind defaults
    assert web.fingerprint() != code.fingerprint()
    # the index only cares about fingerprint fields; the keep decision also about the verify threshold
    assert web.index_fingerprint() == DedupConfig(verify_threshold=0.8).index_fingerprint()
    assert web.fingerprint() != DedupConfig(verify_threshold=0.8).fingerprint()
    assert web.index_fingerprint() != DedupConfig(ngram_size=4).index_fingerprint()
    assert (
        web.fingerprint() == DedupConfig(engine="spark", workers=7).fingerprint()
    )  # engine does not change results
    with pytest.raises(ValidationError, match="bandz"):
        DedupConfig(bandz=3)
    with pytest.raises(ValidationError):
        DedupConfig(min_removed_fraction=0.5, max_removed_fraction=0.1)
    for profile in ("tiny", "micro", "cluster"):
        prof = load_profile(profile)
        assert validate_stage(prof, "dedup_code", DedupConfig).kind == "code"
        assert validate_stage(prof, "dedup_web", DedupConfig).engine == (
            "spark" if profile == "cluster" else "datatrove"
        )


def test_normalisation_and_tokens():
    web, code = MinHasher(DedupConfig()), MinHasher(DedupConfig(kind="code"))
    assert web.tokens("Héllo, WORLD!  It's 2024-05 or 3.14¶ os_path") == [
        "hello",
        "world",
        "it",
        "s",
        "0",
        "0",
        "or",
        "0¶",
        "os",
        "path",
    ]
    tricky = "Ça coûte 3,50 € — «vraiment»? Naïve façade_d’été… 1.5x faster¶ (see §2)."
    assert web.tokens(tricky) == simplify_text(tricky).split()  # datatrove's normalisation, faster
    assert code.tokens("def Foo(x1): return x1+2") == ["def", "Foo", "x1", "return", "x1", "2"]
    # exact keys: words for web (punctuation/case/spacing ignored), collapsed whitespace for code
    assert web.content_hash("A b,  c", web.tokens("A b,  c")) == web.content_hash(
        "a B c", web.tokens("a B c")
    )
    assert code.content_hash("a  =\n b", []) == code.content_hash("a = b", [])
    assert code.content_hash("a = b", []) != code.content_hash("a - b", [])
    assert normalise_url("HTTPS://Site.Example:443/a?q=1#frag") == "https://site.example/a?q=1"
    assert normalise_url("http://x.org") == "http://x.org/"


def test_signature_equals_datatrove_minhash_signature(tmp_path):
    """Same seed, same shingle hash, same universal hashes: datatrove's stock step gives the same signature
    (datatrove tokenises with spaCy, we split simplified text on whitespace: same words here)."""
    step = MinhashDedupSignature(output_folder=str(tmp_path), config=MinhashConfig(), language="en")
    hasher = MinHasher(DedupConfig())
    rng = random.Random(5)
    texts = [" ".join(words(rng, n)) for n in (3, 5, 6, 200)]
    texts.append("The café opened in 1998; its owner, Zoë, sells 3.5 kg of beans — daily! " * 3)
    for text in texts:
        if len(hasher.tokens(text)) < 5:
            assert step.get_shingles(text).size == 0  # datatrove skips short texts; we hash them whole
            continue
        ours = hasher.signature(hasher.shingle_hashes(hasher.tokens(text)))
        theirs = np.array(step.get_signature(step.get_shingles(text)), dtype=np.uint64).ravel()
        assert np.array_equal(ours, theirs)


def test_signatures_are_deterministic_seeded_and_picklable():
    text = " ".join(words(random.Random(0)))
    hasher = MinHasher(DedupConfig())
    a = hasher.fingerprint(text, "https://x.org/")
    b = pickle.loads(pickle.dumps(hasher)).fingerprint(text, "https://x.org/")
    assert a.sig == b.sig and np.array_equal(a.bands, b.bands) and a.content_hash == b.content_hash
    assert len(a.sig) == 4 * 112 and a.bands.dtype == np.int64 and a.tokens == 200
    other_seed = MinHasher(DedupConfig(seed=2)).fingerprint(text)
    assert not np.array_equal(a.bands, other_seed.bands)
    for other in ("sha1", "xxh3_tokens"):
        fp = MinHasher(DedupConfig(shingle_hash=other)).fingerprint(text)
        assert not np.array_equal(a.bands, fp.bands) and fp.tokens == 200
    # empty and short texts still get a signature (so exact copies of them still cluster)
    assert MinHasher(DedupConfig()).fingerprint("").tokens == 0
    assert (
        MinHasher(DedupConfig()).fingerprint("two words").sig != MinHasher(DedupConfig()).fingerprint("").sig
    )


def test_estimated_jaccard_tracks_true_jaccard_and_bands_follow_the_s_curve():
    rng = random.Random(3)
    hasher = MinHasher(DedupConfig())
    rows = []
    for edits in (2, 8, 20, 60):  # J ~ 0.9, 0.7, 0.45, 0.15
        for _ in range(40):
            a = " ".join(words(rng))
            b = substitute(rng, a, edits)
            fa, fb = hasher.fingerprint(a), hasher.fingerprint(b)
            n_perm = hasher.config.num_perm
            est = estimated_jaccard(
                sig_rows(pa.array([fa.sig]), n_perm), sig_rows(pa.array([fb.sig]), n_perm)
            )[0]
            rows.append((edits, true_jaccard(hasher, a, b), est, bool((fa.bands == fb.bands).any())))
    errors = np.array([abs(t - e) for _, t, e, _ in rows])
    assert errors.mean() < 0.04 and errors.max() < 0.15  # 112 permutations: std ~0.045
    caught = {e: np.mean([hit for ed, _, _, hit in rows if ed == e]) for e in (2, 8, 20, 60)}
    assert caught[2] == 1.0 and caught[60] == 0.0  # J~0.9 always a candidate, J~0.15 never
    assert 0.2 < caught[8] < 1.0 and caught[20] < 0.2  # around the 0.72 threshold
    assert len(VOCAB) > 5000


def test_rate_check_bounds():
    cfg = DedupConfig(min_removed_fraction=0.01, max_removed_fraction=0.5, check_min_docs=100)
    assert check_dedup_rate({"removed_fraction": 0.2, "docs_in": 1000}, cfg).passed
    assert not check_dedup_rate({"removed_fraction": 0.7, "docs_in": 1000}, cfg).passed
    assert not check_dedup_rate({"removed_fraction": 0.0, "docs_in": 1000}, cfg).passed
    assert check_dedup_rate({"removed_fraction": 0.9, "docs_in": 50}, cfg).passed  # too small to judge
