"""World-knowledge classifier stage (RECIPE.md, Web) and the rescue of dropped web documents.

`train_world_knowledge(store, config, work_dir)`: assemble positives (Wikipedia dump, dict-* dictionaries,
optionally judge-labelled web samples) and negatives (crawled web documents, fortune cookies), split by
group (article / dictionary passage / page), train fastText and a MiniLM linear head on the same split,
and compare them on the same held-out set. The models and `model_card.json` are committed as one version of
`<output_prefix>` (`infra.committed`; the card is also the version's `meta`); `current_classifier` reads it.

`rescue_documents(store, config, model_key, threshold, snapshot)`: score the web documents the heuristic
filters dropped (`web/filtered/<snapshot>/dropped/`) and commit the ones the classifier calls knowledge
as the output `knowledge/rescued/<snapshot>`, with counts per drop reason and samples.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from classifiers.binary_metrics import roc_auc
from classifiers.judge.client import JudgeClient
from classifiers.judge.judge_config import JudgeConfig, build_judge
from classifiers.labelled_text import LabelledText, TrainedClassifier, source_counts, split_by_group
from classifiers.world_knowledge import (
    WorldKnowledgeClassifier,
    WorldKnowledgeParams,
    train_world_knowledge_classifier,
)
from infra.committed import commit, read_committed
from infra.figures import artifact_dir
from infra.partition_keys import partition_prefix
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.knowledge.document_shards import read_documents, write_documents
from pipelines.knowledge.wikipedia_dump import gensim_sample_dump
from pipelines.knowledge.world_knowledge_data import (
    dictionary_examples,
    document_group,
    fortune_examples,
    web_examples,
    wikipedia_examples,
)
from pipelines.plots import BarPanel, ScorePanel, bar_panels, score_histograms

log = logging.getLogger(__name__)

ENCYCLOPEDIC = ("wikipedia", "dict-")
JUDGE_TASK = "world_knowledge"


class WorldKnowledgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    wikipedia_dump: str | None = Field(
        None, description="MediaWiki XML dump (.xml/.bz2); None = gensim's sample"
    )
    max_wikipedia_articles: int | None = Field(None, ge=1, description="Read at most this many articles")
    max_wikipedia_passages: int | None = Field(1000, ge=1, description="Seeded sample of Wikipedia passages")
    dictionaries: list[str] = Field(
        ["dict-foldoc", "dict-gcide", "dict-wn", "dict-jargon", "dict-elements"],
        description="Debian dictd packages used as encyclopedic positives",
    )
    max_passages_per_dictionary: int | None = Field(200, ge=1, description="Seeded sample per dictionary")
    low_value_packages: list[str] = Field(
        ["fortunes", "fortunes-min"], description="Fortune packages (negatives)"
    )
    max_low_value: int | None = Field(500, ge=1, description="Seeded sample of fortunes")
    web_prefixes: list[str] = Field(["web/filtered/*/kept/"], description="Crawled web documents (negatives)")
    max_web_docs: int | None = Field(2000, ge=1, description="Seeded sample of web negatives")
    dropped_prefix: str = Field(
        "web/filtered/{snapshot}/dropped/", description="Dropped web docs of a snapshot"
    )
    dropped_negative_fraction: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="Share of dropped docs (by id hash) used as negatives; those are never rescued",
    )
    passage_min_chars: int = Field(
        300, ge=50, description="Wikipedia / dictionary passages: at least this long"
    )
    passage_max_chars: int = Field(1500, ge=100, description="... and at most this long")
    judge_sample_size: int = Field(48, ge=0, description="Web docs labelled by the LLM judge (0 = none)")
    judge_positive_min: float = Field(
        4.0, ge=0, le=5, description="Judge score at or above: knowledge positive"
    )
    judge_negative_max: float = Field(1.0, ge=0, le=5, description="Judge score at or below: negative")
    judge: JudgeConfig = Field(default_factory=JudgeConfig, description="Judge used to label web samples")
    classifier: WorldKnowledgeParams = Field(default_factory=WorldKnowledgeParams, description="fastText")
    compare_embeddings: bool = Field(True, description="Also train the MiniLM linear head and compare")
    rescue_min_score: float | None = Field(
        0.9,
        ge=0,
        le=1,
        description="P(knowledge) needed to rescue a dropped doc; None = the classifier threshold",
    )
    output_prefix: str = Field("classifiers/world_knowledge", description="Store prefix for trained models")
    rescued_prefix: str = Field("knowledge/rescued", description="Store prefix for rescued documents")
    seed: int = Field(0, description="Seed for sampling, splits and training")


def _dropped_used_for_training(doc: dict, config: WorldKnowledgeConfig) -> bool:
    if config.dropped_negative_fraction <= 0:
        return False
    h = int(hashlib.sha256(f"{config.seed}:{document_group(doc)}".encode()).hexdigest()[:12], 16) / 16**12
    return h < config.dropped_negative_fraction


def assemble_examples(
    store: ObjectStore,
    config: WorldKnowledgeConfig,
    judge: JudgeClient | None = None,
    debian_cache: Path | None = None,
    stats: dict | None = None,
) -> list[LabelledText]:
    stats = stats if stats is not None else {}
    seed = config.seed
    dump = Path(config.wikipedia_dump) if config.wikipedia_dump else gensim_sample_dump()
    examples = wikipedia_examples(
        dump,
        config.max_wikipedia_passages,
        seed,
        config.passage_min_chars,
        config.passage_max_chars,
        config.max_wikipedia_articles,
        stats,
    )
    for package in config.dictionaries:
        examples += dictionary_examples(
            package,
            config.max_passages_per_dictionary,
            seed,
            config.passage_min_chars,
            config.passage_max_chars,
            debian_cache,
        )
    examples += fortune_examples(
        config.low_value_packages, config.max_low_value, seed, cache_dir=debian_cache
    )
    examples += web_examples(store, config.web_prefixes, "web/kept", config.max_web_docs, seed)
    if config.dropped_negative_fraction > 0:
        examples += web_examples(
            store,
            [config.dropped_prefix.format(snapshot="*")],
            "web/dropped",
            config.max_web_docs,
            seed,
            accept=lambda d: _dropped_used_for_training(d, config),
        )
    if judge is not None and config.judge_sample_size:
        examples = judge_labelled_web(examples, judge, config, stats)
    return examples


def judge_labelled_web(
    examples: list[LabelledText], judge: JudgeClient, config: WorldKnowledgeConfig, stats: dict
) -> list[LabelledText]:
    """Relabel a seeded sample of web negatives by the judge: high scores become 'judge/web' positives,
    low scores stay negatives (as 'judge/web-low'), the uncertain middle is left out."""
    rng = np.random.default_rng(config.seed)
    web_idx = [i for i, e in enumerate(examples) if e.source.startswith("web/")]
    size = min(config.judge_sample_size, len(web_idx) // 2)  # the other half stays plain web negatives
    if size < config.judge_sample_size:
        log.warning(
            "judging %d of %d web docs (at most half), not %d", size, len(web_idx), config.judge_sample_size
        )
    chosen = set(rng.choice(web_idx, size=size, replace=False).tolist()) if size else set()
    order = sorted(chosen)
    scores = judge.score_texts([examples[i].text for i in order])
    relabelled: dict[int, LabelledText | None] = {}
    for i, s in zip(order, scores, strict=True):
        e = examples[i]
        if s.score is None or config.judge_negative_max < s.score < config.judge_positive_min:
            relabelled[i] = None
            stats["judge/web_uncertain"] = stats.get("judge/web_uncertain", 0) + 1
        elif s.score >= config.judge_positive_min:
            relabelled[i] = LabelledText(e.text, 1, "judge/web", e.group)
            stats["judge/web_positive"] = stats.get("judge/web_positive", 0) + 1
        else:
            relabelled[i] = LabelledText(e.text, 0, "judge/web-low", e.group)
            stats["judge/web_negative"] = stats.get("judge/web_negative", 0) + 1
    return [relabelled.get(i, e) for i, e in enumerate(examples) if relabelled.get(i, e) is not None]


def encyclopedic_vs_web_auc(test: list[LabelledText], scores) -> float:
    """The acceptance number: held-out Wikipedia + dictionary passages vs held-out web pages (crawled pages
    the judge did not call knowledge-rich: those left out, as they are positives of neither kind)."""
    idx = [i for i, e in enumerate(test) if e.source.startswith(ENCYCLOPEDIC) or _is_web_negative(e)]
    scores = np.asarray(scores)
    return roc_auc([test[i].source.startswith(ENCYCLOPEDIC) for i in idx], scores[idx])


def _is_web_negative(example: LabelledText) -> bool:
    return example.source.startswith("web/") or example.source == "judge/web-low"


def train_world_knowledge(
    store: ObjectStore,
    config: WorldKnowledgeConfig,
    work_dir: Path,
    judge: JudgeClient | None = None,
    embedder=None,
    debian_cache: Path | None = None,
) -> StageResult:
    """Train + compare the classifiers; see the module docstring. Model files come back as artifacts."""
    started = time.time()
    work_dir = Path(work_dir)
    stats: dict = {}
    if judge is None and config.judge_sample_size:
        judge = build_judge(config.judge, store, JUDGE_TASK)
    examples = assemble_examples(store, config, judge, debian_cache, stats)
    if not any(e.label == 0 for e in examples) or not any(e.label == 1 for e in examples):
        raise ValueError(f"world knowledge needs positives and negatives; got {source_counts(examples)}")
    splits = split_by_group(examples, config.seed)
    data_version = hashlib.sha256(
        "".join(sorted(hashlib.sha256(f"{e.label}|{e.text}".encode()).hexdigest() for e in examples)).encode()
    ).hexdigest()[:16]

    trained: list[TrainedClassifier] = [
        train_world_knowledge_classifier(splits, work_dir, config.classifier, config.seed)
    ]
    scorers = {trained[0].name: WorldKnowledgeClassifier(trained[0].model_path, trained[0].threshold).score}
    if config.compare_embeddings:
        from classifiers.embedding_quality import (
            LinearHead,
            SentenceEmbedder,
            train_embedding_quality_classifier,
        )

        embedder = embedder or SentenceEmbedder()
        trained.append(
            train_embedding_quality_classifier(splits, work_dir, embedder, "world_knowledge_minilm")
        )
        head = LinearHead.load(trained[1].model_path)
        scorers[trained[1].name] = lambda texts: head.predict_proba(embedder.embed(texts))

    test_texts = [e.text for e in splits["test"]]
    rows, metrics, panels = [], {}, []
    for clf in trained:
        t0 = time.time()
        scores = scorers[clf.name](test_texts)
        panels.append(_heldout_panel(clf, splits["test"], scores))
        per_doc_ms = 1000 * (time.time() - t0) / max(1, len(test_texts))
        clf.metrics["auc_encyclopedic_vs_web"] = encyclopedic_vs_web_auc(splits["test"], scores)
        metrics.update({f"{clf.name}/{k}": float(v) for k, v in clf.metrics.items()})
        metrics[f"{clf.name}/ms_per_doc"] = per_doc_ms
        rows.append(
            {
                "classifier": clf.name,
                "auc_encyclopedic_vs_web": round(clf.metrics["auc_encyclopedic_vs_web"], 4),
                "auc_all": round(clf.metrics["auc"], 4),
                "precision": round(clf.metrics["precision"], 3),
                "recall": round(clf.metrics["recall"], 3),
                "f1": round(clf.metrics["f1"], 3),
                "threshold": round(clf.threshold, 3),
                "ms_per_doc": round(per_doc_ms, 3),
            }
        )
    for name, part in splits.items():
        metrics[f"examples/{name}"] = float(len(part))
    for key, n in source_counts(examples).items():
        metrics[f"examples_by_source/{key}"] = float(n)
    metrics.update({k: float(v) for k, v in stats.items()})
    metrics["seconds"] = time.time() - started
    if judge is not None:
        metrics.update(judge.metrics())

    outputs, artifacts = {}, {}
    card = {
        c.name: {
            "threshold": c.threshold,
            "model": c.model_path.name,  # a file of the committed version (its key: out.key(name))
            "metrics": c.metrics,
            "per_source": c.per_source,
        }
        for c in trained
    }
    card["data_version"] = data_version
    files = {c.model_path.name: c.model_path for c in trained}
    (work_dir / "model_card.json").write_text(json.dumps(card, indent=2, default=float))
    files["model_card.json"] = work_dir / "model_card.json"
    out = commit(store, config.output_prefix, files, meta=json.loads(files["model_card.json"].read_text()))
    for clf in trained:
        outputs[clf.name] = out.key(clf.model_path.name)
        artifacts[f"{clf.name}/{clf.model_path.name}"] = clf.model_path
    outputs["model_card"] = out.key("model_card.json")
    table = markdown_table(rows)
    (work_dir / "classifier_comparison.md").write_text(table + "\n")
    artifacts["classifier_comparison.md"] = work_dir / "classifier_comparison.md"
    artifacts["model_card.json"] = work_dir / "model_card.json"
    heldout = score_histograms(
        work_dir / "plots" / "heldout_scores.png", panels, "world-knowledge classifiers, held-out split"
    )
    artifacts["plots/heldout_scores.png"] = heldout.path
    report = "\n".join(
        [
            "## World-knowledge classifier",
            "",
            "Held-out split by group (Wikipedia article, dictionary passage, web page); both classifiers see the "
            "same train / valid / test documents.",
            "",
            table,
            "",
            "### Held-out scores per source (fastText)",
            markdown_table(trained[0].per_source),
            "",
            "### Training examples per source:label",
            markdown_table([{"source": k, "n": v} for k, v in source_counts(examples).items()]),
        ]
    )
    return StageResult(
        metrics,
        outputs,
        report,
        [],
        artifacts,
        data_version,
        extra={
            "thresholds": {c.name: c.threshold for c in trained},
            "comparison": rows,
            "plots": {"heldout_scores": heldout.as_dict()},
        },
    )


def current_classifier(store: ObjectStore, config: WorldKnowledgeConfig) -> tuple[str, str, float, str]:
    """(name, model key, threshold, training data version) of the committed classifier the rescue applies:
    the first by name (fastText, the fast one applied at scale)."""
    out = read_committed(store, config.output_prefix)
    name = min(k for k in out.meta if k != "data_version")
    entry = out.meta[name]
    return name, out.key(entry["model"]), float(entry["threshold"]), str(out.meta["data_version"])


def rescue_documents(
    store: ObjectStore,
    config: WorldKnowledgeConfig,
    model_key: str,
    threshold: float,
    snapshot: str,
    n_samples: int = 5,
) -> StageResult:
    """Apply the world-knowledge classifier to a snapshot's dropped web docs; publish the rescued ones."""
    started = time.time()
    threshold = config.rescue_min_score if config.rescue_min_score is not None else threshold
    docs = list(read_documents(store, config.dropped_prefix.format(snapshot=snapshot)))
    stats: Counter = Counter()
    candidates = []
    for doc in docs:
        if _dropped_used_for_training(doc, config):
            stats["skipped/trained_on"] += 1
        else:
            candidates.append(doc)
    with store.local_copy(model_key) as path:
        scores = WorldKnowledgeClassifier(path, threshold).score([d["text"] for d in candidates])
    rescued = []
    by_outcome: dict[str, list[float]] = {"rescued": [], "left dropped": []}
    for doc, score in zip(candidates, scores, strict=True):
        reason = doc.get("metadata", {}).get("drop_reason", "unknown")
        stats[f"dropped_in/{reason}"] += 1
        by_outcome["rescued" if score >= threshold else "left dropped"].append(float(score))
        if score >= threshold:
            doc["metadata"].update(
                world_knowledge_score=round(float(score), 4),
                rescued_from=reason,
                world_knowledge_model=model_key,
            )
            rescued.append(doc)
            stats[f"rescued/{reason}"] += 1
    prefix = partition_prefix(config.rescued_prefix, snapshot)
    with tempfile.TemporaryDirectory(prefix="crucible-rescue-") as tmp:
        write_documents(Path(tmp) / "part-00000.jsonl.gz", rescued)
        out = commit(store, prefix, Path(tmp), meta={"snapshot": snapshot, "model": model_key})
    metrics = {k: float(v) for k, v in stats.items()}
    metrics.update(
        dropped_docs=float(len(docs)),
        scored=float(len(candidates)),
        rescued=float(len(rescued)),
        rescue_rate=len(rescued) / max(1, len(candidates)),
        threshold=threshold,
        seconds=time.time() - started,
    )
    reasons = sorted({k.split("/", 1)[1] for k in stats if k.startswith("dropped_in/")})
    rows = [
        {"drop_reason": r, "dropped": stats[f"dropped_in/{r}"], "rescued": stats[f"rescued/{r}"]}
        for r in reasons
    ]
    top = sorted(rescued, key=lambda d: -d["metadata"]["world_knowledge_score"])[:n_samples]
    samples = [
        {
            "id": d.get("id"),
            "url": d["metadata"].get("url"),
            "score": d["metadata"]["world_knowledge_score"],
            "rescued_from": d["metadata"]["rescued_from"],
            "text": d["text"][:400],
        }
        for d in top
    ]
    report = "\n".join(
        [
            f"## World-knowledge rescue, snapshot {snapshot}",
            "",
            f"{len(rescued)} of {len(candidates)} dropped documents rescued (P(knowledge) >= {threshold:.2f}).",
            "",
            markdown_table(rows),
            "",
            "### Samples",
            "",
            *[
                f"- **{s['score']}** `{s['url'] or s['id']}` ({s['rescued_from']}): {s['text'][:200]!r}"
                for s in samples
            ],
        ]
    )
    digest = hashlib.sha256("".join(sorted(str(d.get("id")) for d in rescued)).encode()).hexdigest()[:16]
    plots = _rescue_plots(snapshot, threshold, by_outcome, rows)
    return StageResult(
        metrics,
        {"rescued": f"{prefix}/", "committed": out.version},
        report,
        samples,
        {f"plots/{d.path.name}": d.path for d in plots},
        digest,
        extra={"plots": {d.path.stem: d.as_dict() for d in plots}},
    )


