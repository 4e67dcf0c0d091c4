"""Training curves as one PNG: panels of metric histories (a trainer's metrics.jsonl rows) against the step."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from infra.figures import pyplot, save_figure

# Reasoning RL: what a person checks first (is reward rising per domain, does held-out follow, is the
# train/inference mismatch under control, is the policy collapsing).
RL_PANELS = {
    "train reward per domain": r"reward/(?!mean)\w+",
    "held-out pass@1 (greedy)": r"heldout/pass_at_1/\w+",
    "held-out pass@1 (sampled, rollout temperature)": r"heldout/sampled_pass_at_1/\w+",
    "IcePop rho (trainer / engine prob)": r"rho/(min|mean|max)",
    "token fractions: masked by IcePop, clipped": r"icepop/masked_fraction|clip_fraction",
    "entropy and response length": r"entropy|response_length",
}
SFT_PANELS = {"SFT loss (assistant tokens)": r"loss", "learning rate": r"lr", "gradient norm": r"grad_norm"}


def plot_history(rows: list[dict[str, Any]], panels: dict[str, str], out_path: Path, title: str = "") -> Path:
    """One subplot per panel with every key that fully matches its regex; a key with a `_se` twin (e.g.
    `heldout/pass_at_1_se/math`) is drawn with +-1 SE bars. Empty panels say so instead of vanishing."""
    fig, axes = pyplot().subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (name, pattern) in zip(axes[0], panels.items(), strict=True):
        keys = sorted({k for r in rows for k in r if k != "step" and re.fullmatch(pattern, k)})
        for key in keys:
            points = [(r["step"], r[key], r.get(_se_key(key), 0.0)) for r in rows if key in r]
            steps, values, errors = zip(*points, strict=True)
            label = key.rsplit("/", 1)[-1]
            if any(errors):
                ax.errorbar(steps, values, yerr=errors, marker="o", capsize=3, label=label)
            else:
                ax.plot(steps, values, marker="." if len(points) < 30 else None, label=label)
        if not keys:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set(xlabel="step", title=name)
        if keys:
            ax.legend(fontsize=7)
    return save_figure(fig, out_path, title)


def _se_key(key: str) -> str:
    head, _, tail = key.rpartition("/")
    parent, _, metric = head.rpartition("/")
    return f"{parent}/{metric}_se/{tail}" if parent else f"{metric}_se/{tail}"
