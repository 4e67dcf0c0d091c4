"""Token shards with document boundaries, a per-source mixture, and a deterministic, resumable batch iterator.

Layout: a committed output (`infra.committed`) at `out_prefix`, whose meta is the manifest (what was read:
prefixes, partitions, files, hashes; the shards per source; the weights) and whose files are, per split and
source:

    {train,heldout}/<source>/shard-00000.tokens.npy     uint16/uint32 token ids, EOS after each doc
    {train,heldout}/<source>/shard-00000.docs.npy       int64 doc start offsets (n_docs + 1)
    {train,heldout}/<source>/shard-00000.meta.jsonl.gz  per doc: id, partition, group

Shards are written to a local staging directory and committed together: a reader sees one whole shard set.

The mixture is applied when batches are drawn: each row picks a source with the configured weight, so the
shards stay one-per-source and a new weight needs no re-tokenization.
"""

from __future__ import annotations

import gzip
import heapq
import json
import logging
import math
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import xxhash
from pydantic import BaseModel, ConfigDict, Field, field_validator
from tqdm import tqdm

from infra.committed import (
    CommittedOutput,
    commit,
    committed_shards,
    fetch_file,
    is_committed,
    read_committed,
)
from infra.schemas import CodeSamplingWeights, parse_document
from infra.stage import StageResult, markdown_table
from infra.store import LocalStore, ObjectStore

log = logging.getLogger(__name__)

DOC_SUFFIXES = (".jsonl.gz", ".jsonl")
# Path segments that name a pipeline stage rather than a snapshot; what remains of a prefix is its partition.
_STAGE_SEGMENTS = {"web", "code", "math", "dedup", "filtered", "kept", "files", "judged", "science"}


class MixtureConfig(BaseModel):
    """Token shards and mixture settings (defaults are the `tiny` profile's, but for its `train_sample`)."""

    model_config = ConfigDict(extra="forbid")
    weights: dict[str, float] = Field(
        {"web": 0.5, "code": 0.3, "math": 0.1, "knowledge": 0.1},
        description="Sampling weight per source (share of training tokens); renormalised over present sources",
    )
    code_language_weights: bool = Field(
        True, description="Apply <code_quality_root>/<snapshot>/sampling_weights.json to code docs if present"
    )
    code_quality_root: str = Field("code/quality", description="Store prefix of the code quality stage")
    heldout_fraction: float = Field(0.02, ge=0.0, lt=1.0, description="Share of docs per source held out")
    heldout_max_docs: int = Field(500, ge=0, description="Cap on held-out docs per source")
    # tiny's web source is ~110 docs: 2% held out one document, so its perplexity (and the short-context
    # gate of checkpoint_evals) was measured on one 256-token row, and two runs differed by 1.06x vs 1.14x.
    heldout_min_docs: int = Field(
        16,
        ge=0,
        description="Hold out at least this many docs per source (those with the lowest doc-id hashes) when "
        "heldout_fraction gives fewer, but never more than half a source's docs; unused if heldout_fraction=0",
    )
    shard_tokens: int = Field(4_000_000, ge=1024, description="Tokens per shard file (docs never split)")
    max_docs_per_source: int | None = Field(None, ge=1, description="Read at most this many docs per source")
    train_sample: dict[str, float] = Field(
        {},
        description="Share of a source's train docs tokenized (a seeded hash sample per doc, after the held-out "
        "split, so held-out docs are unchanged); sources not named keep all their docs",
    )
    min_doc_chars: int = Field(1, ge=0, description="Skip docs shorter than this many characters")
    encode_batch_size: int = Field(256, ge=1, description="Docs per tokenizer.encode_batch call")
    seed: int = Field(0, description="Seed for held-out selection and language-weight sampling")

    @field_validator("train_sample")
    @classmethod
    def _shares(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not 0 < v <= 1}
        if bad:
            raise ValueError(f"train_sample shares must be in (0, 1]; got {bad}")
        return value


def partition_of(prefix: str) -> str:
    """The snapshot/partition a store prefix names, e.g. 'web/filtered/2026-11/kept/' -> '2026-11'."""
    parts = [p for p in prefix.strip("/").split("/") if p and p not in _STAGE_SEGMENTS]
    return "/".join(parts) or prefix.strip("/")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _unit_hash(*parts: Any) -> float:
    """A deterministic number in [0, 1) from the parts (for seeded per-doc decisions)."""
    return xxhash.xxh64_intdigest("\x1f".join(map(str, parts))) / 2**64


