"""Code crawl of one code-source snapshot: fetch what the manifest lists, turn each file into a record,
skip binaries / vendored / generated files with counted reasons, commit JSONL.gz shards to the store.

Output: the committed output `<out_prefix>/<snapshot>` (`infra.committed`) holding `part-*.jsonl.gz`
records (language = the Linguist-style prior, final language comes from `fix_metadata`), `origins.jsonl.gz`
(every text file of every source with its sha256: what `fix_metadata` checks path/repo metadata against) and
`crawl_stats.json`.

A source that cannot be fetched or read (network, HTTP status, corrupt archive, limit) is counted under
`sources/failed` and `sources/failed/<reason>` (`failure_reason`) and the crawl goes on; any other exception
is a bug and fails the crawl with its traceback.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import heapq
import json
import logging
import re
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from classifiers.code_language_rules import declared_language, language_prior
from infra import code_sources
from infra.partition_keys import partition_prefix
from infra.settings import REPO_ROOT, load_profile
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from pipelines.code.archives import ArchiveError, ArchiveLimitExceeded, ArchiveLimits, iter_source_files
from pipelines.code.licenses import LicenseIndex
from pipelines.code.manifest import SourceSpec, load_manifest
from pipelines.code.records import CRAWL_STATS, ORIGINS, commit_records, data_version, make_record, sha256_hex
from pipelines.code.skip_rules import decode_text, skip_reason_for_content, skip_reason_for_path

log = logging.getLogger(__name__)


class CodeCrawlConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    manifest: str = Field(
        "pipelines/code/manifests/tiny.yaml", description="Manifest YAML (relative to the repo)"
    )
    max_file_bytes: int = Field(
        1_000_000, gt=0, description="Files larger than this are skipped as too_large"
    )
    max_files_per_source: int | None = Field(None, ge=1, description="Override the manifest's per-source cap")
    shard_records: int = Field(5000, gt=0, description="Records per output shard")
    fetch_workers: int = Field(4, ge=1, description="Sources fetched in parallel (network-bound)")
    seed: int = Field(0, description="Seed of the per-source file sample (hash order)")
    out_prefix: str = Field("code/raw", description="Store prefix; records go to <out_prefix>/<snapshot>/")
    archive_max_total_bytes: int = Field(
        ArchiveLimits.max_total_bytes,
        gt=0,
        description="A source whose archives expand past this is refused (archive bomb)",
    )
    archive_max_members: int = Field(
        ArchiveLimits.max_members, gt=0, description="A source with more members is refused"
    )
    archive_max_member_bytes: int = Field(
        ArchiveLimits.max_member_bytes, gt=0, description="A source with a larger archive member is refused"
    )
    archive_max_ratio: float = Field(
        ArchiveLimits.max_ratio,
        gt=1,
        description="A source whose archive expands more than this many times (past 16 MiB) is refused",
    )

    def archive_limits(self) -> ArchiveLimits:
        return ArchiveLimits(self.archive_max_total_bytes, self.archive_max_members,
                             self.archive_max_member_bytes, self.archive_max_ratio)  # fmt: skip


# How a fetch failure reads in our messages and in git / apt-get / npm / pip output, tried in order: the
# first that matches is the reason a failed source is counted under (`sources/failed/<reason>`).
_HTTP_STATUS = re.compile(r"returned error: (\d{3})|HTTP error (\d{3})|\bE(\d{3})\b|\b(\d{3}) +Not Found")
_NETWORK = re.compile(
    r"Could not resolve|Failed to connect|Connection refused|Connection timed out|Temporary failure|"
    r"Network is unreachable|Could not connect|ECONNREFUSED|ENOTFOUND|ETIMEDOUT|EAI_AGAIN|NewConnectionError|"
    r"Max retries exceeded",
    re.I,
)
_NOT_FOUND = re.compile(
    r"does not exist|not found|no ref |Unable to locate package|No matching distribution|produced no|"
    r"expected a commit sha|no Version field",
    re.I,
)
_FETCH_FAILURES = [
    ("timeout", re.compile(r"timed out after")),
    ("command_missing", re.compile(r"not found; install it")),
    ("bad_manifest", re.compile(r"need a version")),
    ("network", _NETWORK),
    ("not_found", _NOT_FOUND),
]


def failure_reason(exc: code_sources.SourceFetchError | ArchiveError) -> str:
    """The short stable slug a failed source is counted under: `http_<status>`, `network`, `timeout`,
    `not_found`, `command_missing`, `bad_manifest`, `fetch_failed` (any other fetch error), `archive_limit`,
    or the `ArchiveError`'s own reason (`archive_corrupt`, ...)."""
    if isinstance(exc, ArchiveLimitExceeded):
        return "archive_limit"  # which limit: `skipped/<limit>`
    if isinstance(exc, ArchiveError):
        return exc.reason
    message = str(exc)
    if status := _HTTP_STATUS.search(message):
        return f"http_{next(g for g in status.groups() if g)}"
    return next((reason for reason, pattern in _FETCH_FAILURES if pattern.search(message)), "fetch_failed")


