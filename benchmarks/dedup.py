"""Near-dedup benchmark: our datatrove engine vs rensa (Rust MinHash) vs datatrove's stock 4-stage MinHash
pipeline vs datasketch's MinHashLSH, on the same real corpus with planted near-duplicates at known Jaccard levels.

    .venv/bin/python benchmarks/dedup.py [--max-base-docs 3000] [--workers 1] [--methods ours,rensa]
    .venv/bin/python benchmarks/dedup.py --scale 10000,100000,1000000 [--methods ours,rensa]
    .venv/bin/python benchmarks/dedup.py --cores 200000

Corpora (--corpus; fetched once with `apt-get download` + `dpkg-deb -x` into the cache dir), converted to text
and cut into documents of 100-800 words at paragraph boundaries; exact duplicates and natural near-duplicates
(word-5-gram Jaccard >= 0.3 with another document; `drop_natural_near_duplicates`) removed, so the planted
pairs are the only near-duplicates and the truth is known:
- manuals (default): the HTML manuals of python3.11-doc and postgresql-doc-15 (English, ~4,000 documents);
- handbook: debian-handbook in 26 languages (the same book translated, pages partly left in English; other
  scripts exercise the normaliser's Unicode paths, and the shared page chrome is long boilerplate).
Every document (--fraction) gets one planted
copy whose word-5-gram Jaccard with its source is set to a level in 0.5..0.95 (cycling) by substituting
random words (binary search on the number of edits).

Ours computes the same MinHash signatures as datatrove's stock step (same shingle hash, same seeded
universal hashes), so the comparison is paired: LSH candidates differ only where the tokenisers disagree,
and the quality differences come from our candidate verification, not from hash luck.

All three use 5-word shingles and 14 bands x 8 rows (112 permutations, seed 1):
- ours: `dedup_partition` (datatrove LocalPipelineExecutor + numpy clustering), end to end: read shards,
  fingerprint, exact + near dedup, write kept shards, clusters, index, committed manifest, markdown report;
  URL dedup off. Without the two report PNGs (`report_plots=False`): they are timed after the run and
  printed separately (mostly matplotlib's import, a fixed ~1 s that no other method pays).
- datatrove: MinhashDedupSignature -> MinhashDedupBuckets -> MinhashDedupCluster -> MinhashDedupFilter, stock
  (spaCy English word tokeniser), reading and writing the same JSONL.gz shards; and the same with a
  `str.split` word tokeniser ("datatrove-split", datatrove's fastest configuration we know).
- datasketch: MinHash.bulk + MinHashLSH(params=(14, 8)) query-then-insert, single process, in memory.
- rensa: RMinHash(112, seed 1).update(5-gram strings) + RMinHashLSH(threshold 0.7, 112, 14 bands)
  query-then-insert, single process, in memory, in its own venv (`<cache>/rensa-venv`, made on first use).
  Like datasketch it gets the benchmark's `\\w+` lowercased tokens, reads the same shards, and does no more
  (no exact/URL dedup, no outputs written, no index).

`--cores N` replaces the quality run: one generated corpus of N documents through our datatrove engine (1 and
2 worker processes) and our Spark engine (local[1], local[2]; the JVM starts inside the timed run, and its
CPU and its Python workers' are counted); docs/s, CPU s, speedup and whether the clusters are identical.

`--scale N1,N2,...` replaces the quality run: generated corpora of N documents (real pages with 40% of their
words substituted, every 10th document a planted copy of an earlier one at a known level) through ours and
rensa; per size: docs/s, CPU s, us/doc relative to the smallest size, peak RSS (largest process and the whole
tree) and our cross-snapshot index size per million documents.

Each method runs in its own subprocess (clean imports and a clean peak RSS: the largest process's and the
sum over the process tree, sampled every 50 ms; CPU s counts the process and its reaped children). The
machine may be shared: every method runs in the same invocation so that ratios are comparable; the load
average at start is printed. Quality: a predicted pair is two documents in the same cluster; precision is the
fraction of predicted pairs whose true Jaccard (word 5-grams, lowercased) is >= --tau; recall is the fraction
of planted pairs with true Jaccard >= --tau that end up in one cluster. Per-level detection rates show the
LSH S-curve.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from itertools import combinations
from pathlib import Path

from tqdm import tqdm

log = logging.getLogger("bench_dedup")

# Two corpora of real pages of different kinds: English software manuals (Sphinx and DocBook), and a book in
# 26 languages (Latin, Cyrillic, Greek, Arabic, CJK scripts; pages partly left in English by translators).
CORPORA = {
    "manuals": {
        "python3.11-doc": "usr/share/doc/python3.11/html",
        "postgresql-doc-15": "usr/share/doc/postgresql-doc-15/html",
    },
    "handbook": {"debian-handbook": "usr/share/doc/debian-handbook/html"},
}
LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
SNAPSHOT = "bench"
INPUT_PREFIX = f"web/filtered/{SNAPSHOT}/kept"
_WORD = re.compile(r"\w+")


# ---------------------------------------------------------------------------------------------- corpus
def fetch_manuals(cache: Path, corpus: str = "manuals") -> dict[str, Path]:
    """Download and unpack the corpus's Debian packages once; returns {package: html dir}."""
    out = {}
    for package, html in CORPORA[corpus].items():
        root = cache / package
        if not (root / html).is_dir():
            cache.mkdir(parents=True, exist_ok=True)
            debs = list(cache.glob(f"{package}_*.deb"))
            if not debs:
                subprocess.run(
                    ["apt-get", "download", "--", package], cwd=cache, check=True, capture_output=True
                )
                debs = list(cache.glob(f"{package}_*.deb"))
            subprocess.run(["dpkg-deb", "-x", "--", str(debs[0]), str(root)], check=True)
        out[package] = root / html
    return out