def heldout_hash(doc_id: str, seed: int) -> float:
    """A doc's held-out draw: held out if below heldout_fraction (or among its source's lowest, to a minimum)."""
    return _unit_hash("heldout", seed, doc_id)


def group_key(doc: Mapping[str, Any]) -> str:
    """A cheap 'same origin' key for interleaved packing: the URL host or the code package."""
    meta = doc.get("metadata") or {}
    if meta.get("url"):
        return urlparse(str(meta["url"])).netloc or str(meta["url"])
    if meta.get("package"):
        return f"{meta.get('source', '')}:{meta['package']}"
    return ""


# ---------------------------------------------------------------------------------------------- reading


def document_keys(store: ObjectStore, prefix: str) -> list[str]:
    """Document shards under `prefix`: the files of the committed output that holds it (e.g. `dedup/web/s1/kept/`
    of `dedup/web/s1`); CommitError if none does (never a listing, which would see a killed writer's files)."""
    return committed_shards(store, prefix, DOC_SUFFIXES)


def iter_documents(store: ObjectStore, key: str) -> Iterator[dict]:
    """Documents of one JSONL(.gz) shard in file order."""
    with store.local_copy(key) as path:
        opener = gzip.open if key.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)


def load_language_weights(store: ObjectStore, quality_root: str, partition: str) -> dict[str, float] | None:
    """{lower-cased language: weight} from the code quality stage's `sampling_weights.json`, None if absent.
    A file of any other shape than `CodeSamplingWeights` raises ValueError naming the file and the keys."""
    prefix = f"{quality_root.strip('/')}/{partition}"
    if not is_committed(store, prefix):
        return None
    quality = read_committed(store, prefix)
    if "sampling_weights.json" not in quality.files:
        raise ValueError(
            f"{store.uri(prefix)}: the committed code quality output has no sampling_weights.json"
        )
    key = quality.key("sampling_weights.json")
    return parse_document(CodeSamplingWeights, store.get_json(key), store.uri(key)).language_weights()


def copies_for_weight(weight: float, doc_id: str, seed: int) -> int:
    """Integer copies with expectation `weight` (floor + a seeded coin for the fraction)."""
    whole = math.floor(weight)
    return whole + int(_unit_hash("copies", seed, doc_id) < weight - whole)


# ---------------------------------------------------------------------------------------------- writing


@dataclass
class _ShardBuffer:
    """Docs of one (split, source) until `shard_tokens` is reached; then one shard file set is written to the
    staging directory `root` (names relative to it, as the committed output lists them)."""

    root: Path
    prefix: str
    dtype: np.dtype
    shard_tokens: int
    chunks: list[np.ndarray] = field(default_factory=list)
    meta: list[dict] = field(default_factory=list)
    n_tokens: int = 0
    keys: list[str] = field(default_factory=list)

    def add(self, ids: Sequence[int], meta: dict) -> None:
        self.chunks.append(np.asarray(ids, dtype=self.dtype))
        self.meta.append(meta)
        self.n_tokens += len(ids)
        if self.n_tokens >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if not self.chunks:
            return
        base = f"{self.prefix}/shard-{len(self.keys):05d}"
        offsets = np.zeros(len(self.chunks) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(c) for c in self.chunks])
        (self.root / base).parent.mkdir(parents=True, exist_ok=True)
        np.save(self.root / f"{base}.tokens.npy", np.concatenate(self.chunks))
        np.save(self.root / f"{base}.docs.npy", offsets)
        text = "".join(json.dumps(m) + "\n" for m in self.meta).encode("utf-8")
        # mtime=0: gzip stamps the time in its header, so the shard's bytes (and the token_shards data
        # version every training job keys its run dir on) changed on each rebuild of the same data
        (self.root / f"{base}.meta.jsonl.gz").write_bytes(gzip.compress(text, mtime=0))
        self.keys.append(f"{base}.tokens.npy")
        self.chunks, self.meta, self.n_tokens = [], [], 0


def _read_doc_file(store: ObjectStore, key: str) -> tuple[dict, list[dict]]:
    """(version record {key, bytes, xxh64}, documents) of one JSONL(.gz) file, read once."""
    with store.local_copy(key) as path:
        data = Path(path).read_bytes()
    text = gzip.decompress(data) if key.endswith(".gz") else data
    docs = [json.loads(line) for line in text.decode("utf-8").splitlines() if line.strip()]
    return {"key": key, "bytes": len(data), "xxh64": xxhash.xxh64_hexdigest(data)}, docs


