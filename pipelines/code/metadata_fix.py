"""Metadata fix: make each record's language, path and repo metadata agree with its content.

Checks, in order, each counted per reason:
- hash mismatch: the text's sha256 differs from the recorded one (content changed or truncated) -> dropped;
- origin: (source, package, version, path) must be in the crawl's origins index with that sha256; a file whose
  content belongs to another package/path is re-attributed (corrected/wrong_repo), unknown content is dropped;
- language: the declared (extension-only) language is replaced by the decision of the content classifier
  combined with the priors (ambiguous `.h .m .pl .v .ts`, content overriding a wrong extension).
Output: the shared contract, committed as `code/files/<snapshot>` (`part-*.jsonl.gz` with the final `language`,
and `fix_stats.json`); crawl records, origins and the language model are read from their committed outputs.
"""

from __future__ import annotations

import gzip
import json
import logging
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from classifiers.code_language import CHAR_MODEL, CodeLanguageClassifier
from classifiers.code_language_rules import extension_of
from infra.committed import commit, fetch_file, read_committed
from infra.figures import artifact_dir
from infra.partition_keys import partition_prefix
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.code.language_id import CALIBRATION
from pipelines.code.records import ORIGINS, data_version, read_shards, sha256_hex, write_shards
from pipelines.plots import BarPanel, bar_panels

log = logging.getLogger(__name__)


class MetadataFixConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    in_prefix: str = Field("code/raw", description="Crawled records: <in_prefix>/<snapshot>/")
    out_prefix: str = Field(
        "code/files", description="Fixed records (the shared contract): <out_prefix>/<snapshot>/"
    )
    model_prefix: str = Field(
        "code/language_id", description="Language model: <model_prefix>/<model_snapshot>/"
    )
    model_snapshot: str | None = Field(
        None, description="Snapshot whose model to use (None = the same snapshot)"
    )
    override_threshold: float = Field(
        0.995, gt=0, le=1, description="Content overrides an extension prior above this"
    )
    override_unambiguous: bool = Field(
        False, description="Let confident content override an unambiguous extension (else only flag it)"
    )
    min_confidence: float = Field(
        0.5, gt=0, le=1, description="Content-only decisions below this are dropped"
    )
    batch_size: int = Field(2000, ge=1, description="Files per classifier batch")
    shard_records: int = Field(5000, gt=0, description="Records per output shard")


def load_origins(
    store: ObjectStore, key: str | None
) -> tuple[dict[tuple, str], dict[str, list[tuple]]] | None:
    """(source, package, version, path) -> sha256, and sha256 -> origins; None if the crawl wrote no index."""
    if key is None:
        return None
    by_key: dict[tuple, str] = {}
    by_sha: dict[str, list[tuple]] = defaultdict(list)
    for line in gzip.decompress(store.get_bytes(key)).decode().split("\n"):  # not splitlines: U+2028 in paths
        if not line:
            continue
        o = json.loads(line)
        k = (o["source"], o["package"], o["version"], o["path"])
        by_key[k] = o["sha256"]
        by_sha[o["sha256"]].append(k)
    return by_key, by_sha


def check_origin(meta: dict, text_sha: str, origins, stats: Counter) -> str | None:
    """Verify/fix one record's provenance in place; returns a drop reason or None."""
    if text_sha != meta["sha256"]:
        return "hash_mismatch"
    if origins is None:
        stats["unchecked/no_origin_index"] += 1
        return None
    by_key, by_sha = origins
    key = (meta["source"], meta["package"], meta["version"], meta["path"])
    if by_key.get(key) == text_sha:
        return None
    candidates = by_sha.get(text_sha)
    if not candidates:
        return "unknown_origin"
    # prefer an origin with the same file name, then the first in index order
    name = meta["path"].rsplit("/", 1)[-1]
    src, pkg, ver, path = next((c for c in candidates if c[3].rsplit("/", 1)[-1] == name), candidates[0])
    stats[
        "corrected/wrong_repo" if (src, pkg) != (meta["source"], meta["package"]) else "corrected/wrong_path"
    ] += 1
    meta["original_origin"] = f"{meta['source']}:{meta['package']}@{meta['version']}:{meta['path']}"
    meta.update({"source": src, "package": pkg, "version": ver, "path": path})
    return None


