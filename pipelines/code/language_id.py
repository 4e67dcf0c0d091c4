"""Train and evaluate the content-only code-language classifier on one crawled snapshot.

Labels come from file names and unambiguous extensions (plus strong heuristics for ambiguous extensions and
shebangs of extension-less scripts, both switchable), by the labeller's own rules (`classifiers/
code_language_labels.py`). Evaluation holds out whole packages/repos, never random files, so near-duplicate files
of one project cannot sit on both sides of the split.

Accuracy is reported per label source. The classifier reads `#!` lines (a script's shebang language gets
probability 1.0) and corrects its model on constructs (`@interface`, `std::`, `function y = f(`) that the
heuristics for ambiguous extensions also label by, so on shebang- and heuristic-labelled files its score is
partly circular. The headline `accuracy/extension_only` counts files labelled by an unambiguous extension only;
`accuracy` counts every held-out file; `accuracy/label_source/<source>` each source; and
`accuracy/shebang_line_removed` scores shebang-labelled files with their `#!` line cut off.

The committed output `<out_prefix>/<snapshot>` (`infra.committed`) holds `code_language.bin` (model; `.ftz`
when quantized), `code_language_chars.bin` (the character view, when dev chose to mix it in), `calibration.json`,
`eval.json` (per-language P/R/F1, confusion matrix), `confusion.png` and `heldout.jsonl.gz` (ids and labels of the
held-out files).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import time
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from classifiers.code_language import (
    CHAR_MODEL,
    CHAR_PARAMS,
    CodeLanguageClassifier,
    fit_char_mix,
    fit_markers,
    train_char_model,
    train_code_language_model,
)
from classifiers.code_language_labels import LABEL_SOURCES, NAME_SOURCES, training_label
from classifiers.code_language_protocol import calibration_report, fit_temperature, split_by_component
from classifiers.fasttext_train import FastTextParams, classification_report, plot_confusion
from infra.committed import commit, is_committed
from infra.figures import artifact_dir
from infra.partition_keys import partition_prefix
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.code import language_protocol
from pipelines.code.crawl import CodeCrawlConfig, crawl_code, default_cache_dir
from pipelines.code.records import read_shards

log = logging.getLogger(__name__)
CALIBRATION = "calibration.json"  # the temperature fit on dev, with the label set (next to the model)


class CodeLanguageIdConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    in_prefix: str = Field("code/raw", description="Crawled records: <in_prefix>/<snapshot>/part-*.jsonl.gz")
    out_prefix: str = Field("code/language_id", description="Model + eval go to <out_prefix>/<snapshot>/")
    test_fraction: float = Field(
        0.3, gt=0, lt=1, description="Target share of each language's files held out"
    )
    min_files_per_language: int = Field(
        60, ge=1, description="Languages with fewer labelled files are left out"
    )
    min_test_files: int = Field(20, ge=1, description="Languages with fewer held-out files are not scored")
    max_train_files_per_language: int = Field(1500, ge=1, description="Cap per language (class balance)")
    label_snapshots: dict[str, str] = Field(
        {
            "code-langs-0001": "classifiers/data/code_language_extra.yaml",
            "code-langs-0002": "classifiers/data/code_language_extra2.yaml",
            "code-langs-0003": "classifiers/data/code_language_extra3.yaml",
            "code-langs-0004": "classifiers/data/code_language_extra4.yaml",
            "code-langs-0005": "classifiers/data/code_language_extra5.yaml",
        },
        description="Crawls that source the labels a corpus crawl lacks: snapshot -> manifest (repo-relative); "
        "crawled into <in_prefix>/<snapshot> once, then reused",
    )
    dev_snapshots: dict[str, str] = Field(
        {"code-langs-dev-0001": "classifiers/data/code_language_dev_extra.yaml"},
        description="Crawls whose projects only ever serve the frozen dev set (never train): snapshot -> manifest; "
        "crawled like label_snapshots",
    )
    unknown_label: bool = Field(
        True, description="Train an `unknown` label on logs, prose, CSV, minified and encoded text"
    )
    frozen_version: str | None = Field(
        "v4",
        description="Hold out the frozen test / dev projects of classifiers/data/code_language_{test,dev}_<v>"
        ".json: test never trains, dev scores the model and fits its temperature (null: split packages by "
        "test_fraction)",
    )
    per_group_cap: int = Field(
        60, ge=1, description="Held-out files of one label from one project (frozen split)"
    )
    train_group_cap: int = Field(
        300, ge=1, description="Training files of one label from one project (frozen split)"
    )
    heuristic_labels: bool = Field(
        True, description="Label ambiguous extensions (.h .m .pl .v .ts) by strong markers"
    )
    shebang_labels: bool = Field(True, description="Label extension-less scripts by their shebang")
    skip_flow: bool = Field(
        True,
        description="Leave `@flow` files out (typed JS, between JS and TS: as JS labels they teach 'typed = JS')",
    )
    lr: float = Field(0.5, gt=0, description="fastText learning rate")
    # chosen on frozen dev v3 (70: 0.9221, 100: 0.9257, 140: 0.9344; classifiers/data/code_language_v5_results.md)
    epoch: int = Field(140, ge=1, description="fastText epochs")
    dim: int = Field(100, ge=2, description="fastText vector size")
    word_ngrams: int = Field(
        2, ge=1, description="fastText word n-gram length over code tokens (3 overfits packages)"
    )
    minn: int = Field(0, ge=0, description="fastText min char n-gram (0 = off)")
    maxn: int = Field(0, ge=0, description="fastText max char n-gram (0 = off)")
    min_count: int = Field(1, ge=1, description="fastText min token count")
    vocabulary_min_groups: int = Field(
        6, ge=0, description="Tokens seen in fewer training packages become their shape (0 = keep all)"
    )
    bucket: int = Field(200_000, ge=1000, description="fastText hash buckets (model size)")
    threads: int = Field(
        1,
        ge=1,
        description="fastText threads: 1 trains the same model on every run (with more, retrains differ by ~0.5 points)",
    )
    char_view: bool = Field(
        True,
        description="Also train the character view (`classifiers.code_language.char_view`) and mix it in where the "
        "token model is unsure, at a weight and threshold chosen on the frozen dev set (needs frozen_version)",
    )
    quantize: bool = Field(
        False,
        description="Quantize the saved model: MBs instead of ~50 MB, but ~3x slower predict (dequantised rows)",
    )
    override_threshold: float = Field(
        0.995, gt=0, le=1, description="Content overrides an extension prior above this"
    )
    min_confidence: float = Field(
        0.5, gt=0, le=1, description="Content-only decisions below this are unknown"
    )
    seed: int = Field(0, description="Seed of the package split, sampling and fastText")

    def fasttext_params(self) -> FastTextParams:
        return FastTextParams(lr=self.lr, epoch=self.epoch, dim=self.dim, word_ngrams=self.word_ngrams,
                              minn=self.minn, maxn=self.maxn, min_count=self.min_count, bucket=self.bucket,
                              threads=self.threads, seed=self.seed)  # fmt: skip


def _hash(seed: int, s: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{s}".encode(), digest_size=8).digest(), "big")


def group_of(meta: dict) -> str:
    """The unit held out together: one package (or repo)."""
    return f"{meta['source']}:{meta['package']}"


def labelled_files(records, config: CodeLanguageIdConfig, stats: Counter) -> list[dict]:
    """Records with a training label (text, label, group, id)."""
    out = []
    for rec in records:
        meta = rec["metadata"]
        label, how = training_label(meta["path"], rec["text"], config.heuristic_labels, config.shebang_labels)
        if label is None:
            stats[f"unlabelled/{how}"] += 1
            continue
        if config.skip_flow and label == "JavaScript" and "@flow" in rec["text"][:2000]:
            stats["unlabelled/flow_typed_javascript"] += 1
            continue
        stats[f"labelled/{how}"] += 1
        out.append({"id": rec["id"], "text": rec["text"], "label": label, "group": group_of(meta),
                    "path": meta["path"], "how": how})  # fmt: skip
    return out


def refine_single_group_languages(
    files: list[dict], label_key: str = "label", share: float = 0.9
) -> dict[str, int]:
    """A language (almost) all found in one package cannot be held out by package: split its files in that
    package by component (the two directories below their common prefix, e.g. `src/library` vs
    `src/compiler`). "Almost": the package holds >= `share` of the language's files (a stray misfiled file
    elsewhere must not become the whole held-out set). Returns language -> number of components made."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for f in files:
        counts[f[label_key]][f["group"]] += 1
    made = {}
    for lang, groups in counts.items():
        main, n = groups.most_common(1)[0]
        if n < share * sum(groups.values()):
            continue
        mine = [f for f in files if f[label_key] == lang and f["group"] == main]
        split_by_component(mine)
        made[lang] = len({f["group"] for f in mine})
    return made


