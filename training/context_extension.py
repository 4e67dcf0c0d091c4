"""Staged context-extension midtraining (RECIPE.md "Mid-training"): per stage, stretch RoPE (ABF or YaRN), then
train on rows of the stage's length built from up-sampled long documents, interleaved packing of similar
documents, and synthetic long-range recall sequences (passkey, MRCR-like multi-key).

The asset layer calls, per stage: `build_midtrain_shards` (data) then `midtrain_stage` (parent checkpoint ->
new checkpoint).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import xxhash
from pydantic import BaseModel, ConfigDict, Field, model_validator

from infra.committed import commit, fetch_file, read_committed
from infra.stage import StageResult, markdown_table
from infra.store import LocalStore, ObjectStore
from training.data import (
    capped_mixture,
    iter_shard_documents,
    shard_paths,
    targets_path,
    token_manifest,
    write_targets,
)
from training.recall_tasks import FillerText, synthetic_recall_examples

log = logging.getLogger(__name__)


class RecallPhase(BaseModel):
    """A phase on synthetic recall rows only (passkey and multi-key), shorter than the stage's context."""

    model_config = ConfigDict(extra="forbid")
    seq_len: int = Field(ge=16, description="Row length (tokens); at most the stage's seq_len")
    steps: int = Field(ge=1, description="Optimizer steps (every row is new: steps x batch_size rows)")
    batch_size: int = Field(8, ge=1, description="Rows per step")
    learning_rate: float | None = Field(None, gt=0, description="Peak LR; None = the stage's")
    replay_rows: int | None = Field(
        None, ge=0, description="Natural rows added to each step's batch; None = curriculum_replay_rows"
    )
    multikey_share: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Share of multi-key rows among the rows that do not repeat a passage (the rest passkey); "
        "None = curriculum_multikey_share",
    )
    # Off in tiny: tiny's checkpoints have no in-context copy (`copy/gain` of checkpoint_evals ~0.05 nats), and
    # ~2,000 steps of such rows grew one on the base at a large cost to its language model (measured with
    # scratch scripts, docs/post_training_results.md 2026-12-08); a copy curriculum has not been tuned yet.
    repeat_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of rows that repeat a passage after unrelated text, trained on the second copy "
        "(grows induction / copy heads)",
    )


# Short to long: a tiny model learns to retrieve a key from 96-token rows and then keeps the skill at longer
# lengths; trained on 256-token rows from the start, it never finds the key (loss stays at ln 10 per digit).
# Recall rows train on their answers only (curriculum_answer_only): with a full-row loss the 5 key tokens
# were ~3% of a step's targets, and whether retrieval emerged within the curriculum was luck (3 runs of one
# data state: 2 learned, 1 stayed at chance). The 96-token phase adds 2 replay rows, not 4: with 4, the
# answers were ~9% of the targets and one of two seeds still did not learn in 400 steps (with 1 or 2, both
# did by step ~150; with none, the model forgot language: web perplexity 164 -> 1e6). Passkey rows only at
# 96 tokens: with half multi-key rows both seeds learned too, but later (answer NLL 1.15-1.24 at step 400
# against 0.76-0.87).
TINY_RECALL_CURRICULUM = [
    RecallPhase(seq_len=96, steps=400, learning_rate=3e-3, replay_rows=2, multikey_share=0.0),
    RecallPhase(seq_len=160, steps=300, learning_rate=3e-3),
    RecallPhase(seq_len=256, steps=600, learning_rate=2e-3),
]


