"""Code language ID stage: the evaluation reports accuracy per label source, and its headline counts only files
labelled by an unambiguous extension (the classifier reads the `#!` lines and constructs that label the others)."""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path, PurePosixPath

import pytest
from code_snippets import snippet

from classifiers.code_language import CHAR_MODEL, CodeLanguageClassifier
from infra.committed import fetch_file, is_committed, read_committed
from infra.store import LocalStore
from pipelines.code.language_id import CodeLanguageIdConfig, train_code_language_classifier
from pipelines.code.records import commit_records, make_record, read_shards, sha256_hex

SHEBANGS = {
    "Python": "#!/usr/bin/env python3\n",
    "Perl": "#!/usr/bin/perl -w\n",
    "Lua": "#!/usr/bin/env lua\n",
}
EXT = {"Python": ".py", "Perl": ".pm", "Lua": ".lua", "C++": ".cpp"}


def _files(pkg: int, rng: random.Random) -> list[tuple[str, str]]:
    """(path, text) of one package: files named by an unambiguous extension, extension-less scripts labelled by
    their shebang, `.h` headers labelled C++ by a marker, and Lua saved as `.py` (its label, Python, is wrong)."""
    out = [
        (f"src/{lang.lower()}_{i}{ext}", snippet(lang, rng)) for lang, ext in EXT.items() for i in range(4)
    ]
    out += [
        (f"bin/{lang.lower()}_tool{i}", sb + snippet(lang, rng))
        for lang, sb in SHEBANGS.items()
        for i in range(2)
    ]
    out += [(f"include/view{i}.h", snippet("C++", rng)) for i in range(2)]
    out += [(f"src/misnamed{pkg}.py", snippet("Lua", rng))]
    return out


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    store = LocalStore(tmp_path_factory.mktemp("langid") / "store")
    rng = random.Random(3)
    records = []
    for pkg in range(8):
        for path, text in _files(pkg, rng):
            records.append(make_record(text, "npm", f"pkg{pkg}", "1", path, len(text), sha256_hex(text.encode()),
                                       "MIT", None, None, "extension", "s1"))  # fmt: skip
    commit_records(store, "code/raw/s1", records, 1000)
    config = CodeLanguageIdConfig(min_files_per_language=10, min_test_files=2, epoch=5, dim=16, bucket=20_000,
                                  vocabulary_min_groups=0, test_fraction=0.3, frozen_version=None,
                                  label_snapshots={}, unknown_label=False)  # fmt: skip
    return train_code_language_classifier(config, store, "s1"), store


def test_headline_accuracy_counts_extension_labelled_files_only(stage):
    result, store = stage
    m = result.metrics
    raw = gzip.decompress(
        store.get_bytes(read_committed(store, "code/language_id/s1").key("heldout.jsonl.gz"))
    )
    heldout = [json.loads(line) for line in raw.splitlines()]
    texts = {r["id"]: r["text"] for r in read_shards(store, "code/raw/s1")}
    probs = CodeLanguageClassifier.load(result.extra["model_path"]).predict_content(
        [texts[h["id"]] for h in heldout], k=1
    )
    pred = {h["id"]: max(p, key=p.get) for h, p in zip(heldout, probs, strict=True)}
    # which held-out files were named by an unambiguous extension, from their paths alone
    by_ext = [h for h in heldout if PurePosixPath(h["path"]).suffix in {".py", ".pm", ".lua", ".cpp"}]
    scripts = [h for h in heldout if h["path"].startswith("bin/")]
    headers = [h for h in heldout if h["path"].endswith(".h")]
    assert len(by_ext) + len(scripts) + len(headers) == len(heldout) and scripts and headers
    ext_acc = sum(pred[h["id"]] == h["label"] for h in by_ext) / len(by_ext)
    all_acc = sum(pred[h["id"]] == h["label"] for h in heldout) / len(heldout)
    assert m["heldout_files/extension_only"] == len(by_ext)
    assert m["accuracy/extension_only"] == pytest.approx(ext_acc)
    assert m["heldout_files"] == len(heldout) and m["accuracy"] == pytest.approx(all_acc)
    # every shebang-labelled script is "right" (its `#!` line decides the prediction), so mixing them in would
    # raise the headline: the misnamed Lua files keep it below the all-files figure
    assert m["accuracy/label_source/shebang"] == 1.0 and m["heldout_files/label_source/shebang"] == len(
        scripts
    )
    assert m["heldout_files/label_source/heuristic"] == len(headers)
    assert m["accuracy/extension_only"] < m["accuracy"]
    # the same scripts with their first (`#!`) line cut off: the content alone decides
    cut = CodeLanguageClassifier.load(result.extra["model_path"]).predict_content(
        [texts[h["id"]].split("\n", 1)[1] for h in scripts], k=1
    )
    cut_acc = sum(max(p, key=p.get) == h["label"] for h, p in zip(scripts, cut, strict=True)) / len(scripts)
    assert m["accuracy/shebang_line_removed"] == pytest.approx(cut_acc)
    assert "accuracy/extension_only" in result.report_md.split("\n")[1]