def split_by_group(files: list[dict], test_fraction: float, seed: int) -> set[str]:
    """Choose held-out groups: walk groups in seeded hash order and hold one out while its languages' held-out
    shares stay under the target (never the last training group of a language)."""
    by_group: dict[str, Counter] = defaultdict(Counter)
    for f in files:
        by_group[f["group"]][f["label"]] += 1
    total = Counter(f["label"] for f in files)
    groups_of_lang: dict[str, set[str]] = defaultdict(set)
    for g, langs in by_group.items():
        for lang in langs:
            groups_of_lang[lang].add(g)
    test: set[str] = set()
    held = Counter()
    for g in sorted(by_group, key=lambda g: _hash(seed, g)):
        langs = by_group[g]
        main = langs.most_common(1)[0][0]
        if held[main] >= test_fraction * total[main]:
            continue
        ok = all(
            held[lang] + n <= max(test_fraction * 1.6 * total[lang], 0)
            and len(groups_of_lang[lang] - test - {g}) >= 1
            for lang, n in langs.items()
            if n >= 0.1 * total[lang]
        )
        if ok:
            test.add(g)
            held.update(langs)
    return test


def accuracy_by_label_source(files: list[dict], y_pred: list[str]) -> dict[str, float]:
    """Accuracy of `y_pred` on held-out `files` (each with `label` and its source `how`): over all of them
    (`accuracy`), over files labelled by an unambiguous extension only (`accuracy/extension_only`, the headline),
    over files labelled by their name or extension, i.e. without reading content (`accuracy/name_labels`), and per
    label source (`accuracy/label_source/<source>`); `heldout_files/...` counts each subset. An empty subset has a
    count of 0 and no accuracy."""
    subsets = {
        "": lambda how: True,
        "/extension_only": lambda how: how == "extension",
        "/name_labels": lambda how: how in NAME_SOURCES,
        **{f"/label_source/{src}": (lambda how, src=src: how == src) for src in LABEL_SOURCES},
    }
    out: dict[str, float] = {}
    for suffix, keep in subsets.items():
        hits = [f["label"] == p for f, p in zip(files, y_pred, strict=True) if keep(f["how"])]
        out[f"heldout_files{suffix}"] = float(len(hits))
        if hits:
            out[f"accuracy{suffix}"] = sum(hits) / len(hits)
    return out


