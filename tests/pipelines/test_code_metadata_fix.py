"""Metadata fix: ambiguous-extension language corrections, hash mismatch, wrong repo, unknown origin."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from code_snippets import corpus, snippet
from png_check import assert_drawn_png  # tests/pipelines is on sys.path (prepend import mode)

from classifiers.code_language import train_code_language_model
from classifiers.code_language_rules import declared_language
from classifiers.fasttext_train import FastTextParams
from infra.committed import read_committed
from infra.store import LocalStore
from pipelines.code.metadata_fix import MetadataFixConfig, fix_metadata
from pipelines.code.records import commit_records, make_record, read_shards, sha256_hex

FILES = {  # path -> the language its content is written in
    "src/view.h": "C++",
    "include/RNView.h": "Objective-C",
    "ios/View.m": "Objective-C",
    "scripts/smooth.m": "MATLAB",
    "lib/facts.pl": "Prolog",
    "lib/tool.pl": "Perl",
    "rtl/alu.v": "Verilog",
    "theories/Arith.v": "Coq",
    "i18n/app_de.ts": "XML",
    "src/app.ts": "TypeScript",
    "src/util.lua": "Lua",
    "src/main.py": "Python",
}


def _record(path: str, text: str, package: str = "pkg-a", sha: str | None = None) -> dict:
    declared = declared_language(path)
    return make_record(text, "npm", package, "1.0", path, len(text.encode()), sha or sha256_hex(text.encode()),
                       "MIT", declared, declared, "extension", "s1")  # fmt: skip


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fix")
    store = LocalStore(root / "store")
    rng = random.Random(5)
    texts = {path: snippet(lang, rng) for path, lang in FILES.items()}
    records = [_record(p, t) for p, t in texts.items()]
    origins = [{"source": "npm", "package": "pkg-a", "version": "1.0", "path": p, "sha256": sha256_hex(t.encode())}
               for p, t in texts.items()]  # fmt: skip
    # a record whose text no longer matches its recorded hash (truncated in transit)
    good = snippet("Lua", rng)
    records.append(_record("src/cut.lua", good[:-20], sha=sha256_hex(good.encode())))
    # records attributed to the wrong repo: pkg-a's src/extra.lua (not sampled into the snapshot itself), and
    # pkg-a's src/util.lua, which the snapshot already holds
    extra = snippet("Lua", rng)
    origins.append(
        {
            "source": "npm",
            "package": "pkg-a",
            "version": "1.0",
            "path": "src/extra.lua",
            "sha256": sha256_hex(extra.encode()),
        }
    )
    records.append(_record("lib/extra.lua", extra, package="pkg-b"))
    records.append(_record("src/util.lua", texts["src/util.lua"], package="pkg-b"))
    # content that no crawled package contains
    records.append(_record("src/ghost.py", "print('from nowhere')\n"))
    origins_gz = gzip.compress("".join(json.dumps(o) + "\n" for o in origins).encode())
    commit_records(
        store, "code/raw/s1", records, 100, extra={"origins.jsonl.gz": origins_gz}
    )  # as the crawl does
    params = FastTextParams(epoch=15, dim=16, threads=1, bucket=20_000, min_count=1)
    model_path = root / "lang.bin"
    train_code_language_model([(lang, t) for lang, _, t in corpus(40, seed=1)], params, model_path)
    result = fix_metadata(MetadataFixConfig(), store, "s1", model_path=model_path)
    out = {(r["metadata"]["package"], r["metadata"]["path"]): r for r in read_shards(store, "code/files/s1")}
    return result, out, store


def test_ambiguous_extensions_are_corrected_by_content(fixed):
    _, out, _ = fixed
    for path, lang in FILES.items():
        meta = out[("pkg-a", path)]["metadata"]
        assert meta["language"] == lang, path
        assert meta["declared_language"] == declared_language(path)
    assert out[("pkg-a", "scripts/smooth.m")]["metadata"]["language_reason"] == "ambiguous_resolved"


def test_corrections_and_drops_are_counted_per_reason(fixed):
    result, out, store = fixed
    m = result.metrics
    assert m["seen"] == len(FILES) + 4
    assert m["dropped/hash_mismatch"] == 1
    assert m["dropped/unknown_origin"] == 1
    assert m["corrected/wrong_repo"] == 2
    assert m["dropped/duplicate_origin"] == 1
    assert m["kept"] == len(FILES) + 1
    # declared -> content: .h C->C++ and C->ObjC, .m ObjC->MATLAB, .pl Perl->Prolog, .v Verilog->Coq, .ts TS->XML
    assert m["corrected/language/ambiguous_resolved"] == 6
    assert not any("->" in k for k in m)  # extension / language pairs are report rows, not metric keys
    fix_stats = store.get_json(read_committed(store, "code/files/s1").key("fix_stats.json"))
    pairs = {(c["extension"], c["declared"], c["corrected"]): c["files"] for c in fix_stats["corrections"]}
    assert pairs[(".m", "Objective-C", "MATLAB")] == 1 and pairs[(".ts", "TypeScript", "XML")] == 1
    assert sum(pairs.values()) == 6
    assert (
        "dropped/hash_mismatch" in result.report_md
        and "| .m | Objective-C | MATLAB | 1 |" in result.report_md
    )
    assert fix_stats["stats"]["kept"] == m["kept"]


def test_wrong_repo_record_is_reattributed_to_the_package_holding_its_content(fixed):
    _, out, _ = fixed
    moved = [r for r in out.values() if r["metadata"].get("original_origin")]
    assert len(moved) == 1
    meta = moved[0]["metadata"]
    assert (meta["package"], meta["path"]) == ("pkg-a", "src/extra.lua")
    assert meta["original_origin"] == "npm:pkg-b@1.0:lib/extra.lua"
    assert not [key for key in out if key[0] == "pkg-b"]


def test_language_mix_plot_counts_the_written_files(fixed):
    result, out, _ = fixed
    assert set(result.artifacts) == {"plots/language_mix.png"}
    assert_drawn_png(result.artifacts["plots/language_mix.png"])
    mix = result.extra["plots"]["language_mix"]["panels"]
    langs = sorted(result.extra["languages"], key=lambda k: (-result.extra["languages"][k], k))
    assert mix["files"]["files"] == [result.extra["languages"][k] for k in langs]
    assert sum(mix["files"]["files"]) == len(out) == result.metrics["kept"]
    kib = sum(len(r["text"].encode()) for r in out.values()) / 1024
    assert sum(mix["size (KiB of UTF-8 text)"]["KiB"]) == pytest.approx(kib, abs=0.1 * len(langs))
