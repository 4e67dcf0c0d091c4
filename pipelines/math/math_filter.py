"""Math & science filter (RECIPE.md, Math & science): candidates -> synthetic-text filter -> LLM judge on a
sample (chunk-and-aggregate, 0-5 additive educational rubric) -> judge distilled into a fast classifier ->
classifier applied to every candidate -> documents above the threshold kept.

Output: the committed output `math/filtered/<tag>` (`infra.committed`, one version, pointer last) holding
`kept/part-*.jsonl.gz` (metadata gains `math_score`, `judge_score` when judged, `math_classifier`),
`dropped/part-*.jsonl.gz` (with `drop_reason`) and `model/` (the distilled classifier). The judge quality gate runs first; its result comes back in `extra["judge_gate"]` and in the
metrics (`judge_gate/*`) so the asset layer can turn it into a blocking (cluster) or warning (tiny) check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from classifiers.fasttext_text import FastTextParams
from classifiers.judge.client import JudgeClient
from classifiers.judge.judge_config import JudgeConfig, build_judge
from classifiers.judge.quality_gate import run_quality_gate
from infra.committed import commit
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.knowledge.document_shards import write_documents
from pipelines.math.candidates import gather_candidates
from pipelines.math.chunk_scores import aggregate_chunk_scores, split_into_chunks
from pipelines.math.distill import distill_judge
from pipelines.math.synthetic_text import SyntheticTextConfig, drop_synthetic
from pipelines.plots import ScorePanel, score_histograms

log = logging.getLogger(__name__)

TASK = "edu_math"


class MathFilterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    web_prefixes: list[str] = Field(
        ["web/filtered/*/kept/"], description="Store prefixes of web document shards (`*` = any snapshot)"
    )
    doc_packages: list[str] = Field(
        ["python-sympy-doc", "maxima-doc"], description="Debian math documentation packages used as sources"
    )
    use_champ: bool = Field(True, description="Add champ-dataset competition problems with solutions")
    min_chars: int = Field(300, ge=0, description="Candidates shorter than this are skipped (counted)")
    max_candidates_per_source: int | None = Field(
        400, ge=1, description="Seeded sample per source; None = all"
    )
    judge_sample_size: int = Field(
        120, ge=0, description="Candidates the LLM judge scores (the rest: classifier)"
    )
    chunk_chars: int = Field(1500, ge=200, description="Chunk size for chunk-and-aggregate judging")
    max_chunks: int = Field(3, ge=1, description="Chunks judged per document at most (evenly spaced)")
    top_chunk_bonus: float = Field(0.5, ge=0, le=1, description="Aggregate = mean + bonus * (best - mean)")
    keep_threshold: float = Field(3.0, ge=0, le=5, description="Judge score (0-5) that counts as 'keep'")
    fallback_top_fraction: float = Field(
        0.3,
        gt=0,
        lt=1,
        description="If the judge almost never reaches keep_threshold, top share labelled keep",
    )
    distill_embeddings: bool = Field(True, description="Also train a MiniLM linear-head student and compare")
    apply_student: str = Field(
        "fasttext", description="Student applied to all candidates: fasttext | minilm_linear"
    )
    fasttext: FastTextParams = Field(
        default_factory=lambda: FastTextParams(epoch=25, lr=0.5, dim=32, word_ngrams=2, min_count=1),
        description="fastText student hyper-parameters",
    )
    synthetic: SyntheticTextConfig = Field(
        default_factory=SyntheticTextConfig, description="Synthetic-text rules"
    )
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="Which judge, its budget and quality gate"
    )
    output_prefix: str = Field("math/filtered", description="Store prefix of this stage's outputs")
    shard_docs: int = Field(2000, ge=1, description="Documents per output shard")
    seed: int = Field(0, description="Seed for sampling and training")


def run_math_filter(
    store: ObjectStore,
    config: MathFilterConfig,
    work_dir: Path,
    tag: str = "all",
    judge: JudgeClient | None = None,
    embedder=None,
    debian_cache: Path | None = None,
) -> StageResult:
    """Run the filter; `judge` / `embedder` can be passed in (tests, shared models), else built from config."""
    started = time.time()
    work_dir = Path(work_dir)
    stats: Counter = Counter()
    candidates = gather_candidates(
        store,
        config.web_prefixes,
        config.doc_packages,
        config.use_champ,
        config.min_chars,
        config.max_candidates_per_source,
        config.seed,
        stats,
        debian_cache,
    )
    dropped: list[dict] = []
    natural = list(drop_synthetic(candidates, stats, config.synthetic, dropped))

    judge = judge or build_judge(config.judge, store, TASK)
    gate = run_quality_gate(judge, config.judge.gate)

    rng = random.Random(config.seed)
    sample = rng.sample(natural, min(config.judge_sample_size, len(natural)))
    judged = judge_documents(judge, sample, config)
    judged_docs = [d for d in sample if judged[d["id"]] is not None]
    stats["judge/docs_unscored"] += len(sample) - len(judged_docs)

    if embedder is None and config.distill_embeddings:
        from classifiers.embedding_quality import SentenceEmbedder

        embedder = SentenceEmbedder()
    students, distill_stats = distill_judge(
        [d["id"] for d in judged_docs],
        [d["text"] for d in judged_docs],
        [judged[d["id"]] for d in judged_docs],
        config.keep_threshold,
        work_dir / "model",
        config.seed,
        config.fasttext,
        embedder if config.distill_embeddings else None,
        fallback_top_fraction=config.fallback_top_fraction,
    )
    applied = next((s for s in students if s.name == config.apply_student), students[0] if students else None)

    texts = [d["text"] for d in natural]
    if applied is not None:
        probs = applied.predict(texts)
        keep_mask = probs >= applied.threshold
    else:  # no student: only judged documents can be decided
        probs = np.array([judged.get(d["id"]) or 0.0 for d in natural]) / 5.0
        keep_mask = np.array([(judged.get(d["id"]) or 0.0) >= config.keep_threshold for d in natural])
    kept = []
    for doc, p, keep in zip(natural, probs, keep_mask, strict=True):
        meta = doc["metadata"]
        meta["math_score"] = round(float(p), 4)
        meta["math_classifier"] = applied.name if applied else "judge_only"
        if judged.get(doc["id"]) is not None:
            meta["judge_score"] = round(judged[doc["id"]], 4)
        if keep:
            kept.append(doc)
            stats[f"kept/{meta['source']}"] += 1
        else:
            meta["drop_reason"] = "below_math_threshold"
            dropped.append(doc)
            stats["dropped/below_math_threshold"] += 1

    out_prefix = f"{config.output_prefix.rstrip('/')}/{tag}"
    outputs = _publish(store, out_prefix, kept, dropped, config.shard_docs, applied)
    metrics = _metrics(stats, candidates, natural, kept, judge, gate, distill_stats, students, started)
    report = _report(stats, gate, students, applied, judge, metrics)
    artifacts = {f"model/{s.model_path.name}": s.model_path for s in students}
    judged_path = work_dir / "judged_sample.jsonl"
    judged_path.write_text(
        "".join(
            json.dumps(
                {
                    "id": d["id"],
                    "source": d["metadata"]["source"],
                    "judge_score": judged[d["id"]],
                    "text": d["text"][:300],
                }
            )
            + "\n"
            for d in judged_docs
        )
    )
    artifacts["judged_sample.jsonl"] = judged_path
    plot = _score_plot(work_dir / "plots" / "math_scores.png", natural, judged, applied, config, tag)
    artifacts["plots/math_scores.png"] = plot.path
    digest = hashlib.sha256("".join(sorted(d["id"] for d in kept)).encode()).hexdigest()[:16]
    samples = [
        {
            "id": d["id"],
            "source": d["metadata"]["source"],
            "math_score": d["metadata"]["math_score"],
            "text": d["text"][:400],
        }
        for d in sorted(kept, key=lambda d: -d["metadata"]["math_score"])[:5]
    ]
    return StageResult(
        metrics,
        outputs,
        report,
        samples,
        artifacts,
        digest,
        extra={
            "judge_gate": asdict(gate),
            "students": [
                {
                    "name": s.name,
                    "threshold": s.threshold,
                    "agreement": s.agreement,
                    "model_path": str(s.model_path),
                }
                for s in students
            ],
            "applied_student": applied.name if applied else None,
            "plots": {"math_scores": plot.as_dict()},
        },
    )


def _score_plot(path: Path, natural: list[dict], judged: dict, applied, config: MathFilterConfig, tag: str):
    """The applied classifier's score of every candidate left after the synthetic filter, kept or dropped,
    with its threshold; next to it the judge's aggregate 0-5 score of the judged sample, with `keep_threshold`
    (the labels the classifier was distilled from)."""
    by_outcome: dict[str, list[float]] = {"kept": [], "dropped": []}
    for doc in natural:
        meta = doc["metadata"]
        by_outcome["dropped" if meta.get("drop_reason") else "kept"].append(meta["math_score"])
    judge_scores = [s for s in (judged.get(d["id"]) for d in natural) if s is not None]
    name = applied.name if applied else "judge only (score / 5)"
    panels = [
        ScorePanel(f"math classifier: {name}", by_outcome, "P(math)",
                   applied.threshold if applied else config.keep_threshold / 5, "threshold"),
        ScorePanel("LLM judge, judged sample", {"judged": judge_scores}, "aggregate judge score (0-5)",
                   config.keep_threshold, "keep_threshold", value_range=(0.0, 5.0)),
    ]  # fmt: skip
    return score_histograms(path, panels, f"math filter ({tag})")


def judge_documents(
    judge: JudgeClient, docs: list[dict], config: MathFilterConfig
) -> dict[str, float | None]:
    """Chunk-and-aggregate judge score per document id (None when no chunk could be scored)."""
    chunks = [split_into_chunks(d["text"], config.chunk_chars, config.max_chunks) for d in docs]
    flat = [c for cs in chunks for c in cs]
    scores = judge.score_texts(flat)
    out: dict[str, float | None] = {}
    i = 0
    for doc, cs in zip(docs, chunks, strict=True):
        chunk_scores = [s.score for s in scores[i : i + len(cs)]]
        out[doc["id"]] = aggregate_chunk_scores(chunk_scores, [len(c) for c in cs], config.top_chunk_bonus)
        i += len(cs)
    return out


def _publish(
    store: ObjectStore, prefix: str, kept: list[dict], dropped: list[dict], shard_docs: int, applied
) -> dict[str, str]:
    """Commit kept/dropped shards (and the applied classifier) as one version of `prefix`."""
    prefix = prefix.rstrip("/")
    with tempfile.TemporaryDirectory(prefix="crucible-math-") as tmp:
        root = Path(tmp)
        for name, docs in (("kept", kept), ("dropped", dropped)):
            for n, start in enumerate(range(0, max(len(docs), 1), shard_docs)):
                write_documents(root / f"{name}/part-{n:05d}.jsonl.gz", docs[start : start + shard_docs])
        if applied is not None:
            (root / "model").mkdir()
            shutil.copyfile(applied.model_path, root / "model" / applied.model_path.name)
        out = commit(store, prefix, root, meta={"kept": len(kept), "dropped": len(dropped)})
    # `kept`/`dropped` are paths inside the committed output (read them with document_shards.read_documents)
    outputs = {"kept": f"{prefix}/kept/", "dropped": f"{prefix}/dropped/", "committed": out.version}
    if applied is not None:
        outputs["classifier"] = out.key(f"model/{applied.model_path.name}")
    return outputs


def _metrics(
    stats, candidates, natural, kept, judge, gate, distill_stats, students, started
) -> dict[str, float]:
    metrics = {k: float(v) for k, v in stats.items()}
    metrics.update(
        candidates=float(len(candidates)),
        after_synthetic_filter=float(len(natural)),
        kept=float(len(kept)),
        keep_rate=len(kept) / max(1, len(natural)),
        seconds=time.time() - started,
    )
    metrics.update(judge.metrics())
    metrics.update(gate.metrics())
    metrics.update(distill_stats)
    for s in students:
        metrics.update({f"distill/{s.name}/{k}": float(v) for k, v in s.agreement.items()})
        metrics[f"distill/{s.name}/threshold"] = s.threshold
    return metrics


def _report(stats, gate, students, applied, judge, metrics) -> str:
    sources = sorted({k.split("/", 1)[1] for k in stats if k.startswith("candidates/")})
    funnel = [
        {"source": s, "candidates": stats[f"candidates/{s}"], "kept": stats[f"kept/{s}"]} for s in sources
    ]
    synth = [
        {"rule": k.split("/")[-1], "dropped": v}
        for k, v in sorted(stats.items())
        if k.startswith("dropped/synthetic/")
    ] or [{"rule": "(none fired)", "dropped": 0}]
    student_rows = [
        {
            "student": s.name,
            "applied": s is applied,
            "threshold": round(s.threshold, 3),
            **{k: round(v, 3) for k, v in s.agreement.items()},
        }
        for s in students
    ]
    lines = [
        "## Math & science filter",
        "",
        f"**{gate.message}**",
        "",
        markdown_table(gate.per_kind),
        "",
        "### Documents per source",
        markdown_table(funnel),
        "",
        f"Synthetic-text filter kept {stats['synthetic_filter/kept']} documents:",
        markdown_table(synth),
        "",
        f"Judge `{judge.backend.model_id}` / prompt `{judge.prompt.prompt_id}`: "
        f"{int(metrics.get('judge/calls', 0))} calls, {int(metrics.get('judge/cache_hits', 0))} cache hits, "
        f"{int(metrics.get('judge/parsed_by/failed', 0))} unparseable, "
        f"{int(metrics.get('judge/call_failed', 0))} failed calls, cost ${metrics.get('judge/cost_usd', 0):.4f}.",
        "",
        "### Students (distilled from the judge; agreement on held-out judged documents)",
        markdown_table(student_rows) if student_rows else "_no student: too few judged documents_",
    ]
    return "\n".join(lines)