def _without_shebang_line(text: str) -> str:
    return text.split("\n", 1)[1] if "\n" in text else ""


def train_code_language_classifier(config: CodeLanguageIdConfig, store: ObjectStore, snapshot: str,
                                   work_dir: Path | None = None) -> StageResult:  # fmt: skip
    """Train the content classifier on `snapshot`'s crawled files, evaluate on held-out packages, publish
    model + eval to the store. Returns metrics (accuracy, macro-F1, per-language F1) and the model file."""
    t0 = time.time()
    stats: Counter = Counter()
    files = labelled_files(read_shards(store, partition_prefix(config.in_prefix, snapshot)), config, stats)
    if config.frozen_version:
        train, test, components = _frozen_protocol_split(config, store, files, stats)
        held_out = f"frozen dev projects ({config.frozen_version})"
    else:
        train, test, components = _package_split(config, files, stats)
        held_out = "held-out packages"
    keep = {f["label"] for f in train}
    test_groups = {f["group"] for f in test}
    test_counts = Counter(f["label"] for f in test)
    scored = sorted(lang for lang in keep if test_counts[lang] >= config.min_test_files)
    not_scored = sorted(keep - set(scored))
    log.info("language id: %d train files, %d held-out files in %d groups, %d languages", len(train), len(test),
             len(test_groups), len(keep))  # fmt: skip
    work = Path(work_dir) if work_dir else artifact_dir("crucible-langid-")  # removed once logged
    model_path = work / ("code_language.ftz" if config.quantize else "code_language.bin")
    t_train = time.time()
    model = train_code_language_model(
        [(f["label"], f["text"]) for f in train], config.fasttext_params(), model_path, quantize=config.quantize,
        groups=[f["group"] for f in train], min_groups=config.vocabulary_min_groups,
    )  # fmt: skip
    train_seconds = time.time() - t_train
    clf = CodeLanguageClassifier(model, config.override_threshold, config.min_confidence)
    eval_files = [f for f in test if f["label"] in scored]
    temperature = 1.0
    char_mix = {"char_weight": 0.0, "char_below": 0.0}
    if config.frozen_version and config.char_view:  # mixed in where dev says it helps (weight 0: not at all)
        clf.char_path = char_path = work / CHAR_MODEL
        clf.char_model = train_char_model([(f["label"], f["text"]) for f in train],
                                          replace(CHAR_PARAMS, threads=config.threads, seed=config.seed),
                                          char_path)  # fmt: skip
        fit = fit_char_mix(clf, [f["text"] for f in test], [f["label"] for f in test])
        char_mix = {"char_weight": fit["char_weight"], "char_below": fit["char_below"]}
        clf.char_weight, clf.char_below = char_mix["char_weight"], char_mix["char_below"]
        log.info("language id: character view on dev: %s", fit)
    if config.frozen_version:  # calibrated on dev (`calibration.json`): what metadata fix and readers apply
        dev_probs = clf.predict_content([f["text"] for f in test], k=-1)
        temperature = fit_temperature(dev_probs, [f["label"] for f in test])
        clf.temperature = temperature
        clf.marker_confidence = fit_markers([f["text"] for f in test], [f["label"] for f in test])
    t_pred = time.time()
    probs = clf.predict_content([f["text"] for f in eval_files], k=-1)
    pred_seconds = time.time() - t_pred
    confidence = [max(p.values(), default=0.0) for p in probs]
    probs = [dict([max(p.items(), key=lambda kv: kv[1])]) if p else {} for p in probs]
    y_pred = [max(p, key=p.get) if p else "" for p in probs]
    report = classification_report([f["label"] for f in eval_files], y_pred, scored)
    by_source = accuracy_by_label_source(eval_files, y_pred)
    # the label of a shebang-labelled file came from its `#!` line, which the classifier also reads: score the rest
    shebang_files = [f for f in eval_files if f["how"] == "shebang"]
    if shebang_files:
        cut = clf.predict_content([_without_shebang_line(f["text"]) for f in shebang_files], k=1)
        cut_pred = [max(p, key=p.get) if p else "" for p in cut]
        by_source["accuracy/shebang_line_removed"] = sum(
            f["label"] == p for f, p in zip(shebang_files, cut_pred, strict=True)
        ) / len(shebang_files)
    confusions = Counter((f["label"], p) for f, p in zip(eval_files, y_pred, strict=True) if f["label"] != p)
    # what `benchmarks/code_lang_id.py protocol --model-snapshot` reads to score this model on the frozen test set
    calibration = {"temperature": temperature, "marker_confidence": clf.marker_confidence, **char_mix,
                   "labels": clf.languages, "frozen_version": config.frozen_version,
                   "epoch": config.epoch, "dev_accuracy": round(report.accuracy, 4),
                   "frozen_test_sha256": language_protocol.frozen_test_digest(config.frozen_version),
                   **calibration_report([f["label"] for f in eval_files], y_pred, confidence)}  # fmt: skip
    report.extra.update({
        "snapshot": snapshot, "train_files": len(train), "test_groups": sorted(test_groups),
        "train_groups": sorted({f["group"] for f in train}),
        "train_counts": dict(Counter(f["label"] for f in train)), "test_counts": dict(test_counts),
        "not_scored": not_scored, "top_confusions": [[t, p, n] for (t, p), n in confusions.most_common(25)],
        "files_per_second": len(eval_files) / max(pred_seconds, 1e-9), "train_seconds": train_seconds,
        "label_sources": {k: v for k, v in stats.items()}, "config": config.model_dump(),
        "split_by_component": components, "accuracy_by_label_source": by_source, "held_out": held_out,
        "calibration": calibration,
    })  # fmt: skip
    plot_path = plot_confusion(report, work / "confusion.png", f"code language ID, {held_out} ({snapshot})")
    eval_path = work / "eval.json"
    eval_path.write_text(json.dumps(report.to_json(), indent=1))
    calibration_path = work / CALIBRATION
    calibration_path.write_text(json.dumps(calibration, indent=1))
    heldout_path = work / "heldout.jsonl.gz"
    keys = ("id", "label", "group", "path", "how")
    heldout = "".join(json.dumps({k: f[k] for k in keys}) + "\n" for f in eval_files)
    heldout_path.write_bytes(gzip.compress(heldout.encode("utf-8"), mtime=0))  # same list, same bytes
    files = {"model": model_path, "eval": eval_path, "confusion": plot_path, "heldout": heldout_path,
             "calibration": calibration_path}  # fmt: skip
    if clf.char_weight > 0:
        files["char_model"] = work / CHAR_MODEL
    # one version (model of one format, its eval, its held-out list), switched in by the pointer last
    out = commit(store, partition_prefix(config.out_prefix, snapshot), {p.name: p for p in files.values()})
    outputs = {name: store.uri(out.key(path.name)) for name, path in files.items()}
    metrics = {"macro_f1": report.macro_f1, "languages_scored": float(len(scored)), "train_files": float(len(train)),
               "heldout_groups": float(len(test_groups)), "files_per_second": report.extra["files_per_second"],
               "train_seconds": train_seconds, "model_bytes": float(model_path.stat().st_size),
               "seconds": time.time() - t0, "labels": float(len(keep)), "temperature": temperature,
               "ece": calibration["ece"], "confident_error_rate": calibration["confident_error_rate"],
               **char_mix, **by_source}  # fmt: skip
    metrics.update({f"f1/{lang}": v["f1"] for lang, v in report.per_class.items()})
    metrics.update(
        {f"train_files/{lang}": float(n) for lang, n in Counter(f["label"] for f in train).items()}
    )
    rows = [{"language": lang, "train": report.extra["train_counts"].get(lang, 0), "heldout": v["support"],
             "precision": f"{v['precision']:.3f}", "recall": f"{v['recall']:.3f}", "f1": f"{v['f1']:.3f}"}
            for lang, v in sorted(report.per_class.items())]  # fmt: skip
    md = [f"## Code language ID `{snapshot}`: {len(keep)} labels, scored on {held_out}",
          _headline(by_source, len(test_groups)),
          f"All held-out files: accuracy {report.accuracy:.4f}, macro-F1 {report.macro_f1:.4f} over {len(scored)} "
          f"languages, {len(eval_files)} files ({report.extra['files_per_second']:.0f} files/s); temperature "
          f"{temperature}, ECE {calibration['ece']}, errors at >= 0.99: {calibration['confident_errors']} of "
          f"{calibration['confident_predictions']}. Character view: "
          + (f"mixed in at weight {char_mix['char_weight']} below a token-model probability of "
             f"{char_mix['char_below']} (chosen on dev)." if char_mix["char_weight"] else "off."), "",
          markdown_table(_source_rows(by_source)), "", markdown_table(rows)]  # fmt: skip
    if components:
        md += [
            "",
            "Found in one package only, held out by component within it: "
            + ", ".join(f"{k} ({v} components)" for k, v in sorted(components.items())),
        ]
    if not_scored:
        md += ["", f"Trained but not scored (too few held-out files): {', '.join(not_scored)}"]
    if confusions:
        md += [
            "",
            "Top confusions: " + ", ".join(f"{t}->{p} ({n})" for (t, p), n in confusions.most_common(8)),
        ]
    return StageResult(
        metrics=metrics, outputs=outputs, report_md="\n".join(md),
        sample=[{"id": f["id"], "path": f["path"], "label": f["label"], "predicted": p}
                for f, p in list(zip(eval_files, y_pred, strict=True))[:10]],
        artifacts={"model/" + model_path.name: model_path, "model/" + CALIBRATION: calibration_path,
                   "eval/eval.json": eval_path, "eval/confusion.png": plot_path,
                   **({"model/" + CHAR_MODEL: files["char_model"]} if "char_model" in files else {})},
        data_version=hashlib.sha256(model_path.read_bytes()).hexdigest()[:16],
        extra={"model_path": model_path, "report": report},
    )  # fmt: skip