def default_cache_dir() -> Path:
    return load_profile().state_path / "cache" / "code_sources"


def fetch_source(
    spec: SourceSpec, cache_dir: Path, apt: code_sources.AptConfig
) -> code_sources.FetchedSource:
    """The archives of one manifest entry: a local path if given, else the registry / git fetcher."""
    if spec.path is not None:
        if not spec.path.exists():
            raise code_sources.SourceFetchError(f"{spec.label}: local path {spec.path} does not exist")
        files = [spec.path] if spec.path.is_file() or spec.kind == "git" else sorted(spec.path.iterdir())
        version = spec.version or spec.commit or "local"
        if spec.kind == "git" and (spec.path / ".git").exists():
            version = code_sources.resolve_git_commit(str(spec.path), spec.commit or "HEAD")
            return code_sources.fetch_git(str(spec.path), version, cache_dir)
        return code_sources.FetchedSource(spec.kind, spec.name, version, files, cached=True)
    if spec.kind == "debian":
        return code_sources.fetch_debian_binary(apt, spec.name, spec.version, cache_dir)
    if spec.kind == "debian_source":
        return code_sources.fetch_debian_source(apt, spec.name, spec.version, cache_dir)
    if spec.kind == "npm":
        return code_sources.fetch_npm(spec.name, spec.version or "latest", cache_dir)
    if spec.kind == "pypi":
        if not spec.version:
            raise code_sources.SourceFetchError(f"{spec.label}: pypi sources need a version")
        return code_sources.fetch_pypi_sdist(spec.name, spec.version, cache_dir)
    return code_sources.fetch_git(spec.name, spec.commit or "HEAD", cache_dir)


