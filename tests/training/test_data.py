"""Token shards, mixture and the batch iterator: counts, proportions, determinism and resume."""

import gzip
import json
import math
import random
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from infra.committed import commit, read_committed
from infra.store import LocalStore
from pipelines.code.quality import CodeQualityConfig, train_code_quality
from pipelines.code.records import commit_records, make_record, sha256_hex
from training.data import (
    MixtureConfig,
    TokenBatches,
    build_token_shards,
    cap_source_epochs,
    iter_shard_documents,
    load_corpus_tokenizer,
    load_shard_meta,
    partition_of,
    shard_paths,
    source_epochs,
    token_manifest,
)
from training.tokenizer import EOS, TokenizerConfig, load_tokenizer, train_tokenizer

WORDS = "alpha beta gamma delta river stone light paper code math sum prime graph node".split()


def _docs(kind, n, seed, **meta):
    rng = random.Random(seed)
    for i in range(n):
        text = " ".join(rng.choices(WORDS, k=rng.randint(5, 80)))
        yield {"id": f"{kind}-{seed}-{i}", "text": text, "metadata": dict(meta, idx=i)}


def _commit_docs(store, prefix, shards: dict[str, list[dict]]):
    """Commit {name: docs} JSONL.gz shards as one version of `prefix`, as the producing stages do."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, docs in shards.items():
            (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(Path(tmp) / name, "wt") as fh:
                fh.writelines(json.dumps(d) + "\n" for d in docs)
        commit(store, prefix, Path(tmp))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    store = LocalStore(root)
    web = {}
    for snap, seed in [("2026-10", 1), ("2026-11", 2)]:
        docs = list(_docs("web", 120, seed, url=f"https://site{seed}.org/page"))
        docs[3]["text"] += " literal <|endoftext|> inside a page"
        _commit_docs(
            store,
            f"web/filtered/{snap}",
            {"kept/00000.jsonl.gz": docs[:60], "kept/00001.jsonl.gz": docs[60:]},
        )
        web[snap] = docs
    code = _code_records()
    commit_records(store, "code/files/pypi-1", code, 1000)
    # the real producer of the per-language weights (heuristic scores only: no classifier to train)
    quality = train_code_quality(
        CodeQualityConfig(languages=[]), store, "pypi-1", tmp_path_factory.mktemp("quality")
    )
    math_docs = list(_docs("math", 80, 4))
    _commit_docs(store, "math/kept/m1", {"00000.jsonl.gz": math_docs})
    tok_dir = train_tokenizer(
        (d["text"] for d in web["2026-10"] + code[::5]), TokenizerConfig(vocab_size=512), root.parent / "tok"
    )
    sources = {
        "web": ["web/filtered/2026-10/kept/", "web/filtered/2026-11/kept/"],
        "code": ["code/files/pypi-1/"],
        "math": ["math/kept/m1/"],
    }
    config = MixtureConfig(
        weights={"web": 0.5, "code": 0.3, "math": 0.2}, heldout_fraction=0.1, shard_tokens=2048
    )
    result = build_token_shards(config, store, sources, tok_dir, "tokens/v1")
    return {"store": store, "tok_dir": tok_dir, "web": web, "code": code, "math": math_docs, "result": result,
            "quality": quality}  # fmt: skip


def _code_records(n_python: int = 400, n_lua: int = 100) -> list[dict]:
    """Code files of equal length, 4:1 Python:Lua by characters (temperature 2 up-samples Lua)."""
    rng = random.Random(3)
    records = []
    for i in range(n_python + n_lua):
        lang, ext = ("Python", "py") if i < n_python else ("Lua", "lua")
        text = " ".join(rng.choices(WORDS, k=40))
        path = f"src/f{i}.{ext}"
        records.append(make_record(text, "pypi", f"pkg{i % 7}", "1", path, len(text), sha256_hex(text.encode()),
                                   "MIT", lang, lang, "extension", "pypi-1"))  # fmt: skip
    return records


def test_partition_of():
    assert partition_of("web/filtered/2026-11/kept/") == "2026-11"
    assert partition_of("dedup/code/pypi-2026-01/kept") == "pypi-2026-01"
    assert partition_of("code/files/gh-1/") == "gh-1"


def test_a_local_store_is_read_in_place_with_no_cache_dir_made(corpus, monkeypatch):
    def no_cache_dir(*args, **kwargs):
        raise AssertionError("a local store's shards need no cache dir")

    monkeypatch.setattr(tempfile, "mkdtemp", no_cache_dir)
    store = corpus["store"]
    paths = shard_paths(store, corpus["result"].outputs["manifest"], "train")
    assert paths and all(p.is_relative_to(store.root) for ps in paths.values() for p in ps)


def test_shard_tokens_equal_doc_tokens_plus_eos(corpus):
    store, result = corpus["store"], corpus["result"]
    tok = load_tokenizer(corpus["tok_dir"])
    paths = shard_paths(store, result.outputs["manifest"], "train")
    heldout = shard_paths(store, result.outputs["manifest"], "heldout")
    web_docs = corpus["web"]["2026-10"] + corpus["web"]["2026-11"]
    held_ids = {m["id"] for p in heldout["web"] for m in load_shard_meta(p)}
    train_docs = [d for d in web_docs if d["id"] not in held_ids]
    corpus_tok = load_corpus_tokenizer(corpus["tok_dir"])
    expected = sum(len(corpus_tok.encode(d["text"]).ids) for d in train_docs) + len(train_docs)
    got = sum(len(np.load(p)) for p in paths["web"])
    assert got == expected == result.metrics["train_tokens/web"]
    assert result.metrics["train_docs/web/2026-10"] + result.metrics["train_docs/web/2026-11"] == len(
        train_docs
    )
    assert 0 < len(held_ids) < 0.25 * len(web_docs)  # ~10% held out
    # Every document ends with exactly one EOS and contains no other.
    eos = tok.convert_tokens_to_ids(EOS)
    docs = list(iter_shard_documents(paths["web"]))
    assert len(docs) == len(train_docs)
    assert "web-1-3" not in held_ids
    # The literal "<|endoftext|>" inside web doc 3 is encoded as text, never as a real EOS.
    assert all(d[-1] == eos and (d == eos).sum() == 1 for d in docs)
    assert len(paths["web"]) > 1  # shard_tokens=2048 splits the source into several shards


def test_a_small_source_still_holds_out_its_minimum_of_documents(corpus, tmp_path):
    """2% of 60 docs is ~1 document: the held-out set is topped up to heldout_min_docs with the docs of the
    lowest held-out draws (spread over both partitions), at most half a source, and none if the fraction is 0."""
    from training.data import heldout_hash

    store = LocalStore(tmp_path / "store")
    parts = {"s1": list(_docs("small", 30, 7, url="https://a.org/x")), "s2": list(_docs("small", 30, 8))}
    for name, docs in parts.items():
        _commit_docs(store, f"web/filtered/{name}", {"kept/00000.jsonl.gz": docs})
    docs = parts["s1"] + parts["s2"]
    sources = {"web": ["web/filtered/s1/kept/", "web/filtered/s2/kept/"]}

    def held(out: str, **cfg) -> tuple[list[str], dict]:
        config = MixtureConfig(weights={"web": 1.0}, shard_tokens=2048, **cfg)
        result = build_token_shards(config, store, sources, corpus["tok_dir"], out)
        paths = shard_paths(store, result.outputs["manifest"], "heldout").get("web", [])
        train = shard_paths(store, result.outputs["manifest"], "train")["web"]
        train_ids = [m["id"] for p in train for m in load_shard_meta(p)]
        held_ids = [m["id"] for p in paths for m in load_shard_meta(p)]
        assert sorted(train_ids + held_ids) == sorted(d["id"] for d in docs)  # each doc once, in one split
        return held_ids, result.metrics

    by_draw = sorted((heldout_hash(d["id"], 0), d["id"]) for d in docs)
    ids, metrics = held("t/a", heldout_fraction=0.02, heldout_min_docs=16)
    assert sorted(ids) == sorted(i for _, i in by_draw[:16])
    assert (
        metrics["heldout_docs/web"] == 16 == metrics["heldout_docs/web/s1"] + metrics["heldout_docs/web/s2"]
    )
    assert metrics["train_docs/web/s1"] + metrics["train_docs/web/s2"] == 44
    assert 0 < metrics["heldout_docs/web/s1"] < 16  # drawn over the whole source, not its first partition
    assert held("t/b", heldout_fraction=0.02, heldout_min_docs=0)[0] == [i for _, i in by_draw if _ < 0.02]
    assert sorted(held("t/c", heldout_fraction=0.02, heldout_min_docs=50)[0]) == sorted(
        i for _, i in by_draw[:30]
    )  # at most half of the source's 60 docs
    assert held("t/d", heldout_fraction=0.0, heldout_min_docs=16)[0] == []
    # a fraction that already gives more than the minimum is left alone
    over = held("t/e", heldout_fraction=0.5, heldout_min_docs=16)[0]
    assert sorted(over) == sorted(i for d, i in by_draw if d < 0.5)


def test_a_train_sample_tokenizes_a_seeded_share_of_train_docs_and_keeps_the_held_out_set(corpus, tmp_path):
    """train_sample {"code": 0.5}: code's held-out docs are the unsampled build's, its train docs are exactly
    those whose sample draw is below 0.5 (counted as dropped otherwise), and web is untouched."""
    from training.data import _unit_hash

    def ids(result, split: str, source: str) -> list[str]:
        paths = shard_paths(corpus["store"], result.outputs["manifest"], split)[source]
        return sorted(m["id"] for p in paths for m in load_shard_meta(p))

    sources = {"web": ["web/filtered/2026-10/kept/"], "code": ["code/files/pypi-1/"]}
    base = dict(weights={"web": 0.5, "code": 0.5}, heldout_fraction=0.1, shard_tokens=2048)
    whole = build_token_shards(MixtureConfig(**base), corpus["store"], sources, corpus["tok_dir"], "ts/all")
    half = build_token_shards(
        MixtureConfig(**base, train_sample={"code": 0.5}),
        corpus["store"],
        sources,
        corpus["tok_dir"],
        "ts/half",
    )
    assert ids(half, "heldout", "code") == ids(whole, "heldout", "code")
    assert ids(half, "train", "web") == ids(whole, "train", "web")
    all_train = sorted(set(ids(whole, "train", "code")))  # a doc may be copied by its language weight
    kept = [i for i in all_train if _unit_hash("train_sample", 0, i) < 0.5]
    assert sorted(set(ids(half, "train", "code"))) == kept
    assert 0.35 < len(kept) / len(all_train) < 0.65
    held = set(ids(whole, "heldout", "code"))
    candidates = [r["id"] for r in corpus["code"] if r["id"] not in held]  # language weight 0 or not
    dropped = [i for i in candidates if _unit_hash("train_sample", 0, i) >= 0.5]
    assert half.metrics["dropped/code/train_sample"] == len(dropped) > 0
    with pytest.raises(ValueError, match="train_sample"):
        MixtureConfig(train_sample={"code": 0.0})


def test_manifest_records_inputs_and_versions(corpus):
    manifest = token_manifest(corpus["store"], corpus["result"].outputs["prefix"])
    web_inputs = manifest["sources"]["web"]["inputs"]
    assert [i["partition"] for i in web_inputs] == ["2026-10", "2026-11"]
    version = read_committed(corpus["store"], "web/filtered/2026-10").version  # the files of what was read
    assert [f["key"] for f in web_inputs[0]["files"]] == [
        f"web/filtered/2026-10/v-{version}/kept/00000.jsonl.gz",
        f"web/filtered/2026-10/v-{version}/kept/00001.jsonl.gz",
    ]
    assert all(len(i["data_version"]) == 16 for i in web_inputs)
    assert manifest["data_version"] == corpus["result"].data_version
    produced = corpus["quality"].extra["summary"]
    assert manifest["sources"]["code"]["inputs"][0]["language_weights"] == {
        lang.lower(): entry["language_weight"] for lang, entry in produced.items()
    }


def test_code_mixture_follows_the_quality_stage_weights(corpus):
    """The producer's sampling_weights.json, read back by the mixture: each train doc of a language appears
    `language_weight` times in expectation (floor + a seeded coin for the fraction)."""
    store, manifest_key = corpus["store"], corpus["result"].outputs["manifest"]
    weights = {lang.lower(): e["language_weight"] for lang, e in corpus["quality"].extra["summary"].items()}
    # temperature 2 on a 4:1 character split: Lua up-sampled, Python down-sampled (~1/3 : 2/3 of copies)
    assert weights == pytest.approx({"python": 0.833, "lua": 1.667}, rel=0.01)
    language = {d["id"]: d["metadata"]["language"].lower() for d in corpus["code"]}
    held = {m["id"] for p in shard_paths(store, manifest_key, "heldout")["code"] for m in load_shard_meta(p)}
    sampled = Counter(language[m["id"]] for p in shard_paths(store, manifest_key, "train")["code"]
                      for m in load_shard_meta(p))  # fmt: skip
    for lang, weight in weights.items():
        n = sum(1 for doc_id, lg in language.items() if lg == lang and doc_id not in held)
        frac = weight - math.floor(weight)
        # each doc's copies are floor(w) + Bernoulli(frac): 4 binomial standard errors of the total
        tolerance = 4 * math.sqrt(n * frac * (1 - frac))
        assert abs(sampled[lang] - weight * n) <= tolerance, (lang, sampled[lang], weight * n, tolerance)
    assert sampled["lua"] / sampled["python"] > 0.4  # 0.25 of the docs, about half of the python copies


def test_languages_without_a_weight_and_a_missing_quality_output_are_counted_not_silent(
    corpus, tmp_path, caplog
):
    """A language the quality stage did not weigh keeps one copy per doc and is counted; a code partition
    without a committed quality output is built unweighted with a warning and a count."""
    store, code = corpus["store"], corpus["code"]
    python = [d for d in code if d["metadata"]["language"] == "Python"]
    commit_records(store, "code/files/mixed-1", python, 1000)
    train_code_quality(CodeQualityConfig(languages=[]), store, "mixed-1", tmp_path)  # Python only
    commit_records(store, "code/files/mixed-1", code, 1000)  # a new version: Lua joins after the weights
    config = MixtureConfig(weights={"code": 1.0}, heldout_fraction=0.0, shard_tokens=2048)
    result = build_token_shards(
        config, store, {"code": ["code/files/mixed-1/"]}, corpus["tok_dir"], "tokens/m"
    )
    n_lua = sum(d["metadata"]["language"] == "Lua" for d in code)
    assert (
        result.metrics["code_language_unweighted/lua"] == n_lua == result.metrics["code_language_copies/lua"]
    )
    assert "code_language_unweighted/python" not in result.metrics
    assert "code_language_weights_missing" not in result.metrics

    commit_records(store, "code/files/noq-1", code[:50], 1000)
    with caplog.at_level("WARNING", logger="training.data"):
        result = build_token_shards(
            config, store, {"code": ["code/files/noq-1/"]}, corpus["tok_dir"], "tokens/n"
        )
    assert result.metrics["code_language_weights_missing"] == 1
    assert "no committed code quality output" in caplog.text and "noq-1" in caplog.text


def test_weights_of_another_shape_fail_naming_the_file_and_key(corpus, tmp_path):
    store = corpus["store"]
    commit_records(store, "code/files/flat-1", corpus["code"][:5], 1000)
    (tmp_path / "sampling_weights.json").write_text(json.dumps({"python": 1.0, "lua": 2.5}))
    commit(store, "code/quality/flat-1", {"sampling_weights.json": tmp_path / "sampling_weights.json"})
    with pytest.raises(
        ValueError, match=r"(?s)flat-1/v-\w+/sampling_weights.json.*key 'languages'.*key 'lua'"
    ):
        build_token_shards(MixtureConfig(weights={"code": 1.0}), store, {"code": ["code/files/flat-1/"]},
                           corpus["tok_dir"], "tokens/flat")  # fmt: skip


def test_mixture_proportions(corpus):
    paths = shard_paths(corpus["store"], corpus["result"].outputs["manifest"], "train")
    weights = corpus["result"].extra["manifest"]["weights"]
    assert weights == pytest.approx({"code": 0.3, "math": 0.2, "web": 0.5})
    batches = TokenBatches(paths, seq_len=32, batch_size=16, seed=7, weights=weights)
    counts = {s: 0 for s in weights}
    for pos in range(200):
        for [(source, _, _)] in batches.plan(pos):
            counts[source] += 1
    total = sum(counts.values())
    for source, weight in weights.items():
        assert counts[source] / total == pytest.approx(weight, abs=0.03)


def test_a_source_past_its_epoch_cap_gives_its_share_to_the_others():
    tokens = {"web": 1_000, "math": 10_000, "code": 1_000_000}
    weights = {"web": 0.5, "math": 0.3, "code": 0.2}
    capped = cap_source_epochs(weights, tokens, 100_000, 4.0)
    epochs = source_epochs(capped, tokens, 100_000)
    assert sum(capped.values()) == pytest.approx(1.0)
    assert epochs["web"] == pytest.approx(4.0) and capped["web"] == pytest.approx(0.04)
    # the 0.46 web gives up goes to math and code 3:2, which pushes math past its own cap (0.576 > 0.4): capped too
    assert epochs["math"] == pytest.approx(4.0) and capped["code"] == pytest.approx(1 - 0.04 - 0.4)
    # a cap no source reaches changes nothing; None is the mixture as configured
    assert cap_source_epochs(weights, tokens, 100, 4.0) == pytest.approx(weights)
    assert cap_source_epochs(weights, tokens, 100_000, None) == pytest.approx(weights)
    # uncapped sources keep their ratio to each other
    three = cap_source_epochs({"web": 0.6, "math": 0.1, "code": 0.3}, tokens, 100_000, 4.0)
    assert three["web"] == pytest.approx(0.04) and three["code"] / three["math"] == pytest.approx(3.0)
    # a run longer than 4 passes over everything: every source repeats equally, the fewest passes possible
    equal = source_epochs(cap_source_epochs(weights, tokens, 10_000_000, 4.0), tokens, 10_000_000)
    assert len({round(e, 9) for e in equal.values()}) == 1 and equal["web"] < 10.0


def test_batches_deterministic_and_resumable(corpus):
    paths = shard_paths(corpus["store"], corpus["result"].outputs["manifest"], "train")
    a = TokenBatches(paths, seq_len=64, batch_size=4, seed=3)
    first = [next(a) for _ in range(10)]
    assert first[0]["input_ids"].shape == (4, 64)
    assert first[0]["input_ids"].dtype.is_floating_point is False
    b = TokenBatches(paths, seq_len=64, batch_size=4, seed=3)
    assert all((x["input_ids"] == next(b)["input_ids"]).all() for x in first)
    # Resume from a saved position reproduces the tail exactly.
    state = {"position": 6, "seed": 3}
    c = TokenBatches(paths, seq_len=64, batch_size=4, seed=3)
    c.load_state_dict(state)
    assert all((x["input_ids"] == next(c)["input_ids"]).all() for x in first[6:])
    d = TokenBatches(paths, seq_len=64, batch_size=4, seed=3, start_position=6)
    assert (next(d)["input_ids"] == first[6]["input_ids"]).all()
    assert d.state_dict() == {"position": 7, "seed": 3}
    other = TokenBatches(paths, seq_len=64, batch_size=4, seed=4)
    assert not (next(other)["input_ids"] == first[0]["input_ids"]).all()


def test_windows_are_real_token_runs(corpus):
    paths = shard_paths(corpus["store"], corpus["result"].outputs["manifest"], "train")
    stream = np.concatenate([np.load(p) for p in paths["math"]]).astype(np.int64)
    batches = TokenBatches({"math": paths["math"]}, seq_len=50, batch_size=3, seed=1)
    for [(source, start, n)], row in zip(batches.plan(0), batches.batch_at(0)["input_ids"], strict=True):
        assert (source, n) == ("math", 50)
        assert (row.numpy() == stream[start : start + 50]).all()


def test_repeat_rows_copy_a_passage(corpus):
    paths = shard_paths(corpus["store"], corpus["result"].outputs["manifest"], "train")
    batches = TokenBatches(paths, seq_len=96, batch_size=8, seed=2, repeat_share=0.5)
    repeated = 0
    for pos in range(50):
        for pieces, row in zip(batches.plan(pos), batches.batch_at(pos)["input_ids"].numpy(), strict=True):
            assert len(row) == 96 and sum(n for _, _, n in pieces) == 96
            if len(pieces) == 3:
                repeated += 1
                n = pieces[0][2]
                assert 96 // 8 <= n <= 96 // 3 and pieces[0] == pieces[2]
                assert (row[:n] == row[-n:]).all()  # the passage comes back after the gap
    assert repeated / (50 * 8) == pytest.approx(0.5, abs=0.06)
    plain = TokenBatches(paths, seq_len=96, batch_size=8, seed=2)
    assert all(len(p) == 1 for p in plain.plan(0))
    with pytest.raises(ValueError, match="repeat_share"):
        TokenBatches(paths, seq_len=96, batch_size=8, repeat_share=1.5)


def test_unknown_source_fails_with_name(corpus):
    with pytest.raises(ValueError, match="books"):
        build_token_shards(
            MixtureConfig(), corpus["store"], {"books": ["x/"]}, corpus["tok_dir"], "tokens/bad"
        )


def test_ranks_draw_different_rows_and_heldout_batches_are_fixed(corpus):
    from training.data import heldout_batches, token_batches

    paths = shard_paths(corpus["store"], corpus["result"].outputs["manifest"], "train")
    r0 = token_batches(rank=0, world_size=2, shard_paths=paths, seq_len=32, batch_size=4, seed=5)
    r1 = token_batches(rank=1, world_size=2, shard_paths=paths, seq_len=32, batch_size=4, seed=5)
    assert not (next(r0)["input_ids"] == next(r1)["input_ids"]).all()
    held = shard_paths(corpus["store"], corpus["result"].outputs["manifest"], "heldout")
    a = heldout_batches(held, seq_len=16, batch_size=2, max_batches=2)
    b = heldout_batches(held, seq_len=16, batch_size=2, max_batches=2)
    assert len(a) == 2 * 3 and all(
        (x["input_ids"] == y["input_ids"]).all() for x, y in zip(a, b, strict=True)
    )
    halves = [heldout_batches(held, 16, 2, 2, rank=r, world_size=2) for r in (0, 1)]
    assert sum(len(h) for h in halves) == len(a)


def test_a_failed_rebuild_leaves_the_committed_shards_readable_and_unchanged(corpus, tmp_path):
    """On 98a639e shards were written in place and the manifest last: a rebuild that failed midway had already
    replaced the files the old manifest names, so readers got the new run's tokens under the old manifest."""
    store = LocalStore(tmp_path / "store")
    for snap, docs in corpus["web"].items():
        _commit_docs(store, f"web/filtered/{snap}", {"kept/00000.jsonl.gz": docs})
    cfg = MixtureConfig(weights={"web": 1.0, "code": 1.0}, heldout_fraction=0.0, shard_tokens=1024)
    first = build_token_shards(cfg, store, {"web": ["web/filtered/2026-10/kept/"]}, corpus["tok_dir"], "tok")

    def tokens() -> list[bytes]:
        return [np.load(p).tobytes() for p in shard_paths(store, first.outputs["manifest"], "train")["web"]]

    before = tokens()
    assert len(before) > 1  # several shard files, so a partial rewrite would show
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip")  # fails after web's shards are written
    commit(store, "code/files/broken", {"00000.jsonl.gz": tmp_path / "broken.jsonl.gz"})
    sources = {"web": ["web/filtered/2026-11/kept/"], "code": ["code/files/broken/"]}
    with pytest.raises(gzip.BadGzipFile):
        build_token_shards(cfg, store, sources, corpus["tok_dir"], "tok")
    assert tokens() == before


