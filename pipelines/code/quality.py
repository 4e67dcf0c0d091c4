"""Per-language code quality classifiers for low-resource languages and quality-aware sampling weights.

For each configured language: labels from an LLM-judge labels file when given (JSONL `{"id", "score"}`,
score >= `judge_threshold` is high quality), else from the documented heuristics in
`classifiers/code_quality.py` (top / bottom `label_quantile` of the heuristic score within the language);
a fastText model per language, evaluated on held-out packages; a quality score on every file of the language
(other languages get the heuristic score).

Sampling weights (`sampling_weights.json` of the committed output `<out_prefix>/<snapshot>`): a language
multiplier from temperature sampling over characters (share^(1/T), renormalised; T > 1 upsamples
low-resource languages), times a per-file factor exp(beta * (quality - language mean)) normalised to mean 1
within the language, clipped to [min_file_weight, max_file_weight]. Per-file scores and weights:
`scores/part-*.jsonl.gz` (same output). Plots: `plots/quality_scores.png` (score histogram per language, the
classifier's 0.5 decision line) and `plots/language_mix.png` (character share vs sampled share per language).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import Counter, defaultdict
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from classifiers.code_quality import (
    HQ,
    LQ,
    heuristic_quality,
    is_test_path,
    quality_features,
    quality_scores,
    train_quality_model,
)
from classifiers.fasttext_train import FastTextParams, classification_report
from infra.committed import commit, read_committed
from infra.figures import artifact_dir
from infra.partition_keys import partition_prefix
from infra.schemas import CodeSamplingWeights, LanguageSamplingWeight
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.code.language_id import refine_single_group_languages
from pipelines.code.records import read_shards, write_shards
from pipelines.plots import BarPanel, ScorePanel, bar_panels, score_histograms

log = logging.getLogger(__name__)


class CodeQualityConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    in_prefix: str = Field("code/files", description="Fixed code files: <in_prefix>/<snapshot>/")
    out_prefix: str = Field("code/quality", description="Models, scores, weights: <out_prefix>/<snapshot>/")
    languages: list[str] = Field(
        ["Scala", "Swift", "Lua"], description="Languages that get their own classifier"
    )
    judge_labels: str | None = Field(
        None, description="Store key of LLM-judge labels JSONL {id, score}; None = heuristics"
    )
    judge_threshold: float = Field(3.0, description="Judge score at or above which a file is high quality")
    label_quantile: float = Field(
        0.3, gt=0, lt=0.5, description="Heuristic labels: top/bottom share per language"
    )
    test_fraction: float = Field(0.25, gt=0, lt=1, description="Share of packages held out for evaluation")
    min_files: int = Field(60, ge=4, description="Languages with fewer labelled files get no classifier")
    epoch: int = Field(20, ge=1, description="fastText epochs")
    lr: float = Field(0.3, gt=0, description="fastText learning rate")
    word_ngrams: int = Field(2, ge=1, description="fastText word n-grams")
    dim: int = Field(32, ge=2, description="fastText vector size")
    bucket: int = Field(100_000, ge=1000, description="fastText hash buckets")
    quantize: bool = Field(
        True, description="Quantize the per-language models (small files, slower training)"
    )
    temperature: float = Field(2.0, ge=1, description="Language sampling temperature (1 = natural shares)")
    beta: float = Field(
        3.0, ge=0, description="Per-file weight exp(beta * (quality - mean)); 0 = quality-blind"
    )
    min_file_weight: float = Field(0.1, ge=0, description="Clip for per-file weights")
    max_file_weight: float = Field(5.0, gt=0, description="Clip for per-file weights")
    seed: int = Field(0, description="Seed of the split and fastText")


def _hash(seed: int, s: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{s}".encode(), digest_size=8).digest(), "big")


def load_judge_labels(store: ObjectStore, key: str) -> dict[str, float]:
    out = {}
    for line in store.get_bytes(key).decode().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["id"]] = float(row["score"])
    return out


def language_weights(chars: dict[str, int], temperature: float) -> dict[str, float]:
    """Multiplier per language so that sampling shares become share^(1/T) (renormalised)."""
    total = sum(chars.values()) or 1
    shares = {lang: c / total for lang, c in chars.items()}
    tempered = {lang: s ** (1 / temperature) for lang, s in shares.items()}
    norm = sum(tempered.values()) or 1
    return {lang: (tempered[lang] / norm) / shares[lang] if shares[lang] else 0.0 for lang in chars}


def check_languages_are_labels(languages: list[str], labels: list[str] | None, src: str) -> None:
    """A language the code files can never carry (not a label of the classifier that fixed them, e.g. an old
    name) would silently get no classifier: refuse it. Files written before labels were recorded pass."""
    missing = sorted(set(languages) - set(labels)) if labels is not None else []
    if missing:
        raise ValueError(f"code_quality.languages: {missing} are not labels of the language classifier that "
                         f"fixed {src} (its labels: {', '.join(labels)}); use those names")  # fmt: skip


def train_code_quality(
    config: CodeQualityConfig, store: ObjectStore, snapshot: str, work_dir: Path | None = None
) -> StageResult:
    """Label, train and evaluate one quality model per configured language; score every file; write scores
    and sampling weights. Returns per-language eval metrics and the model files."""
    t0 = time.time()
    work = Path(work_dir) if work_dir else artifact_dir("crucible-quality-")  # removed once logged
    src = partition_prefix(config.in_prefix, snapshot)
    check_languages_are_labels(config.languages, read_committed(store, src).meta.get("labels"), src)
    records = list(read_shards(store, src))
    judge = load_judge_labels(store, config.judge_labels) if config.judge_labels else None
    tested_packages = {
        (r["metadata"]["source"], r["metadata"]["package"])
        for r in records
        if is_test_path(r["metadata"]["path"])
    }
    rows: list[dict] = []
    for rec in records:
        meta = rec["metadata"]
        pkg = (meta["source"], meta["package"])
        feats = quality_features(rec["text"], meta["language"], meta["path"], pkg in tested_packages)
        rows.append({"id": rec["id"], "language": meta["language"], "group": f"{pkg[0]}:{pkg[1]}",
                     "chars": len(rec["text"]), "heuristic": heuristic_quality(feats), "text": rec["text"],
                     "path": meta["path"]})  # fmt: skip
    # a language found in one package only is held out by component within it (as for language ID)
    refine_single_group_languages(
        [r for r in rows if r["language"] in config.languages], label_key="language"
    )
    by_lang: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_lang[row["language"]].append(row)
    metrics: dict[str, float] = {}
    artifacts: dict[str, Path] = {}
    outputs: dict[str, str] = {}
    evals: dict[str, dict] = {}
    prefix = partition_prefix(config.out_prefix, snapshot)
    files: dict[str, Path] = {}  # committed together at the end: models, sampling weights, scores
    for lang in config.languages:
        items = by_lang.get(lang, [])
        if judge is not None:
            labelled = [
                (r, HQ if judge[r["id"]] >= config.judge_threshold else LQ) for r in items if r["id"] in judge
            ]
            label_source = "judge"
        else:
            ranked = sorted(items, key=lambda r: (r["heuristic"], _hash(config.seed, r["id"])))
            k = int(len(ranked) * config.label_quantile)
            labelled = (
                [(r, LQ) for r in ranked[:k]] + [(r, HQ) for r in ranked[len(ranked) - k :]] if k else []
            )
            label_source = "heuristic"
        if len(labelled) < config.min_files:
            log.warning(
                "quality: %s has %d labelled files (< %d); using heuristic scores",
                lang,
                len(labelled),
                config.min_files,
            )
            evals[lang] = {"skipped": f"{len(labelled)} labelled files"}
            continue
        groups = sorted({r["group"] for r, _ in labelled}, key=lambda g: _hash(config.seed, g))
        test_groups, held = set(), 0
        sizes = Counter(r["group"] for r, _ in labelled)
        for g in groups:  # hold out whole packages up to the target share, never overshooting it by half
            if held >= config.test_fraction * len(labelled) or len(test_groups) >= len(groups) - 1:
                break
            if held + sizes[g] <= 1.5 * config.test_fraction * len(labelled):
                test_groups.add(g)
                held += sizes[g]
        train = [(lab, r["text"]) for r, lab in labelled if r["group"] not in test_groups]
        test = [(lab, r["text"]) for r, lab in labelled if r["group"] in test_groups]
        params = FastTextParams(lr=config.lr, epoch=config.epoch, dim=config.dim, word_ngrams=config.word_ngrams,
                                bucket=config.bucket, threads=1, seed=config.seed)  # fmt: skip
        slug = lang.lower().replace(" ", "_").replace("+", "p").replace("#", "sharp")
        model_path = work / f"quality_{slug}.ftz"
        model_path = model_path.with_suffix(".ftz" if config.quantize else ".bin")
        model = train_quality_model(train, params, model_path, quantize=config.quantize)
        ev = {
            "label_source": label_source,
            "train": len(train),
            "test": len(test),
            "test_groups": sorted(test_groups),
        }
        if test:
            scores = quality_scores(model, [t for _, t in test])
            pred = [HQ if s >= 0.5 else LQ for s in scores]
            rep = classification_report([lab for lab, _ in test], pred, [HQ, LQ])
            ev.update({"accuracy": rep.accuracy, "macro_f1": rep.macro_f1, "f1_hq": rep.per_class[HQ]["f1"]})
            metrics[f"{slug}/accuracy"] = rep.accuracy
            metrics[f"{slug}/macro_f1"] = rep.macro_f1
        evals[lang] = ev
        for r, s in zip(items, quality_scores(model, [r["text"] for r in items]), strict=True):
            r["quality"] = round(s, 4)
        artifacts[f"models/{model_path.name}"] = model_path
        files[model_path.name] = model_path
        outputs[f"model_{slug}"] = model_path.name  # its store URI once committed
    for row in rows:
        row.setdefault("quality", row["heuristic"])
    # sampling weights
    chars = Counter()
    for row in rows:
        chars[row["language"]] += row["chars"]
    lang_w = language_weights(dict(chars), config.temperature)
    summary: dict[str, LanguageSamplingWeight] = {}
    for lang, items in by_lang.items():
        mean_q = sum(r["quality"] for r in items) / len(items)
        raw = [math.exp(config.beta * (r["quality"] - mean_q)) for r in items]
        norm = sum(raw) / len(raw)
        for r, w in zip(items, raw, strict=True):
            r["weight"] = round(
                lang_w[lang] * min(config.max_file_weight, max(config.min_file_weight, w / norm)), 5
            )
        buckets = Counter(min(4, int(r["quality"] * 5)) for r in items)
        summary[lang] = LanguageSamplingWeight(
            files=len(items), chars=chars[lang], mean_quality=round(mean_q, 4),
            language_weight=round(lang_w[lang], 5), classifier=lang in evals and "skipped" not in evals[lang],
            quality_histogram={f"{b / 5:.1f}-{(b + 1) / 5:.1f}": buckets[b] for b in range(5)},
        )  # fmt: skip
    # the one schema the token-shard mixture parses (training/data.py)
    weights_doc = CodeSamplingWeights(
        snapshot=snapshot, temperature=config.temperature, beta=config.beta,
        method="weight(file) = language_weight * clip(exp(beta*(q - mean_q)) / mean, min, max)",
        languages=summary, eval=evals,
    ).model_dump()  # fmt: skip
    (work / "sampling_weights.json").write_text(json.dumps(weights_doc, indent=1))
    files["sampling_weights.json"] = artifacts["sampling_weights.json"] = work / "sampling_weights.json"
    scores = write_shards(work / "scores", ({"id": r["id"], "language": r["language"], "quality": r["quality"],
                                             "heuristic": r["heuristic"], "weight": r["weight"]} for r in rows), 50_000)  # fmt: skip
    files.update({f"scores/{path.name}": path for path in scores})
    out = commit(store, prefix, files, meta={"snapshot": snapshot, "files_scored": len(rows)})
    outputs = {k: store.uri(out.key(name)) for k, name in outputs.items()}
    outputs["sampling_weights"] = store.uri(out.key("sampling_weights.json"))
    outputs["scores"] = store.uri(f"{out.version_prefix}/scores/")
    metrics["seconds"] = time.time() - t0
    metrics["files_scored"] = float(len(rows))
    table = [{"language": lang, "label_source": ev.get("label_source", "-"), "train": ev.get("train", 0),
              "heldout": ev.get("test", 0), "accuracy": f"{ev['accuracy']:.3f}" if "accuracy" in ev else "-",
              "mean_quality": summary[lang].mean_quality if lang in summary else "-",
              "language_weight": summary[lang].language_weight if lang in summary else "-"} for lang, ev in evals.items()]  # fmt: skip
    md = [f"## Code quality `{snapshot}`", markdown_table(table)]
    plots = _plots(snapshot, config, by_lang, evals, dict(chars), lang_w)
    artifacts.update({f"plots/{d.path.name}": d.path for d in plots})
    return StageResult(metrics=metrics, outputs=outputs, report_md="\n".join(md), artifacts=artifacts,
                       sample=[{k: v for k, v in r.items() if k != "text"} for r in rows[:5]],
                       extra={"eval": evals, "summary": weights_doc["languages"],
                              "plots": {d.path.stem: d.as_dict() for d in plots}})  # fmt: skip


def _plots(snapshot: str, config: CodeQualityConfig, by_lang: dict[str, list[dict]], evals: dict,
           chars: dict[str, int], lang_w: dict[str, float]) -> list:  # fmt: skip
    """`quality_scores.png`: the score of every file, one panel per configured language (its classifier's
    P(high quality), 0.5 being its decision; the heuristic score if it got no classifier) and one for all
    other languages (heuristic scores). `language_mix.png`: each language's share of the characters and its
    share once sampled with the language weights (temperature sampling)."""
    folder = artifact_dir("crucible-code-quality-plots-")
    panels = []
    for lang in config.languages:
        classified = lang in evals and "skipped" not in evals[lang]
        scores = [r["quality"] for r in by_lang.get(lang, [])]
        panels.append(ScorePanel(
            f"{lang}: {'classifier' if classified else 'heuristic (no classifier)'}", {"files": scores},
            "P(high quality)" if classified else "heuristic quality", 0.5 if classified else None,
            "high-quality decision", ylabel="files"))  # fmt: skip
    others = [r["quality"] for lang, items in by_lang.items() if lang not in config.languages for r in items]
    if others:
        panels.append(
            ScorePanel("other languages: heuristic", {"files": others}, "heuristic quality", ylabel="files")
        )
    hist = score_histograms(folder / "quality_scores.png", panels, f"code quality scores ({snapshot})")
    total = sum(chars.values()) or 1
    sampled = {k: chars[k] * lang_w[k] for k in chars}
    total_sampled = sum(sampled.values()) or 1
    langs = sorted(chars, key=lambda k: (-chars[k], k))
    shares = {
        "share of characters": [round(chars[k] / total, 4) for k in langs],
        f"sampled share (T={config.temperature:g})": [round(sampled[k] / total_sampled, 4) for k in langs],
    }
    mix = bar_panels(folder / "language_mix.png", [BarPanel("language mix", langs, shares, "share")],
                     f"code language mix before and after sampling weights ({snapshot})")  # fmt: skip
    return [hist, mix]
