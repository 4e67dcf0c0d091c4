"""The code-language classifier's training data by the frozen protocol (issue 19's label set).

Files: the labelled files of the partition's crawl and of *label snapshots* (crawls of
`classifiers/data/code_language_extra*.yaml`, which source the languages a corpus crawl lacks), plus
`unknown` texts (test logs shipped in pinned Debian packages, prose, CSV, minified and encoded blobs from this
machine's installed packages). Split: the frozen test and dev projects of `classifiers/data/
code_language_{test,dev}_<version>.json` (chosen before any tuning, `benchmarks/code_lang_id.py train` freezes
them); the test projects are never trained on, dev scores the model and fits its temperature.
"""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

from classifiers.code_language_protocol import UNKNOWN, component_groups, load_frozen, text_sha256
from infra.code_sources import AptConfig, fetch_debian_binary, local_unknown_texts, site_packages_dir
from infra.settings import REPO_ROOT
from pipelines.code.archives import iter_deb

FROZEN_DIR = REPO_ROOT / "classifiers" / "data"

# log files of the `unknown` label: test logs shipped in Debian packages (sshd, apache, postfix, haproxy,
# simulation runs), pinned so that the frozen sets stay reproducible (v1 / v2 used this machine's own logs,
# which change while it runs)
PACKAGED_LOGS = {
    ("fail2ban", "1.0.2-2"): "*/tests/files/logs/*",
    ("python3-haproxy-log-analysis", "2.0~b0-4"): "*/tests/files/*",
    ("votca-tutorials", "2022.1-1"): "*.log",
}