def test_rebuilding_the_same_shards_gives_the_same_bytes_and_version(corpus):
    """The meta .gz carried gzip's timestamp: each rebuild of unchanged data committed a new version, and the
    training specs record shard paths under it, so a finished pretraining no longer matched its run dir."""
    import time

    time.sleep(1.1)  # gzip's header time has one-second resolution
    config = MixtureConfig(
        weights={"web": 0.5, "code": 0.3, "math": 0.2}, heldout_fraction=0.1, shard_tokens=2048
    )
    sources = {
        "web": ["web/filtered/2026-10/kept/", "web/filtered/2026-11/kept/"],
        "code": ["code/files/pypi-1/"],
        "math": ["math/kept/m1/"],
    }
    before = read_committed(corpus["store"], "tokens/v1").version
    again = build_token_shards(config, corpus["store"], sources, corpus["tok_dir"], "tokens/v1")
    assert again.data_version == corpus["result"].data_version
    # the committed version names the shard paths a training spec records: it must not move either
    assert read_committed(corpus["store"], "tokens/v1").version == before


def test_a_loss_mask_beside_a_shard_keeps_labels_on_its_targets_only(tmp_path):
    from training.data import heldout_batches, write_targets

    rows = np.arange(4 * 8, dtype=np.uint16).reshape(4, 8)
    masked, plain = tmp_path / "masked.tokens.npy", tmp_path / "plain.tokens.npy"
    np.save(masked, rows.reshape(-1))
    np.save(plain, rows.reshape(-1) + 100)
    targets = np.zeros(rows.shape, dtype=bool)
    targets[:, -2:] = True  # the last two tokens of every row
    write_targets(masked, targets)
    batches = TokenBatches({"a": [masked], "b": [plain]}, seq_len=8, batch_size=16, aligned=True, seed=3)
    batch = batches.batch_at(0)
    sources = [pieces[0][0] for pieces in batches.plan(0)]
    assert set(sources) == {"a", "b"}
    for source, ids, labels in zip(sources, batch["input_ids"], batch["labels"], strict=True):
        if source == "a":  # labels on the masked positions only, equal to the tokens there
            assert (labels[:-2] == -100).all() and (labels[-2:] == ids[-2:]).all()
        else:  # a shard without a mask trains on every token
            assert (labels == ids).all()
    (held,) = heldout_batches([masked], seq_len=8, batch_size=4, max_batches=1)
    assert (held["labels"][:, :-2] == -100).all() and (
        held["labels"][:, -2:] == held["input_ids"][:, -2:]
    ).all()
    # A mask for only some shards of a source, or of the wrong length, would shift labels: refused.
    with pytest.raises(ValueError, match="loss masks missing"):
        TokenBatches({"a": [masked, plain]}, seq_len=8, batch_size=2, aligned=True)
    write_targets(masked, targets[:3])
    with pytest.raises(ValueError, match="hold 24 entries for 32 tokens"):
        TokenBatches([masked], seq_len=8, batch_size=2, aligned=True)