def fix_records(
    records,
    clf: CodeLanguageClassifier,
    origins,
    stats: Counter,
    batch_size: int = 2000,
    transitions: Counter | None = None,
):
    """Yield fixed records (a datatrove-style step: counts every drop and correction by reason). Corrections
    by extension and language pair go to `transitions` (report rows, not metrics: the keys are open-ended)."""
    transitions = Counter() if transitions is None else transitions
    batch: list[dict] = []

    def flush():
        probs = clf.predict_content([r["text"] for r in batch], k=5)
        for rec, p in zip(batch, probs, strict=True):
            meta = rec["metadata"]
            declared = meta.get("declared_language")
            decision = clf.decide(meta["path"], rec["text"], declared, p)
            if decision.language is None:  # `not_code`: the classifier's `unknown` label
                stats[
                    "dropped/not_code" if decision.reason == "not_code" else "dropped/unknown_language"
                ] += 1
                continue
            meta["language"] = decision.language
            meta["language_reason"] = decision.reason
            meta["language_score"] = round(p.get(decision.language, 0.0), 4)
            if decision.reason == "prior_content_disagrees":
                stats["flagged/content_disagrees_with_extension"] += 1
                meta["content_language"] = decision.content_language
            if declared != decision.language:
                ext = extension_of(meta["path"]) or "(none)"
                stats[f"corrected/language/{decision.reason}"] += 1
                transitions[(ext, declared or "", decision.language)] += 1
            stats["kept"] += 1
            yield rec
        batch.clear()

    emitted: set[tuple] = set()
    for rec in records:
        stats["seen"] += 1
        meta = rec["metadata"]
        reason = check_origin(meta, sha256_hex(rec["text"].encode()), origins, stats)
        key = (meta["source"], meta["package"], meta["version"], meta["path"])
        if reason is None and key in emitted:
            reason = "duplicate_origin"  # re-attributed to a file that is already in the snapshot
        emitted.add(key)
        if reason:
            stats[f"dropped/{reason}"] += 1
            continue
        batch.append(rec)
        if len(batch) >= batch_size:
            yield from flush()
    if batch:
        yield from flush()