def test_stage_files_share_one_artifact_dir_so_the_asset_removes_them_once_logged(stage):
    import infra.figures

    result, _ = stage
    root = infra.figures.ARTIFACT_ROOT.resolve()
    dirs = {Path(p).resolve().relative_to(root).parts[0] for p in result.artifacts.values()}
    assert any(k.startswith("model/code_language.") for k in result.artifacts)  # the model is among them
    assert len(dirs) == 1 and dirs.pop().startswith("crucible-langid-")


def test_benchmark_defaults_to_the_code_snapshot_make_run_creates(monkeypatch):
    import importlib.util

    import assets.cli as cli
    from infra.settings import REPO_ROOT

    spec = importlib.util.spec_from_file_location(
        "code_lang_id", REPO_ROOT / "benchmarks" / "code_lang_id.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen = {}
    monkeypatch.setattr(cli, "cmd_run", lambda args: seen.update(vars(args)) or 0)
    assert cli.main(["run"]) == 0  # `make run` runs `crucible run` with its defaults
    assert bench.build_parser().parse_args([]).snapshot == seen["code_snapshot"] == "code-0001"


def test_packaged_logs_unpack_only_matching_members_of_the_cached_deb(tmp_path, monkeypatch):
    # the `unknown` label's logs come from a pinned .deb; a cached download is read without the network
    import shutil
    import subprocess

    from pipelines.code import language_protocol as protocol

    if shutil.which("dpkg-deb") is None:
        pytest.skip("needs dpkg-deb to build a package")
    root = tmp_path / "pkg"
    logs = root / "usr/lib/python3/dist-packages/tool/tests/files/logs"
    logs.mkdir(parents=True)
    (logs / "sshd").write_text("Jan 1 00:00:01 host sshd[1]: Failed password for root\n" * 5)
    (logs / "empty").write_text("")
    (root / "usr/lib/python3/dist-packages/tool/core.py").write_text("print('not a log')\n")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(
        "Package: logtool\nVersion: 1.0-1\nArchitecture: all\nMaintainer: t <t@e>\nDescription: t\n"
    )
    cache = tmp_path / "cache"
    (cache / "debian" / "logtool_1.0-1").mkdir(parents=True)
    deb = cache / "debian" / "logtool_1.0-1" / "logtool_1.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True,
                   capture_output=True)  # fmt: skip
    monkeypatch.setattr(protocol, "PACKAGED_LOGS", {("logtool", "1.0-1"): "*/tests/files/logs/*"})
    files = protocol.packaged_log_files(cache)
    assert [f.name for f in files] == ["logtool__sshd"]  # the empty log and the code file are not taken
    assert "Failed password" in files[0].read_text()
    assert not list((cache / "unknown-logs").glob("*.partial"))  # published by rename
    deb.unlink()  # a second call reads the unpacked directory, not the package
    assert protocol.packaged_log_files(cache) == files


def _commit(
    store, snapshot: str, files_by_package: dict[str, list[tuple[str, str]]], source: str = "npm"
) -> None:
    records = [make_record(text, source, pkg, "1", path, len(text), sha256_hex(text.encode()), "MIT", None, None,
                           "extension", snapshot)
               for pkg, files in files_by_package.items() for path, text in files]  # fmt: skip
    commit_records(store, f"code/raw/{snapshot}", records, 1000)