def _package_split(config: CodeLanguageIdConfig, files: list[dict], stats: Counter):
    """Train / held-out by package (`test_fraction`), rare languages dropped, at most N train files a language."""
    counts = Counter(f["label"] for f in files)
    keep = {lang for lang, n in counts.items() if n >= config.min_files_per_language}
    stats["files/dropped_rare_language"] = sum(n for lang, n in counts.items() if lang not in keep)
    files = [f for f in files if f["label"] in keep]
    components = refine_single_group_languages(files)
    test_groups = split_by_group(files, config.test_fraction, config.seed)
    train = [f for f in files if f["group"] not in test_groups]
    test = [f for f in files if f["group"] in test_groups]
    by_lang: dict[str, list[dict]] = defaultdict(list)
    for f in sorted(train, key=lambda f: _hash(config.seed, f["id"])):
        by_lang[f["label"]].append(f)
    train = [f for lang in sorted(by_lang) for f in by_lang[lang][: config.max_train_files_per_language]]
    return train, test, components


def _frozen_protocol_split(
    config: CodeLanguageIdConfig, store: ObjectStore, files: list[dict], stats: Counter
):
    """The partition's files plus the label snapshots' (crawled here the first time) and the `unknown` texts;
    train on all but the frozen test and dev projects, score on dev (`pipelines/code/language_protocol.py`)."""
    for name, manifest in {**config.label_snapshots, **config.dev_snapshots}.items():
        prefix = partition_prefix(config.in_prefix, name)
        if not is_committed(store, prefix):  # a killed crawl leaves files but no pointer: crawl again
            log.info("language id: crawling label snapshot %s from %s", name, manifest)
            crawl_code(CodeCrawlConfig(manifest=manifest), store, name)
        dev_only = name in config.dev_snapshots
        files = files + [
            {**f, "dev_only": dev_only} for f in labelled_files(read_shards(store, prefix), config, stats)
        ]
    if config.unknown_label:
        files = files + language_protocol.unknown_files(default_cache_dir(), config.seed)
    files, info = language_protocol.protocol_files(
        files, config.seed, config.per_group_cap, config.min_files_per_language
    )
    info.update(language_protocol.apply_frozen_split(files, config.frozen_version))
    stats.update({k: v for k, v in info["stats"].items()})
    stats.update({k: v for k, v in info.items() if isinstance(v, int)})
    train = language_protocol.training_sample(
        files, config.train_group_cap, config.max_train_files_per_language, config.seed
    )
    return train, [f for f in files if f["split"] == "dev"], info["split_by_component"]