def html_paragraphs(path: Path) -> list[str]:
    import lxml.html

    tree = lxml.html.parse(str(path))
    root = tree.getroot()
    for bad in root.xpath(
        '//div[contains(@class, "navheader") or contains(@class, "navfooter") or '
        '@class="sphinxsidebar" or @class="related" or @class="footer"]|//script|//style'
    ):
        bad.drop_tree()
    main = root.xpath('//div[@role="main"]') or root.xpath("//body")
    if not main:
        return []
    text = main[0].text_content()
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def drop_natural_near_duplicates(
    docs: list[dict], limit: int, below: float = 0.3, common: int = 50
) -> list[dict]:
    """The first `limit` of `docs` whose word-5-gram Jaccard with every earlier kept one is < `below`: real pages
    repeat (a page left untranslated in 20 locales of a book), and a corpus whose only near-duplicates are
    the planted ones has a known truth. Candidates share a shingle that is in at most `common` documents
    (page chrome is in all of them); their Jaccard is then computed exactly. Logs how many were dropped."""
    kept: list[dict] = []
    sets: list[set] = []
    dropped = 0
    postings: dict[tuple, list[int]] = defaultdict(list)
    for doc in docs:
        if len(kept) == limit:
            break
        sh = shingles(doc["text"])
        candidates = {i for g in sh if len(ids := postings.get(g, ())) <= common for i in ids}
        if any(jaccard(sh, sets[i]) >= below for i in candidates):
            dropped += 1
            continue
        for g in sh:
            postings[g].append(len(kept))
        kept.append(doc)
        sets.append(sh)
    log.info(
        "base corpus: %d documents kept, %d near-duplicates of earlier ones (J >= %.2f) dropped",
        len(kept),
        dropped,
        below,
    )
    return kept


def base_documents(cache: Path, max_docs: int, seed: int, corpus: str = "manuals") -> list[dict]:
    """Real documents of 100-800 words, exact and natural near duplicates removed, sampled with `seed`."""
    docs, seen = [], set()
    for package, html_dir in fetch_manuals(cache, corpus).items():
        for path in sorted(html_dir.rglob("*.html")):
            chunk: list[str] = []
            words = 0
            for para in html_paragraphs(path) + [""]:
                n = len(para.split())
                if (not para or words + n > 800) and words >= 100:
                    text = "\n\n".join(chunk)
                    key = " ".join(_WORD.findall(text.lower()))
                    if key not in seen:
                        seen.add(key)
                        rel = path.relative_to(html_dir).as_posix()
                        docs.append(
                            {"text": text, "url": f"https://docs.example/{package}/{rel}#{len(docs)}"}
                        )
                    chunk, words = [], 0
                if para:
                    chunk.append(para)
                    words += n
    random.Random(seed).shuffle(docs)
    return drop_natural_near_duplicates(docs, max_docs)


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    toks = _WORD.findall(text.lower())
    return {tuple(toks[i : i + n]) for i in range(max(1, len(toks) - n + 1))}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def plant_copy(text: str, target: float, vocab: list[str], rng: random.Random) -> tuple[str, float]:
    """A copy of `text` with random word substitutions, Jaccard with the original as close to `target` as the
    number of substitutions allows (binary search)."""
    words = text.split(" ")
    order = list(range(len(words)))
    rng.shuffle(order)
    replacement = [rng.choice(vocab) for _ in words]
    original = shingles(text)

    def variant(k: int) -> str:
        out = list(words)
        for pos in order[:k]:
            out[pos] = replacement[pos]
        return " ".join(out)

    lo, hi = 0, len(words)
    while lo < hi:  # smallest k with J(k) <= target
        mid = (lo + hi) // 2
        if jaccard(original, shingles(variant(mid))) <= target:
            hi = mid
        else:
            lo = mid + 1
    candidates = [k for k in (lo - 1, lo) if k >= 0]
    best = min(candidates, key=lambda k: abs(jaccard(original, shingles(variant(k))) - target))
    copy = variant(best)
    return copy, jaccard(original, shingles(copy))


