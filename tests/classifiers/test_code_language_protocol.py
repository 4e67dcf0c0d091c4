"""The code-language held-out protocol (issue 19): split by project, frozen sets checked by hash, temperature
scaling, ECE and the confident-error rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from classifiers.code_language_protocol import (
    UNKNOWN,
    apply_temperature,
    calibration_report,
    component_groups,
    decide_unknown,
    expected_calibration_error,
    extend_split,
    fit_temperature,
    frozen_digest,
    frozen_set,
    load_frozen,
    match_frozen,
    paired_project_bootstrap,
    split_groups,
    write_frozen,
)
from classifiers.code_language_rules import language_from_path

DATA = Path(__file__).resolve().parents[2] / "classifiers" / "data"


def _files(label: str, groups: int, per_group: int) -> list[dict]:
    return [{"label": label, "group": f"{label}-p{g}", "path": f"src/m{g}/f{i}.x", "text": f"{label} {g} {i}"}
            for g in range(groups) for i in range(per_group)]  # fmt: skip


def test_split_is_by_project_and_every_label_reaches_each_split():
    files = _files("Python", 10, 5) + _files("SQL", 3, 8) + _files("Zig", 5, 4)
    where = split_groups(files, seed=0)
    assert set(where) == {f["group"] for f in files}
    for label in ("Python", "SQL", "Zig"):
        splits = {where[f["group"]] for f in files if f["label"] == label}
        assert splits == {"train", "dev", "test"}, label
    assert split_groups(files, seed=0) == where  # deterministic


def test_extend_split_keeps_earlier_held_out_projects_and_splits_only_new_labels():
    old = _files("Python", 10, 5) + _files("SQL", 6, 4)
    logs = [{**f, "label": UNKNOWN, "how": "log"} for f in _files("log", 8, 3)]
    prose = [{**f, "label": UNKNOWN, "how": "prose"} for f in _files("doc", 8, 3)]
    previous = {g: s for g, s in split_groups(old + prose, seed=0).items() if s != "train"}
    # since: a new language, a new kind of unknown text, new projects of an old label, and an old training
    # project that now also ships files of the new language
    mixed = [
        {"label": "TOML", "group": "Python-p0", "path": f"cfg{i}.toml", "text": f"t{i}"} for i in range(3)
    ]
    mixed = mixed if previous.get("Python-p0") is None else []
    # a held-out project of the earlier version held two PowerShell files, too few for a label then
    held = next(iter(previous))
    stray = [{"label": "PowerShell", "group": held, "path": f"w{i}.ps1", "text": f"ps{i}"} for i in range(2)]
    new = _files("TOML", 7, 4) + _files("PowerShell", 7, 4) + _files("Python", 14, 5)[10 * 5 :]
    files = old + prose + logs + new + mixed + stray
    where = extend_split(files, previous, {"Python", "SQL", UNKNOWN}, seed=0)
    assert all(where[g] == s for g, s in previous.items())  # no earlier held-out project moves
    for label in ("TOML", "PowerShell", "log"):  # new split labels reach every split
        assert {where[f["group"]] for f in files if f["group"].startswith(label)} == {"train", "dev", "test"}
    assert {where[f"Python-p{g}"] for g in range(10, 14)} == {"train"}  # new projects of an old label train
    assert all(where[f["group"]] == "train" for f in mixed)  # an old training project stays in training
    assert extend_split(files, previous, {"Python", "SQL", UNKNOWN}, seed=0) == where


def test_component_groups_split_a_one_project_label():
    files = [{"label": "Elixir", "group": "deb:elixir", "path": f"elixir/lib/{c}/lib/f{i}.ex", "text": "x"}
             for c in ("mix", "ex_unit", "iex", "eex") for i in range(3)] + _files("C", 5, 2)  # fmt: skip
    made = component_groups(files, min_groups=4)
    assert made == {"Elixir": 4}
    assert {f["group"] for f in files if f["label"] == "Elixir"} == {
        "deb:elixir#mix/lib",
        "deb:elixir#ex_unit/lib",
        "deb:elixir#iex/lib",
        "deb:elixir#eex/lib",
    }


def test_frozen_set_round_trip_and_tamper(tmp_path):
    frozen = frozen_set(_files("Go", 2, 2), "test", seed=0)
    path = tmp_path / "t.json"
    digest = write_frozen(frozen, path)
    assert load_frozen(path) == frozen and digest == frozen_digest(frozen)
    with pytest.raises(ValueError, match="frozen with another content"):
        write_frozen(frozen_set(_files("Go", 3, 2), "test", seed=0), path)
    path.write_text(json.dumps({**frozen, "groups": ["Go-p9"]}))
    with pytest.raises(ValueError, match="does not match"):
        load_frozen(path)


def test_match_frozen_scores_only_frozen_files_and_bounds_the_drift():
    held = _files("Python", 4, 50) + _files(UNKNOWN, 2, 50)
    frozen = frozen_set(held, "test", 0)
    held[-1]["text"] += " (a Debian update to this changelog)"  # one unknown file changed upstream
    for f in held:
        f["split"] = "test"
    info = match_frozen(held, frozen)
    assert (info["frozen_files"], info["frozen_missing"], info["not_frozen"]) == (300, 1, 1)
    assert held[-1]["split"] == "not_frozen"  # neither trained on nor scored
    assert sum(f["split"] == "test" for f in held) == 299
    held[0]["text"] += " changed"
    with pytest.raises(ValueError, match="2 of 300 files are missing") as err:
        match_frozen(held, frozen)  # 2 > 0.5% of 300
    assert "('Python', 1)" in str(err.value) and "('unknown', 1)" in str(err.value)
    gone = [f for f in held if f["group"] != "Python-p3"]
    with pytest.raises(ValueError, match="projects with no file: \\['Python-p3'\\]"):
        match_frozen(gone, frozen)


@pytest.mark.parametrize("version", ["v1", "v2", "v3", "v4"])
def test_repo_frozen_test_set_matches_its_hash(version):
    frozen = load_frozen(DATA / f"code_language_test_{version}.json")  # raises on a mismatch with its .sha256
    dev = load_frozen(DATA / f"code_language_dev_{version}.json")
    assert not set(frozen["groups"]) & set(dev["groups"])  # disjoint by project
    assert not {h for h, _ in frozen["files"]} & {h for h, _ in dev["files"]}


def test_temperature_scaling_and_fit():
    p = {"a": 0.9, "b": 0.1}
    assert apply_temperature(p, 1.0) == p
    hot = apply_temperature(p, 2.0)
    assert hot["a"] == pytest.approx(0.75) and sum(hot.values()) == pytest.approx(1.0)
    # overconfident: right 75% of the time at 0.99 -> a temperature > 1 is fit
    probs = [{"a": 0.99, "b": 0.01}] * 4
    assert fit_temperature(probs, ["a", "a", "a", "b"]) > 1.5


def test_ece_and_confident_errors():
    assert expected_calibration_error([1.0, 1.0], [True, True]) == 0.0
    assert expected_calibration_error([0.9, 0.9], [True, False]) == pytest.approx(0.4)
    rep = calibration_report(["a", "b", "a"], ["a", "a", "a"], [0.995, 0.999, 0.5])
    assert rep["confident_predictions"] == 2 and rep["confident_errors"] == 1
    assert rep["confident_error_rate"] == 0.5
    assert decide_unknown({"a": 0.4, "b": 0.3}, 0.5) == (UNKNOWN, 0.4)
    assert decide_unknown({"a": 0.6}, 0.5) == ("a", 0.6)


def test_new_names_and_extensions():
    assert language_from_path("ci/Dockerfile.alpine") == "Dockerfile"
    assert language_from_path("Containerfile") == "Dockerfile"
    assert language_from_path("lapack/SRC/dgemm.f") == "Fortran"
    assert language_from_path("lib/std/mem.zig") == "Zig"


def test_classifier_temperature_keeps_the_argmax_and_matches_the_reference(tmp_path):
    from classifiers.code_language import CodeLanguageClassifier, train_code_language_model
    from classifiers.fasttext_train import FastTextParams, predict_proba

    py = ["import os\ndef f(x):\n    return x + 1\n", "for i in range(3):\n    print(i)\n"] * 10
    c = ["#include <stdio.h>\nint main(void) { return 0; }\n", "static int g(int x) { return x * 2; }\n"] * 10
    examples = [("Python", t) for t in py] + [("C", t) for t in c]
    path = tmp_path / "m.bin"
    train_code_language_model(examples, FastTextParams(epoch=5, dim=8, bucket=1000, threads=1, seed=0), path)
    raw = CodeLanguageClassifier.load(path)
    hot = CodeLanguageClassifier.load(path, temperature=2.0)
    texts = ["def g(y):\n    return y\n", "int h(void) { return 1; }\n"]
    ref = [apply_temperature(p, 2.0) for p in predict_proba(raw.model, [raw.features.line(t) for t in texts])]
    for top1, full, r in zip(
        hot.predict_content(texts, k=1), hot.predict_content(texts, k=-1), ref, strict=True
    ):
        ((lang, p),) = top1.items()
        assert lang == max(r, key=r.get) == max(full, key=full.get)
        assert p == pytest.approx(r[lang], abs=1e-6) and sum(full.values()) == pytest.approx(1.0, abs=1e-6)
    # worker processes load the model with its temperature too (they used the raw softmax before)
    many = texts * 200
    assert hot.predict_content(many, k=1, workers=2) == hot.predict_content(many, k=1)


def test_repo_v3_keeps_every_v2_held_out_project():
    # v3 extends v2 (extend_split): only v2's machine-log groups are gone (v3 reads packaged logs instead)
    for name in ("test", "dev"):
        v2, v3 = (set(load_frozen(DATA / f"code_language_{name}_{v}.json")["groups"]) for v in ("v2", "v3"))
        gone = v2 - v3
        assert gone and all(g.startswith("log:") for g in gone), sorted(gone)[:5]
        assert not v3 & set(
            load_frozen(DATA / f"code_language_{'dev' if name == 'test' else 'test'}_v3.json")["groups"]
        )


def test_repo_v4_is_v3_test_byte_for_byte_and_v3_dev_plus_the_dev_only_projects():
    import yaml

    assert (DATA / "code_language_test_v4.json").read_bytes() == (
        DATA / "code_language_test_v3.json"
    ).read_bytes()
    v3, v4 = (load_frozen(DATA / f"code_language_dev_{v}.json") for v in ("v3", "v4"))
    assert set(v3["groups"]) < set(v4["groups"]) and set(map(tuple, v3["files"])) <= set(
        map(tuple, v4["files"])
    )
    manifest = yaml.safe_load((DATA / "code_language_dev_extra.yaml").read_text())["sources"]
    added = set(v4["groups"]) - set(v3["groups"])
    assert added == {f"{s['kind']}:{s['name']}" for s in manifest}  # every dev-only project gave dev files
    assert len(v4["files"]) - len(v3["files"]) > 3000


def test_paired_project_bootstrap_resolves_broad_gains_not_one_projects():
    groups = [f"p{i // 20}" for i in range(2000)]  # 100 projects of 20 files
    a = [i % 10 != 0 for i in range(2000)]  # 90% right
    assert paired_project_bootstrap(a, a, groups) == (0.0, 0.0, 0.0)
    broad = [x or (i % 20 == 0 and i % 80 != 0) for i, x in enumerate(a)]  # a fix in 3 of every 4 projects
    diff, lo, hi = paired_project_bootstrap(a, broad, groups)
    assert diff == pytest.approx(0.0375) and 0 < lo < diff < hi
    one = [x or g == "p7" for x, g in zip(a, groups, strict=True)]  # all of one project's errors fixed
    one = [y if g != "p8" else False for y, g in zip(one, groups, strict=True)]  # and one project broken
    diff, lo, hi = paired_project_bootstrap(a, one, groups)
    assert diff == pytest.approx((2 - 18) / 2000) and lo < 0 < hi  # a project each way: not resolved
    assert paired_project_bootstrap(a, one, groups, seed=3) == paired_project_bootstrap(
        a, one, groups, seed=3
    )
    with pytest.raises(ValueError):
        paired_project_bootstrap([], [], [])


def test_dev_only_projects_regroup_nothing_never_train_and_may_not_share_a_training_project():
    from pipelines.code.language_protocol import check_dev_only_groups, frozen_side

    def elixir() -> list[dict]:
        return [{"label": "Elixir", "group": "deb:elixir", "path": f"elixir/lib/{c}/lib/f{i}.ex", "text": "x"}
                for c in ("mix", "ex_unit") for i in range(3)] + _files("Elixir", 2, 3)  # fmt: skip

    before = elixir()
    component_groups(before, min_groups=4)
    # two dev-only projects bring Elixir to five: counted, they would stop splitting deb:elixir by component and
    # move the frozen sets' `deb:elixir#mix/lib` files into training
    dev = [{**f, "dev_only": True} for f in _files("Elixir", 4, 3)[6:]]
    after = elixir() + dev
    assert component_groups(after, min_groups=4) == {"Elixir": 2}
    assert [f["group"] for f in after[: len(before)]] == [f["group"] for f in before]
    assert {f["group"] for f in dev} == {"Elixir-p2", "Elixir-p3"}

    test, dev_groups = {"Elixir-p0"}, {"Elixir-p2"}
    sides = {f["group"]: frozen_side({**f, "over_cap": False}, test, dev_groups) for f in after}
    assert sides["Elixir-p0"] == "test" and sides["Elixir-p1"] == "train" and sides["Elixir-p2"] == "dev"
    assert sides["Elixir-p3"] == "unused_dev_only"  # a dev-only project the frozen dev set lacks never trains
    assert frozen_side({**dev[0], "over_cap": True}, test, dev_groups) == "over_cap"
    assert check_dev_only_groups(after) == {"Elixir-p2", "Elixir-p3"}
    with pytest.raises(
        ValueError, match=r"both in a dev-only crawl and in a training crawl: \['Elixir-p1'\]"
    ):
        check_dev_only_groups(after + [{**after[-1], "group": "Elixir-p1"}])


def test_marker_confidence_is_each_markers_dev_hit_rate_smoothed_with_pooled_fallbacks():
    from classifiers.code_language import marker_probability
    from classifiers.code_language_protocol import fit_marker_confidence

    hits = [("content:HTML", True)] * 126 + [("content:HTML", False)] + [("script:Shell", True)] * 18
    conf = fit_marker_confidence(hits)
    assert conf["content:HTML"] == round(127 / 129, 4) == 0.9845  # 126 of 127 right
    assert conf["script:Shell"] == round(19 / 20, 4)  # 18 of 18 is not certainty
    assert conf["content:*"] == conf["content:HTML"] and conf["*"] == round(145 / 147, 4)
    assert marker_probability(conf, "content:JSON") == conf["content:*"]  # a marker dev never saw: its kind's
    assert marker_probability(conf, "script:Ruby") == conf["script:*"]
    assert marker_probability({"*": 0.97}, "script:Ruby") == 0.97
    assert marker_probability(None, "content:HTML") == 1.0  # an uncalibrated model keeps markers decisive


def test_a_marker_decides_at_its_dev_probability_and_the_model_shares_out_the_rest(tmp_path):
    from classifiers.code_language import CodeLanguageClassifier, marker_of, train_code_language_model
    from classifiers.fasttext_train import FastTextParams

    php = ["<?php\necho $x;\nfunction f($a) { return $a; }\n", "<?php\n$y = array(1, 2);\n"] * 10
    c = ["#include <stdio.h>\nint main(void) { return 0; }\n", "static int g(int x) { return x * 2; }\n"] * 10
    path = tmp_path / "m.bin"
    examples = [("PHP", t) for t in php] + [("C", t) for t in c]
    train_code_language_model(examples, FastTextParams(epoch=5, dim=8, bucket=1000, threads=1, seed=0), path)
    page = '<!DOCTYPE html>\n<html><body><?php echo "hi"; ?></body></html>\n'
    assert marker_of(page) == ("content:HTML", "HTML") and marker_of("int x;\n") is None
    raw = CodeLanguageClassifier.load(path)
    assert raw.predict_content([page], k=-1) == [{"HTML": 1.0}]
    calibrated = CodeLanguageClassifier.load(path, marker_confidence={"content:HTML": 0.9, "*": 0.95})
    (full,) = calibrated.predict_content([page], k=-1)
    assert (
        full["HTML"] == 0.9 and sum(full.values()) == pytest.approx(1.0) and set(full) == {"HTML", "PHP", "C"}
    )
    model = raw._probabilities([raw.features.line(page)], k=-1)[0][0]
    assert full["PHP"] / full["C"] == pytest.approx(model["PHP"] / model["C"])  # the model's odds, kept
    assert calibrated.predict_content([page], k=1) == [{"HTML": 0.9}]
    assert calibrated.predict_content([page] * 400, k=1, workers=2) == [{"HTML": 0.9}] * 400  # workers too
    assert calibrated.predict_content(["#!/bin/sh\necho hi\n"], k=1) == [
        {"Shell": 0.95}
    ]  # the pooled fallback
