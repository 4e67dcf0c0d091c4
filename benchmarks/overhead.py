"""Orchestration overhead of one real stage: web extraction (`web_documents`: WARC -> Trafilatura -> lid.176)
called directly vs materialized through Dagster with MLflow tracking, in one run.

- baseline "direct call": `pipelines.web.extract.extract_documents(config, store, ...)`, as a notebook would;
- "dagster + mlflow": `dg.materialize([web_documents], partition_key=...)` on a real DagsterInstance (sqlite,
  in a temp dir) with the real resources: the asset resolves its config, opens an MLflow run (sqlite store in
  the temp dir) with lineage tags, calls the same function, logs params, metrics, report, sample and plot
  artifacts, runs its two blocking checks and writes the materialization event. This stage does not use
  Pipes (only the training assets launch processes).

Input: a WARC of real pages (the HTML manual of Debian's `git-doc`, fetched once into the repo's cache),
committed to the store once. Both paths run on the same store and config (one datatrove task) and write the
same committed output; runs alternate (direct, dagster, direct, ...) after one untimed warm-up of each, and
the medians are compared. The overhead is printed in seconds too: it is roughly constant per
materialization, so its share shrinks with the stage's length (extrapolate from the absolute number).

    .venv/bin/python benchmarks/overhead.py [--repeats 3] [--pages 60] [--copies 1]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = "bench-0001"


def build_warc(path: Path, pages: list[Path], root: Path, copies: int) -> int:
    """A gzipped WARC with one response record per page (each page `copies` times under its own URL)."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    n = 0
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        for copy in range(copies):
            for page in pages:
                url = f"http://docs.bench/{copy}/{page.relative_to(root).as_posix()}"
                http = StatusAndHeaders(
                    "200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1"
                )
                record = writer.create_warc_record(
                    url, "response", payload=io.BytesIO(page.read_bytes()), http_headers=http
                )
                writer.write_record(record)
                n += 1
    return n


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each path")
    parser.add_argument("--pages", type=int, default=60, help="HTML pages of git-doc to use (at most 242)")
    parser.add_argument("--copies", type=int, default=1, help="each page this many times (a longer stage)")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="crucible-overhead-"))
    # everything the graph touches lives in the temp dir: state (store), MLflow sqlite, Dagster instance
    os.environ["CRUCIBLE_PROFILE"] = "micro"
    os.environ["CRUCIBLE_STATE_DIR"] = str(tmp / "state")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
    os.environ["DAGSTER_HOME"] = str(tmp / "dagster")
    (tmp / "dagster").mkdir()

    import dagster as dg

    from assets.resources import resources_for
    from assets.web_crawl import warc_prefix
    from assets.web_extract import documents_prefix, web_documents
    from infra.committed import commit
    from infra.local_web import fetch_doc_package
    from infra.packaged import LID_176, packaged_file
    from infra.settings import load_profile, validate_stage
    from pipelines.web.extract import ExtractConfig, extract_documents

    profile = load_profile()
    resources = resources_for(profile)
    store = resources["store"].open()
    config = validate_stage(profile, "web_extract", ExtractConfig).model_copy(
        update={"tasks": 1, "workers": 1}
    )
    packaged_file(LID_176)

    tree = fetch_doc_package("git-doc", REPO / ".crucible" / "cache" / "debian-docs")
    pages = sorted(p for p in tree.rglob("*.html") if p.is_file())[: args.pages]
    n_pages = build_warc(tmp / "part-00000.warc.gz", pages, tree, args.copies)
    commit(store, warc_prefix(SNAPSHOT), {"part-00000.warc.gz": tmp / "part-00000.warc.gz"})

    instance = dg.DagsterInstance.get()  # sqlite storage under DAGSTER_HOME (the temp dir)
    instance.add_dynamic_partitions("web_snapshot", [SNAPSHOT])
    run_config = {
        "ops": {"web_documents": {"config": {"tasks": 1, "workers": 1}}},
        "loggers": {"console": {"config": {"log_level": "WARNING"}}},
    }

    def direct() -> int:
        result = extract_documents(config, store, SNAPSHOT, warc_prefix(SNAPSHOT), documents_prefix(SNAPSHOT))
        return int(result.metrics["docs_out"])

    def dagster() -> int:
        result = dg.materialize(
            [web_documents],
            instance=instance,
            partition_key=SNAPSHOT,
            resources=resources,
            run_config=run_config,
            raise_on_error=True,
        )
        (event,) = result.asset_materializations_for_node("web_documents")
        return int(event.metadata["docs_out"].value)

    def timed(fn) -> tuple[float, int]:
        start = time.perf_counter()
        docs = fn()
        return time.perf_counter() - start, docs

    warm_direct, warm_dagster = timed(direct), timed(dagster)  # imports, model loads, sqlite schema creation
    times: dict[str, list[float]] = {"direct": [], "dagster": []}
    docs: set[int] = {warm_direct[1], warm_dagster[1]}
    for _ in range(args.repeats):
        for name, fn in (("direct", direct), ("dagster", dagster)):
            seconds, kept = timed(fn)
            times[name].append(seconds)
            docs.add(kept)
    if len(docs) != 1:
        print(f"the two paths kept different document counts: {sorted(docs)}")
        return 1

    base, orchestrated = statistics.median(times["direct"]), statistics.median(times["dagster"])
    overhead = orchestrated - base
    print(
        f"stage: web_documents (extract_documents), {n_pages} pages in one WARC, {docs.pop()} documents kept"
    )
    print(
        f"timed runs per path: {args.repeats}, alternating (untimed warm-up: direct {warm_direct[0]:.2f} s, "
        f"dagster + mlflow {warm_dagster[0]:.2f} s)"
    )
    print(
        f"direct call (baseline):      median {base:.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times['direct'])})"
    )
    print(
        f"dagster materialize + mlflow: median {orchestrated:.2f} s  "
        f"(runs: {', '.join(f'{t:.2f}' for t in times['dagster'])})"
    )
    print(
        f"overhead: {overhead:+.2f} s per materialization, {100 * overhead / base:+.1f}% of the direct call"
    )
    for target in (60.0, 600.0):
        print(f"  at a {target:.0f} s stage that would be {100 * overhead / target:+.2f}%")
    print(f"(state, MLflow and Dagster instance in {tmp})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