def build_corpus(base: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Documents (base + planted copies, shuffled) and the planted pairs with their true Jaccard."""
    rng = random.Random(seed)
    vocab = sorted({w for d in base[:500] for w in _WORD.findall(d["text"].lower()) if w.isalpha()})
    docs = [
        {"id": f"doc-{i:06d}", "text": d["text"], "metadata": {"url": d["url"], "snapshot": SNAPSHOT}}
        for i, d in enumerate(base)
    ]
    pairs = []
    for i, d in enumerate(tqdm(base[: int(len(base) * fraction)], desc="planting copies", mininterval=5)):
        level = LEVELS[i % len(LEVELS)]
        text, true_j = plant_copy(d["text"], level, vocab, rng)
        copy_id = f"copy-{i:06d}"
        docs.append(
            {
                "id": copy_id,
                "text": text,
                "metadata": {"url": f"https://mirror.example/{i}", "snapshot": SNAPSHOT},
            }
        )
        pairs.append({"a": f"doc-{i:06d}", "b": copy_id, "level": level, "jaccard": true_j})
    rng.shuffle(docs)
    return docs, pairs


def write_corpus(root: Path, docs: list[dict], docs_per_shard: int) -> None:
    folder = root / INPUT_PREFIX
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(math.ceil(len(docs) / docs_per_shard)):
        with gzip.open(folder / f"{s:05d}.jsonl.gz", "wt", compresslevel=6) as fh:
            for d in docs[s * docs_per_shard : (s + 1) * docs_per_shard]:
                fh.write(json.dumps(d) + "\n")


# ---------------------------------------------------------------------------------------------- rensa
# rensa (Rust MinHash, PyPI) never goes into the project venv: like guesslang in benchmarks/code_lang_id.py,
# this script makes a separate venv on first use (`<cache>/rensa-venv`, `pip install rensa==<pin>`) and runs
# rensa there in a subprocess that reads the same shards and prints its clusters, time and peak RSS as JSON.
RENSA_PIN = "rensa==0.5.0"

RENSA_RUNNER = r"""
import gzip, json, re, resource, sys, time
t0 = time.perf_counter()
from rensa import RMinHash, RMinHashLSH
WORD = re.compile(r"\w+")
ids, parent = [], []
def find(x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x
lsh = RMinHashLSH(threshold=0.7, num_perm=112, num_bands=14)
for path in sys.argv[1:]:
    with gzip.open(path, "rt") as fh:
        for line in fh:
            doc = json.loads(line)
            toks = WORD.findall(doc["text"].lower())
            shingles = {" ".join(toks[i : i + 5]) for i in range(max(1, len(toks) - 4))}
            m = RMinHash(num_perm=112, seed=1)
            m.update(list(shingles))
            i = len(ids)
            ids.append(doc["id"])
            parent.append(i)
            for j in lsh.query(m):  # query-then-insert, as datasketch below
                parent[find(i)] = find(j)
            lsh.insert(i, m)
groups = {}
for i in range(len(ids)):
    groups.setdefault(find(i), []).append(i)
clusters = {ids[i]: str(r) for r, g in groups.items() if len(g) > 1 for i in g}
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"clusters": clusters, "seconds": time.perf_counter() - t0,
                  "cpu_seconds": ru.ru_utime + ru.ru_stime, "max_rss": ru.ru_maxrss * 1024}))
