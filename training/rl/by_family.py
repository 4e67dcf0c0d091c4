"""Scores broken down by task family (`Task.meta["family"]`, e.g. code's `floor_div`). A domain's pass@1 hides
which families RL learned; the difficulty filter keeps no prompt of a family the starting policy never solves,
so such a family cannot gain (docs/post_training_results.md, "where code's held-out gain goes")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from training.tasks.base import Task


def family_of(task: Task) -> str | None:
    family = task.meta.get("family")
    return str(family) if family else None


def family_means(values: Mapping[str, float], tasks: Sequence[Task], prefix: str) -> dict[str, float]:
    """Mean of `values[task.id]` per domain and family: `<prefix>/<domain>/<family>`; tasks without a family
    or a value are skipped."""
    by: dict[str, list[float]] = defaultdict(list)
    for t in tasks:
        family = family_of(t)
        if family and t.id in values:
            by[f"{prefix}/{t.domain}/{family}"].append(values[t.id])
    return {k: sum(v) / len(v) for k, v in sorted(by.items())}


def family_counts(tasks: Sequence[Task], prefix: str) -> dict[str, float]:
    """How many tasks of each domain and family: `<prefix>/<domain>/<family>`."""
    out: dict[str, float] = defaultdict(float)
    for t in tasks:
        if family := family_of(t):
            out[f"{prefix}/{t.domain}/{family}"] += 1
    return dict(sorted(out.items()))


def family_rows(history: Sequence[Mapping[str, Any]], before: str, after: str) -> list[dict]:
    """One row per domain and family scored held-out, from a run's logged metric rows: greedy and sampled
    pass@1 at the first evaluation (the parent checkpoint, `before`) and the last (`after`), and the difficulty
    filter's sampled pass rate and kept count on the family's train prompts."""
    evals = [r for r in history if any(k.startswith("heldout/family/") for k in r)]
    if not evals:
        return []
    first, final = evals[0], evals[-1]
    filt = next((r for r in history if "filter/pool" in r), {})

    def pick(row: Mapping[str, Any], key: str) -> float:
        return round(float(row.get(key, float("nan"))), 3)

    rows = []
    for key in sorted(k for k in final if k.startswith("heldout/family/")):
        name = key.removeprefix("heldout/family/")
        rows.append(
            {
                "family": name,
                "n": int(final.get(f"heldout/family_n/{name}", 0)),
                before: pick(first, key),
                after: pick(final, key),
                f"{before} sampled": pick(first, f"heldout/family_sampled/{name}"),
                f"{after} sampled": pick(final, f"heldout/family_sampled/{name}"),
                "filter: train pass rate": pick(filt, f"filter/pass_rate/{name}"),
                "filter: kept": int(filt.get(f"filter/kept/{name}", 0)),
            }
        )
    return rows