def packaged_log_files(cache_dir: Path) -> list[Path]:
    """PACKAGED_LOGS, fetched once and unpacked to `cache_dir/unknown-logs/<package>_<version>/` (published by
    rename: a killed run leaves no half-filled directory that looks complete)."""
    out: list[Path] = []
    for (package, version), pattern in PACKAGED_LOGS.items():
        dest = cache_dir / "unknown-logs" / f"{package}_{version}"
        if not dest.is_dir():
            deb = fetch_debian_binary(AptConfig(cache_dir / "apt"), package, version, cache_dir).files[0]
            tmp = dest.with_name(dest.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for m in iter_deb(deb):
                if fnmatch(m.path, pattern) and m.size > 0:
                    (tmp / f"{package}__{m.path.rsplit('/', 1)[-1]}").write_bytes(m.read())
            tmp.rename(dest)
        out += sorted(dest.iterdir())
    return out


def unknown_files(cache_dir: Path, seed: int) -> list[dict]:
    """The `unknown` label's texts as protocol files (text, label, group, path, how). Paths are relative to the
    cache and to site-packages: files are ordered by a hash of their path, so an absolute one would make the
    training sample (and the model) depend on where the state directory or the venv lives."""
    site = site_packages_dir()

    def portable(path: str) -> str:
        for root, name in ((cache_dir, "cache"), (site, "site-packages")):
            if path.startswith(f"{root}/"):
                return f"{name}/{path[len(str(root)) + 1 :]}"
        return path

    return [{"id": portable(t.path), "text": t.text, "label": UNKNOWN, "group": t.group, "path": portable(t.path),
             "how": t.kind} for t in local_unknown_texts(site, packaged_log_files(cache_dir), seed=seed)]  # fmt: skip


def _hash_key(seed: int, s: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{s}".encode(), digest_size=8).digest(), "big")


def protocol_files(
    labelled: Iterable[dict], seed: int, per_group_cap: int, min_files: int
) -> tuple[list[dict], dict]:
    """Labelled files (text, label, group, path, how; every snapshot's and the `unknown` texts), deduplicated by
    content (first project wins), flagged `over_cap` past `per_group_cap` files of one label per project (they
    may train, never be held out), labels with fewer than `min_files` capped files dropped. Returns the files and
    stats."""
    stats: Counter = Counter()
    seen: set[str] = set()
    per_group: Counter = Counter()
    kept = []
    # dev-only files come last, so a copy of a file in a training or frozen project never moves to them
    for f in sorted(
        labelled, key=lambda f: (bool(f.get("dev_only")), f["group"], _hash_key(seed, f["path"]))
    ):
        sha = text_sha256(f["text"])
        if sha in seen:
            stats["dropped/duplicate_content"] += 1
            continue
        seen.add(sha)
        f["over_cap"] = per_group[f["group"], f["label"]] >= per_group_cap
        stats["over_project_cap"] += f["over_cap"]
        per_group[f["group"], f["label"]] += 1
        kept.append(f)
    counts = Counter(f["label"] for f in kept if not f["over_cap"])
    kept = [f for f in kept if counts[f["label"]] >= min_files]
    stats[f"dropped/label_under_{min_files}_files"] = sum(n for n in counts.values() if n < min_files)
    return kept, {
        "stats": dict(stats),
        "dropped_labels": sorted(lab for lab, n in counts.items() if n < min_files),
    }


def drop_held_out_copies(files: list[dict]) -> int:
    """Forks and vendored copies: a held-out file whose content is also in train is not held out (`dropped`)."""
    train_sha = {text_sha256(f["text"]) for f in files if f["split"] == "train"}
    dropped = 0
    for f in files:
        if f["split"] != "train" and text_sha256(f["text"]) in train_sha:
            f["split"] = "dropped"
            dropped += 1
    return dropped


def frozen_paths(version: str) -> dict[str, Path]:
    return {name: FROZEN_DIR / f"code_language_{name}_{version}.json" for name in ("test", "dev")}


def frozen_test_digest(version: str | None) -> str | None:
    """The recorded sha256 of frozen test set `version` (None without one)."""
    if version is None:
        return None
    path = frozen_paths(version)["test"]
    return path.with_suffix(".json.sha256").read_text().split()[0] if path.is_file() else None


def apply_frozen_split(files: list[dict], version: str) -> dict:
    """Set each file's `split` from the frozen test / dev projects of `version` (their hashes checked): a file of
    a test or dev project is held out (an over-cap one is not used at all), every other file trains. The split is
    read, never made here: a new split is a new frozen version. Returns counts."""
    paths = frozen_paths(version)
    for name, path in paths.items():
        if not path.is_file():
            raise FileNotFoundError(f"frozen {name} set {path} not found: set `frozen_version` to one of "
                                    f"{sorted(p.stem.rsplit('_', 1)[1] for p in FROZEN_DIR.glob('code_language_test_*.json'))} "
                                    f"or null (package split)")  # fmt: skip
    groups = {name: set(load_frozen(path)["groups"]) for name, path in paths.items()}
    check_dev_only_groups(files)
    made = component_groups(
        files, min_groups=4
    )  # as when frozen: a label of few projects splits by component
    for f in files:
        f["split"] = frozen_side(f, groups["test"], groups["dev"])
    counts = Counter(f["split"] for f in files)
    return {"held_out_in_train": drop_held_out_copies(files), "split_by_component": made,
            **{f"files/{k}": v for k, v in counts.items()}}  # fmt: skip


def frozen_side(f: dict, test_groups: set[str], dev_groups: set[str]) -> str:
    """A file's split under frozen test / dev groups: held out if its project is, else train. An over-cap file of a
    held-out project is not used; so is a dev-only file (a crawl of `dev_snapshots`) whose project is in neither
    set, since such a project must never train."""
    side = "test" if f["group"] in test_groups else "dev" if f["group"] in dev_groups else "train"
    if f.get("dev_only") and side != "dev":
        return "unused_dev_only"
    return "over_cap" if f["over_cap"] and side != "train" else side


def check_dev_only_groups(files: list[dict]) -> set[str]:
    """The projects of dev-only crawls; raises ValueError if one of them also has files in a training crawl
    (the same project on both sides of the split)."""
    dev_only = {f["group"] for f in files if f.get("dev_only")}
    shared = sorted(dev_only & {f["group"] for f in files if not f.get("dev_only")})
    if shared:
        raise ValueError(f"projects both in a dev-only crawl and in a training crawl: {shared[:8]}; remove them "
                         f"from one of the manifests")  # fmt: skip
    return dev_only


def training_sample(files: list[dict], group_cap: int, per_label: int, seed: int) -> list[dict]:
    """The training files: at most `group_cap` of one label from one project (files in seeded hash order), then
    at most `per_label` of each label (seeded), so no project dominates a label and labels stay balanced."""
    import random

    per_project: Counter = Counter()
    pool = []
    for f in files:
        if f["split"] != "train":
            continue
        per_project[f["group"], f["label"]] += 1
        if per_project[f["group"], f["label"]] <= group_cap:
            pool.append(f)
    rng = random.Random(seed)
    out: list[dict] = []
    for lab in sorted({f["label"] for f in pool}):
        mine = [f for f in pool if f["label"] == lab]
        out += rng.sample(mine, min(len(mine), per_label))
    return out
