"""`dedup_partition`: one snapshot of web documents or code files -> kept documents, clusters, index entry.

Inputs (datatrove JSONL.gz shards): web `web/filtered/<snapshot>/kept/*.jsonl.gz`, code
`code/files/<snapshot>/*.jsonl.gz` (the files of the producer's committed version when it has one). Outputs:
the committed output `dedup/<kind>/<snapshot>` (`infra.committed`; read it with `read_committed`) holding
`kept/<shard>.jsonl.gz` (the input lines of the kept documents, in order) and `clusters/<shard>.parquet`
(every document in a cluster of two or more: its root, the root's snapshot, the reason it was dropped), its
`meta` the seq, metrics and stale partitions; and the index entry under `dedup/<kind>/index/` (index.py).
Order: shard outputs, then the index log record (the compare-and-swap), then the output pointer.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow.parquet as pq

from infra.committed import CommittedFile, commit_uploaded, committed_keys
from infra.figures import artifact_dir
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.dedup.config import DedupConfig
from pipelines.dedup.index import (
    IndexConflictError,
    IndexEntry,
    assign_seq,
    check_compatible,
    commit_entry,
    earlier_entries,
    read_index,
    stale_partitions,
    verify_parts,
)
from pipelines.dedup.job import EngineResult, PartitionJob
from pipelines.dedup.shards import SHARD_SUFFIX, PartitionLayout
from pipelines.plots import funnel_chart

log = logging.getLogger(__name__)

_COUNTS = (
    "docs_in",
    "docs_out",
    "tokens_in",
    "tokens_out",
    "exact_dups",
    "url_dups",
    "near_dups",
    "cross_partition_dups",
)
# Times a run recomputes after another partition committed first (each time it dedups against that one too).
MAX_ATTEMPTS = 3


def default_input_prefix(kind: str, snapshot: str) -> str:
    return f"web/filtered/{snapshot}/kept" if kind == "web" else f"code/files/{snapshot}"


def list_shards(store: ObjectStore, prefix: str) -> list[str]:
    """The input shards: those of the committed output enclosing `prefix` if there is one, else a listing."""
    prefix = prefix.rstrip("/") + "/"
    keys = committed_keys(store, prefix, SHARD_SUFFIX)
    if keys is None:  # a producer that does not commit yet (plain shards under the prefix)
        keys = [k for k in store.list(prefix) if k.endswith(SHARD_SUFFIX)]
    if not keys:
        raise FileNotFoundError(f"no *{SHARD_SUFFIX} shards under {store.uri(prefix)}")
    names = [PurePosixPath(k).name for k in keys]
    if len(set(names)) != len(names):
        raise ValueError(
            f"{store.uri(prefix)}: shard file names must be unique (outputs are named after them)"
        )
    return keys


def dedup_partition(
    config: DedupConfig,
    store: ObjectStore,
    snapshot: str,
    input_prefix: str | None = None,
    out_prefix: str | None = None,
    index_prefix: str | None = None,
    *,
    spark=None,
    scratch: Path | None = None,
    report_plots: bool = True,
) -> StageResult:
    """Deduplicate one snapshot against itself and every partition committed to the index before it.

    `config.kind` picks the default prefixes; `spark` is an existing SparkSession for `engine="spark"`
    (else one is built from `config.spark_master`). Concurrent runs of one kind are safe: the index commit
    is a compare-and-swap, and a run that loses it is recomputed against the winner. `report_plots=False`
    skips the two PNGs (cluster sizes, funnel: ~1 s of matplotlib, mostly its import), for callers that
    only want the outputs; everything else is the same."""
    kind = config.kind
    input_prefix = (input_prefix or default_input_prefix(kind, snapshot)).rstrip("/")
    out_prefix = (out_prefix or f"dedup/{kind}/{snapshot}").rstrip("/")
    index_prefix = (index_prefix or f"dedup/{kind}/index").rstrip("/")
    shard_keys = list_shards(store, input_prefix)
    started = time.perf_counter()
    for attempt in range(1, MAX_ATTEMPTS + 1):
        entries = read_index(store, index_prefix).entries
        check_compatible(entries, config.index_fingerprint(), index_prefix)
        seq = assign_seq(entries, snapshot)
        earlier = earlier_entries(entries, seq)
        verify_parts(store, earlier, index_prefix)
        layout = PartitionLayout(kind, snapshot, out_prefix, index_prefix)
        job = PartitionJob(config=config, layout=layout, seq=seq, shard_keys=shard_keys, earlier=earlier)
        result = _run_engine(config, store, job, spark, scratch)
        layout = PartitionLayout(kind, snapshot, out_prefix, index_prefix, result.version)
        stats = {s["shard"]: s for s in result.shard_stats}
        entry = IndexEntry(
            snapshot=snapshot,
            seq=seq,
            version=result.version,
            config=config.index_fingerprint(),
            parts=[layout.index_part_key(k) for k in shard_keys],
            part_bytes=[stats[k]["index_part_bytes"] for k in shard_keys],
            docs=sum(s["docs_in"] for s in result.shard_stats),
            kept=sum(s["docs_out"] for s in result.shard_stats),
            deduped_against=[e.ref for e in earlier],
        )
        committed, _ = commit_entry(store, index_prefix, entry)
        if committed:
            break
        log.warning(
            "dedup %s %s: another partition committed to %s first (attempt %d/%d): recomputing against it",
            kind,
            snapshot,
            store.uri(index_prefix),
            attempt,
            MAX_ATTEMPTS,
        )
    else:
        raise IndexConflictError(
            f"dedup {kind} {snapshot}: other partitions committed to {store.uri(index_prefix)} during each of "
            f"{MAX_ATTEMPTS} attempts; rerun it when fewer dedup runs of kind {kind!r} overlap"
        )
    seconds = time.perf_counter() - started
    metrics = _metrics(result, seconds, earlier)
    metrics["attempts"] = float(attempt)
    stale = stale_partitions([e for e in entries if e.snapshot != snapshot], snapshot, result.version)
    metrics["stale_partitions"] = float(len(stale))
    files = {n: CommittedFile(**f) for s in result.shard_stats for n, f in s["files"].items()}
    meta = {
        "kind": kind,
        "snapshot": snapshot,
        "seq": seq,
        "index_version": result.version,
        "metrics": metrics,
        "stale_partitions": stale,
        "histogram": {str(k): v for k, v in sorted(result.histogram.items())},
    }
    committed_out = commit_uploaded(store, out_prefix, result.version, files, meta)

    artifacts, plots = {}, {}
    if report_plots:
        artifacts, plots = draw_report_plots(result.histogram, metrics, f"{kind} {snapshot}", scratch)
    check = check_dedup_rate(metrics, config)
    report = _report(config, snapshot, seq, metrics, result, earlier, stale, check)
    return StageResult(
        metrics=metrics,
        outputs={
            "kept": store.uri(f"{committed_out.version_prefix}/kept/"),
            "clusters": store.uri(f"{committed_out.version_prefix}/clusters/"),
            "index": store.uri(layout.entry_prefix + "/"),
        },
        report_md=report,
        sample=_cluster_sample(store, layout, shard_keys),
        artifacts=artifacts,
        data_version=result.version,
        extra={
            "seq": seq,
            "stale_partitions": stale,
            "histogram": result.histogram,
            "plots": plots,
            "check_passed": check.passed,
            "check_description": check.description,
        },
    )


def _run_engine(config: DedupConfig, store: ObjectStore, job: PartitionJob, spark, scratch) -> EngineResult:
    if config.engine == "spark":
        from pipelines.dedup.spark_engine import run_spark, spark_session

        return run_spark(spark or spark_session(config), store, job)
    from pipelines.dedup.local_engine import run_local

    return run_local(store, job, scratch)


def _metrics(result: EngineResult, seconds: float, earlier: list[IndexEntry]) -> dict[str, float]:
    m = {name: float(sum(s[name] for s in result.shard_stats)) for name in _COUNTS}
    m["removed_fraction"] = 1.0 - m["docs_out"] / m["docs_in"] if m["docs_in"] else 0.0
    m["unique_tokens"] = m[
        "tokens_out"
    ]  # tokens left after exact + fuzzy dedup (the report's "unique tokens")
    m["token_retention"] = m["tokens_out"] / m["tokens_in"] if m["tokens_in"] else 0.0
    m["clusters"] = float(sum(result.histogram.values()))
    m["largest_cluster"] = float(max(result.histogram, default=1))
    m["candidate_pairs"] = float(result.counts.get("candidate_pairs", 0))
    m["verified_pairs"] = float(result.counts.get("verified_pairs", 0))
    m["indexed_docs"] = float(sum(e.docs for e in earlier))
    m["shards"] = float(len(result.shard_stats))
    m["seconds"] = seconds
    m["docs_per_s"] = m["docs_in"] / seconds if seconds > 0 else 0.0
    return m


@dataclass(frozen=True)
class DedupRateCheck:
    passed: bool
    description: str


def check_dedup_rate(metrics: dict[str, float], config: DedupConfig) -> DedupRateCheck:
    """Fails when the fraction of removed documents is implausible (outside the configured bounds)."""
    rate, docs = metrics["removed_fraction"], metrics["docs_in"]
    bounds = f"[{config.min_removed_fraction:.2f}, {config.max_removed_fraction:.2f}]"
    if docs < config.check_min_docs:
        return DedupRateCheck(
            True, f"{docs:.0f} docs < check_min_docs={config.check_min_docs}: rate {rate:.3f} not judged"
        )
    ok = config.min_removed_fraction <= rate <= config.max_removed_fraction
    return DedupRateCheck(ok, f"removed {rate:.3f} of {docs:.0f} docs; plausible range {bounds}")


def dedup_funnel(m: dict[str, float]) -> list[dict]:
    """The removal steps in order (exact, URL, MinHash near-dup), as `pipelines.plots.funnel_chart` takes
    them; a step's removals include copies of documents in earlier partitions."""
    steps, left = [], m["docs_in"]
    for name, key in (("exact", "exact_dups"), ("url", "url_dups"), ("near", "near_dups")):
        steps.append(
            {"name": name, "docs_in": left, "docs_out": left - m[key], "reasons": {"duplicate": m[key]}}
        )
        left -= m[key]
    return steps