def _write_batch(tok, batch: list[tuple[str, str, dict]], eos_id: int, buffers, counts: Counter) -> None:
    """Tokenize a batch of (split, partition, doc), append EOS to each doc and add it to its split's shard
    buffer; counts[(name, partition)] counts tokens and docs per split."""
    encodings = tok.encode_batch([doc["text"] for _, _, doc in batch], add_special_tokens=False)
    for (split, partition, doc), enc in zip(batch, encodings, strict=True):
        ids = enc.ids + [eos_id]
        meta = {"id": str(doc.get("id", "")), "partition": partition, "group": group_key(doc)}
        buffers[split].add(ids, meta)
        counts[(f"{split}_tokens", partition)] += len(ids)
        counts[(f"{split}_docs", partition)] += 1
    batch.clear()


def load_corpus_tokenizer(tokenizer_path: str | Path):
    """The raw `tokenizers` object, with special-token text in documents encoded as plain text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(_tokenizer_file(tokenizer_path)))
    # A web page that contains the string "<|endoftext|>" must not inject a real EOS.
    tok.encode_special_tokens = True
    return tok


def _tokenizer_file(tokenizer_path: str | Path) -> Path:
    path = Path(tokenizer_path)
    return path / "tokenizer.json" if path.is_dir() else path


@dataclass
class _SourceRun:
    """Everything one source's tokenization reads and counts."""

    source: str
    buffers: dict[str, _ShardBuffer]
    inputs: list[dict] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    docs_read: int = 0
    n_heldout: int = 0
    # Candidates for heldout_min_docs: the non-held-out docs with the lowest held-out draws so far, as a
    # max-heap of (-draw, doc id, partition, read index, doc); a doc pushed out of it goes to train.
    reserve: list = field(default_factory=list)
    lang_weights: dict[str, dict | None] = field(default_factory=dict)
    train_sample: float = 1.0  # share of train docs kept (MixtureConfig.train_sample)


def _tokenize_prefix(
    run: _SourceRun, prefix: str, store, tok, eos_id: int, config: MixtureConfig, stats
) -> None:
    """Tokenize the docs under one prefix (a partition) into the source's train / held-out buffers."""
    partition = partition_of(prefix)
    lang_weights = None
    if run.source == "code" and config.code_language_weights:
        lang_weights = load_language_weights(store, config.code_quality_root, partition)
        if lang_weights is None:  # said, not silent: the code mixture is then the corpus as deduplicated
            log.warning("%s: no committed code quality output under %s/%s; code language weights not applied",
                        prefix, config.code_quality_root, partition)  # fmt: skip
            stats["code_language_weights_missing"] += 1
    run.lang_weights[partition] = lang_weights
    files, batch = [], []
    for key in tqdm(document_keys(store, prefix), desc=f"tokenize {run.source}:{partition}", leave=False):
        version, docs = _read_doc_file(store, key)
        files.append(version)
        for doc in docs:
            if config.max_docs_per_source and run.docs_read >= config.max_docs_per_source:
                stats[f"dropped/{run.source}/over_max_docs"] += 1
                continue
            text = doc.get("text") or ""
            if len(text) < config.min_doc_chars:
                stats[f"dropped/{run.source}/too_short"] += 1
                continue
            run.docs_read += 1
            doc_id = str(doc.get("id") or xxhash.xxh64_hexdigest(text))
            draw = heldout_hash(doc_id, config.seed)
            to_train: tuple | None = (doc_id, partition, doc)
            if config.heldout_fraction > 0 and run.n_heldout < config.heldout_max_docs:
                if draw < config.heldout_fraction:
                    run.n_heldout += 1
                    batch.append(("heldout", partition, doc))
                    to_train = None
                elif config.heldout_min_docs:  # docs_read breaks ties: dicts do not compare
                    item = (-draw, doc_id, partition, run.docs_read, doc)
                    if len(run.reserve) < config.heldout_min_docs:
                        heapq.heappush(run.reserve, item)
                        to_train = None
                    else:
                        _, out_id, out_partition, _, out_doc = heapq.heappushpop(run.reserve, item)
                        to_train = (out_id, out_partition, out_doc)
            if to_train is not None:
                batch.extend(_train_items(run, *to_train, config.seed, stats))
            if len(batch) >= config.encode_batch_size:
                _write_batch(tok, batch, eos_id, run.buffers, run.counts)
    _write_batch(tok, batch, eos_id, run.buffers, run.counts)
    run.inputs.append(
        {
            "prefix": prefix,
            "partition": partition,
            "files": files,
            "data_version": xxhash.xxh64_hexdigest(json.dumps(files, sort_keys=True)),
            "language_weights": lang_weights,
        }
    )