def test_frozen_protocol_trains_label_snapshots_and_unknown_never_the_frozen_test_projects(
    tmp_path, monkeypatch
):
    from classifiers.code_language_protocol import frozen_set, write_frozen
    from pipelines.code import language_protocol as protocol
    from pipelines.code.crawl import default_cache_dir
    from pipelines.code.metadata_fix import MetadataFixConfig, fix_metadata
    from pipelines.code.quality import CodeQualityConfig, train_code_quality

    store = LocalStore(tmp_path / "store")
    rng = random.Random(5)
    _commit(store, "s1", {f"pkg{i}": _files(i, rng) for i in range(8)})
    # a label snapshot: TypeScript and Verilog, which the partition's crawl has none of
    labels = {f"hw{i}": [(f"rtl/core{j}.sv", snippet("Verilog", rng)) for j in range(6)]
              + [(f"ui/view{j}.tsx", snippet("TypeScript", rng)) for j in range(6)] for i in range(6)}  # fmt: skip
    _commit(store, "labels-1", labels, source="debian")
    # a dev-only snapshot: its projects may only ever be dev (one is in the frozen dev set, one is not)
    dev_only = {f"dv{i}": [(f"rtl/x{j}.sv", snippet("Verilog", rng)) for j in range(5)] for i in range(2)}
    _commit(store, "dev-1", dev_only, source="pypi")
    # the pinned packaged logs, already unpacked in the cache (no download); the rest of `unknown` is this machine's
    for (package, version), _ in protocol.PACKAGED_LOGS.items():
        logs = default_cache_dir() / "unknown-logs" / f"{package}_{version}"
        logs.mkdir(parents=True)
        (logs / f"{package}.log").write_text("".join(f"Jan {i % 28 + 1} sshd[{i}]: Failed password for root from "
                                                     f"10.0.{i % 7}.{i} port 22\n" for i in range(300)))  # fmt: skip
    unknown = protocol.unknown_files(default_cache_dir(), seed=0)
    unknown_groups = sorted({f["group"] for f in unknown})
    assert len(unknown_groups) >= 6
    # paths order the files (and so the training sample): none may name where this state or venv lives
    assert {f["path"].split("/", 1)[0] for f in unknown if f["how"] == "log"} == {"cache"}
    cache = str(default_cache_dir())  # once: each call loads the profile
    assert not [f for f in unknown if cache in f["path"] or sys.prefix in f["path"]]
    # the frozen split (what `benchmarks/code_lang_id.py train` writes once): test and dev projects of each label
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    test_groups = ["npm:pkg6", "debian:hw4", *unknown_groups[:3]]
    dev_groups = ["npm:pkg7", "debian:hw5", "pypi:dv0", *unknown_groups[3:6]]
    for name, groups in (("test", test_groups), ("dev", dev_groups)):
        write_frozen(frozen_set([{"group": g, "text": g, "label": "x"} for g in groups], name, 0),
                     frozen / f"code_language_{name}_t1.json")  # fmt: skip
    monkeypatch.setattr(protocol, "FROZEN_DIR", frozen)
    # a second label snapshot whose earlier crawl was killed: files under its prefix, no committed pointer
    store.put_bytes("code/raw/labels-2/v-0123456789abcdef/part-00000.jsonl.gz", b"half-written")
    snapshots = {"labels-1": "unused: already crawled", "labels-2": "pipelines/code/manifests/micro.yaml"}
    config = CodeLanguageIdConfig(label_snapshots=snapshots, dev_snapshots={"dev-1": "unused"}, frozen_version="t1",
                                  min_files_per_language=10, min_test_files=2, epoch=5, dim=16, bucket=20_000,
                                  vocabulary_min_groups=0, max_train_files_per_language=200)  # fmt: skip
    result = train_code_language_classifier(config, store, "s1")

    report = result.extra["report"].extra
    assert {"TypeScript", "Verilog", "unknown", "Python", "Lua"} <= set(report["train_counts"])
    assert not set(test_groups) & set(report["train_groups"])  # the frozen test projects never train
    assert (
        is_committed(store, "code/raw/labels-2") and "git:crucible" in report["train_groups"]
    )  # crawled anew
    assert set(report["test_groups"]) <= set(dev_groups) and "npm:pkg7" in report["test_groups"]
    assert "pypi:dv0" in report["test_groups"]  # the dev-only project the frozen dev set names is scored
    assert not {"pypi:dv0", "pypi:dv1"} & set(report["train_groups"])  # and no dev-only project trains
    assert {"Verilog", "unknown"} <= set(report["test_counts"])  # scored on the dev projects
    assert report["held_out"] == "frozen dev projects (t1)"
    lid = read_committed(store, "code/language_id/s1")
    calibration = json.loads(store.get_bytes(lid.key("calibration.json")))
    assert calibration["temperature"] == result.metrics["temperature"] != 1.0  # fit on dev (grid skips 1.0)
    assert "unknown" in calibration["labels"] and 0 <= calibration["ece"] <= 1
    # the dev projects' shebang scripts: each marker's dev hit rate, (n+1)/(n+2) at best, never 1
    assert "script:*" in calibration["marker_confidence"]
    assert all(0 < p < 1 for p in calibration["marker_confidence"].values())
    # what the protocol benchmark needs to score this model on the frozen test set, the one it was kept from
    assert (
        calibration["frozen_test_sha256"]
        == (frozen / "code_language_test_t1.json.sha256").read_text().split()[0]
    )
    assert calibration["epoch"] == 5 and calibration["dev_accuracy"] == round(result.metrics["accuracy"], 4)

    # metadata fix applies the committed temperature: a file's language score is the calibrated probability
    _commit(store, "s1", {f"pkg{i}": _files(i, rng) for i in range(2)})
    fix_metadata(MetadataFixConfig(), store, "s1")
    rec = next(r for r in read_shards(store, "code/files/s1") if r["metadata"]["path"].endswith(".lua"))
    # ... and the character view, committed next to the model, at the weight and threshold dev chose for it
    char_mix = {k: calibration[k] for k in ("char_weight", "char_below")}
    assert char_mix["char_weight"] > 0 and CHAR_MODEL in lid.files  # these dev files were better with it
    assert (
        result.metrics["char_weight"] == char_mix["char_weight"]
        and "Character view: mixed in" in result.report_md
    )
    calibrated = CodeLanguageClassifier.load(
        result.extra["model_path"],
        fetch_file(store, lid, CHAR_MODEL, tmp_path / CHAR_MODEL),
        temperature=calibration["temperature"],
        marker_confidence=calibration["marker_confidence"],
        **char_mix,
    )
    raw = CodeLanguageClassifier.load(result.extra["model_path"])
    lang = rec["metadata"]["language"]
    expected = round(calibrated.predict_content([rec["text"]], k=5)[0].get(lang, 0.0), 4)
    assert rec["metadata"]["language_score"] == expected
    assert round(raw.predict_content([rec["text"]], k=5)[0].get(lang, 0.0), 4) != expected
    # per-language quality names languages by this label set: an old or misspelt name fails before any work
    assert set(read_committed(store, "code/files/s1").meta["labels"]) == set(calibration["labels"])
    with pytest.raises(ValueError, match=r"code_quality.languages: \['Bash'\] are not labels"):
        train_code_quality(CodeQualityConfig(languages=["Lua", "Bash"]), store, "s1")


