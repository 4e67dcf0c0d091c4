"""Config of the dedup stage (profile sections `dedup_web` and `dedup_code`); defaults are the `tiny` values."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Per-kind defaults for the fields left at None. Web: datatrove/FineWeb's 5-gram words, 14 bands x 8 rows
# (LSH threshold (1/14)^(1/8) ~ 0.72). Code: The Stack v2's Jaccard ~0.7, with fewer rows per band:
# 12 bands x 7 rows puts the LSH threshold at (1/12)^(1/7) ~ 0.70; identifiers keep their case and digits.
KIND_DEFAULTS: dict[str, dict] = {
    "web": dict(
        num_bands=14,
        rows_per_band=8,
        tokenizer="datatrove",
        lowercase=True,
        normalize_digits=True,
        strip_accents=True,
        exact_match_on="words",
        url_dedup=True,
        verify_threshold=0.6,
    ),
    "code": dict(
        num_bands=12,
        rows_per_band=7,
        tokenizer="words",
        lowercase=False,
        normalize_digits=False,
        strip_accents=False,
        exact_match_on="whitespace",
        url_dedup=False,
        verify_threshold=0.7,
    ),
}

# Fields that define a document's fingerprint (shingles, signature, exact-match keys): an index is only
# usable by configs that agree on all of them.
INDEX_FIELDS = (
    "ngram_size",
    "num_bands",
    "rows_per_band",
    "seed",
    "shingle_hash",
    "tokenizer",
    "lowercase",
    "normalize_digits",
    "strip_accents",
    "exact_match_on",
    "url_dedup",
)
# Fields that change which documents are kept, or the bytes of the kept shards (gzip_level): the output's
# version directory is named by them, so a rerun that would write other bytes never rewrites a committed one.
RESULT_FIELDS = (
    "kind",
    *INDEX_FIELDS,
    "verify_threshold",
    "quality_field",
    "gzip_level",
)


class DedupConfig(BaseModel):
    """Exact + MinHash LSH near-dedup of one snapshot against itself and every snapshot processed before it."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["datatrove", "spark"] = Field(
        "datatrove", description="datatrove = single machine (LocalPipelineExecutor); spark = PySpark cluster"
    )
    kind: Literal["web", "code"] = Field("web", description="web documents or code files (sets the defaults)")
    ngram_size: int = Field(5, ge=1, le=32, description="Words per shingle")
    num_bands: int | None = Field(None, ge=1, le=64, description="LSH bands (None: 14 web, 12 code)")
    rows_per_band: int | None = Field(
        None, ge=1, le=32, description="MinHash rows per band (None: 8 web, 7 code)"
    )
    seed: int = Field(1, ge=0, description="Seed of the MinHash permutation parameters")
    shingle_hash: Literal["xxh64", "sha1", "xxh3_tokens"] = Field(
        "xxh64",
        description="64-bit shingle hash before the universal hashes mod 2^61-1: xxh64/sha1 of the shingle "
        "string (datatrove's, so signatures match its MinhashDedupSignature), or xxh3_tokens (token hashes "
        "combined in numpy: faster, not datatrove-compatible)",
    )
    tokenizer: Literal["datatrove", "words"] | None = Field(
        None,
        description="datatrove = datatrove's simplify_text rules (numbers -> 0, punctuation incl. '_' -> space) "
        "then whitespace split; words = \\w+ runs, identifiers keep '_' (None: web datatrove, code words)",
    )
    lowercase: bool | None = Field(None, description="Lowercase before tokenising (None: web yes, code no)")
    normalize_digits: bool | None = Field(None, description="Numbers -> '0' (None: web yes, code no)")
    strip_accents: bool | None = Field(None, description="Drop combining accents (None: web yes, code no)")
    exact_match_on: Literal["words", "whitespace", "raw"] | None = Field(
        None,
        description="Exact-dup key: normalised words, whitespace-collapsed text or raw text (None: web words, "
        "code whitespace)",
    )
    url_dedup: bool | None = Field(
        None, description="Drop later copies of a normalised URL (None: web yes, code no)"
    )
    verify_threshold: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Keep an LSH candidate pair only if its signature-estimated Jaccard reaches this; 0 = off "
        "(None: 0.6 web, 0.7 code)",
    )
    quality_field: str = Field(
        "quality_score", description="Metadata key of a quality score; the highest score in a cluster is kept"
    )
    tasks: int = Field(2, ge=1, description="datatrove engine: tasks (shards are split among them)")
    workers: int = Field(2, ge=1, description="datatrove engine: worker processes (1 = in this process)")
    task_deadline_s: float = Field(
        3600.0,
        gt=0,
        description="datatrove engine: wall-clock limit of the worker processes of each step (workers > 1); "
        "then the stage fails",
    )
    spark_master: str | None = Field(
        "local[2]", description="spark engine: master URL; None = the active/submitted session's master"
    )
    spark_shuffle_partitions: int = Field(8, ge=1, description="spark engine: spark.sql.shuffle.partitions")
    gzip_level: int = Field(3, ge=1, le=9, description="Compression level of the kept JSONL.gz shards")
    min_removed_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="Check: fail if a partition loses less than this fraction of docs"
    )
    max_removed_fraction: float = Field(
        0.9, ge=0.0, le=1.0, description="Check: fail if a partition loses more than this fraction of docs"
    )
    check_min_docs: int = Field(
        100, ge=0, description="Check: only judge the dedup rate above this many docs in"
    )

    @model_validator(mode="after")
    def _kind_defaults(self) -> DedupConfig:
        for name, value in KIND_DEFAULTS[self.kind].items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.min_removed_fraction > self.max_removed_fraction:
            raise ValueError("min_removed_fraction must not exceed max_removed_fraction")
        return self

    @property
    def num_perm(self) -> int:
        return self.num_bands * self.rows_per_band

    @property
    def lsh_threshold(self) -> float:
        """Jaccard at which a pair becomes a candidate with probability ~1/2: (1/b)^(1/r)."""
        return (1.0 / self.num_bands) ** (1.0 / self.rows_per_band)

    def fingerprint(self) -> str:
        """Hash of the fields that decide the result (not the engine or its parallelism)."""
        return _hash({name: getattr(self, name) for name in RESULT_FIELDS})

    def index_fingerprint(self) -> str:
        """Hash of the fields that decide the fingerprints stored in the index."""
        return _hash({name: getattr(self, name) for name in INDEX_FIELDS})


def _hash(values: dict) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]