def draw_report_plots(
    histogram: dict[int, int], metrics: dict[str, float], title: str, scratch: Path | None = None
) -> tuple[dict[str, Path], dict[str, dict]]:
    """The stage's two PNGs: (artifacts {name: path}, {plot name: the numbers it shows})."""
    out_dir = (
        Path(tempfile.mkdtemp(prefix="dedup-report-", dir=scratch))
        if scratch
        else artifact_dir("dedup-report-")
    )
    histogram_png = plot_cluster_sizes(histogram, out_dir / "cluster_sizes.png", title)
    funnel = funnel_chart(out_dir / "dedup_funnel.png", dedup_funnel(metrics), f"dedup {title}")
    artifacts = {"dedup/cluster_sizes.png": histogram_png, "plots/dedup_funnel.png": funnel.path}
    return artifacts, {"dedup_funnel": funnel.as_dict()}


def plot_cluster_sizes(histogram: dict[int, int], path: Path, title: str) -> Path:
    """Bar chart of duplicate-cluster sizes (clusters of >= 2 documents), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if histogram:
        sizes = sorted(histogram)
        ax.bar([str(s) for s in sizes], [histogram[s] for s in sizes], color="#4c72b0")
        ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no duplicate clusters", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("documents per cluster")
    ax.set_ylabel("clusters")
    ax.set_title(f"dedup clusters: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _report(
    config: DedupConfig,
    snapshot: str,
    seq: int,
    m: dict,
    result: EngineResult,
    earlier: list[IndexEntry],
    stale: list[str],
    check: DedupRateCheck,
) -> str:
    after_exact = m["docs_in"] - m["exact_dups"]
    after_url = after_exact - m["url_dups"]
    funnel = [
        {"step": "input", "documents": int(m["docs_in"]), "removed": 0},
        {
            "step": "exact (normalised content)",
            "documents": int(after_exact),
            "removed": int(m["exact_dups"]),
        },
        {"step": "url", "documents": int(after_url), "removed": int(m["url_dups"])},
        {
            "step": f"near (MinHash {config.num_bands}x{config.rows_per_band}, {config.ngram_size}-grams)",
            "documents": int(m["docs_out"]),
            "removed": int(m["near_dups"]),
        },
    ]
    lines = [
        f"## Dedup `{config.kind}` snapshot `{snapshot}` (engine {config.engine}, seq {seq})",
        "",
        markdown_table(funnel),
        "",
        f"- tokens {int(m['tokens_in']):,} -> {int(m['tokens_out']):,} ({m['token_retention']:.1%} kept)",
        f"- {int(m['clusters'])} duplicate clusters, largest {int(m['largest_cluster'])}; "
        f"{int(m['cross_partition_dups'])} documents dropped for a copy in an earlier partition",
        f"- LSH candidate pairs {int(m['candidate_pairs'])}, verified (est. Jaccard >= {config.verify_threshold}) "
        f"{int(m['verified_pairs'])}",
        f"- deduplicated against {len(earlier)} earlier partitions ({int(m['indexed_docs'])} docs): "
        + (", ".join(e.snapshot for e in earlier) or "none"),
        f"- rate check: {'pass' if check.passed else 'FAIL'} ({check.description})",
        f"- {m['docs_per_s']:.0f} docs/s, version `{result.version}`",
    ]
    if stale:
        lines.append(
            f"- **stale**: {', '.join(stale)} were deduplicated against an older version of this "
            "snapshot; rerun them"
        )
    return "\n".join(lines)


def _cluster_sample(
    store: ObjectStore, layout: PartitionLayout, shard_keys: list[str], size: int = 5
) -> list[dict]:
    rows: list[dict] = []
    for key in shard_keys:
        with store.local_copy(layout.clusters_key(key)) as path:
            rows += [r for r in pq.read_table(path).to_pylist() if not r["kept"]]
        if len(rows) >= size:
            break
    return rows[:size]