class ContextStage(BaseModel):
    """One context-extension stage."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Stage name, e.g. 'ctx_1024' (used in store keys and model names)")
    seq_len: int = Field(ge=16, description="Training context length of this stage (tokens)")
    rope_theta: float | None = Field(None, gt=0, description="ABF: RoPE base for this stage; None = keep")
    steps: int = Field(200, ge=1, description="Optimizer steps in this stage")
    batch_size: int = Field(4, ge=1, description="Rows per step")
    learning_rate: float = Field(1e-3, gt=0, description="Peak learning rate of this stage")
    dsa_mode: Literal["dense", "sparse"] = Field(
        "sparse", description="Attention while training: sparse = DSA top-k with the indexer on its own loss"
    )
    indexer_warmup_steps: int = Field(
        0,
        ge=0,
        description="Indexer-only steps at the new length: before the main phase if sparse, after it if dense",
    )
    recall_curriculum: list[RecallPhase] = Field(
        default_factory=list,
        description="Dense phases on synthetic recall rows of increasing length, before the main phase",
    )

    @model_validator(mode="after")
    def _curriculum_fits(self) -> ContextStage:
        lengths = [p.seq_len for p in self.recall_curriculum]
        if any(b <= a for a, b in zip(lengths, lengths[1:], strict=False)):
            raise ValueError(f"stage {self.name!r}: recall_curriculum seq_len must increase, got {lengths}")
        too_long = [n for n in lengths if n > self.seq_len]
        if too_long:
            raise ValueError(
                f"stage {self.name!r}: recall_curriculum seq_len {too_long} exceeds the stage's "
                f"seq_len {self.seq_len}; use shorter rows or drop them"
            )
        return self


class ContextExtensionConfig(BaseModel):
    """Context-extension midtraining settings (defaults are the `tiny` profile's: 256 -> 512 -> 768 -> 1024).

    The first tiny stage trains dense (retrieval heads grow under full attention; under top-k sparse attention
    the indexer would only ever show the model what it already attends to), then warms the indexer up on it.
    It opens with a recall curriculum (synthetic rows of 96 -> 160 -> 256 tokens) that grows the retrieval
    skill the longer stages stretch.
    """

    model_config = ConfigDict(extra="forbid")
    base_seq_len: int = Field(256, ge=16, description="Context length of pretraining (the base checkpoint)")
    rope_method: Literal["abf", "yarn"] = Field(
        "abf", description="abf: raise the RoPE base; yarn: YaRN scaling"
    )
    stages: list[ContextStage] = Field(
        default_factory=lambda: [
            ContextStage(
                name="ctx_512",
                seq_len=512,
                rope_theta=20_000.0,
                steps=200,
                learning_rate=5e-4,
                dsa_mode="dense",
                indexer_warmup_steps=30,
                recall_curriculum=TINY_RECALL_CURRICULUM,
            ),
            ContextStage(
                name="ctx_768",
                seq_len=768,
                rope_theta=30_000.0,
                steps=100,
                learning_rate=5e-4,
                indexer_warmup_steps=20,
            ),
            ContextStage(
                name="ctx_1024",
                seq_len=1024,
                rope_theta=40_000.0,
                steps=100,
                learning_rate=5e-4,
                indexer_warmup_steps=20,
            ),
        ],
        description="Stages in order; each starts from the previous stage's checkpoint",
    )
    rows_per_stage: int = Field(
        1024, ge=1, description="Packed rows built per stage (batches sample them with replacement)"
    )
    long_doc_alpha: float = Field(
        1.5,
        ge=0,
        description="Doc sampling weight ∝ length^alpha (1 = token-proportional, >1 favours long docs)",
    )
    interleave_share: float = Field(
        0.5, ge=0, le=1, description="Share of natural rows packed from similar docs"
    )
    interleave_chunk_tokens: int = Field(
        128,
        ge=0,
        description="Similar docs are cut into chunks of this size and interleaved (0 = concatenated)",
    )
    similarity_cluster_docs: int = Field(
        16, ge=2, description="Target docs per tf-idf k-means cluster when grouping similar docs"
    )
    synthetic_share: float = Field(
        0.5, ge=0, le=1, description="Share of rows that are synthetic recall rows"
    )
    multikey_share: float = Field(
        0.5, ge=0, le=1, description="Share of synthetic rows that are multi-key (MRCR)"
    )
    # Off in tiny: repeated passages did not move passkey retrieval (measured, training/recall_tasks.py).
    repeat_share: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of synthetic rows that repeat a passage (dense long-range copying)",
    )
    # Replay is added, not swapped in: replacing 25% or 50% of the curriculum's recall rows with natural ones
    # kept short-context perplexity in tiny but the model no longer learned retrieval in the same steps.
    # Without replay, a tiny run of an earlier ladder ended at 1.23x the base's short-context perplexity.
    # Not more: 8 rows (same data state and base) left web perplexity on 71 held-out rows at 220 after the
    # 256-token phase against 187 after the 160-token one (base 159): tiny's web source is ~95 docs, 820x
    # up-sampled by the mixture, and 8 rows x 600 steps replay it ~7 times, more than all of pretraining.
    curriculum_replay_rows: int = Field(
        4,
        ge=0,
        description="Natural corpus rows added to every recall-curriculum step's batch (replay of pretraining "
        "data against forgetting; the step's recall rows stay the phase's batch_size)",
    )
    # Replay of pretraining data against forgetting, but not of one small source many times over: uncapped,
    # tiny's former ~95-document web source (93k tokens) got ~8.6 more passes here on top of pretraining's 4.
    # Not 1: capped at one pass, web was 6% of the natural rows and its held-out perplexity recovered far less
    # from the 96-token phase (474, then 355 after the 160-token phase, against 313 and 217 uncapped; base 168).
    max_source_epochs: float | None = Field(
        4.0,
        gt=0,
        description="Cap on the passes over any one source's train tokens in the natural rows of the whole "
        "context extension (main phases and curriculum replay); what a capped source gives up goes to the "
        "others by their weights (None = the mixture's weights as they are)",
    )
    curriculum_multikey_share: float = Field(
        0.5, ge=0, le=1, description="Share of recall-curriculum rows that are multi-key (the rest passkey)"
    )
    curriculum_answer_only: bool = Field(
        True,
        description="Recall-curriculum rows train on their answers only (the asked keys; labels -100 elsewhere); "
        "replay rows on every token",
    )
    curriculum_eval_rows: int = Field(
        32,
        ge=0,
        description="Rows in held-out text per curriculum phase, passkey rows and repeated passages in the "
        "phase's repeat_share; the phase's eval_loss is the NLL of their answers (ln 10 = 2.3 per digit token is "
        "chance for a key), logged every eval_every steps (0 = off)",
    )
    filler_max_tokens: int = Field(
        4_000_000, ge=1, description="Tokens of the largest source used as filler of synthetic rows"
    )
    seed: int = Field(0, description="Seed for sampling, packing and synthetic rows")

    @model_validator(mode="after")
    def _increasing(self) -> ContextExtensionConfig:
        if self.multikey_share + self.repeat_share > 1:
            raise ValueError("multikey_share + repeat_share must be <= 1 (the rest are passkey rows)")
        lengths = [self.base_seq_len] + [s.seq_len for s in self.stages]
        if any(b <= a for a, b in zip(lengths, lengths[1:], strict=False)):
            raise ValueError(f"stages: seq_len must increase from base_seq_len, got {lengths}")
        return self

    def stage(self, name: str) -> ContextStage:
        for s in self.stages:
            if s.name == name:
                return s
        raise ValueError(f"unknown context stage {name!r}; stages are {[s.name for s in self.stages]}")


# ---------------------------------------------------------------------------------------------- RoPE


def extend_rope(hf_config: Any, stage: ContextStage, method: str, base_seq_len: int) -> Any:
    """A copy of a transformers config stretched to `stage.seq_len`.

    abf:  rope_parameters = {"rope_type": "default", "rope_theta": stage.rope_theta}
    yarn: rope_parameters = {"rope_type": "yarn", "rope_theta": <pretraining base>, "factor": seq_len / base_seq_len,
          "original_max_position_embeddings": base_seq_len}
    Both set max_position_embeddings = stage.seq_len.
    """
    cfg = copy.deepcopy(hf_config)
    rope = dict(cfg.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
    if method == "abf":
        theta = stage.rope_theta or rope.get("rope_theta", 10000.0)
        rope = {"rope_type": "default", "rope_theta": float(theta)}
    elif method == "yarn":
        rope = {
            "rope_type": "yarn",
            "rope_theta": float(rope.get("rope_theta", 10000.0)),
            "factor": stage.seq_len / base_seq_len,
            "original_max_position_embeddings": base_seq_len,
        }
    else:
        raise ValueError(f"rope_method must be 'abf' or 'yarn', got {method!r}")
    cfg.rope_parameters = rope
    cfg.max_position_embeddings = stage.seq_len
    return cfg


# ---------------------------------------------------------------------------------------------- packing


def length_weights(lengths: np.ndarray, alpha: float) -> np.ndarray:
    """Doc sampling probabilities ∝ length^alpha."""
    w = np.asarray(lengths, dtype=np.float64) ** alpha
    return w / w.sum()


def doc_vectors(docs: Sequence[np.ndarray], vocab_size: int, dim: int, seed: int) -> np.ndarray:
    """Unit-norm random projections [n_docs, dim] of the docs' tf-idf vectors (cosine is roughly preserved)."""
    counted = [np.unique(d, return_counts=True) for d in docs]
    df = np.zeros(vocab_size, dtype=np.float64)
    for ids, _ in counted:
        df[ids] += 1
    idf = np.log((1 + len(docs)) / (1 + df))
    planes = np.random.default_rng(seed).standard_normal((vocab_size, dim))
    vecs = np.zeros((len(docs), dim))
    for i, (ids, counts) in enumerate(counted):
        vecs[i] = (counts * idf[ids]) @ planes[ids]
    return vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)