def _sample_key(seed: int, path: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{path}".encode(), digest_size=8).digest(), "big")


def records_from_source(spec: SourceSpec, fetched: code_sources.FetchedSource, cap: int, config: CodeCrawlConfig,
                        snapshot: str, stats: Counter, origins: list[dict]) -> list[dict]:  # fmt: skip
    """Scan every member of a fetched source; keep at most `cap` code files (a seeded hash sample)."""
    licenses = LicenseIndex()
    # max-heap on the sample key (negated): the `cap` smallest keys win
    heap: list[tuple[int, str, dict]] = []
    package = (
        spec.name if spec.kind != "git" else spec.name.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    )
    for member in iter_source_files(spec.kind, fetched.files, config.archive_limits()):
        stats["files/seen"] += 1
        if licenses.wants(member.path) and member.size < 2_000_000:
            licenses.observe(spec.kind, member.path, member.read())
        reason = skip_reason_for_path(member.path, member.size, config.max_file_bytes)
        if reason is None and spec.include and not any(fnmatch.fnmatch(member.path, g) for g in spec.include):
            reason = "not_included"
        if reason is None and declared_language(member.path) is None and PurePosixPath(member.path).suffix:
            reason = "unknown_language"  # an unknown extension: only extension-less files get a shebang look
        if reason in ("too_large", "binary", "empty"):
            stats[f"dropped/{reason}"] += 1
            continue
        data = member.read()
        digest = sha256_hex(data)
        text = decode_text(data)
        if text is not None:
            origins.append({"source": spec.kind, "package": package, "version": fetched.version,
                            "path": member.path, "sha256": digest})  # fmt: skip
        if reason is None and text is None:
            reason = "binary"
        key = _sample_key(config.seed, member.path)
        if reason is None and len(heap) >= cap and -heap[0][0] < key:
            reason = "over_source_cap"  # decided before the content checks: they are the costly part
        if reason is None and (reason := skip_reason_for_content(member.path, text)) is None:
            prior = language_prior(member.path, text)
            declared = declared_language(member.path) or prior.language
            if declared is None and prior.language is None:
                reason = "unknown_language"
        if reason is not None:
            stats[f"dropped/{reason}"] += 1
            continue
        rec = {
            "text": text,
            "path": member.path,
            "size": len(data),
            "sha256": digest,
            "declared": declared,
            "language": prior.language or declared,
            "language_source": prior.source if prior.language else "extension",
        }
        heapq.heappush(heap, (-key, member.path, rec))
        if len(heap) > cap:
            heapq.heappop(heap)
            stats["dropped/over_source_cap"] += 1
    out = []
    for _, _, r in sorted(heap, key=lambda item: item[1]):
        out.append(
            make_record(
                r["text"],
                spec.kind,
                package,
                fetched.version,
                r["path"],
                r["size"],
                r["sha256"],
                licenses.license_for(r["path"]),
                r["declared"],
                r["language"],
                r["language_source"],
                snapshot,
            )  # fmt: skip
        )
    return out


def _debian_batches(pool: ThreadPoolExecutor, sources: list[SourceSpec], n_batches: int, cache_dir: Path,
                    apt: code_sources.AptConfig) -> dict[tuple[str, str], Future]:  # fmt: skip
    """Debian sources fetched `n_batches` apt-get calls per kind, side by side (`prefetch_debian`): apt's own
    CPU is paid once per call, not once per package. Submitted before any other fetch, so a fetch that waits
    for its batch never holds a worker the batch needs. Returns each (kind, name)'s batch future."""
    out: dict[tuple[str, str], Future] = {}
    for kind in ("debian", "debian_source"):
        names = Counter(s.name for s in sources if s.kind == kind and s.path is None)
        targets = [
            (s.name, s.version) for s in sources if s.kind == kind and s.path is None and names[s.name] == 1
        ]
        for i in range(min(n_batches, len(targets))):
            part = targets[i::n_batches]
            fut = pool.submit(code_sources.prefetch_debian, apt, kind, part, cache_dir)
            out.update({(kind, name): fut for name, _ in part})
    return out


def _in_batch(spec: SourceSpec, batches: dict[tuple[str, str], Future]) -> bool:
    fut = batches.get((spec.kind, spec.name))
    return fut is not None and spec.name in fut.result()


def _fetch_after_batch(spec: SourceSpec, batches: dict[tuple[str, str], Future], cache_dir: Path,
                       apt: code_sources.AptConfig) -> code_sources.FetchedSource:  # fmt: skip
    if (fut := batches.get((spec.kind, spec.name))) is not None:
        fut.exception()  # wait; a failed batch leaves the package to its own fetch
    return fetch_source(spec, cache_dir, apt)


def crawl_code(config: CodeCrawlConfig, store: ObjectStore, snapshot: str, manifest_path: str | Path | None = None,
               out_prefix: str | None = None, cache_dir: Path | None = None) -> StageResult:  # fmt: skip
    """Fetch the manifest's sources (cached), write code records for `snapshot`; one bad source never stops
    the others (its error is counted and reported)."""
    t0 = time.time()
    prefix = partition_prefix(out_prefix or config.out_prefix, snapshot)
    manifest_path = Path(manifest_path or config.manifest)
    manifest = load_manifest(manifest_path if manifest_path.is_absolute() else REPO_ROOT / manifest_path)
    cache_dir = Path(cache_dir or default_cache_dir())
    cache_dir.mkdir(parents=True, exist_ok=True)
    apt = code_sources.AptConfig(cache_dir / "apt")
    stats: Counter = Counter()
    per_source: list[dict] = []
    errors: list[str] = []
    origins: list[dict] = []
    all_records: list[dict] = []
    if any(s.kind in ("debian", "debian_source") and s.path is None for s in manifest.sources):
        apt.ensure()  # once, before the parallel fetches
    with ThreadPoolExecutor(max_workers=config.fetch_workers) as pool:
        batches = _debian_batches(pool, manifest.sources, config.fetch_workers, cache_dir, apt)
        futures: list[Future] = [
            pool.submit(_fetch_after_batch, s, batches, cache_dir, apt) for s in manifest.sources
        ]
        for spec, fut in tqdm(
            list(zip(manifest.sources, futures, strict=True)), desc="code sources", unit="src"
        ):
            cap = spec.max_files or config.max_files_per_source or manifest.max_files_per_source
            before = len(origins)
            try:
                fetched = fut.result()
                batched = _in_batch(spec, batches)
                stats["sources/batch_fetched"] += int(batched)
                stats["sources/cached"] += int(fetched.cached and not batched)
                stats["fetch_seconds"] += fetched.seconds
                recs = records_from_source(spec, fetched, cap, config, snapshot, stats, origins)
            except (code_sources.SourceFetchError, ArchiveError) as exc:
                stats["sources/failed"] += 1
                stats[f"sources/failed/{failure_reason(exc)}"] += 1
                if isinstance(exc, ArchiveLimitExceeded):
                    stats[f"skipped/{exc.reason}"] += 1
                errors.append(f"{spec.label}: {exc}")
                log.error("code source %s skipped: %s", spec.label, exc)
                del origins[before:]  # a half-read archive contributes nothing
                continue
            except BaseException:
                pool.shutdown(cancel_futures=True)  # a bug fails the crawl now, not after every queued fetch
                raise
            stats["sources/ok"] += 1
            langs = Counter(r["metadata"]["language"] for r in recs)
            per_source.append({"source": spec.label, "version": fetched.version, "files": len(recs),
                               "license": recs[0]["metadata"]["license"] if recs else "", "top_languages":
                               ", ".join(f"{k}:{v}" for k, v in langs.most_common(3))})  # fmt: skip
            all_records.extend(recs)
    by_lang = Counter(r["metadata"]["language"] for r in all_records)
    stats["files/kept"] = len(all_records)
    metrics = {k: float(v) for k, v in stats.items()}
    metrics.update({f"language_files/{k}": float(v) for k, v in by_lang.items()})
    metrics["languages"] = float(len(by_lang))
    metrics["seconds"] = time.time() - t0
    summary = {"snapshot": snapshot, "manifest": str(manifest_path), "stats": dict(stats), "errors": errors,
               "languages": dict(by_lang.most_common()), "sources": per_source, "seconds": metrics["seconds"]}  # fmt: skip
    # records, origin index and stats as one version: a kill never leaves a partial crawl readable
    out = commit_records(
        store,
        prefix,
        all_records,
        config.shard_records,
        extra={
            ORIGINS: gzip.compress("".join(json.dumps(o) + "\n" for o in origins).encode(), mtime=0),
            CRAWL_STATS: json.dumps(summary, indent=2, sort_keys=True, default=str).encode(),
        },
        meta={"snapshot": snapshot, "files": len(all_records), "errors": len(errors)},
    )
    keys = out.keys(".jsonl.gz")
    funnel = [
        {"step": k, "files": v} for k, v in sorted(stats.items()) if k.startswith(("files/", "dropped/"))
    ]
    failed_by = ", ".join(f"{k.removeprefix('sources/failed/')}: {v}" for k, v in sorted(stats.items())
                          if k.startswith("sources/failed/"))  # fmt: skip
    report = [f"## Code crawl `{snapshot}`", f"{len(manifest.sources)} sources, {stats['sources/failed']} failed"
              f"{f' ({failed_by})' if failed_by else ''}, {stats['sources/cached']} from cache, "
              f"{metrics['seconds']:.0f}s.", "", markdown_table(funnel), "",
              "### Files per language", markdown_table([{"language": k, "files": v} for k, v in by_lang.most_common()])]  # fmt: skip
    if errors:
        report += ["", "### Failed sources", *[f"- {e}" for e in errors]]
    sample = [{**r, "text": r["text"][:500]} for r in all_records[:: max(1, len(all_records) // 5)][:5]]
    return StageResult(
        metrics=metrics,
        outputs={"records": store.uri(prefix), "origins": store.uri(out.key(ORIGINS))},
        report_md="\n".join(report),
        sample=sample,
        data_version=data_version(r["id"] + r["metadata"]["sha256"] for r in all_records),
        extra={"errors": errors, "shards": keys, "languages": dict(by_lang)},
    )