"""


def ensure_rensa_venv(venv: Path) -> Path:
    """A separate venv with rensa (never the project venv); returns its python."""
    python = venv / "bin" / "python"
    marker = venv / ".rensa-ready"
    if marker.exists() and marker.read_text().strip() == RENSA_PIN:
        return python
    log.info("creating %s with %s (one time)", venv, RENSA_PIN)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", RENSA_PIN], check=True)
    marker.write_text(RENSA_PIN + "\n")
    return python


def run_rensa(root: Path, work: Path, workers: int) -> dict:
    """rensa RMinHash + RMinHashLSH(threshold 0.7, 112 perms, 14 bands), single process, in memory."""
    runner = work / "rensa_runner.py"
    runner.write_text(RENSA_RUNNER)
    shards = [str(p) for p in sorted((root / INPUT_PREFIX).glob("*.jsonl.gz"))]
    proc = subprocess.run(
        [os.environ["CRUCIBLE_RENSA_PYTHON"], str(runner), *shards], capture_output=True, text=True
    )
    if proc.returncode:
        raise RuntimeError(f"rensa runner failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout)
    return {"clusters": out["clusters"], "runner": {k: out[k] for k in ("seconds", "cpu_seconds", "max_rss")}}


# ---------------------------------------------------------------------------------------------- methods
class PeakRSS:
    """Peak of the summed RSS of this process and its children, sampled in a thread."""

    def __init__(self, interval: float = 0.05):
        import psutil

        self.proc, self.interval, self.peak, self.largest = psutil.Process(), interval, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for p in [self.proc] + self.proc.children(recursive=True):
            try:
                rss = p.memory_info().rss
            except Exception:  # a child that just exited
                continue
            total += rss
            self.largest = max(self.largest, rss)
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def read_docs(root: Path):
    for path in sorted((root / INPUT_PREFIX).glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as fh:
            for line in fh:
                yield json.loads(line)


def run_ours(root: Path, work: Path, workers: int) -> dict[str, str]:
    from infra.store import LocalStore
    from pipelines.dedup import DedupConfig, dedup_partition

    shutil.rmtree(root / "dedup", ignore_errors=True)
    config = DedupConfig(tasks=workers, workers=workers, url_dedup=False)
    result = dedup_partition(config, LocalStore(root), SNAPSHOT, scratch=work, report_plots=False)
    _OURS_REPORT.update(histogram=result.extra["histogram"], metrics=result.metrics)
    return _clusters_of(root)


_OURS_REPORT: dict = {}  # what the stage's report PNGs would draw: timed after the run (`child_main`)
_UNREAPED_CPU = [0.0]  # CPU s of child processes os.times() cannot see (the Spark JVM and its Python workers)


def _clusters_of(root: Path) -> dict[str, str]:
    import pyarrow.parquet as pq

    clusters = {}
    for path in sorted((root / f"dedup/web/{SNAPSHOT}").glob("v-*/clusters/*.parquet")):
        for row in pq.read_table(path, columns=["doc_id", "root_doc_id"]).to_pylist():
            clusters[row["doc_id"]] = row["root_doc_id"]
    return clusters


def run_spark(root: Path, work: Path, cores: int) -> dict[str, str]:
    """Our Spark engine on local[cores] (the JVM starts inside the timed run, as in a stage)."""
    import psutil

    from infra.store import LocalStore
    from pipelines.dedup import DedupConfig, dedup_partition
    from pipelines.dedup.spark_engine import spark_session

    shutil.rmtree(root / "dedup", ignore_errors=True)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    config = DedupConfig(engine="spark", spark_master=f"local[{cores}]", url_dedup=False)
    spark = spark_session(config)
    spark.sparkContext.setLogLevel("ERROR")
    dedup_partition(config, LocalStore(root), SNAPSHOT, spark=spark, scratch=work, report_plots=False)
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            _UNREAPED_CPU[0] += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    spark.stop()
    return _clusters_of(root)


def time_report_plots(work: Path) -> float:
    """Seconds the stage's two report PNGs take (what `report_plots=True`, the asset's default, adds)."""
    from pipelines.dedup.stage import draw_report_plots

    started = time.perf_counter()
    draw_report_plots(_OURS_REPORT["histogram"], _OURS_REPORT["metrics"], SNAPSHOT, work)
    return time.perf_counter() - started


class _SplitWords:
    """datatrove WordTokenizer that splits on whitespace (datatrove strips punctuation before it)."""

    def __new__(cls):
        from datatrove.utils.word_tokenizers import WordTokenizer

        class SplitWords(WordTokenizer):
            def word_tokenize(self, text: str) -> list[str]:
                return text.split()

            def sent_tokenize(self, text: str) -> list[str]:
                return [text]

            def span_tokenize(self, text: str) -> list[tuple[int, int]]:
                return [(0, len(text))]

        return SplitWords("en")


def run_datatrove(root: Path, work: Path, workers: int, split_words: bool) -> dict[str, str]:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    out = work / ("datatrove-split" if split_words else "datatrove")
    shutil.rmtree(out, ignore_errors=True)
    config = MinhashConfig(n_grams=5, num_buckets=14, hashes_per_bucket=8, seed=1, hash_config=HashConfig(64))
    language = _SplitWords() if split_words else "en"
    tasks = len(list((root / INPUT_PREFIX).glob("*.jsonl.gz")))
    data = str(root / INPUT_PREFIX)

    def stage(pipeline, n_tasks: int, name: str) -> LocalPipelineExecutor:
        return LocalPipelineExecutor(
            pipeline=pipeline,
            tasks=n_tasks,
            workers=min(workers, n_tasks),
            logging_dir=str(out / "logs" / name),
            skip_completed=False,
        )

    stage(
        [JsonlReader(data), MinhashDedupSignature(str(out / "sigs"), config=config, language=language)],
        tasks,
        "sigs",
    ).run()
    stage([MinhashDedupBuckets(str(out / "sigs"), str(out / "buckets"), config=config)], 14, "buckets").run()
    stage(
        [MinhashDedupCluster(str(out / "buckets"), str(out / "remove"), config=config, save_cluster_id=True)],
        1,
        "cluster",
    ).run()
    stage(
        [
            JsonlReader(data),
            MinhashDedupFilter(str(out / "remove"), exclusion_writer=JsonlWriter(str(out / "removed"))),
            JsonlWriter(str(out / "kept")),
        ],
        tasks,
        "filter",
    ).run()
    # cluster ids from stage 3's .clusters files: (doc index in the task's stream, cluster); one shard per task
    import struct

    clusters = {}
    for rank, shard in enumerate(sorted((root / INPUT_PREFIX).glob("*.jsonl.gz"))):
        path = out / "remove" / f"{rank:06d}.clusters"
        if not path.exists():
            continue
        with gzip.open(shard, "rt") as fh:
            ids = [json.loads(line)["id"] for line in fh]
        raw = path.read_bytes()
        for doc_idx, cid in struct.iter_unpack("<2I", raw):
            clusters[ids[doc_idx]] = str(cid)
    return clusters


def run_datasketch(root: Path, work: Path, workers: int) -> dict[str, str]:
    from datasketch import MinHash, MinHashLSH

    docs = list(read_docs(root))
    sets = [[" ".join(g).encode() for g in shingles(d["text"])] for d in docs]
    lsh = MinHashLSH(num_perm=112, params=(14, 8))
    parent = list(range(len(docs)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, m in enumerate(MinHash.bulk(sets, num_perm=112, seed=1)):
        for j in lsh.query(m):
            parent[find(i)] = find(j)
        lsh.insert(i, m)
    members = defaultdict(list)
    for i in range(len(docs)):
        members[find(i)].append(i)
    return {docs[i]["id"]: str(r) for r, group in members.items() if len(group) > 1 for i in group}


METHODS = {
    "ours": run_ours,
    "datatrove": lambda root, work, workers: run_datatrove(root, work, workers, split_words=False),
    "datatrove-split": lambda root, work, workers: run_datatrove(root, work, workers, split_words=True),
    "datasketch": run_datasketch,
    "rensa": run_rensa,
    "spark": run_spark,  # --workers = local[N] cores
}


def child_main(args: argparse.Namespace) -> None:
    """Run one method in this (fresh) process; write its clusters, time and peak RSS as JSON."""
    logging.disable(logging.INFO)
    try:
        from loguru import logger

        logger.remove()  # datatrove's console logging would dominate the output
    except ImportError:
        pass
    root, work = Path(args.root), Path(args.work)
    with PeakRSS() as rss:
        started, cpu0 = time.perf_counter(), os.times()
        clusters = METHODS[args.method](root, work, args.workers)
        seconds, cpu1 = time.perf_counter() - started, os.times()
    # CPU of this process and of its waited-for children (worker processes, the rensa runner)
    cpu = sum(cpu1[:4]) - sum(cpu0[:4]) + _UNREAPED_CPU[0]
    largest = rss.largest
    if args.method == "rensa":  # rensa: the runner's own peak (the sampler may miss a short-lived peak)
        largest = max(largest, clusters["runner"]["max_rss"])
        clusters = clusters["clusters"]
    index_bytes = sum(p.stat().st_size for p in (root / "dedup").rglob("index/*/v-*/*.parquet"))
    plot_seconds = time_report_plots(work) if args.method == "ours" else 0.0
    Path(args.result).write_text(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu,
                "peak_rss": rss.peak,
                "largest_rss": largest,
                "index_bytes": index_bytes,
                "plot_seconds": plot_seconds,
                "clusters": clusters,
            }
        )
    )


def run_method(method: str, root: Path, work: Path, workers: int) -> dict:
    result = work / f"{method}.json"
    cmd = [
        sys.executable,
        __file__,
        "--child",
        method,
        "--root",
        str(root),
        "--work",
        str(work),
        "--workers",
        str(workers),
        "--result",
        str(result),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{method} failed:\n{proc.stderr[-4000:]}")
    return json.loads(result.read_text())


# ---------------------------------------------------------------------------------------------- scoring
def evaluate(
    clusters: dict[str, str], pairs: list[dict], texts: dict[str, str], tau: float, cache: dict
) -> dict:
    groups = defaultdict(list)
    for doc, cid in clusters.items():
        groups[cid].append(doc)
    predicted = {tuple(sorted(p)) for g in groups.values() for p in combinations(sorted(g), 2)}

    def true_j(a: str, b: str) -> float:
        for d in (a, b):
            if d not in cache:
                cache[d] = shingles(texts[d])
        return jaccard(cache[a], cache[b])

    correct = sum(1 for a, b in predicted if true_j(a, b) >= tau)
    positives = [p for p in pairs if p["jaccard"] >= tau]
    found = [
        p
        for p in positives
        if clusters.get(p["a"]) is not None and clusters.get(p["a"]) == clusters.get(p["b"])
    ]
    per_level = {}
    for level in LEVELS:
        at = [p for p in pairs if p["level"] == level]
        hit = sum(
            1 for p in at if clusters.get(p["a"]) is not None and clusters.get(p["a"]) == clusters.get(p["b"])
        )
        per_level[level] = hit / len(at) if at else float("nan")
    return {
        "predicted_pairs": len(predicted),
        "precision": correct / len(predicted) if predicted else 1.0,
        "recall": len(found) / len(positives) if positives else float("nan"),
        "positives": len(positives),
        "per_level": per_level,
    }


def wilson(p: float, n: int, z: float = 1.96) -> float:
    """Half-width of the Wilson 95% interval (what 'no lower' can resolve)."""
    if n == 0:
        return float("nan")
    return z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)


def synthetic_corpus(
    docs: list[dict], n: int, seed: int, dup_every: int = 10, offset: int = 0
) -> tuple[list[dict], list[dict]]:
    """`n` documents generated from the real ones: each is a real document with 40% of its words substituted
    (Jaccard ~0.15 with its source, so a new document), and every `dup_every`-th one is instead a planted copy
    of an earlier generated document at a Jaccard level of LEVELS (cycling), by word substitution."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = np.array(sorted({w for d in docs[:300] for w in _WORD.findall(d["text"].lower()) if w.isalpha()}))
    bases = [np.array(d["text"].split(" ")) for d in docs]
    # share of substituted words giving word-5-gram Jaccard ~level: J ~ (1-q)^5 / (2 - (1-q)^5)
    subst = {lv: 1 - (2 * lv / (1 + lv)) ** 0.2 for lv in LEVELS}
    out: list[dict] = []
    pairs: list[dict] = []
    for i in range(n):
        if i % dup_every == dup_every - 1 and out:
            src = int(rng.integers(0, len(out)))
            level = LEVELS[len(pairs) % len(LEVELS)]
            words = out[src]["text"].split(" ")
            q = subst[level]
            pos = rng.random(len(words)) < q
            w = np.array(words)
            w[pos] = vocab[rng.integers(0, len(vocab), int(pos.sum()))]
            out.append(
                {"id": f"s{offset + i:08d}", "text": " ".join(w.tolist()), "metadata": {"snapshot": SNAPSHOT}}
            )
            pairs.append({"a": out[src]["id"], "b": f"s{offset + i:08d}", "level": level})
            continue
        w = bases[int(rng.integers(0, len(bases)))].copy()
        pos = rng.random(len(w)) < 0.4
        w[pos] = vocab[rng.integers(0, len(vocab), int(pos.sum()))]
        out.append(
            {"id": f"s{offset + i:08d}", "text": " ".join(w.tolist()), "metadata": {"snapshot": SNAPSHOT}}
        )
    return out, pairs


