"""The held-out protocol of the code-language classifier (issue 19): projects split into train / dev / test before
any tuning, the test set frozen (its projects and file hashes, with the sha256 of that list in the repo), every
choice (epochs, temperature, the `unknown` threshold) made on dev, and the frozen test set scored once per model
version. Plus the calibration pieces: temperature scaling fit on dev, expected calibration error (ECE), and the
error rate of predictions made at >= 0.99.

Plain Python: the driver that reads crawled records and logs to MLflow is `benchmarks/code_lang_id.py train`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

UNKNOWN = "unknown"  # text that is no label: prose, logs, CSV, minified or encoded blobs
SPLITS = ("train", "dev", "test")
CONFIDENT = 0.99  # the confidence the issue bounds the error rate of (<= 0.5% wrong)


def _hash(seed: int, s: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}:{s}".encode(), digest_size=8).digest(), "big")


def split_by_component(files: list[dict]) -> None:
    """Regroup files of one project by component: `group` gets `#` and the two directories below the files'
    common directory prefix (`.` for a file directly in it)."""
    dirs = [f["path"].split("/")[:-1] for f in files]
    common = 0
    while all(len(d) > common for d in dirs) and len({d[common] for d in dirs}) == 1:
        common += 1
    for f, d in zip(files, dirs, strict=True):
        f["group"] = f"{f['group']}#{'/'.join(d[common : common + 2]) or '.'}"


def component_groups(files: list[dict], min_groups: int) -> dict[str, int]:
    """A label found in fewer than `min_groups` projects cannot be split three ways by project: its files in its
    largest project are regrouped by component (the two directories below their common prefix, e.g.
    `lib/mix` vs `lib/ex_unit`). Mutates `group`; returns label -> components made (reported as a caveat: the
    split of such a label is by component, not by project). Dev-only projects (`dev_only`) are not counted: adding
    them must not regroup a project a frozen set was made with."""
    by_label: dict[str, Counter] = defaultdict(Counter)
    for f in files:
        if not f.get("dev_only"):
            by_label[f["label"]][f["group"]] += 1
    made = {}
    for label, groups in by_label.items():
        if len(groups) >= min_groups:
            continue
        main = groups.most_common(1)[0][0]
        mine = [f for f in files if f["label"] == label and f["group"] == main and not f.get("dev_only")]
        split_by_component(mine)
        made[label] = len({f["group"] for f in mine})
    return made


def split_groups(
    files: list[dict], seed: int, dev_fraction: float = 0.2, test_fraction: float = 0.2
) -> dict[str, str]:
    """Group -> `train` | `dev` | `test`. Labels with the fewest groups choose first; each label's groups in seeded
    hash order go to test, then dev, until each holds its share of the label's files (at least one group each when
    the label has three or more groups), the rest to train. A group is one project: all its files go one way."""
    by_label: dict[str, Counter] = defaultdict(Counter)
    for f in files:
        by_label[f["label"]][f["group"]] += 1
    where: dict[str, str] = {}
    for label in sorted(by_label, key=lambda lab: (len(by_label[lab]), lab)):
        groups = by_label[label]
        total = sum(groups.values())
        held = Counter({s: sum(n for g, n in groups.items() if where.get(g) == s) for s in SPLITS})
        order = sorted(groups, key=lambda g: _hash(seed, g))
        if (
            len(groups) < 6
        ):  # few projects: the largest trains, or train may keep a handful of files (v1: Verilog 6)
            biggest = max(order, key=lambda g: groups[g])
            if biggest not in where:
                where[biggest] = "train"
                held["train"] += groups[biggest]
        for g in order:
            if g in where:
                continue
            free = [x for x in groups if x not in where]
            if len(groups) >= 3 and len(free) <= 1 and held["train"] == 0:
                where[g] = "train"  # never the label's last group
            elif held["test"] < test_fraction * total and (
                held["test"] == 0 or held["test"] + groups[g] <= 1.5 * test_fraction * total
            ):
                where[g] = "test"
            elif held["dev"] < dev_fraction * total and (
                held["dev"] == 0 or held["dev"] + groups[g] <= 1.5 * dev_fraction * total
            ):
                where[g] = "dev"
            else:
                where[g] = "train"
            held[where[g]] += groups[g]
    return where


def split_label(f: dict) -> str:
    """What a file is split by: its label, with `unknown` texts apart per kind (logs, prose, CSV, ...), so that a
    new kind of `unknown` text gets held-out groups of its own."""
    return f"{f['label']}/{f.get('how', '')}" if f["label"] == UNKNOWN else f["label"]


def extend_split(
    files: list[dict], previous: dict[str, str], previous_labels: set[str], seed: int
) -> dict[str, str]:
    """A new frozen version on top of an earlier one (`previous`: its test and dev groups; `previous_labels`: the
    labels its files have): those groups keep their side; a split label that is new (a language the earlier
    version did not have, even if a few of its files sat in its groups; a kind of `unknown` text none of its
    groups holds) is split by project over the groups made only of such labels (`split_groups`); every other
    group trains. So adding labels moves no earlier held-out file and puts no earlier training project into a
    held-out set."""
    held_labels = {split_label(f) for f in files if f["group"] in previous and f["label"] in previous_labels}
    new_labels = {split_label(f) for f in files} - held_labels
    labels_of: dict[str, set[str]] = defaultdict(set)
    for f in files:
        labels_of[f["group"]].add(split_label(f))
    eligible = {g for g, labs in labels_of.items() if g not in previous and labs <= new_labels}
    fresh = split_groups([{**f, "label": split_label(f)} for f in files if f["group"] in eligible], seed)
    return {g: previous.get(g) or fresh.get(g, "train") for g in labels_of}


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def frozen_set(files: list[dict], name: str, seed: int) -> dict:
    """The frozen description of a held-out set: its groups and (sha256, label) of each file, sorted."""
    return {
        "name": name,
        "seed": seed,
        "groups": sorted({f["group"] for f in files}),
        "files": sorted([text_sha256(f["text"]), f["label"]] for f in files),
    }


def frozen_digest(frozen: dict) -> str:
    """sha256 of the canonical JSON of a frozen set (what the repo records next to it)."""
    return hashlib.sha256(json.dumps(frozen, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_frozen(frozen: dict, path: Path) -> str:
    """Write the frozen set and `<path>.sha256`; refuses to overwrite a different frozen set."""
    digest = frozen_digest(frozen)
    sha_path = path.with_suffix(path.suffix + ".sha256")
    if path.exists() and load_frozen(path) != frozen:
        raise ValueError(f"{path} is frozen with another content: a new test set needs a new name")
    path.write_text(json.dumps(frozen, sort_keys=True, indent=0) + "\n")
    sha_path.write_text(f"{digest}  {path.name}\n")
    return digest


def load_frozen(path: Path) -> dict:
    """A frozen set, checked against its recorded sha256."""
    frozen = json.loads(Path(path).read_text())
    sha_path = Path(path).with_suffix(Path(path).suffix + ".sha256")
    recorded = sha_path.read_text().split()[0]
    if frozen_digest(frozen) != recorded:
        raise ValueError(f"{path}: content does not match {sha_path.name} ({recorded[:12]}...)")
    return frozen


# `unknown` prose comes from /usr/share/doc of the packages installed here: a Debian update to one of them
# (chromium's changelog) changes a frozen file's hash. A drift this small is scored without the changed files and
# reported; a larger one means other data, and the set must be re-crawled or frozen anew.
MAX_FROZEN_DRIFT = 0.005


def match_frozen(held: list[dict], frozen: dict, max_drift: float = MAX_FROZEN_DRIFT) -> dict:
    """Hold `held` (the files of a frozen set's projects) to the frozen list: a file not on it gets split
    `not_frozen` (neither trained nor scored), and frozen files the data no longer gives are counted. Raises
    ValueError naming the labels and projects when more than `max_drift` of the frozen files are missing."""
    wanted = {(sha, label) for sha, label in frozen["files"]}
    present: set[tuple[str, str]] = set()
    extra: Counter = Counter()
    for f in held:
        key = (text_sha256(f["text"]), f["label"])
        if key in wanted:
            present.add(key)
        else:
            f["split"] = "not_frozen"
            extra[f["group"]] += 1
    missing = wanted - present
    if len(missing) > max_drift * len(wanted):
        by_label = Counter(label for _, label in missing).most_common(5)
        projects = sorted(set(frozen["groups"]) - {f["group"] for f in held})
        raise ValueError(
            f"frozen {frozen['name']} set: {len(missing)} of {len(wanted)} files are missing from the data (more "
            f"than {max_drift:.1%}; by label {by_label}; projects with no file: {projects[:8]}"
            f"{' ...' if len(projects) > 8 else ''}). Crawl the same snapshots; `unknown` prose comes from "
            f"/usr/share/doc, so install what `make test` installs (make browser-deps postgres-deps); or freeze a "
            f"new version"
        )
    return {
        "frozen_files": len(wanted),
        "frozen_missing": len(missing),
        "not_frozen": sum(extra.values()),
        "not_frozen_groups": dict(extra.most_common(5)),
    }


# --- calibration -----------------------------------------------------------------------------------------


def apply_temperature(probs: dict[str, float], temperature: float) -> dict[str, float]:
    """Temperature scaling of a probability vector: p_i^(1/T) renormalised (softmax of log p / T)."""
    if temperature == 1.0 or not probs:
        return probs
    logs = {k: math.log(max(v, 1e-12)) / temperature for k, v in probs.items()}
    top = max(logs.values())
    exp = {k: math.exp(v - top) for k, v in logs.items()}
    z = sum(exp.values())
    return {k: v / z for k, v in exp.items()}


def nll(probs: Sequence[dict[str, float]], y_true: Sequence[str], temperature: float) -> float:
    total = 0.0
    for p, y in zip(probs, y_true, strict=True):
        total -= math.log(max(apply_temperature(p, temperature).get(y, 0.0), 1e-12))
    return total / max(len(y_true), 1)


def fit_temperature(probs: Sequence[dict[str, float]], y_true: Sequence[str],
                    grid: Sequence[float] | None = None) -> float:  # fmt: skip
    """The temperature minimising dev NLL over a log grid (0.5 .. 8)."""
    grid = grid or [round(0.5 * 1.1**i, 4) for i in range(30)]
    return min(grid, key=lambda t: nll(probs, y_true, t))


def fit_marker_confidence(hits: Sequence[tuple[str, bool]]) -> dict[str, float]:
    """How often each content marker / script header is right on dev, as (right + 1) / (n + 2) (the posterior
    mean under a uniform prior, so 20 of 20 right is 0.955, not 1.0), per key (`content:HTML`), pooled per kind
    (`content:*`) and over all (`*`) for keys dev never saw. `hits`: (key, right) of each dev file a marker
    decided."""
    right: Counter = Counter()
    seen: Counter = Counter()
    for key, ok in hits:
        for k in (key, f"{key.split(':', 1)[0]}:*", "*"):
            seen[k] += 1
            right[k] += bool(ok)
    return {k: round((right[k] + 1) / (seen[k] + 2), 4) for k in sorted(seen)}


def expected_calibration_error(conf: Sequence[float], correct: Sequence[bool], bins: int = 15) -> float:
    """ECE: sum over equal-width confidence bins of |accuracy - mean confidence| weighted by the bin's share."""
    n = len(conf)
    if n == 0:
        return 0.0
    acc: list[list[float]] = [[0, 0.0, 0.0] for _ in range(bins)]
    for c, ok in zip(conf, correct, strict=True):
        b = min(int(c * bins), bins - 1)
        acc[b][0] += 1
        acc[b][1] += c
        acc[b][2] += float(ok)
    return sum(abs(s_ok - s_c) for _, s_c, s_ok in acc) / n


def calibration_report(y_true: Sequence[str], y_pred: Sequence[str], conf: Sequence[float]) -> dict:
    """ECE overall and per predicted label, and the error rate of predictions at >= CONFIDENT."""
    correct = [t == p for t, p in zip(y_true, y_pred, strict=True)]
    per_label = {}
    for lab in sorted(set(y_pred)):
        idx = [i for i, p in enumerate(y_pred) if p == lab]
        per_label[lab] = round(
            expected_calibration_error([conf[i] for i in idx], [correct[i] for i in idx]), 4
        )
    sure = [i for i, c in enumerate(conf) if c >= CONFIDENT]
    wrong_sure = sum(1 for i in sure if not correct[i])
    return {
        "ece": round(expected_calibration_error(conf, correct), 4),
        "ece_per_predicted_label": per_label,
        "confident_predictions": len(sure),
        "confident_errors": wrong_sure,
        "confident_error_rate": round(wrong_sure / len(sure), 5) if sure else 0.0,
    }


def paired_project_bootstrap(correct_a: Sequence[bool], correct_b: Sequence[bool], groups: Sequence[str],
                             draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:  # fmt: skip
    """Accuracy of B minus A on the same files, and its 95% interval when whole projects are resampled: files of
    one project err together, so a per-file interval would claim a resolution dev does not have."""
    import random

    by: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # project -> [sum of differences, files]
    for a, b, g in zip(correct_a, correct_b, groups, strict=True):
        by[g][0] += int(b) - int(a)
        by[g][1] += 1
    cells = list(by.values())
    if not cells:
        raise ValueError("paired_project_bootstrap: no files")
    rng = random.Random(seed)
    stats = []
    for _ in range(draws):
        picked = [cells[rng.randrange(len(cells))] for _ in cells]
        stats.append(sum(c[0] for c in picked) / sum(c[1] for c in picked))
    stats.sort()
    diff = sum(c[0] for c in cells) / sum(c[1] for c in cells)
    return diff, stats[int(0.025 * draws)], stats[int(0.975 * draws) - 1]


def decide_unknown(probs: dict[str, float], min_prob: float) -> tuple[str, float]:
    """Top label and its probability; `unknown` when the top probability is under `min_prob`."""
    if not probs:
        return UNKNOWN, 0.0
    top = max(probs, key=probs.get)
    return (top if probs[top] >= min_prob else UNKNOWN), probs[top]
