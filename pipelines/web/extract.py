"""Extract and filter web documents for one crawl snapshot, with datatrove.

`extract_documents`: WARC files -> HTML responses -> Trafilatura main text -> min length -> fastText language ID
(lid.176, local file) -> `<out>/kept/*.jsonl.gz`.
`filter_documents`: those documents -> Gopher repetition -> Gopher quality -> C4 quality -> FineWeb quality ->
`<out>/kept/*.jsonl.gz`.

Every step sends what it drops to `<out>/dropped/<step>/*.jsonl.gz` with `metadata.drop_reason`, and the
funnel (docs in, dropped per step and reason, kept) comes back as metrics and a Markdown table. Both stages
work in a temp dir (datatrove's completion markers and logs stay there) and then commit `<out>/` as a new
version of the output (`infra.committed`: files under `<out>/v-<hash>/`, the pointer `<out>/_committed.json`
switched last), so a kill never leaves a partial output readable and the same input gives byte-identical shards.

Metrics: `docs_in`, `docs_out` (kept), `docs_dropped`, `drop_rate`, `seconds`, `docs_per_s`,
`dropped/<step>` and `dropped/<step>/<reason>`, `kept_language_docs/<lang>`; the extract stage adds
`detected_language_docs/<lang>` (top lid.176 label of every document that reached language ID) and
`target_language_share` (share of those in `config.languages`).

Plots (`plots/funnel.png`: documents left after each step and dropped per step and reason;
`plots/quality_scores.png`: extract: the lid.176 score of every document that reached language ID with
`language_threshold`; filter: FineWeb's line-punctuation and short-line ratios of the documents that reached
it with their thresholds), the numbers behind them in `extra["plots"]`.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.filters import (
    C4QualityFilter,
    FineWebQualityFilter,
    GopherQualityFilter,
    GopherRepetitionFilter,
)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.text import TERMINAL_PUNCTUATION
from pydantic import BaseModel, ConfigDict, Field

from infra.committed import POINTER, commit
from infra.figures import artifact_dir
from infra.packaged import LID_176, packaged_file
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.bounded_executor import run_tasks_bounded
from pipelines.plots import ScorePanel, funnel_chart, score_histograms
from pipelines.web.filters import CountLanguages, DropWriter, MinLengthFilter
from pipelines.web.html_extraction import DECODED_BY, HtmlWarcReader, TrafilaturaWithDrops
from pipelines.web.lid import LanguageIdFilter
from pipelines.web.stage_io import (
    first_per_reason,
    iter_docs,
    output_files,
    sample_docs,
    stage_inputs,
    zero_gzip_mtime,
)

log = logging.getLogger(__name__)

WARC_SUFFIXES = (".warc.gz", ".warc")
KEPT, DROPPED = "kept", "dropped"


class ExtractConfig(BaseModel):
    """Config of the web extract + quality-filter stages (profile section `web_extract`)."""

    model_config = ConfigDict(extra="forbid")

    tasks: int = Field(
        2, ge=1, description="datatrove tasks (input files are split between them; one shard each)"
    )
    workers: int = Field(0, ge=0, description="Tasks run at once; 0 = all tasks at once, capped by CPU count")
    task_deadline_s: float = Field(
        3600.0,
        gt=0,
        description="Wall-clock limit of the worker processes (workers > 1); then the stage fails",
    )
    languages: list[str] = Field(["en"], min_length=1, description="lid.176 language codes to keep")
    language_threshold: float = Field(
        0.65, ge=0, le=1, description="Minimum lid.176 score of a kept language"
    )
    extraction_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Trafilatura time limit per page, s (a timeout drops the page: keep it generous)",
    )
    min_doc_chars: int = Field(100, ge=0, description="Drop extracted texts shorter than this (0 = off)")
    dropped_html_chars: int = Field(
        2000, ge=0, description="HTML characters kept in records of failed extractions"
    )
    gopher_repetition: bool = Field(True, description="Run the Gopher repetition filter")
    gopher_dup_line_frac: float = Field(0.3, ge=0, le=1, description="Gopher: max share of duplicated lines")
    gopher_dup_para_frac: float = Field(
        0.3, ge=0, le=1, description="Gopher: max share of duplicated paragraphs"
    )
    gopher_quality: bool = Field(True, description="Run the Gopher quality filter")
    gopher_min_doc_words: int = Field(50, ge=0, description="Gopher: minimum words per document")
    gopher_max_doc_words: int = Field(100_000, ge=1, description="Gopher: maximum words per document")
    gopher_min_stop_words: int = Field(2, ge=0, description="Gopher: minimum distinct English stop words")
    gopher_min_alpha_words_ratio: float = Field(
        0.8,
        ge=0,
        le=1,
        description="Gopher: min share of words with a letter (spaCy counts punctuation as words)",
    )
    c4_quality: bool = Field(True, description="Run the C4 quality filter")
    c4_min_num_sentences: int = Field(
        5, ge=-1, description="C4: minimum sentences after line filtering (-1 = off)"
    )
    c4_filter_no_terminal_punct: bool = Field(
        False, description="C4: drop lines without terminal punctuation (off, as in FineWeb)"
    )
    c4_filter_curly_bracket: bool = Field(True, description="C4: drop documents containing '{'")
    c4_filter_lorem_ipsum: bool = Field(True, description="C4: drop documents containing 'lorem ipsum'")
    fineweb_quality: bool = Field(True, description="Run the FineWeb quality filter")
    fineweb_line_punct_thr: float = Field(
        0.12, ge=0, le=1, description="FineWeb: min share of lines ending in punctuation"
    )
    fineweb_short_line_thr: float = Field(
        0.67, ge=0, le=1, description="FineWeb: max share of lines <= 30 chars"
    )
    fineweb_char_dup_ratio: float = Field(
        0.01, ge=0, le=1, description="FineWeb: max share of chars in duplicated lines"
    )
    fineweb_new_line_ratio: float = Field(0.3, ge=0, description="FineWeb: max newlines per word")
    sample_size: int = Field(5, ge=0, description="Kept documents in the logged sample")
    seed: int = Field(0, description="Seed of the sample draw")


@dataclass
class FunnelStep:
    """One step of the funnel: documents in, dropped (by reason) and passed on."""

    name: str
    docs_in: int
    dropped: int
    docs_out: int
    reasons: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------- pipelines


def _extract_steps(
    config: ExtractConfig, snapshot: str, folder: Path, paths_file: Path, out: Path, lid_model: Path
) -> list[tuple[str | None, object]]:
    def drops(step: str) -> DropWriter:
        return DropWriter(str(out / DROPPED / step), step)

    steps: list[tuple[str | None, object]] = [
        (
            "read",
            HtmlWarcReader(
                str(folder), str(paths_file), snapshot, exclusion_writer=drops("read"), doc_progress=True
            ),
        ),
        (
            "extract",
            TrafilaturaWithDrops(
                config.extraction_timeout_s,
                exclusion_writer=drops("extract"),
                dropped_html_chars=config.dropped_html_chars,
            ),
        ),
    ]
    if config.min_doc_chars:
        steps.append(
            ("min_length", MinLengthFilter(config.min_doc_chars, exclusion_writer=drops("min_length")))
        )
    steps.append(
        (
            "language",
            LanguageIdFilter(
                lid_model, config.languages, config.language_threshold, exclusion_writer=drops("language")
            ),
        )
    )
    return steps


def _quality_steps(
    config: ExtractConfig, folder: Path, paths_file: Path, out: Path
) -> list[tuple[str | None, object]]:
    def drops(step: str) -> DropWriter:
        return DropWriter(str(out / DROPPED / step), step)

    steps: list[tuple[str | None, object]] = [
        (None, JsonlReader(str(folder), paths_file=str(paths_file), add_file_path=False, doc_progress=True))
    ]
    if config.gopher_repetition:
        steps.append(
            (
                "gopher_repetition",
                GopherRepetitionFilter(
                    dup_line_frac=config.gopher_dup_line_frac,
                    dup_para_frac=config.gopher_dup_para_frac,
                    exclusion_writer=drops("gopher_repetition"),
                ),
            )
        )
    if config.gopher_quality:
        steps.append(
            (
                "gopher_quality",
                GopherQualityFilter(
                    min_doc_words=config.gopher_min_doc_words,
                    max_doc_words=config.gopher_max_doc_words,
                    min_stop_words=config.gopher_min_stop_words,
                    max_non_alpha_words_ratio=config.gopher_min_alpha_words_ratio,  # datatrove's name is inverted
                    exclusion_writer=drops("gopher_quality"),
                ),
            )
        )
    if config.c4_quality:
        steps.append(
            (
                "c4_quality",
                C4QualityFilter(
                    min_num_sentences=config.c4_min_num_sentences,
                    filter_no_terminal_punct=config.c4_filter_no_terminal_punct,
                    filter_curly_bracket=config.c4_filter_curly_bracket,
                    filter_lorem_ipsum=config.c4_filter_lorem_ipsum,
                    exclusion_writer=drops("c4_quality"),
                ),
            )
        )
    if config.fineweb_quality:
        steps.append(
            (
                "fineweb_quality",
                FineWebQualityFilter(
                    line_punct_thr=config.fineweb_line_punct_thr,
                    short_line_thr=config.fineweb_short_line_thr,
                    char_duplicates_ratio=config.fineweb_char_dup_ratio,
                    new_line_ratio=config.fineweb_new_line_ratio,
                    exclusion_writer=drops("fineweb_quality"),
                ),
            )
        )
    return steps


def _run(config: ExtractConfig, steps: list[tuple[str | None, object]], out: Path, logs: Path):
    """Run the named steps, then count languages and write `kept/`.

    Returns (funnel, kept docs per language, seconds, {step name: datatrove stats}).
    """
    pipeline = [step for _, step in steps] + [
        CountLanguages(),
        JsonlWriter(str(out / KEPT), compression="gzip"),
    ]
    workers = min(config.tasks, config.workers or config.tasks, os.cpu_count() or 1)
    executor = LocalPipelineExecutor(
        pipeline, tasks=config.tasks, workers=workers, logging_dir=str(logs), skip_completed=False
    )
    start = time.perf_counter()
    if workers > 1:
        # our own spawned processes with a deadline (datatrove's pool can hang in teardown); they re-run a
        # calling *script* unless it has a __main__ guard (`python -m dagster`, console scripts are fine)
        stats = run_tasks_bounded(executor, workers, config.task_deadline_s, stage="web extract/filter")
    else:
        stats = executor.run()
    seconds = time.perf_counter() - start
    # PipelineStats lists one Stats per pipeline step, in pipeline order
    per_step = [s.stats for s in stats.stats] if stats and stats.stats else [{} for _ in pipeline]

    def count(index: int, key: str) -> int:
        metric = per_step[index].get(key)
        return int(metric.total) if metric is not None else 0

    def prefixed(index: int, prefix: str) -> dict[str, int]:
        return {k[len(prefix) :]: count(index, k) for k in sorted(per_step[index]) if k.startswith(prefix)}

    funnel = [
        FunnelStep(
            name, count(i, "total"), count(i, "dropped"), count(i, "forwarded"), prefixed(i, "dropped_")
        )
        for i, (name, _) in enumerate(steps)
        if name is not None
    ]
    step_stats = {name: per_step[i] for i, (name, _) in enumerate(steps) if name is not None}
    return funnel, prefixed(len(pipeline) - 2, "language_"), seconds, step_stats


# ---------------------------------------------------------------- reporting


def _funnel_metrics(funnel: list[FunnelStep], seconds: float) -> dict[str, float]:
    docs_in = funnel[0].docs_in if funnel else 0
    docs_out = funnel[-1].docs_out if funnel else 0
    metrics: dict[str, float] = {
        "docs_in": docs_in,
        "docs_out": docs_out,
        "docs_dropped": docs_in - docs_out,
        "drop_rate": round((docs_in - docs_out) / docs_in, 4) if docs_in else 0.0,
        "seconds": round(seconds, 3),
        "docs_per_s": round(docs_in / seconds, 2) if seconds > 0 else 0.0,
    }
    for step in funnel:
        metrics[f"dropped/{step.name}"] = step.dropped
        for reason, n in step.reasons.items():
            metrics[f"dropped/{step.name}/{reason}"] = n
    return metrics


def _report(
    title: str, funnel: list[FunnelStep], lang_counts: dict[str, int], drop_samples: list[dict]
) -> str:
    rows = [
        {
            "step": s.name,
            "docs in": s.docs_in,
            "dropped": s.dropped,
            "kept": s.docs_out,
            "drop %": f"{100 * s.dropped / s.docs_in:.1f}" if s.docs_in else "-",
        }
        for s in funnel
    ]
    reasons = [{"step": s.name, "reason": r, "docs": n} for s in funnel for r, n in s.reasons.items()]
    langs = [{"language": k, "kept docs": v} for k, v in sorted(lang_counts.items(), key=lambda kv: -kv[1])]
    examples = [
        {
            "step": d["metadata"].get("drop_step"),
            "reason": d["metadata"].get("drop_reason"),
            "url": d["metadata"].get("url"),
        }
        for d in drop_samples
    ]
    return "\n\n".join(
        [
            f"### {title}",
            "**Funnel**",
            markdown_table(rows),
            "**Drop reasons**",
            markdown_table(reasons),
            "**Kept languages**",
            markdown_table(langs),
            "**Dropped examples**",
            markdown_table(examples),
        ]
    )


def _kept_sample(docs: list[dict]) -> list[dict]:
    return [
        {
            "status": "kept",
            "url": d["metadata"].get("url"),
            "language": d["metadata"].get("language"),
            "language_score": d["metadata"].get("language_score"),
            "text": d["text"][:300],
        }
        for d in docs
    ]


def _drop_sample(docs: list[dict]) -> list[dict]:
    return [
        {
            "status": "dropped",
            "step": d["metadata"].get("drop_step"),
            "reason": d["metadata"].get("drop_reason"),
            "url": d["metadata"].get("url"),
            "text": d["text"][:300],
        }
        for d in docs
    ]


def _finish(
    config: ExtractConfig,
    store: ObjectStore,
    snapshot: str,
    title: str,
    steps_fn: Callable,
    input_prefix: str,
    suffixes: tuple[str, ...],
    out_prefix: str,
    extra_metrics: Callable | None = None,
    input_committed: bool = True,
    score_panels: Callable[[Path], list[ScorePanel]] | None = None,
) -> StageResult:
    with tempfile.TemporaryDirectory(prefix="crucible-web-") as tmp_name:
        tmp = Path(tmp_name)
        folder, paths_file = stage_inputs(store, input_prefix, suffixes, tmp, require_commit=input_committed)
        out = tmp / "out"
        steps = steps_fn(folder, paths_file, out)
        funnel, lang_counts, seconds, step_stats = _run(config, steps, out, tmp / "datatrove_logs")
        for path in output_files(out):
            zero_gzip_mtime(path)
        kept_paths = output_files(out / KEPT) if (out / KEPT).exists() else []
        dropped_paths = output_files(out / DROPPED) if (out / DROPPED).exists() else []
        kept = sample_docs(kept_paths, config.sample_size, config.seed)
        dropped = first_per_reason(dropped_paths)

        metrics = _funnel_metrics(funnel, seconds)
        for lang, n in lang_counts.items():
            metrics[f"kept_language_docs/{lang}"] = n
        if extra_metrics:
            metrics.update(extra_metrics(step_stats))
        artifacts, plots = _plots(title, snapshot, funnel, score_panels(out) if score_panels else [])
        meta = {
            "snapshot": snapshot,
            "input": store.uri(input_prefix),
            "funnel": [vars(s) for s in funnel],
            "kept_languages": lang_counts,
            "config": config.model_dump(),
        }
        # new version under <out_prefix>/v-<hash>/, pointer switched last: a kill leaves the old one readable
        committed = commit(store, out_prefix, out, meta=meta)

    out_prefix = out_prefix.rstrip("/")
    log.info(
        "%s %s: %d docs in, %d kept in %.1fs",
        title,
        snapshot,
        metrics["docs_in"],
        metrics["docs_out"],
        seconds,
    )
    return StageResult(
        metrics=metrics,
        outputs={
            "kept": store.uri(f"{committed.version_prefix}/{KEPT}/"),
            "dropped": store.uri(f"{committed.version_prefix}/{DROPPED}/"),
            "manifest": store.uri(f"{out_prefix}/{POINTER}"),
        },
        report_md=_report(f"{title} ({snapshot})", funnel, lang_counts, dropped),
        sample=_kept_sample(kept) + _drop_sample(dropped),
        artifacts=artifacts,
        data_version=committed.version,
        extra={
            "plots": plots,
            "funnel": [vars(s) for s in funnel],
            "kept_languages": lang_counts,
            "kept_prefix": f"{out_prefix}/{KEPT}/",  # resolve with infra.committed.committed_shards
            "shard_keys": committed.keys(),
        },
    )


# ---------------------------------------------------------------- plots


def _shards(out: Path, *parts: str) -> list[Path]:
    folder = out.joinpath(*parts)
    return output_files(folder) if folder.exists() else []


def language_score_panels(config: ExtractConfig, out: Path) -> list[ScorePanel]:
    """lid.176 top-language score of every document that reached language ID (kept, or dropped there by
    reason), with the threshold a target language must pass."""
    series: dict[str, list[float]] = {
        "kept": [d["metadata"]["language_score"] for d in iter_docs(_shards(out, KEPT))]
    }
    for doc in iter_docs(_shards(out, DROPPED, "language")):
        series.setdefault(f"dropped: {doc['metadata']['drop_reason']}", []).append(
            doc["metadata"]["language_score"]
        )
    return [
        ScorePanel(
            f"language ID score (target: {', '.join(config.languages)})",
            series,
            xlabel="lid.176 score of the top language",
            threshold=config.language_threshold,
            threshold_label="language_threshold",
        )
    ]


def fineweb_ratios(text: str) -> tuple[float, float] | None:
    """(share of lines ending in terminal punctuation, share of lines <= 30 chars) as FineWeb's quality
    filter computes them (non-blank lines); None for a document with no such line."""
    lines = [line for line in text.split("\n") if line.strip() != ""]
    if not lines:
        return None
    punct = sum(1 for line in lines if line.endswith(tuple(TERMINAL_PUNCTUATION))) / len(lines)
    short = sum(1 for line in lines if len(line) <= 30) / len(lines)
    return punct, short


def fineweb_score_panels(config: ExtractConfig, out: Path) -> list[ScorePanel]:
    """FineWeb's two line ratios over the documents that reached the FineWeb filter (the text it saw: the
    C4 filter before it may remove lines), by outcome, with the configured thresholds. A document is checked
    for short lines only if its punctuation ratio passed, as in the filter."""
    if not config.fineweb_quality:
        return []
    punct: dict[str, list[float]] = {}
    short: dict[str, list[float]] = {}
    docs = [("kept", d) for d in iter_docs(_shards(out, KEPT))]
    docs += [
        (f"dropped: {d['metadata']['drop_reason']}", d)
        for d in iter_docs(_shards(out, DROPPED, "fineweb_quality"))
    ]
    for outcome, doc in docs:
        ratios = fineweb_ratios(doc["text"])
        if ratios is None:
            continue
        punct.setdefault(outcome, []).append(ratios[0])
        if ratios[0] >= config.fineweb_line_punct_thr:
            short.setdefault(outcome, []).append(ratios[1])
    return [
        ScorePanel("FineWeb: lines ending in punctuation", punct, "share of lines",
                   config.fineweb_line_punct_thr, "min (fineweb_line_punct_thr)"),
        ScorePanel("FineWeb: short lines (<= 30 chars)", short, "share of lines",
                   config.fineweb_short_line_thr, "max (fineweb_short_line_thr)"),
    ]  # fmt: skip


def _plots(
    title: str, snapshot: str, funnel: list[FunnelStep], panels: list[ScorePanel]
) -> tuple[dict[str, Path], dict]:
    folder = artifact_dir("crucible-web-plots-")
    drawn = [funnel_chart(folder / "funnel.png", [vars(s) for s in funnel], f"{title} ({snapshot})")]
    if panels:
        drawn.append(score_histograms(folder / "quality_scores.png", panels, f"{title} ({snapshot})"))
    return {f"plots/{d.path.name}": d.path for d in drawn}, {d.path.stem: d.as_dict() for d in drawn}


# ---------------------------------------------------------------- stages


def extract_documents(
    config: ExtractConfig, store: ObjectStore, snapshot: str, warc_prefix: str, out_prefix: str
) -> StageResult:
    """Main text of the HTML responses in the WARC files under `warc_prefix`, in `config.languages`.

    Commits `kept/NNNNN.jsonl.gz` (metadata url, date, snapshot, warc_file, language, language_score) and
    `dropped/{read,extract,min_length,language}/NNNNN.jsonl.gz` (with `drop_step`, `drop_reason`) as the
    output `<out_prefix>` (its `meta`: funnel, languages, config). WARC files are split between
    `config.tasks` tasks; with more than one worker, a calling script needs an `if __name__ == "__main__"` guard.
    """
    lid_model = packaged_file(LID_176)  # resolved before the run: nothing downloads inside the pipeline

    def language_metrics(step_stats: dict) -> dict[str, float]:
        detected = {
            k[len("language_") :]: int(v.total)
            for k, v in step_stats["language"].items()
            if k.startswith("language_")
        }
        scored = sum(detected.values())
        target = sum(n for lang, n in detected.items() if lang in config.languages)
        out: dict[str, float] = {f"detected_language_docs/{k}": v for k, v in sorted(detected.items())}
        out["target_language_share"] = round(target / scored, 4) if scored else 0.0
        read = step_stats["read"]
        out.update(
            {
                f"decoded/{how}": int(read[f"decoded_{how}"].total) if f"decoded_{how}" in read else 0
                for how in DECODED_BY
            }
        )
        return out

    return _finish(
        config,
        store,
        snapshot,
        "Web extract",
        lambda folder, paths_file, out: _extract_steps(config, snapshot, folder, paths_file, out, lid_model),
        warc_prefix,
        WARC_SUFFIXES,
        out_prefix,
        language_metrics,
        input_committed=True,  # the crawl / ingest commits its WARC files (pipelines/web/warc_files.py)
        score_panels=lambda out: language_score_panels(config, out),
    )


def filter_documents(
    config: ExtractConfig, store: ObjectStore, snapshot: str, docs_prefix: str, out_prefix: str
) -> StageResult:
    """Gopher repetition -> Gopher quality -> C4 quality -> FineWeb quality on `<docs_prefix>/kept/`.

    Writes `<out_prefix>/kept/NNNNN.jsonl.gz` and `<out_prefix>/dropped/<filter>/NNNNN.jsonl.gz` with
    `drop_reason` (the filter's own reason string, e.g. `dup_line_frac`, `gopher_short_doc`).
    """
    return _finish(
        config,
        store,
        snapshot,
        "Web quality filter",
        lambda folder, paths_file, out: _quality_steps(config, folder, paths_file, out),
        f"{docs_prefix.rstrip('/')}/{KEPT}",
        (".jsonl.gz",),
        out_prefix,
        score_panels=lambda out: fineweb_score_panels(config, out),
    )