def _cluster_sums(vecs: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per cluster: the sum of its member vectors (added in doc order, as `members.sum(0)` does) and its size."""
    sums = np.stack([np.bincount(labels, weights=vecs[:, j], minlength=k) for j in range(vecs.shape[1])], 1)
    return sums, np.bincount(labels, minlength=k)


def similarity_clusters(vecs: np.ndarray, n_clusters: int, seed: int, iters: int = 10) -> np.ndarray:
    """Spherical k-means cluster id per doc (seeded init from random docs)."""
    n = len(vecs)
    k = max(1, min(n_clusters, n))
    centroids = vecs[np.random.default_rng(seed).choice(n, size=k, replace=False)]
    labels = np.zeros(n, dtype=np.int64)
    vecs32 = vecs.astype(np.float32)  # the assignment matmul is most of the time; float32 halves it
    for _ in range(iters):
        labels = np.argmax(vecs32 @ centroids.T.astype(np.float32), axis=1)
        sums, sizes = _cluster_sums(vecs, labels, k)
        filled = sizes > 0  # an empty cluster keeps its centroid
        norms = np.maximum(np.linalg.norm(sums[filled], axis=1, keepdims=True), 1e-12)
        centroids[filled] = sums[filled] / norms
    return labels


def similarity_order(
    docs: Sequence[np.ndarray], vocab_size: int, docs_per_cluster: int, seed: int, dim: int = 64
) -> np.ndarray:
    """Doc indices ordered so that similar docs are adjacent: tf-idf k-means clusters, visited as a chain
    that always moves to the most similar unvisited cluster."""
    vecs = doc_vectors(docs, vocab_size, dim, seed)
    labels = similarity_clusters(vecs, max(1, len(docs) // docs_per_cluster), seed)
    ids, labels = np.unique(labels, return_inverse=True)  # clusters renumbered 0..len(ids)-1
    sums, sizes = _cluster_sums(vecs, labels, len(ids))
    centroids = sums / sizes[:, None]
    sims = centroids @ centroids.T
    chain = [0]
    unseen = np.ones(len(ids), dtype=bool)
    unseen[0] = False
    for _ in range(len(ids) - 1):
        nxt = int(np.argmax(np.where(unseen, sims[chain[-1]], -np.inf)))  # the first of equals, as max() took
        chain.append(nxt)
        unseen[nxt] = False
    members = np.argsort(labels, kind="stable")  # doc indices grouped by cluster, in doc order within one
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return np.concatenate([members[starts[c] : starts[c + 1]] for c in chain])


def _window(doc: np.ndarray, length: int, rng: np.random.Generator) -> np.ndarray:
    if len(doc) <= length:
        return doc
    start = int(rng.integers(0, len(doc) - length + 1))
    return doc[start : start + length]


def pack_random(
    docs: Sequence[np.ndarray], probs: np.ndarray, seq_len: int, rng: np.random.Generator
) -> tuple[np.ndarray, list[int], list[int]]:
    """One row: docs drawn with `probs` and concatenated (a long doc gives a random window).
    Returns (row, doc indices used, tokens taken from each)."""
    parts, used, n = [], [], 0
    while n < seq_len:
        i = int(rng.choice(len(docs), p=probs))
        piece = _window(docs[i], seq_len - n, rng)
        parts.append(piece)
        used.append(i)
        n += len(piece)
    return np.concatenate(parts)[:seq_len], used, [len(p) for p in parts]


def interleave_chunks(group: Sequence[np.ndarray], chunk: int) -> np.ndarray:
    """Round-robin chunks of the docs in `group`: A1 B1 C1 A2 B2 ... (continuing A needs looking back)."""
    if chunk <= 0:
        return np.concatenate(list(group))
    pieces = [[d[i : i + chunk] for i in range(0, len(d), chunk)] for d in group]
    out = []
    for k in range(max(len(p) for p in pieces)):
        out += [p[k] for p in pieces if k < len(p)]
    return np.concatenate(out)


def pack_similar(
    docs: Sequence[np.ndarray],
    order: np.ndarray,
    probs: np.ndarray,
    seq_len: int,
    chunk: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, list[int], list[int]]:
    """One row from a seed doc (drawn with `probs`) and its neighbours in similarity order, interleaved.
    Returns (row, doc indices used, tokens taken from each)."""
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    pos = int(rank[int(rng.choice(len(docs), p=probs))])
    group, used, n = [], [], 0
    step = 0
    while n < seq_len and step < len(order):
        # Walk outwards from the seed: pos, pos+1, pos-1, pos+2, ... (the nearest neighbours first).
        offset = (step + 1) // 2 * (1 if step % 2 else -1)
        j = pos + offset
        step += 1
        if not 0 <= j < len(order):
            continue
        i = int(order[j])
        piece = _window(docs[i], seq_len - n, rng)
        group.append(piece)
        used.append(i)
        n += len(piece)
    row = interleave_chunks(group, chunk)
    if len(row) < seq_len:  # fewer docs than a row: repeat
        row = np.resize(row, seq_len)
    return row[:seq_len], used, [len(g) for g in group]


def build_midtrain_rows(
    docs_by_source: Mapping[str, Sequence[np.ndarray]],
    weights: Mapping[str, float],
    filler: FillerText,
    encode,
    eos_id: int,
    vocab_size: int,
    config: ContextExtensionConfig,
    stage: ContextStage,
) -> tuple[np.ndarray, dict[str, float]]:
    """[rows_per_stage, stage.seq_len] token rows and stats: synthetic recall rows, similar-doc rows and
    length-weighted random rows; a row's source is drawn with the mixture `weights`."""
    seed = config.seed + xxhash.xxh32_intdigest(stage.name)
    rng = np.random.default_rng(seed)
    n_rows, seq_len = config.rows_per_stage, stage.seq_len
    n_synth = int(round(config.synthetic_share * n_rows))
    sources = sorted(s for s in docs_by_source if docs_by_source[s] and weights.get(s, 0) > 0)
    probs_by_source = {
        s: length_weights(np.array([len(d) for d in docs_by_source[s]]), config.long_doc_alpha)
        for s in sources
    }
    orders = {
        s: similarity_order(docs_by_source[s], vocab_size, config.similarity_cluster_docs, seed)
        for s in sources
    }
    source_p = np.array([weights[s] for s in sources], dtype=np.float64)
    source_p /= source_p.sum()
    stats: Counter = Counter()
    rows = []
    long_tokens = 0
    for _ in range(n_rows - n_synth):
        s = sources[int(rng.choice(len(sources), p=source_p))]
        docs = docs_by_source[s]
        if rng.random() < config.interleave_share:
            row, used, taken = pack_similar(
                docs, orders[s], probs_by_source[s], seq_len, config.interleave_chunk_tokens, rng
            )
            stats["rows/interleaved"] += 1
        else:
            row, used, taken = pack_random(docs, probs_by_source[s], seq_len, rng)
            stats["rows/random"] += 1
        stats[f"rows/source/{s}"] += 1
        long_tokens += sum(t for i, t in zip(used, taken, strict=True) if len(docs[i]) >= seq_len)
        rows.append(row)
    synth, _ = synthetic_recall_examples(
        encode,
        filler,
        n_synth,
        seq_len,
        eos_id,
        seed + 1,
        config.multikey_share,
        repeat_share=config.repeat_share,
    )
    stats["rows/synthetic"] = n_synth
    all_rows = np.concatenate([np.stack(rows) if rows else np.zeros((0, seq_len), np.int64), synth])
    all_rows = all_rows[rng.permutation(len(all_rows))]
    natural_tokens = (n_rows - n_synth) * seq_len
    metrics = {k: float(v) for k, v in stats.items()}
    # Share of natural-row tokens taken from docs at least as long as this stage's context, vs the corpus share.
    metrics["long_doc_token_share/sampled"] = (
        min(long_tokens / natural_tokens, 1.0) if natural_tokens else 0.0
    )
    all_docs = [d for s in sources for d in docs_by_source[s]]
    total = sum(len(d) for d in all_docs)
    metrics["long_doc_token_share/corpus"] = (
        sum(len(d) for d in all_docs if len(d) >= seq_len) / total if total else 0.0
    )
    return all_rows, metrics


# ---------------------------------------------------------------------------------------------- stage data


def filler_source_of(docs_by_source: Mapping[str, Sequence[np.ndarray]]) -> str:
    """The source with the most tokens: filler must be too large to memorise, else a model learns the
    repeated passages by heart instead of copying them from context (a 42k-token web filler did that)."""
    return max(sorted(docs_by_source), key=lambda s: sum(len(d) for d in docs_by_source[s]))


def replay_rows(
    docs_by_source: Mapping[str, Sequence[np.ndarray]],
    weights: Mapping[str, float],
    n: int,
    seq_len: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """[n, seq_len] natural rows as pretraining saw them: a source by the mixture weights, then documents
    drawn in proportion to their length and concatenated."""
    sources = sorted(s for s in docs_by_source if docs_by_source[s] and weights.get(s, 0) > 0)
    if n <= 0 or not sources:
        return np.zeros((0, seq_len), np.int64)
    p = np.array([weights[s] for s in sources], dtype=np.float64)
    p /= p.sum()
    probs = {s: length_weights(np.array([len(d) for d in docs_by_source[s]]), 1.0) for s in sources}
    rows = []
    for _ in range(n):
        s = sources[int(rng.choice(len(sources), p=p))]
        rows.append(pack_random(docs_by_source[s], probs[s], seq_len, rng)[0])
    return np.stack(rows).astype(np.int64)


def curriculum_replay(config: ContextExtensionConfig, phase: RecallPhase) -> int:
    """Replay rows per step of a curriculum phase."""
    return config.curriculum_replay_rows if phase.replay_rows is None else phase.replay_rows


def natural_tokens(config: ContextExtensionConfig) -> int:
    """Natural-text tokens the context extension trains on: the main phases' non-synthetic rows and the
    recall curriculum's replay rows of every stage (the indexer-only steps train no language model)."""
    total = 0.0
    for stage in config.stages:
        total += stage.steps * stage.batch_size * stage.seq_len * (1.0 - config.synthetic_share)
        total += sum(p.steps * curriculum_replay(config, p) * p.seq_len for p in stage.recall_curriculum)
    return int(total)


def midtrain_mixture(
    config: ContextExtensionConfig, weights: Mapping[str, float], tokens: Mapping[str, int]
) -> tuple[dict[str, float], dict[str, float]]:
    """The weights natural rows are drawn with (the mixture's, capped at `max_source_epochs` passes per source
    over the whole context extension) and their metrics: `mixture_midtrain/<source>` and
    `source_epochs/<source>` (expected passes over all stages)."""
    return capped_mixture(weights, tokens, natural_tokens(config), config.max_source_epochs, "midtrain")


def _eval_filler(
    store: ObjectStore, shards_prefix: str, cache_dir: str | Path | None, eos_id: int
) -> FillerText | None:
    """Filler for the curriculum's eval rows: held-out text of the largest source (training never saw it)."""
    heldout = shard_paths(store, shards_prefix, "heldout", cache_dir)
    docs = {s: list(iter_shard_documents(p)) for s, p in heldout.items()}
    docs = {s: d for s, d in docs.items() if sum(len(x) for x in d)}
    return FillerText(docs[filler_source_of(docs)], eos_id=eos_id) if docs else None


def curriculum_rows(
    recall: np.ndarray, replay: np.ndarray, rng: np.random.Generator, recall_targets: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Recall rows and replay rows of one curriculum phase, shuffled together (recall rows as they are when
    there is no replay, so a run without replay keeps its data), and their loss masks if `recall_targets`
    is given (replay rows train on every token)."""
    if not len(replay):
        return recall, recall_targets
    rows = np.concatenate([recall.astype(np.int64), replay])
    order = rng.permutation(len(rows))
    if recall_targets is None:
        return rows[order], None
    return rows[order], np.concatenate([recall_targets, np.ones(replay.shape, dtype=bool)])[order]


def build_midtrain_shards(
    config: ContextExtensionConfig,
    stage_name: str,
    store: ObjectStore,
    shards_prefix: str,
    tokenizer_path: str | Path,
    out_prefix: str,
    cache_dir: str | Path | None = None,
) -> StageResult:
    """Build one stage's packed rows from the committed token shards at `shards_prefix` and commit them as a
    token shard of `seq_len`-aligned rows (plus the recall curriculum's) at `out_prefix`; read them back with
    `midtrain_shard_paths` and `TokenBatches(..., aligned=True)`."""
    from training.data import load_corpus_tokenizer

    stage = config.stage(stage_name)
    manifest = token_manifest(store, shards_prefix)
    train = shard_paths(store, shards_prefix, "train", cache_dir)
    docs_by_source = {s: list(iter_shard_documents(p)) for s, p in train.items()}
    tokens = {s: sum(len(d) for d in docs) for s, docs in docs_by_source.items()}
    weights, mixture_metrics = midtrain_mixture(config, manifest.get("weights") or tokens, tokens)
    tok = load_corpus_tokenizer(tokenizer_path)
    eos_id = manifest["tokenizer"]["eos_id"]
    # Synthetic rows hide their keys in training text (never the held-out text the passkey eval uses).
    filler_docs, n = [], 0
    for doc in docs_by_source[filler_source_of(docs_by_source)]:
        if n >= config.filler_max_tokens:
            break
        filler_docs.append(doc)
        n += len(doc)
    filler = FillerText(filler_docs, eos_id=eos_id)

    # Recall rows encode ~650k short template strings on the first stage, many of them repeats (the questions,
    # " <key>"): each call to the tokenizer costs ~17 us, most of it the binding's, so repeats are looked up.
    encoded: dict[str, list[int]] = {}

    def encode(text: str) -> list[int]:
        ids = encoded.get(text)
        if ids is None:
            ids = encoded[text] = tok.encode(text, add_special_tokens=False).ids
        return list(ids)

    rows, metrics = build_midtrain_rows(
        docs_by_source,
        weights,
        filler,
        encode,
        eos_id,
        manifest["tokenizer"]["vocab_size"],
        config,
        stage,
    )
    staging = Path(tempfile.mkdtemp(prefix="crucible-midtrain-rows-"))
    try:
        base = _write_rows(staging, "shard-00000", rows, manifest["tokenizer"]["vocab_size"])
        digest = xxhash.xxh64(rows.tobytes())
        recall_shards: dict[int, str] = {}
        eval_shards: dict[int, str] = {}
        eval_filler = (
            _eval_filler(store, shards_prefix, cache_dir, eos_id) if stage.recall_curriculum else None
        )
        for i, phase in enumerate(stage.recall_curriculum):
            phase_seed = config.seed + xxhash.xxh32_intdigest(f"{stage.name}/recall/{i}")
            n_rows = phase.steps * phase.batch_size
            n_replay = phase.steps * curriculum_replay(config, phase)
            rng = np.random.default_rng(phase_seed)
            multikey = (
                config.curriculum_multikey_share if phase.multikey_share is None else phase.multikey_share
            )
            rows_, targets_ = synthetic_recall_examples(
                encode,
                filler,
                n_rows,
                phase.seq_len,
                eos_id,
                phase_seed,
                multikey * (1 - phase.repeat_share),
                repeat_share=phase.repeat_share,
            )
            recall, targets = curriculum_rows(
                rows_,
                replay_rows(docs_by_source, weights, n_replay, phase.seq_len, rng),
                rng,
                targets_ if config.curriculum_answer_only else None,
            )  # fmt: skip
            metrics[f"replay_rows/{phase.seq_len}"] = float(n_replay)
            name = _write_rows(
                staging, f"recall-{phase.seq_len}/shard-00000", recall, manifest["tokenizer"]["vocab_size"]
            )
            recall_shards[phase.seq_len] = name
            digest.update(recall.tobytes())
            if targets is not None:
                write_targets(staging / name, targets)
                digest.update(targets.tobytes())
                metrics[f"recall_target_share/{phase.seq_len}"] = float(targets.mean())
            metrics[f"recall_rows/{phase.seq_len}"] = float(len(recall))
            if config.curriculum_eval_rows and eval_filler is not None:
                ev_rows, ev_targets = synthetic_recall_examples(
                    encode,
                    eval_filler,
                    config.curriculum_eval_rows,
                    phase.seq_len,
                    eos_id,
                    phase_seed + 1,
                    0.0,
                    repeat_share=phase.repeat_share,  # a copy phase is scored on copies (no passkey to fit)
                )
                ev_name = _write_rows(
                    staging,
                    f"recall-eval-{phase.seq_len}/shard-00000",
                    ev_rows,
                    manifest["tokenizer"]["vocab_size"],
                )
                write_targets(staging / ev_name, ev_targets)
                eval_shards[phase.seq_len] = ev_name
        data_version = digest.hexdigest()
        stage_manifest = {
            "stage": stage.model_dump(),
            "config": config.model_dump(),
            "token_shards": shards_prefix,
            "token_data_version": manifest.get("data_version"),
            "shards": [base],
            "recall_shards": {str(n): name for n, name in recall_shards.items()},
            "recall_eval_shards": {str(n): name for n, name in eval_shards.items()},
            "rows": len(rows),
            "seq_len": stage.seq_len,
            "data_version": data_version,
        }
        out = commit(store, out_prefix, staging, meta=json.loads(json.dumps(stage_manifest, default=str)))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    metrics.update(mixture_metrics)
    metrics.update({"rows": float(len(rows)), "tokens": float(rows.size), "seq_len": float(stage.seq_len)})
    table = [{"metric": k, "value": round(v, 4)} for k, v in sorted(metrics.items())]
    return StageResult(
        metrics=metrics,
        outputs={"prefix": out.prefix, "version": out.version},
        report_md=f"## Midtraining data `{stage.name}` ({stage.seq_len} tokens)\n\n" + markdown_table(table),
        data_version=data_version,
        extra={"manifest": stage_manifest},
    )


class MidtrainShards(NamedTuple):
    """Local paths of one stage's committed rows: the main rows shard, and by row length the recall
    curriculum's shards and its held-out eval shards."""

    rows: Path
    recall: dict[int, Path]
    recall_eval: dict[int, Path]


def midtrain_shard_paths(
    store: ObjectStore, prefix: str, cache_dir: str | Path | None = None
) -> MidtrainShards:
    """Local paths of the committed shards at `prefix` (read in place on a local store; else downloaded,
    hash-checked, to `cache_dir`), each with its doc index and loss mask (if any) beside it."""
    out = read_committed(store, prefix)
    in_place = isinstance(store, LocalStore)  # read in place: no cache dir to make
    cache = (
        None
        if in_place
        else Path(cache_dir or tempfile.mkdtemp(prefix="crucible-rows-")) / out.prefix / out.version
    )

    def local(name: str) -> Path:
        names = [name, name.replace(".tokens.npy", ".docs.npy"), targets_path(name).as_posix()]
        paths = [
            store.local_path(out.key(n)) if in_place else fetch_file(store, out, n, cache / n)
            for n in names
            if n in out.files
        ]
        return paths[0]

    def by_length(key: str) -> dict[int, Path]:
        return {int(n): local(name) for n, name in out.meta.get(key, {}).items()}

    return MidtrainShards(
        local(out.meta["shards"][0]), by_length("recall_shards"), by_length("recall_eval_shards")
    )


def _write_rows(root: Path, base: str, rows: np.ndarray, vocab_size: int) -> str:
    """Write [n, seq_len] rows as a token shard (+ doc index, one doc per row) under `root`; returns its name."""
    from training.data import token_dtype

    (root / base).parent.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{base}.tokens.npy", rows.reshape(-1).astype(token_dtype(vocab_size)))
    np.save(root / f"{base}.docs.npy", np.arange(len(rows) + 1, dtype=np.int64) * rows.shape[1])
    return f"{base}.tokens.npy"


def stage_model_config(model_cfg: Any, stage: ContextStage, method: str, base_seq_len: int) -> Any:
    """The pretraining `training.model.ModelConfig` with this stage's RoPE (same shapes, see `extend_rope`)."""
    if method == "abf":
        update = {"rope_theta": stage.rope_theta or model_cfg.rope_theta, "rope_scaling": None}
    elif method == "yarn":
        update = {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": stage.seq_len / base_seq_len,
                "original_max_position_embeddings": base_seq_len,
            }
        }
    else:
        raise ValueError(f"rope_method must be 'abf' or 'yarn', got {method!r}")
    return model_cfg.model_copy(update={**update, "max_position_embeddings": stage.seq_len})


def midtrain_job_specs(
    parent_dir: str | Path,
    model_cfg: Any,
    trainer_cfg: Any,
    config: ContextExtensionConfig,
    stage_name: str,
    rows_shards: Sequence[str | Path],
    run_dir: str | Path,
    heldout: Mapping[str, Sequence[str | Path]] | None = None,
    tokenizer_dir: str | Path | None = None,
    distributed: Any = None,
    callbacks: Sequence[str] = (),
    recall_shards: Mapping[int, Sequence[str | Path]] | None = None,
    recall_eval_shards: Mapping[int, Sequence[str | Path]] | None = None,
) -> list[Any]:
    """The training phases of one stage as `training.job.TrainJobSpec`s, in order: the recall curriculum
    (dense, one phase per row length), an optional indexer-only warm-up at the new length, then the main
    phase; each starts from the previous phase's HF export.

    model_cfg: the pretraining `ModelConfig` (this stage's RoPE is applied here); trainer_cfg: the profile's
    `TrainerConfig` (steps, LR and DSA mode are taken from the stage); rows_shards: `build_midtrain_shards` output;
    recall_shards: its curriculum shards by row length; recall_eval_shards: held-out recall rows by row length
    (the phase's eval_loss is their answers' NLL); distributed: a `training.distributed.DistributedConfig`
    (None = one local process).
    """
    from training.job import DataSpec, TrainJobSpec

    stage = config.stage(stage_name)
    run_dir = Path(run_dir)
    recall_shards = recall_shards or {}
    missing = [p.seq_len for p in stage.recall_curriculum if p.seq_len not in recall_shards]
    if missing:
        raise ValueError(f"stage {stage.name!r}: no recall-curriculum rows for seq_len {missing}")

    def rows(paths: Sequence[str | Path], seq_len: int, batch_size: int) -> DataSpec:
        kwargs = {"seq_len": seq_len, "batch_size": batch_size, "seed": config.seed, "aligned": True}
        return DataSpec(
            factory="training.data:token_batches", kwargs={"shard_paths": [str(p) for p in paths], **kwargs}
        )

    eval_data = None
    if heldout:
        eval_data = DataSpec(
            factory="training.data:heldout_batches",
            kwargs={
                "shard_paths": {s: [str(p) for p in ps] for s, ps in heldout.items()},
                "seq_len": stage.seq_len,
                "batch_size": stage.batch_size,
                "max_batches": 2,
            },
        )
    extra = {}
    if tokenizer_dir:
        extra = {n: str(Path(tokenizer_dir) / n) for n in ("tokenizer.json", "tokenizer_config.json")}
    model = stage_model_config(model_cfg, stage, config.rope_method, config.base_seq_len)
    main = rows(rows_shards, stage.seq_len, stage.batch_size)
    # (name, DSA mode, steps, data, eval data), then the LR
    phases = [("main", stage.dsa_mode, stage.steps, main, eval_data)]
    if stage.indexer_warmup_steps:
        # Sparse: warm the indexer up before the main phase (its top-k decides what the model sees). Dense:
        # after it, so the indexer learns the attention the dense phase grew (e.g. retrieval heads) and the
        # checkpoint runs natively with DSA top-k.
        warmup = ("indexer_warmup", "indexer_warmup", stage.indexer_warmup_steps, main, eval_data)
        phases = [warmup, *phases] if stage.dsa_mode == "sparse" else [*phases, warmup]

    def recall_eval(seq_len: int) -> DataSpec | None:
        paths = (recall_eval_shards or {}).get(seq_len)
        if not paths:
            return None
        kwargs = {
            "shard_paths": [str(p) for p in paths],
            "seq_len": seq_len,
            "batch_size": 8,
            "max_batches": 8,
        }
        return DataSpec(factory="training.data:heldout_batches", kwargs=kwargs)

    curriculum = [
        (
            f"recall_{p.seq_len}",
            "dense",
            p.steps,
            rows(recall_shards[p.seq_len], p.seq_len, p.batch_size + curriculum_replay(config, p)),
            recall_eval(p.seq_len),
            p.learning_rate or stage.learning_rate,
        )
        for p in stage.recall_curriculum
    ]
    phases = [(*p, stage.learning_rate) for p in phases]
    specs, init_from = [], str(parent_dir)
    for name, mode, steps, data, evals, lr in [*curriculum, *phases]:
        optim = trainer_cfg.optim.model_copy(update={"lr": lr})
        if mode == "indexer_warmup":  # GLM-5 warms the indexer up at a high LR (RECIPE.md: 5e-3)
            optim = optim.model_copy(update={"lr": max(stage.learning_rate, 5e-3), "optimizer": "adamw"})
        trainer = trainer_cfg.model_copy(update={"steps": steps, "dsa_mode": mode, "optim": optim})
        phase_dir = run_dir / name
        spec = TrainJobSpec(
            run_dir=str(phase_dir),
            model=model,
            init_from=init_from,
            trainer=trainer,
            data=data,
            eval_data=evals,
            extra_files=extra,
            callbacks=list(callbacks),
            **({"distributed": distributed} if distributed is not None else {}),
        )
        specs.append(spec)
        init_from = str(phase_dir / "hf")
    return specs


def midtrain_stage(
    parent_dir: str | Path,
    model_cfg: Any,
    trainer_cfg: Any,
    config: ContextExtensionConfig,
    stage_name: str,
    rows_shards: Sequence[str | Path],
    run_dir: str | Path,
    heldout: Mapping[str, Sequence[str | Path]] | None = None,
    tokenizer_dir: str | Path | None = None,
    in_process: bool = False,
    distributed: Any = None,
    torch_extensions_dir: str | Path | None = None,
    launch: Any = None,
    callbacks: Sequence[str] = (),
    recall_shards: Mapping[int, Sequence[str | Path]] | None = None,
    recall_eval_shards: Mapping[int, Sequence[str | Path]] | None = None,
) -> Path:
    """Train one context-extension stage from the parent checkpoint; returns the new HF checkpoint dir.

    Runs each phase of `midtrain_job_specs` as a child process (`training.job.run_training_job`, resumable,
    fails loudly) or, with `in_process=True`, in this process (tests, notebooks). `launch` / `callbacks` as
    for `training.job.run_training_job` / `TrainJobSpec.callbacks` (the asset layer passes Dagster Pipes).
    """
    from training.job import run_training_job

    result: dict = {}
    for spec in midtrain_job_specs(
        parent_dir,
        model_cfg,
        trainer_cfg,
        config,
        stage_name,
        rows_shards,
        run_dir,
        heldout,
        tokenizer_dir,
        distributed,
        recall_shards=recall_shards,
        recall_eval_shards=recall_eval_shards,
    ):
        if callbacks:
            spec = spec.model_copy(update={"callbacks": [*spec.callbacks, *callbacks]})
        if in_process:
            from training.launch_entry import run

            result = run(spec)
        else:
            ext_dir = Path(torch_extensions_dir) if torch_extensions_dir else None
            result = run_training_job(spec, ext_dir, launch)
        log.info("midtrain %s phase %s: %s", stage_name, Path(spec.run_dir).name, result.get("metrics"))
    return Path(result["hf_dir"])


def row_purity(rows_docs: Sequence[Sequence[int]], labels: Sequence[Any]) -> float:
    """Mean share of a row's docs that carry the row's majority label (1.0 = every row is one topic)."""
    shares = []
    for used in rows_docs:
        counts = Counter(labels[i] for i in used)
        shares.append(max(counts.values()) / len(used))
    return float(np.mean(shares))