@pytest.mark.parametrize(
    "snapshot,sources",
    [("code-langs-0003", 50), ("code-langs-0004", 36), ("code-langs-0005", 39), ("code-langs-0006", 59)],
)
def test_label_snapshot_manifests_load_and_later_ones_add_no_frozen_held_out_project(snapshot, sources):
    """The label snapshots `make run` crawls (and the benchmark's candidate data) parse as code manifests;
    code-langs-0003 to -0005 and the candidate -0006 only add training projects (were one of their sources a frozen dev / test project, the
    frozen protocol would hold it out unscored, and a project already in another crawl would add nothing new)."""
    import importlib.util

    from classifiers.code_language_protocol import load_frozen
    from infra.settings import REPO_ROOT
    from pipelines.code.language_protocol import frozen_paths
    from pipelines.code.manifest import load_manifest

    spec = importlib.util.spec_from_file_location(
        "code_lang_id", REPO_ROOT / "benchmarks" / "code_lang_id.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    config = CodeLanguageIdConfig()
    crawls = {**config.label_snapshots, **config.dev_snapshots, **bench.CANDIDATE_SNAPSHOTS}
    manifests = {snap: load_manifest(REPO_ROOT / path) for snap, path in crawls.items()}
    assert all(m.sources for m in manifests.values())
    held_out = {
        g.split("#")[0]
        for path in frozen_paths(config.frozen_version).values()
        for g in load_frozen(path)["groups"]
    }
    newest = {f"{s.kind}:{s.name}" for s in manifests[snapshot].sources}
    assert len(newest) == len(manifests[snapshot].sources) == sources
    assert not newest & held_out
    others = {f"{s.kind}:{s.name}" for snap, m in manifests.items() if snap != snapshot for s in m.sources}
    for corpus in (
        "tiny",
        "heldout",
    ):  # code-0001 (the corpus crawl) and the older benchmark's held-out crawl
        others |= {
            f"{s.kind}:{s.name}"
            for s in load_manifest(REPO_ROOT / f"pipelines/code/manifests/{corpus}.yaml").sources
        }
    assert not newest & others


def test_dev_only_manifest_shares_no_project_with_training_or_the_frozen_sets():
    """Every project of a `dev_snapshots` manifest is new: in no label snapshot, corpus manifest or frozen v3 set
    (a shared project would put one project on both sides of the split; the pipeline refuses that at run time)."""
    from classifiers.code_language_protocol import load_frozen
    from infra.settings import REPO_ROOT
    from pipelines.code.language_protocol import frozen_paths
    from pipelines.code.manifest import load_manifest

    config = CodeLanguageIdConfig()
    assert config.dev_snapshots and not set(config.dev_snapshots) & set(config.label_snapshots)
    paths = [
        *config.label_snapshots.values(),
        *(f"pipelines/code/manifests/{m}.yaml" for m in ("tiny", "heldout")),
    ]
    training = {f"{s.kind}:{s.name}" for p in paths for s in load_manifest(REPO_ROOT / p).sources}
    frozen_v3 = {g.split("#")[0] for p in frozen_paths("v3").values() for g in load_frozen(p)["groups"]}
    for manifest in config.dev_snapshots.values():
        dev = [f"{s.kind}:{s.name}" for s in load_manifest(REPO_ROOT / manifest).sources]
        assert len(dev) == len(set(dev)) >= 90
        assert not set(dev) & (training | frozen_v3)


def test_benchmark_extends_a_frozen_version_with_dev_only_projects_keeping_its_test_file(
    tmp_path, monkeypatch
):
    """`code_lang_id.py train --extend-from`: the earlier test file is copied byte for byte (same sha256), dev gains
    the dev-only projects, and no dev-only project trains."""
    import importlib.util

    from classifiers.code_language_protocol import frozen_set, load_frozen, write_frozen
    from infra.settings import REPO_ROOT

    spec = importlib.util.spec_from_file_location(
        "code_lang_id", REPO_ROOT / "benchmarks" / "code_lang_id.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def files(group: str, label: str, n: int, dev_only: bool = False) -> list[dict]:
        return [{"group": group, "label": label, "path": f"src/f{i}.x", "text": f"{group} {label} {i}",
                 "over_cap": False, "dev_only": dev_only} for i in range(n)]  # fmt: skip

    data = [f for i in range(8) for f in files(f"npm:py{i}", "Python", 3)]
    data += files("pypi:devA", "Python", 4, dev_only=True) + files("pypi:devB", "Lua", 2, dev_only=True)
    for name, group in (("test", "npm:py0"), ("dev", "npm:py1")):
        # seed 7: a test set frozen anew by this run (seed 0) would differ from v1 in its bytes
        write_frozen(frozen_set([f for f in data if f["group"] == group], name, 7),
                     tmp_path / f"code_language_{name}_v1.json")  # fmt: skip
    monkeypatch.setattr(bench, "DATA_DIR", tmp_path)
    bench.use_frozen_version("v2")
    bench.assign_splits(data, seed=0, extend_from="v1")

    v1, v2 = (tmp_path / f"code_language_test_{v}.json" for v in ("v1", "v2"))
    assert v2.read_bytes() == v1.read_bytes()
    assert v2.with_suffix(".json.sha256").read_text() == f"{bench.frozen_digest_of(v1)}  {v2.name}\n"
    assert load_frozen(v2) == load_frozen(v1)  # and it verifies against its own sha256
    assert not list(tmp_path.glob("*.partial"))
    dev = load_frozen(tmp_path / "code_language_dev_v2.json")
    assert set(dev["groups"]) == {"npm:py1", "pypi:devA", "pypi:devB"}
    assert {f["split"] for f in data if f["dev_only"]} == {"dev"}
    assert {f["group"] for f in data if f["split"] == "test"} == {"npm:py0"}
