"""Judge quality gate: every judge run first scores a probe set of known character and reports agreement.

The probe set (`classifiers/data/probe_<task>_v<N>.jsonl`, built by `pipelines/math/probe_set.py`) holds
documents graded 0-5 by their source kind. Agreement = AUC of the judge score for "grade >= 3" and Spearman
correlation with the grades. Below the bar the gate fails: `blocking` (cluster) means downstream must not
run; otherwise (tiny) it warns loudly and the run goes on. The asset layer turns the result into an asset
check with the matching severity.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from classifiers.binary_metrics import roc_auc, spearman

log = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


class GateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    probe_set: str = Field(
        "probe_edu_math_v1", description="Probe file in classifiers/data/ (without .jsonl)"
    )
    min_auc: float = Field(
        0.75, ge=0, le=1, description="Minimum probe AUC (grade >= positive_grade vs rest)"
    )
    min_spearman: float = Field(
        0.4, ge=-1, le=1, description="Minimum Spearman correlation with probe grades"
    )
    positive_grade: int = Field(3, ge=1, le=5, description="Probes at or above this grade count as positives")
    blocking: bool = Field(
        False, description="A failed gate blocks downstream (cluster) instead of warning (tiny)"
    )
    max_probes: int | None = Field(None, ge=4, description="Use only the first N probes (tests); None = all")


@dataclass
class GateResult:
    passed: bool
    blocking: bool
    auc: float
    spearman: float
    n_probes: int
    message: str
    per_kind: list[dict] = field(default_factory=list)
    unscored: int = 0

    def metrics(self, prefix: str = "judge_gate/") -> dict[str, float]:
        return {
            f"{prefix}auc": self.auc,
            f"{prefix}spearman": self.spearman,
            f"{prefix}passed": float(self.passed),
            f"{prefix}n_probes": float(self.n_probes),
            f"{prefix}unscored": float(self.unscored),
        }


def load_probe_set(name: str = "probe_edu_math_v1", data_dir: Path | None = None) -> list[dict]:
    """Probe records: {'id', 'kind', 'grade', 'text', 'source', 'license', 'ref'}."""
    path = Path(data_dir or DATA_DIR) / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def interleave_kinds(probes: list[dict]) -> list[dict]:
    """Round-robin over kinds, so the first N probes cover every kind (for `max_probes`)."""
    by_kind: dict[str, list[dict]] = {}
    for p in probes:
        by_kind.setdefault(p["kind"], []).append(p)
    out: list[dict] = []
    while any(by_kind.values()):
        for items in by_kind.values():
            if items:
                out.append(items.pop(0))
    return out


def evaluate_gate(probes: list[dict], scores: list[float | None], config: GateConfig) -> GateResult:
    """Agreement of judge `scores` (aligned with `probes`, None = unscored) with the probe grades."""
    pairs = [(p, s) for p, s in zip(probes, scores, strict=True) if s is not None]
    unscored = len(probes) - len(pairs)
    grades = [p["grade"] for p, _ in pairs]
    values = [s for _, s in pairs]
    auc = roc_auc([g >= config.positive_grade for g in grades], values) if pairs else float("nan")
    rho = spearman(grades, values) if pairs else float("nan")
    per_kind = []
    for kind in dict.fromkeys(p["kind"] for p in probes):
        ks = [s for p, s in pairs if p["kind"] == kind]
        grade = next(p["grade"] for p in probes if p["kind"] == kind)
        per_kind.append(
            {
                "kind": kind,
                "grade": grade,
                "n": len(ks),
                "mean_judge_score": round(sum(ks) / len(ks), 3) if ks else None,
            }
        )
    ok = auc == auc and rho == rho and auc >= config.min_auc and rho >= config.min_spearman
    verdict = "passed" if ok else ("FAILED (blocking)" if config.blocking else "FAILED (warning only)")
    message = (
        f"judge quality gate {verdict}: probe AUC {auc:.3f} (bar {config.min_auc}), Spearman {rho:.3f} "
        f"(bar {config.min_spearman}) on {len(pairs)} probes ({unscored} unscored)"
    )
    if not ok:
        log.warning(
            "!!! %s: the judge does not separate educational math from junk on known documents; "
            "its scores are close to noise. Use a stronger judge (cluster endpoint).",
            message,
        )
    else:
        log.info(message)
    return GateResult(ok, config.blocking, auc, rho, len(pairs), message, per_kind, unscored)


def run_quality_gate(judge, config: GateConfig | None = None, data_dir: Path | None = None) -> GateResult:
    """Score the probe set with `judge` (a JudgeClient, cached like any run) and evaluate agreement."""
    config = config or GateConfig()
    probes = interleave_kinds(load_probe_set(config.probe_set, data_dir))
    if config.max_probes:
        probes = probes[: config.max_probes]
    scores = judge.score_texts([p["text"] for p in probes])
    return evaluate_gate(probes, [s.score for s in scores], config)