def _heldout_panel(clf: TrainedClassifier, test: list[LabelledText], scores) -> ScorePanel:
    """A classifier's held-out scores by true label, with the threshold it was tuned to."""
    series: dict[str, list[float]] = {"knowledge (label 1)": [], "not knowledge (label 0)": []}
    for example, score in zip(test, scores, strict=True):
        series["knowledge (label 1)" if example.label == 1 else "not knowledge (label 0)"].append(
            float(score)
        )
    return ScorePanel(clf.name, series, "P(world knowledge)", clf.threshold, "threshold")


def _rescue_plots(snapshot: str, threshold: float, by_outcome: dict[str, list[float]], rows: list[dict]):
    """`rescue_scores.png`: the classifier's score of every scored dropped document, rescued or not, with
    the threshold; `rescued_by_reason.png`: dropped and rescued documents per drop reason."""
    folder = artifact_dir("crucible-rescue-plots-")
    title = f"world-knowledge rescue ({snapshot})"
    hist = score_histograms(
        folder / "rescue_scores.png",
        [
            ScorePanel(
                "dropped web documents scored", by_outcome, "P(world knowledge)", threshold, "threshold"
            )
        ],
        title,
    )
    reasons = [r["drop_reason"] for r in rows]
    series = {"dropped": [r["dropped"] for r in rows], "rescued": [r["rescued"] for r in rows]}
    bars = bar_panels(
        folder / "rescued_by_reason.png", [BarPanel("per drop reason", reasons, series, "documents")], title
    )
    return [hist, bars]