def _headline(by_source: dict[str, float], groups: int) -> str:
    n = int(by_source["heldout_files/extension_only"])
    acc = by_source.get("accuracy/extension_only")
    figure = f"**{acc:.4f}**" if acc is not None else "n/a"
    return (f"Headline, files labelled by an unambiguous extension only (`accuracy/extension_only`): {figure} on {n} "
            f"files of {groups} held-out packages. Shebang- and heuristic-labelled files are left out of it: the "
            f"classifier reads the same `#!` lines and constructs that labelled them.")  # fmt: skip


def _source_rows(by_source: dict[str, float]) -> list[dict]:
    rows = []
    for name, key in [("all", ""), ("extension only", "/extension_only"), ("name or extension", "/name_labels"),
                      *((src, f"/label_source/{src}") for src in LABEL_SOURCES if src != "extension")]:  # fmt: skip
        acc = by_source.get(f"accuracy{key}")
        rows.append({"labels": name, "files": int(by_source[f"heldout_files{key}"]),
                     "accuracy": "-" if acc is None else f"{acc:.4f}"})  # fmt: skip
    if "accuracy/shebang_line_removed" in by_source:
        n = int(by_source["heldout_files/label_source/shebang"])
        acc = by_source["accuracy/shebang_line_removed"]
        rows.append({"labels": "shebang, `#!` line removed", "files": n, "accuracy": f"{acc:.4f}"})
    return rows