def fix_metadata(
    config: MetadataFixConfig, store: ObjectStore, snapshot: str, model_path: Path | None = None
) -> StageResult:
    """Fix language/path/repo metadata of `snapshot`'s crawled records and write the final code files."""
    t0 = time.time()
    src = partition_prefix(config.in_prefix, snapshot)
    dst = partition_prefix(config.out_prefix, snapshot)
    stats: Counter = Counter()
    transitions: Counter = Counter()
    crawled = read_committed(store, src)
    temperature, markers, char_path, char_mix = 1.0, None, None, {}
    origins = load_origins(store, crawled.key(ORIGINS) if ORIGINS in crawled.files else None)
    with tempfile.TemporaryDirectory(prefix="crucible-fix-") as tmp:
        if model_path is None:
            lid = read_committed(
                store, partition_prefix(config.model_prefix, config.model_snapshot or snapshot)
            )
            name = "code_language.ftz" if "code_language.ftz" in lid.files else "code_language.bin"
            model_path = fetch_file(store, lid, name, Path(tmp) / name)
            if CALIBRATION in lid.files:  # the temperature and marker probabilities fit on the frozen dev set
                calibration = json.loads(store.get_bytes(lid.key(CALIBRATION)))
                temperature, markers = calibration["temperature"], calibration.get("marker_confidence")
                char_mix = {k: calibration.get(k, 0.0) for k in ("char_weight", "char_below")}
            if CHAR_MODEL in lid.files:  # the character view, mixed in where the token model is unsure
                char_path = fetch_file(store, lid, CHAR_MODEL, Path(tmp) / CHAR_MODEL)
        clf = CodeLanguageClassifier.load(
            model_path,
            char_path,
            **char_mix,
            override_threshold=config.override_threshold,
            min_confidence=config.min_confidence,
            override_unambiguous=config.override_unambiguous,
            temperature=temperature,
            marker_confidence=markers,
        )  # fmt: skip
        kept: list[dict] = []
        languages = Counter()
        language_bytes = Counter()
        for rec in tqdm(fix_records(read_shards(store, src), clf, origins, stats, config.batch_size, transitions),
                        desc="metadata fix", unit="file", mininterval=5):  # fmt: skip
            kept.append(rec)
            languages[rec["metadata"]["language"]] += 1
            language_bytes[rec["metadata"]["language"]] += len(rec["text"].encode())
    with tempfile.TemporaryDirectory(prefix="crucible-fix-out-") as tmp:
        write_shards(tmp, kept, config.shard_records)
        corrections = [
            {"extension": ext, "declared": old, "corrected": new, "files": n}
            for (ext, old, new), n in transitions.most_common()
        ]
        # `labels`: the classifier's label set, which later stages (per-language quality) name languages by
        fix_stats = {"snapshot": snapshot, "stats": dict(stats), "languages": dict(languages),
                     "corrections": corrections, "labels": clf.languages}  # fmt: skip
        (Path(tmp) / "fix_stats.json").write_text(json.dumps(fix_stats, indent=2, sort_keys=True))
        out = commit(store, dst, Path(tmp), meta=fix_stats)
    keys = out.keys(".jsonl.gz")
    metrics = {k: float(v) for k, v in stats.items()}
    metrics["seconds"] = time.time() - t0
    reasons = [
        {"reason": k, "files": v}
        for k, v in sorted(stats.items())
        if k.startswith(("dropped/", "corrected/", "flagged/"))
    ]
    md = [f"## Code metadata fix `{snapshot}`", f"{stats['seen']} records in, {stats['kept']} kept.", "",
          markdown_table(reasons), "", "### Files per final language",
          markdown_table([{"language": k, "files": v} for k, v in languages.most_common()]),
          "", "### Language corrections by extension", markdown_table(corrections[:40])]  # fmt: skip
    mix = plot_language_mix(languages, language_bytes, f"code files per final language ({snapshot})")
    return StageResult(
        metrics=metrics, outputs={"files": store.uri(dst)}, report_md="\n".join(md),
        artifacts={f"plots/{mix.path.name}": mix.path},
        sample=[{**r, "text": r["text"][:400]} for r in kept if r["metadata"].get("language_reason") == "ambiguous_resolved"][:5],
        data_version=data_version(r["id"] + r["metadata"]["language"] for r in kept),
        extra={"shards": keys, "languages": dict(languages), "stats": dict(stats),
               "plots": {mix.path.stem: mix.as_dict()}},
    )  # fmt: skip


def plot_language_mix(files: Counter, size: Counter, title: str, top: int = 24):
    """Files and bytes per language, most files first; languages past the `top` summed as `(N others)`."""
    ranked = [lang for lang, _ in sorted(files.items(), key=lambda kv: (-kv[1], kv[0]))]
    shown, rest = ranked[:top], ranked[top:]
    labels = shown + ([f"({len(rest)} others)"] if rest else [])
    n_files = [files[k] for k in shown] + ([sum(files[k] for k in rest)] if rest else [])
    n_kib = [size[k] / 1024 for k in shown] + ([sum(size[k] for k in rest) / 1024] if rest else [])
    return bar_panels(
        artifact_dir("crucible-code-plots-") / "language_mix.png",
        [
            BarPanel("files", labels, {"files": n_files}, "files"),
            BarPanel("size (KiB of UTF-8 text)", labels, {"KiB": [round(v, 1) for v in n_kib]}, "KiB"),
        ],
        title,
    )