def _train_items(run: _SourceRun, doc_id: str, partition: str, doc: dict, seed: int, stats) -> list:
    """A training doc as (split, partition, doc) items: one per copy its code-language weight asks for; none
    when it falls outside the source's `train_sample`."""
    share = run.train_sample
    if share < 1 and _unit_hash("train_sample", seed, doc_id) >= share:
        stats[f"dropped/{run.source}/train_sample"] += 1
        return []
    lang_weights, copies = run.lang_weights.get(partition), 1
    if lang_weights is not None:
        lang = str((doc.get("metadata") or {}).get("language", "")).lower()
        if lang not in lang_weights:  # a language the quality stage did not weigh: one copy, counted
            stats[f"code_language_unweighted/{lang or 'unknown'}"] += 1
        copies = copies_for_weight(lang_weights.get(lang, 1.0), doc_id, seed)
        stats[f"code_language_copies/{lang or 'unknown'}"] += copies
        stats[f"dropped/{run.source}/language_weight"] += copies == 0
    return [("train", partition, doc)] * copies


def _settle_reserve(run: _SourceRun, tok, eos_id: int, config: MixtureConfig, stats) -> None:
    """Hold out the reserve's lowest draws until the source has heldout_min_docs held-out docs (at most half
    its docs, within heldout_max_docs); the rest of the reserve goes to train."""
    want = min(config.heldout_min_docs, config.heldout_max_docs, run.docs_read // 2) - run.n_heldout
    batch = []
    for i, (_, doc_id, partition, _, doc) in enumerate(
        sorted(run.reserve, key=lambda x: x[:4], reverse=True)
    ):
        if i < want:
            run.n_heldout += 1
            batch.append(("heldout", partition, doc))
        else:
            batch.extend(_train_items(run, doc_id, partition, doc, config.seed, stats))
    run.reserve.clear()
    if batch:
        _write_batch(tok, batch, eos_id, run.buffers, run.counts)


def build_token_shards(
    config: MixtureConfig,
    store: ObjectStore,
    sources: Mapping[str, Sequence[str]],
    tokenizer_path: str | Path,
    out_prefix: str,
) -> StageResult:
    """Tokenize every doc under each source's store prefixes into train/held-out token shards.

    sources: source name (a key of `config.weights`) -> store prefixes holding JSONL(.gz) doc shards.
    Commits the shards as one version of `out_prefix` with the manifest as its meta (it lists every input
    file with its size and hash); `outputs["prefix"]` (also `"manifest"`) names it for `shard_paths`. Metrics
    count docs and tokens per source and per partition.
    """
    from training.tokenizer import EOS

    missing = sorted(s for s, prefixes in sources.items() if prefixes and s not in config.weights)
    if missing:
        raise ValueError(
            f"mixture.weights has no entry for source(s) {missing}; add a weight for each source"
        )
    tok = load_corpus_tokenizer(tokenizer_path)
    eos_id, vocab_size = tok.token_to_id(EOS), tok.get_vocab_size()
    dtype = token_dtype(vocab_size)
    out_prefix = out_prefix.strip("/")
    tokenizer_hash = xxhash.xxh64_hexdigest(_tokenizer_file(tokenizer_path).read_bytes())
    manifest: dict[str, Any] = {
        "tokenizer": {"xxh64": tokenizer_hash, "vocab_size": vocab_size, "eos_id": eos_id},
        "dtype": dtype.name,
        "config": config.model_dump(),
        "sources": {},
    }
    metrics: dict[str, float] = {}
    stats: Counter = Counter()
    staging = Path(tempfile.mkdtemp(prefix="crucible-token-shards-"))
    try:
        _tokenize_sources(config, store, sources, tok, eos_id, dtype, staging, manifest, metrics, stats)
        out = _commit_shards(config, store, out_prefix, staging, manifest, metrics, stats)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    rows = [
        {
            "source": source,
            "partitions": ", ".join(i["partition"] for i in entry["inputs"]),
            "train tokens": entry["train_tokens"],
            "held-out tokens": entry["heldout_tokens"],
            "weight": round(manifest["weights"].get(source, 0.0), 4),
            "up-sampling": round(metrics[f"mixture_upsampling/{source}"], 3),
        }
        for source, entry in manifest["sources"].items()
    ]
    report = (
        f"## Token shards\n\n{markdown_table(rows)}\n\nTokenizer xxh64 `{tokenizer_hash}`, dtype {dtype}."
    )
    return StageResult(
        metrics=metrics,
        outputs={"manifest": out_prefix, "prefix": out_prefix, "version": out.version},
        report_md=report,
        sample=rows,
        data_version=manifest["data_version"],
        extra={"manifest": manifest},
    )


def _tokenize_sources(config, store, sources, tok, eos_id, dtype, staging, manifest, metrics, stats) -> None:
    """Tokenize every source into train / held-out shards under `staging`; fills the manifest's sources."""
    for source, prefixes in sources.items():
        if not prefixes:
            continue
        buffers = {
            split: _ShardBuffer(staging, f"{split}/{source}", dtype, config.shard_tokens)
            for split in ("train", "heldout")
        }
        run = _SourceRun(source, buffers, train_sample=config.train_sample.get(source, 1.0))
        for prefix in prefixes:
            _tokenize_prefix(run, prefix, store, tok, eos_id, config, stats)
        _settle_reserve(run, tok, eos_id, config, stats)
        for buf in buffers.values():
            buf.flush()
        for entry in run.inputs:
            for name in ("train_tokens", "train_docs", "heldout_tokens", "heldout_docs"):
                metrics[f"{name}/{source}/{entry['partition']}"] = float(
                    run.counts[(name, entry["partition"])]
                )
        for name in ("train_tokens", "train_docs", "heldout_tokens", "heldout_docs"):
            metrics[f"{name}/{source}"] = float(sum(v for (k, _), v in run.counts.items() if k == name))
        manifest["sources"][source] = {
            "inputs": run.inputs,
            "train_shards": buffers["train"].keys,
            "heldout_shards": buffers["heldout"].keys,
            "train_tokens": int(metrics[f"train_tokens/{source}"]),
            "heldout_tokens": int(metrics[f"heldout_tokens/{source}"]),
        }


def _commit_shards(config, store, out_prefix, staging, manifest, metrics, stats) -> CommittedOutput:
    """Mixture weights and metrics into the manifest, then commit the staged shards with it as meta."""
    available = {s: v["train_tokens"] for s, v in manifest["sources"].items()}
    weights = manifest["weights"] = mixture_weights(config.weights, available)
    total = sum(available.values())
    metrics["train_tokens/total"] = float(total)
    for source, entry in manifest["sources"].items():
        share = entry["train_tokens"] / total if total else 0.0
        metrics[f"mixture/{source}"] = weights.get(source, 0.0)
        # Passes over this source's tokens per pass over all tokens (>1 = up-sampled by the mixture).
        metrics[f"mixture_upsampling/{source}"] = weights.get(source, 0.0) / share if share else 0.0
    metrics.update({k: float(v) for k, v in stats.items()})
    manifest["data_version"] = xxhash.xxh64_hexdigest(json.dumps(manifest, sort_keys=True, default=str))
    return commit(store, out_prefix, staging, meta=json.loads(json.dumps(manifest, default=str)))


def mixture_weights(weights: Mapping[str, float], available: Mapping[str, int]) -> dict[str, float]:
    """Configured weights restricted to sources that have tokens, normalised to sum to 1."""
    present = {s: float(weights.get(s, 0.0)) for s, n in available.items() if n > 0}
    total = sum(present.values())
    if total <= 0:
        raise ValueError(f"no source with both tokens and a positive weight (weights={dict(weights)})")
    return {s: w / total for s, w in sorted(present.items()) if w > 0}


def cap_source_epochs(
    weights: Mapping[str, float], tokens: Mapping[str, int], budget_tokens: float, max_epochs: float | None
) -> dict[str, float]:
    """Mixture weights under which no source is drawn for more than `max_epochs` passes over its `tokens`
    in a run that trains on `budget_tokens`: a capped source keeps its cap, and the share it gives up goes
    to the others in proportion to their weights. When even that cannot hold every source to the cap (the
    run is longer than `max_epochs` passes over all tokens), weights are token-proportional: every source
    repeats equally, the least any mixture can. `max_epochs=None` returns `mixture_weights(weights, tokens)`."""
    w = mixture_weights(weights, tokens)
    if max_epochs is None or budget_tokens <= 0:
        return w
    cap = {s: max_epochs * tokens[s] / budget_tokens for s in w}
    if sum(cap.values()) <= 1.0:
        total = sum(tokens[s] for s in w)
        return {s: tokens[s] / total for s in w}
    fixed: dict[str, float] = {}
    while True:
        free = [s for s in w if s not in fixed]
        mass, free_weight = 1.0 - sum(fixed.values()), sum(w[s] for s in free)
        share = {s: mass * w[s] / free_weight for s in free}
        over = [s for s in free if share[s] > cap[s]]
        if not over:
            return {s: fixed.get(s, share.get(s, 0.0)) for s in w}
        fixed.update({s: cap[s] for s in over})


def source_epochs(
    weights: Mapping[str, float], tokens: Mapping[str, int], budget_tokens: float
) -> dict[str, float]:
    """Expected passes over each source's tokens in a run of `budget_tokens` drawn with `weights`."""
    return {s: w * budget_tokens / tokens[s] for s, w in weights.items() if tokens.get(s)}


def capped_mixture(
    weights: Mapping[str, float],
    tokens: Mapping[str, int],
    budget_tokens: float,
    max_epochs: float | None,
    stage: str,
) -> tuple[dict[str, float], dict[str, float]]:
    """`cap_source_epochs` and its metrics: `mixture_<stage>/<source>` (the weight drawn with) and
    `source_epochs/<source>` (expected passes over the source's train tokens in the stage)."""
    capped = cap_source_epochs(weights, tokens, budget_tokens, max_epochs)
    metrics = {f"mixture_{stage}/{s}": w for s, w in capped.items()}
    metrics.update({f"source_epochs/{s}": e for s, e in source_epochs(capped, tokens, budget_tokens).items()})
    return capped, metrics


# ---------------------------------------------------------------------------------------------- reading shards


def shard_paths(
    store: ObjectStore, prefix: str, split: str = "train", cache_dir: str | Path | None = None
) -> dict[str, list[Path]]:
    """Local paths of the committed token shards at `prefix` per source (`outputs["prefix"]` of
    `build_token_shards`); a remote store's files are downloaded, hash-checked, to `cache_dir`."""
    out = read_committed(store, prefix)
    in_place = isinstance(store, LocalStore)  # read in place: no cache dir to make
    cache = (
        None
        if in_place
        else Path(cache_dir or tempfile.mkdtemp(prefix="crucible-shards-")) / out.prefix / out.version
    )
    paths: dict[str, list[Path]] = {}
    for source, entry in out.meta["sources"].items():
        for name in entry[f"{split}_shards"]:
            for n in (
                name,
                name.replace(".tokens.npy", ".docs.npy"),
                name.replace(".tokens.npy", ".meta.jsonl.gz"),
            ):
                if in_place:
                    path = store.local_path(out.key(n))  # its size was just checked
                elif not (cache / n).exists() or (cache / n).stat().st_size != out.files[n].bytes:
                    path = fetch_file(store, out, n, cache / n)
                else:
                    path = cache / n
                if n == name:
                    paths.setdefault(source, []).append(path)
    return paths


def token_manifest(store: ObjectStore, prefix: str) -> dict[str, Any]:
    """The manifest of the committed token shards at `prefix` (tokenizer, sources, weights, data_version)."""
    return read_committed(store, prefix).meta


def load_shard(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, doc offsets) of one shard; tokens are memory-mapped."""
    path = Path(path)
    tokens = np.load(path, mmap_mode="r")
    offsets = np.load(str(path).replace(".tokens.npy", ".docs.npy"))
    return tokens, offsets


def load_shard_meta(path: str | Path) -> list[dict]:
    meta_path = Path(str(path).replace(".tokens.npy", ".meta.jsonl.gz"))
    if not meta_path.exists():
        return []
    with gzip.open(meta_path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def iter_shard_documents(paths: Iterable[str | Path]) -> Iterator[np.ndarray]:
    """Each document's token ids (EOS included) in shard order."""
    for path in paths:
        tokens, offsets = load_shard(path)
        for a, b in zip(offsets[:-1], offsets[1:], strict=True):
            yield np.asarray(tokens[a:b])


class TokenStream:
    """The shards of one source as one virtual token array (reads may span shard files)."""

    def __init__(self, paths: Sequence[str | Path]):
        if not paths:
            raise ValueError("TokenStream needs at least one shard path")
        self.paths = [Path(p) for p in paths]
        self.arrays = [np.load(p, mmap_mode="r") for p in self.paths]
        self.starts = np.concatenate([[0], np.cumsum([len(a) for a in self.arrays])]).astype(np.int64)
        self.num_tokens = int(self.starts[-1])
        if self.num_tokens == 0:
            raise ValueError(f"shards {self.paths} hold no tokens")

    def read(self, start: int, length: int) -> np.ndarray:
        """`length` tokens from `start`, wrapping around the end of the stream."""
        out = np.empty(length, dtype=np.int64)
        filled = 0
        pos = start % self.num_tokens
        while filled < length:
            i = int(np.searchsorted(self.starts, pos, side="right")) - 1
            local = pos - self.starts[i]
            take = min(length - filled, len(self.arrays[i]) - local)
            out[filled : filled + take] = self.arrays[i][local : local + take]
            filled += take
            pos = (pos + take) % self.num_tokens
        return out


def targets_path(tokens_path: str | Path) -> Path:
    """The loss mask beside a token shard: one uint8 per token, 1 = a training target."""
    return Path(str(tokens_path).replace(".tokens.npy", ".targets.npy"))


def write_targets(tokens_path: str | Path, targets: np.ndarray) -> Path:
    """Write the loss mask of the token shard at `tokens_path` (flattened in token order)."""
    path = targets_path(tokens_path)
    np.save(path, np.ascontiguousarray(targets, dtype=np.uint8).reshape(-1))
    return path


def targets_stream(paths: Sequence[str | Path]) -> TokenStream | None:
    """The loss masks of `paths` as one stream aligned with their tokens; None if no shard has one. A mask
    for some shards only, or of another length than its tokens, is an error (it would shift the labels)."""
    masks = [targets_path(p) for p in paths]
    present = [m.exists() for m in masks]
    if not any(present):
        return None
    if not all(present):
        missing = [str(m) for m, ok in zip(masks, present, strict=True) if not ok]
        raise ValueError(f"loss masks missing for some shards of one source: {missing}; rebuild the shards")
    stream = TokenStream(masks)
    tokens = sum(len(np.load(p, mmap_mode="r")) for p in paths)
    if stream.num_tokens != tokens:
        raise ValueError(f"loss masks {masks} hold {stream.num_tokens} entries for {tokens} tokens")
    return stream


class TokenBatches:
    """Deterministic, resumable batches of `seq_len` token windows drawn from token shards.

    Batch `i` is a pure function of (seed, rank, i): each row picks a source by `weights` (default: by token count)
    and a uniformly random window in it (`aligned=True`: windows start at multiples of `seq_len`, for shards of
    pre-packed rows). Iterating yields {"input_ids", "labels"} (int64, [batch_size, seq_len]); `position`
    is the index of the next batch, saved by `state_dict()` and restored by `load_state_dict()`.

    `repeat_share` of the rows are repeated-passage rows: a window, an unrelated window, then the first window
    again. The second copy is predictable only by looking back, the signal that grows induction (copy) heads;
    a few-million-token run of natural text alone holds too few repeats for a small model to learn them.

    A shard with a loss mask beside it (`*.targets.npy`, see `write_targets`) trains only on the tokens the
    mask marks: labels are -100 elsewhere.
    """

    def __init__(
        self,
        shard_paths: Sequence[str | Path] | Mapping[str, Sequence[str | Path]],
        seq_len: int,
        batch_size: int,
        seed: int = 0,
        start_position: int = 0,
        weights: Mapping[str, float] | None = None,
        aligned: bool = False,
        rank: int = 0,
        world_size: int = 1,
        repeat_share: float = 0.0,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        if not 0 <= repeat_share <= 1:
            raise ValueError(f"repeat_share must be in [0, 1], got {repeat_share}")
        self.rank, self.world_size = rank, world_size
        if not isinstance(shard_paths, Mapping):
            shard_paths = {"all": list(shard_paths)}
        self.sources = sorted(s for s, paths in shard_paths.items() if paths)
        self.streams = {s: TokenStream(shard_paths[s]) for s in self.sources}
        self.targets = {s: t for s in self.sources if (t := targets_stream(shard_paths[s])) is not None}
        raw = {
            s: (weights or {}).get(s, 0.0) if weights else float(self.streams[s].num_tokens)
            for s in self.sources
        }
        total = sum(raw.values())
        if total <= 0:
            raise ValueError(f"no source with a positive weight among {self.sources} (weights={weights})")
        self.probs = np.array([raw[s] / total for s in self.sources])
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.aligned = aligned
        self.repeat_share = repeat_share
        self.position = start_position

    def _start(self, rng: np.random.Generator, source: str) -> int:
        n = self.streams[source].num_tokens
        if self.aligned:
            return int(rng.integers(0, max(n // self.seq_len, 1))) * self.seq_len
        return int(rng.integers(0, max(n - self.seq_len + 1, 1)))

    def plan(self, position: int) -> list[list[tuple[str, int, int]]]:
        """The pieces (source, start offset, length) of every row of batch `position`."""
        rng = np.random.default_rng([self.seed, self.rank, position])  # each data-parallel rank its own rows
        picks = rng.choice(len(self.sources), size=self.batch_size, p=self.probs)
        rows = []
        for idx in picks:
            source = self.sources[idx]
            if self.repeat_share and rng.random() < self.repeat_share:
                passage = int(rng.integers(self.seq_len // 8, self.seq_len // 3 + 1))
                copy = (source, self._start(rng, source), passage)
                gap = (source, self._start(rng, source), self.seq_len - 2 * passage)
                rows.append([copy, gap, copy])
            else:
                rows.append([(source, self._start(rng, source), self.seq_len)])
        return rows

    def batch_at(self, position: int) -> dict[str, Any]:
        import torch

        plan = self.plan(position)
        rows = [np.concatenate([self.streams[s].read(start, n) for s, start, n in pieces]) for pieces in plan]
        input_ids = torch.from_numpy(np.stack(rows))
        labels = input_ids.clone()
        for i, pieces in enumerate(plan):
            if pieces[0][0] in self.targets:
                keep = np.concatenate([self.targets[s].read(start, n) for s, start, n in pieces]).astype(bool)
                labels[i, torch.from_numpy(~keep)] = -100
        return {"input_ids": input_ids, "labels": labels}

    def __iter__(self) -> TokenBatches:
        return self

    def __next__(self) -> dict[str, Any]:
        batch = self.batch_at(self.position)
        self.position += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if "seed" in state and state["seed"] != self.seed:
            raise ValueError(f"batch iterator seed {self.seed} != checkpoint's {state['seed']}")
        self.position = int(state["position"])


def token_batches(rank: int = 0, world_size: int = 1, **kwargs: Any) -> TokenBatches:
    """Factory for training job specs (`training.data:token_batches`); kwargs as for `TokenBatches`."""
    return TokenBatches(rank=rank, world_size=world_size, **kwargs)


def heldout_batches(
    shard_paths: Sequence[str | Path] | Mapping[str, Sequence[str | Path]],
    seq_len: int,
    batch_size: int,
    max_batches: int = 4,
    rank: int = 0,
    world_size: int = 1,
) -> list[dict[str, Any]]:
    """Fixed eval batches (up to `max_batches` per source): consecutive windows from the start of each
    source's held-out stream, split over ranks (factory for job specs: `training.data:heldout_batches`)."""
    import torch

    if not isinstance(shard_paths, Mapping):
        shard_paths = {"all": list(shard_paths)}
    rows, labels = [], []
    for source in sorted(shard_paths):
        stream, targets = TokenStream(shard_paths[source]), targets_stream(shard_paths[source])
        n = max(1, min(stream.num_tokens // seq_len, max_batches * batch_size))
        for i in range(n):
            row = stream.read(i * seq_len, seq_len)
            rows.append(row)
            labels.append(
                row if targets is None else np.where(targets.read(i * seq_len, seq_len) > 0, row, -100)
            )
    rows, labels = rows[rank::world_size], labels[rank::world_size]
    batches = []
    for i in range(0, min(len(rows), max_batches * batch_size * len(shard_paths)), batch_size):
        ids = torch.from_numpy(np.stack(rows[i : i + batch_size]))
        batches.append({"input_ids": ids, "labels": torch.from_numpy(np.stack(labels[i : i + batch_size]))})
    return batches


__all__ = [
    "MixtureConfig",
    "TokenBatches",
    "TokenStream",
    "build_token_shards",
    "cap_source_epochs",
    "capped_mixture",
    "iter_shard_documents",
    "load_shard",
    "load_shard_meta",
    "mixture_weights",
    "partition_of",
    "shard_paths",
    "source_epochs",
    "token_batches",
    "token_manifest",
    "heldout_batches",
]