def write_synthetic(root: Path, base: list[dict], n: int, seed: int, docs_per_shard: int) -> list[dict]:
    """Generate and write `n` synthetic documents shard by shard (bounded memory: planted copies come from
    the same shard); returns the planted pairs."""
    folder = root / INPUT_PREFIX
    folder.mkdir(parents=True, exist_ok=True)
    pairs = []
    for s in range(math.ceil(n / docs_per_shard)):
        count = min(docs_per_shard, n - s * docs_per_shard)
        docs, planted = synthetic_corpus(base, count, seed * 100003 + s, offset=s * docs_per_shard)
        pairs += planted
        with gzip.open(folder / f"{s:05d}.jsonl.gz", "wt", compresslevel=1) as fh:
            fh.write("".join(json.dumps(d) + "\n" for d in docs))
    return pairs


def detected(clusters: dict[str, str], p: dict) -> bool:
    return clusters.get(p["a"]) is not None and clusters.get(p["a"]) == clusters.get(p["b"])


def plot_curve(results: dict[str, dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, r in results.items():
        ax.plot(LEVELS, [r["per_level"][lv] for lv in LEVELS], marker="o", label=method)
    jj = [x / 100 for x in range(40, 101)]
    ax.plot(jj, [1 - (1 - j**8) ** 14 for j in jj], ls=":", color="grey", label="LSH 14x8 S-curve")
    ax.set_xlabel("planted pair's true Jaccard (word 5-grams)")
    ax.set_ylabel("share detected (same cluster)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_cores(args, base: list[dict], work: Path) -> None:
    """--cores N: one generated corpus of N documents through our two engines on 1 and then 2 cores."""
    n = args.cores
    root = work / f"cores-{n}"
    shutil.rmtree(root, ignore_errors=True)
    write_synthetic(root, base, n, args.seed + n, args.scale_docs_per_shard)
    runs = {}
    for method in ("ours", "spark"):
        for cores in (1, 2):
            log.info("cores %d docs: running %s on %d", n, method, cores)
            runs[(method, cores)] = run_method(method, root, work, cores)
    shutil.rmtree(root, ignore_errors=True)
    reference = runs[("ours", 1)]["clusters"]
    print(f"\n## Engines on 1 and 2 cores: {n} generated documents\n")
    print("CPU s: this process and its reaped children, for Spark also the JVM and its Python workers")
    print("(the datatrove engine's pool workers, children of a forkserver, are not counted)\n")
    print("| engine | cores | seconds | docs/s | CPU s | vs 1 core | same clusters as datatrove/1 |")
    print("|---|---|---|---|---|---|---|")
    for (method, cores), r in runs.items():
        name = {"ours": "datatrove engine (workers)", "spark": "Spark local[N]"}[method]
        speedup = runs[(method, 1)]["seconds"] / r["seconds"]
        print(
            f"| {name} | {cores} | {r['seconds']:.1f} | {n / r['seconds']:.0f} | {r['cpu_seconds']:.1f} | "
            f"{speedup:.2f}x | {r['clusters'] == reference} |"
        )


def run_scale(args, base: list[dict], work: Path) -> None:
    """--scale: generated corpora of the given sizes through ours and rensa; docs/s, CPU and RSS per size."""
    sizes = [int(float(x)) for x in args.scale.split(",") if x]
    methods = [m for m in args.methods.split(",") if m in ("ours", "rensa")]
    rows = []
    for n in sizes:
        root = work / f"scale-{n}"
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        pairs = write_synthetic(root, base, n, args.seed + n, args.scale_docs_per_shard)
        log.info("scale %d: corpus written in %.0fs", n, time.perf_counter() - t0)
        positives = [p for p in pairs if p["level"] >= args.tau]
        for method in methods:
            log.info("scale %d: running %s", n, method)
            r = run_method(method, root, work, args.workers)
            recall = sum(detected(r["clusters"], p) for p in positives) / max(1, len(positives))
            rows.append((n, method, r, recall))
            del r["clusters"]
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n## Scaling: generated documents (40%-rewritten real pages, every 10th a planted copy), "
        f"workers={args.workers}\n"
    )
    print(
        "| docs | method | seconds | docs/s | CPU s | us/doc (wall) | vs smallest | peak RSS MB largest (tree) "
        f"| index MB per 1M docs | recall J>={args.tau:.2g} planted |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    first: dict[str, float] = {}
    for n, method, r, recall in rows:
        per_doc = r["seconds"] / n
        first.setdefault(method, per_doc)
        index = f"{r['index_bytes'] / 2**20 * 1e6 / n:.0f}" if method == "ours" else "-"
        print(
            f"| {n} | {method} | {r['seconds']:.1f} | {n / r['seconds']:.0f} | {r['cpu_seconds']:.1f} | "
            f"{per_doc * 1e6:.0f} | {per_doc / first[method]:.2f}x | {r['largest_rss'] / 2**20:.0f} "
            f"({r['peak_rss'] / 2**20:.0f}) | {index} | {recall:.4f} |"
        )
    by = {(n, m): r for n, m, r, _ in rows}
    for n in sizes:
        if (n, "ours") in by and (n, "rensa") in by:
            o, q = by[(n, "ours")], by[(n, "rensa")]
            print(
                f"{n} docs: ours/rensa docs/s {q['seconds'] / o['seconds']:.2f}x, "
                f"largest-process RSS {o['largest_rss'] / q['largest_rss']:.2f}x"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--cache", default=os.environ.get("CRUCIBLE_BENCH_CACHE", str(Path.home() / ".cache/crucible/bench"))
    )
    parser.add_argument("--max-base-docs", type=int, default=5000, help="real documents before planting")
    parser.add_argument(
        "--corpus",
        choices=sorted(CORPORA),
        default="manuals",
        help="manuals: python3.11-doc + postgresql-doc-15 (English); handbook: debian-handbook in 26 languages",
    )
    parser.add_argument(
        "--fraction", type=float, default=1.0, help="share of documents that get a planted copy"
    )
    parser.add_argument("--methods", default="ours,rensa,datatrove,datatrove-split,datasketch")
    parser.add_argument(
        "--scale",
        default="",
        help="comma-separated document counts (e.g. 10000,100000,1000000): generated corpora through ours and "
        "rensa instead of the quality run",
    )
    parser.add_argument("--scale-docs-per-shard", type=int, default=5000)
    parser.add_argument(
        "--cores",
        type=int,
        default=0,
        help="N: instead of the quality run, N generated docs through the datatrove and Spark engines on 1 and 2 cores",
    )
    parser.add_argument(
        "--png", default=None, help="detection-curve PNG (default: <cache>/dedup_detection_curve.png)"
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes for ours and datatrove")
    parser.add_argument("--docs-per-shard", type=int, default=500)
    parser.add_argument(
        "--tau", type=float, default=0.7, help="Jaccard at which a pair counts as a duplicate"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="work dir (default: a temp dir, removed afterwards)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.method = args.child
        return child_main(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-dedup-"))
    work.mkdir(parents=True, exist_ok=True)
    if "rensa" in args.methods.split(","):
        os.environ["CRUCIBLE_RENSA_PYTHON"] = str(ensure_rensa_venv(Path(args.cache) / "rensa-venv"))
    print(
        f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at "
        "start (shared with other sessions: compare methods within this run, not with other runs)"
    )
    started = time.perf_counter()
    base = base_documents(Path(args.cache), args.max_base_docs, args.seed, args.corpus)
    if args.scale or args.cores:
        (run_scale if args.scale else run_cores)(args, base, work)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        return
    docs, pairs = build_corpus(base, args.fraction, args.seed)
    texts = {d["id"]: d["text"] for d in docs}
    words = sum(len(d["text"].split()) for d in docs)
    log.info(
        "corpus: %d documents (%d real + %d planted copies), %.1fM words, built in %.0fs",
        len(docs),
        len(base),
        len(pairs),
        words / 1e6,
        time.perf_counter() - started,
    )
    root = work / "store"
    write_corpus(root, docs, args.docs_per_shard)

    cache: dict = {}
    rows, results = [], {}
    for method in args.methods.split(","):
        log.info("running %s on %d documents", method, len(docs))
        res = run_method(method, root, work, args.workers)
        score = evaluate(res["clusters"], pairs, texts, args.tau, cache)
        results[method] = res | score
        rows.append(method)

    positives = results[rows[0]]["positives"]
    print(
        f"\n## Near-dedup benchmark, corpus {args.corpus}: {len(docs)} docs ({len(base)} real, "
        f"{len(pairs)} planted copies), "
        f"{words / 1e6:.2f}M words, workers={args.workers}, 5-grams, 14x8, tau={args.tau}\n"
    )
    head = (
        "| method | seconds | docs/s | CPU s | peak RSS MB largest (tree) | pred. pairs | precision | recall | "
        + " | ".join(f"J={lv}" for lv in LEVELS)
        + " |"
    )
    print(head)
    print("|" + "---|" * (8 + len(LEVELS)))
    for m in rows:
        r = results[m]
        per = " | ".join(f"{r['per_level'][lv]:.2f}" for lv in LEVELS)
        print(
            f"| {m} | {r['seconds']:.1f} | {len(docs) / r['seconds']:.0f} | {r['cpu_seconds']:.1f} | "
            f"{r['largest_rss'] / 2**20:.0f} ({r['peak_rss'] / 2**20:.0f}) | "
            f"{r['predicted_pairs']} | {r['precision']:.4f} | {r['recall']:.4f} | {per} |"
        )
    print(
        f"\n(recall over {positives} planted pairs with J >= {args.tau}; 95% interval half-width "
        f"~{wilson(results[rows[0]]['recall'], positives):.3f})"
    )
    if "ours" in results:
        print(
            f"ours runs `dedup_partition(report_plots=False)`; its two report PNGs (drawn when the Dagster "
            f"asset runs the stage) take {results['ours']['plot_seconds']:.2f} s more, timed after the run"
        )
    if "ours" in results:
        ours = results["ours"]
        print()
        for m in rows:
            if m == "ours":
                continue
            r = results[m]
            print(
                f"ours vs {m}: {r['seconds'] / ours['seconds']:.2f}x docs/s, "
                f"{r['cpu_seconds'] / ours['cpu_seconds']:.2f}x docs per CPU s, precision "
                f"{ours['precision'] - r['precision']:+.4f}, recall {ours['recall'] - r['recall']:+.4f}, "
                f"largest-process RSS {ours['largest_rss'] / r['largest_rss']:.2f}x, "
                f"tree RSS {ours['peak_rss'] / r['peak_rss']:.2f}x"
            )
    png = Path(args.png or Path(args.cache) / "dedup_detection_curve.png")
    plot_curve(
        {m: results[m] for m in rows},
        png,
        f"{len(docs)} docs, {len(pairs)} planted pairs, 5-grams, 14x8 (detection per Jaccard level)",
    )
    print(f"\ndetection curve: {png}")

    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
