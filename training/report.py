"""The post-training results table (docs/recipe.md, "On-policy cross-stage distillation"): every checkpoint of
the chain, from the midtrained base to the distilled one, scored on the same held-out sets, each number with
its standard error, as a Markdown table and one PNG; and the distillation's recovery rows: its teacher, the RL
checkpoint it started from (without distillation) and the distilled one.

Metrics (all on the same items for every checkpoint):
- `ppl/<source>`: held-out perplexity; SE by the delta method over rows (se(ppl) = ppl · se(mean row NLL));
- `test/ppl/<source>`: the same on the tail of the held-out stream, past everything a dev score, a gate or an
  eval loss reads from its head (sources with too few held-out tokens have none);
- `passkey/<length>`: passkey multiple-choice accuracy at the longest length, binomial SE;
- `pass_at_1/<domain>`: greedy pass@1 on the held-out reasoning tasks (math / code / tool / knowledge ...);
- `test/pass_at_1/<domain>`: the same on the frozen test split (task_suites' test.jsonl), scored once per
  report and never read to choose a setting: the check on what the held-out (dev) columns suggest;
- `success/<family>`: greedy success on the held-out agentic tasks with in-process environments;
- `general/<component>`: general-reward components, when a scorer is given.

Plain Python: the asset gives HF dirs and held-out sets, gets a `Report` back."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from training.recall_tasks import PasskeyItem
from training.tasks.base import Task
from training.worker_pool import Workers, run_in_workers, worker_count

log = logging.getLogger(__name__)
Score = tuple[float, float]  # (value, standard error)
Items = dict[str, float]  # item id -> that item's value (0/1, a reward, a row's mean NLL)
GeneralScorer = Callable[[torch.nn.Module, Any], Mapping[str, Mapping[str, float]]]  # component -> Items
HIGHER_IS_BETTER = ("passkey/", "pass_at_1/", "success/", "general/")  # ppl/ is lower-is-better


def higher_is_better(metric: str) -> bool:
    """The metric's direction (a `test/` metric has its held-out twin's)."""
    return metric.removeprefix("test/").startswith(HIGHER_IS_BETTER)


class ReportConfig(BaseModel):
    """What the results table scores (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    ppl_seq_len: int = Field(256, ge=8, description="Context of the held-out perplexity rows (tokens)")
    ppl_max_tokens: int = Field(16_384, ge=64, description="Held-out tokens scored per source")
    ppl_test_tokens: int = Field(
        16_384,
        ge=0,
        description="Perplexity test split (test/ppl/<source>): at most this many tokens from the tail of each "
        "source's held-out stream; 0 = none",
    )
    ppl_test_after_tokens: int = Field(
        262_144,
        ge=0,
        description="The perplexity test split starts at a document at or after this token of the held-out "
        "stream: everything that reads held-out text for a dev score, a gate or an eval loss (these rows, "
        "checkpoint_evals, the trainers' eval batches) reads from its head, well below this",
    )
    passkey_length: int = Field(1024, ge=32, description="Passkey prompt length (the longest trained one)")
    passkey_depths: list[float] = Field([0.1, 0.3, 0.5, 0.7, 0.9], description="Needle depths (0 = start)")
    passkey_per_depth: int = Field(8, ge=1, description="Passkey items per depth")
    passkey_choices: int = Field(4, ge=2, description="Candidate keys per item (chance = 1/choices)")
    passkey_digits: int = Field(5, ge=1, description="Digits per key")
    filler_source: str = Field("web", description="Held-out source whose text fills the passkey haystack")
    reasoning_tasks_per_domain: int = Field(60, ge=1, description="Held-out reasoning tasks per domain")
    reasoning_tasks_for: dict[str, int] = Field(
        {"code": 200},
        description="Per-domain exceptions to reasoning_tasks_per_domain (code's pass@1 moves by 2-3 points "
        "between stages: 60 tasks cannot tell that from noise)",
    )
    test_split: bool = Field(
        True,
        description="Also score the test splits (test/pass_at_1/<domain> on the frozen task split, "
        "test/ppl/<source> on the held-out stream's tail), once per report; never used to choose a setting",
    )
    max_new_tokens: int = Field(48, ge=1, description="Tokens per turn on the reasoning tasks")
    max_turns: int = Field(3, ge=1, description="Assistant turns on the reasoning tasks")
    agentic_tasks_per_domain: int = Field(40, ge=1, description="Held-out agentic tasks per family")
    agentic_max_new_tokens: int = Field(64, ge=1, description="Tokens per turn on the agentic tasks")
    agentic_max_turns: int = Field(4, ge=1, description="Assistant turns on the agentic tasks")
    general_prompts: int = Field(
        60,
        ge=1,
        description="Held-out General RL prompts scored per checkpoint (round-robin over categories)",
    )
    general_max_new_tokens: int = Field(48, ge=1, description="Tokens per answer to a General RL prompt")
    batch_size: int = Field(4, ge=1, description="Sequences per forward pass (perplexity, passkey)")
    seed: int = Field(1234, description="Seed of the passkey set and the agentic environments")
    # On CPU a decode step of a small model is per-op overhead: a second torch thread buys 1.1-1.3x; two
    # 1-thread processes took tiny's table from 377 to 307 s, every cell the same.
    workers: Workers = Field(
        "auto",
        description="Processes scoring checkpoints side by side, each with CPUs / workers torch threads; "
        "auto = min(CPUs, checkpoints); 1 = in this process",
    )

    @model_validator(mode="after")
    def _test_rows_after_dev_rows(self) -> ReportConfig:
        if self.ppl_test_tokens and self.ppl_test_after_tokens < self.ppl_max_tokens:
            raise ValueError(
                f"ppl_test_after_tokens={self.ppl_test_after_tokens} is below ppl_max_tokens="
                f"{self.ppl_max_tokens}: the perplexity test rows would overlap the held-out (dev) rows; "
                "raise ppl_test_after_tokens or set ppl_test_tokens: 0"
            )
        return self


@dataclass
class HeldoutSets:
    """The held-out items every checkpoint is scored on (built once: same items, same tokens for all)."""

    text_rows: dict[str, torch.Tensor] = field(default_factory=dict)  # source -> [N, T] token ids
    test_text_rows: dict[str, torch.Tensor] = field(default_factory=dict)  # the same, perplexity test split
    passkey: list[PasskeyItem] = field(default_factory=list)
    reasoning: list[Task] = field(default_factory=list)
    test: list[Task] = field(default_factory=list)  # the frozen test split, whole
    facts: list[tuple[str, str]] = field(default_factory=list)  # knowledge suite
    agentic: list[Task] = field(default_factory=list)
    agentic_facts: list[tuple[str, str]] = field(default_factory=list)  # search family's documents
    verifiers: dict[str, Any] | None = None  # domain -> TaskSuite; None = training.tasks.suites(facts)


@dataclass
class CheckpointScores:
    scores: dict[str, Score] = field(default_factory=dict)  # metric -> (value, se)
    items: dict[str, Items] = field(default_factory=dict)  # metric -> its per-item values (for paired SEs)


@dataclass
class Report:
    scores: dict[str, dict[str, Score]]  # checkpoint -> metric -> (value, se), checkpoints in chain order
    markdown: str
    plot: Path | None = None
    items: dict[str, dict[str, Items]] = field(default_factory=dict)  # checkpoint -> metric -> Items

    def flat_metrics(self) -> dict[str, float]:
        """`<checkpoint>/<metric>` and `<checkpoint>/<metric>_se` for MLflow / Dagster metadata."""
        out = {}
        for ckpt, metrics in self.scores.items():
            for name, (value, se) in metrics.items():
                out[f"{ckpt}/{name}"], out[f"{ckpt}/{name}_se"] = value, se
        return out


def build_heldout_sets(
    tokenizer: Any,
    cfg: ReportConfig,
    text_shards: Mapping[str, Sequence[str | Path]] | None = None,
    reasoning: Sequence[Task] = (),
    facts: Sequence[tuple[str, str]] = (),
    agentic: Sequence[Task] = (),
    agentic_facts: Sequence[tuple[str, str]] = (),
    test: Sequence[Task] = (),
) -> HeldoutSets:
    """Held-out rows per source and passkey items from token shards (`training.data.shard_paths(...,
    "heldout")`), capped task subsets (round-robin over difficulty levels), and the whole test split when
    `cfg.test_split`."""
    from training.data import iter_shard_documents
    from training.evals import heldout_rows, tail_rows
    from training.recall_tasks import FillerText, passkey_items
    from training.tasks.suites import eval_subset
    from training.tokenizer import EOS

    sets = HeldoutSets(
        facts=list(facts), agentic_facts=list(agentic_facts), test=list(test) if cfg.test_split else []
    )
    sets.reasoning = eval_subset(list(reasoning), cfg.reasoning_tasks_per_domain, cfg.reasoning_tasks_for)
    sets.agentic = eval_subset(list(agentic), cfg.agentic_tasks_per_domain)
    if text_shards:
        sets.text_rows = {
            s: heldout_rows(p, cfg.ppl_seq_len, cfg.ppl_max_tokens) for s, p in text_shards.items()
        }
        if cfg.test_split and cfg.ppl_test_tokens:
            tails = {
                s: tail_rows(p, cfg.ppl_seq_len, cfg.ppl_test_tokens, cfg.ppl_test_after_tokens)
                for s, p in text_shards.items()
            }
            sets.test_text_rows = {s: rows for s, rows in tails.items() if rows is not None and len(rows) > 1}
        filler_paths = text_shards.get(cfg.filler_source) or next(iter(text_shards.values()))
        filler = FillerText(
            list(iter_shard_documents(filler_paths)), eos_id=tokenizer.convert_tokens_to_ids(EOS)
        )
        sets.passkey = passkey_items(
            lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]), filler,
            [cfg.passkey_length], cfg.passkey_depths, cfg.passkey_per_depth, cfg.passkey_choices, cfg.seed,
            cfg.passkey_digits,
        )  # fmt: skip
    return sets


@torch.no_grad()
def row_nlls(model: torch.nn.Module, rows: torch.Tensor, batch_size: int = 4) -> list[float]:
    """Each row's mean token NLL (rows [N, T] of equal length)."""
    per_row = []
    for i in range(0, len(rows), batch_size):
        batch = rows[i : i + batch_size]
        logits = model(input_ids=batch, use_cache=False).logits[:, :-1].float()
        # over [B*T, V]: the class-dim-1 form on a transposed view copies it and steps the vocab with a
        # stride: 3.1x slower at 4 x 1024 x 8192 on one thread
        nll = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
        per_row += nll.view(len(batch), -1).mean(1).tolist()
    return per_row


def perplexity_of(per_row: Sequence[float]) -> Score:
    """exp(mean row NLL) and its delta-method SE over rows."""
    mean = float(np.mean(per_row))
    se = float(np.std(per_row, ddof=1) / math.sqrt(len(per_row))) if len(per_row) > 1 else 0.0
    return math.exp(mean), math.exp(mean) * se


def mean_with_se(items: Mapping[str, float]) -> Score:
    """Mean over items and its standard error (sample variance)."""
    v = np.array(list(items.values()), dtype=float)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else 0.0


def score_checkpoint(
    model: torch.nn.Module,
    tokenizer: Any,
    sets: HeldoutSets,
    cfg: ReportConfig,
    score_general: GeneralScorer | None = None,
) -> CheckpointScores:
    """Every metric of the table for one model (left in eval mode), with each metric's per-item values."""
    from training.dsa_indexer import set_dsa_mode
    from training.evals import model_choice_scorer, passkey_hits
    from training.rl.reasoning import greedy_trajectories, task_rewards
    from training.rollout.engine import LocalRolloutEngine
    from training.tasks.suites import suites

    model.eval()
    set_dsa_mode(model, "sparse_gather")  # native's top-k attention, computed faster on CPU (training.evals)
    out = CheckpointScores()
    for prefix, text_rows in (("", sets.text_rows), ("test/", sets.test_text_rows)):
        for source, rows in sorted(text_rows.items()):
            nlls = row_nlls(model, rows, cfg.batch_size)
            out.scores[f"{prefix}ppl/{source}"] = perplexity_of(nlls)
            out.items[f"{prefix}ppl/{source}"] = {str(i): x for i, x in enumerate(nlls)}
    if sets.passkey:
        hits = passkey_hits(model_choice_scorer(model, cfg.batch_size), sets.passkey)
        n = max(item.length for item in sets.passkey)
        p = float(np.mean(hits))
        out.scores[f"passkey/{n}"] = (p, math.sqrt(p * (1 - p) / len(hits)))  # binomial
        out.items[f"passkey/{n}"] = {str(i): float(h) for i, h in enumerate(hits)}
    pad = tokenizer.pad_token_id
    if sets.reasoning or sets.test:
        engine = LocalRolloutEngine(model, dtype=torch.float32, pad_id=pad)
        verifiers = sets.verifiers if sets.verifiers is not None else suites(sets.facts)
        for prefix, tasks in (("", sets.reasoning), ("test/", sets.test)):
            if tasks:
                rewards = task_rewards(
                    greedy_trajectories(
                        engine, tokenizer, tasks, verifiers, cfg.max_new_tokens, cfg.max_turns
                    )
                )
                _pass_at_1(prefix, rewards, tasks, out)
    if sets.agentic:
        _agentic_success(model, tokenizer, sets, cfg, pad, out)
    if score_general is not None:
        for name, items in score_general(model, tokenizer).items():
            out.scores[f"general/{name}"] = mean_with_se(items)
            out.items[f"general/{name}"] = dict(items)
    return out


def _pass_at_1(
    prefix: str, rewards: Mapping[str, float], tasks: Sequence[Task], out: CheckpointScores
) -> None:
    from training.rl.reasoning import pass_at_1_of

    scores = pass_at_1_of(dict(rewards), tasks)
    for domain in sorted({t.domain for t in tasks}):
        key = f"{prefix}pass_at_1/{domain}"
        out.scores[key] = (scores[f"pass_at_1/{domain}"], scores[f"pass_at_1_se/{domain}"])
        out.items[key] = {t.id: rewards[t.id] for t in tasks if t.domain == domain}


def _agentic_success(
    model, tokenizer, sets: HeldoutSets, cfg: ReportConfig, pad: int, out: CheckpointScores
) -> None:
    from training.agentic.async_loop import AgenticRLConfig, greedy_trajectories, rewards_by_task, success_of
    from training.agentic.families import agentic_suites

    envs = agentic_suites(sets.agentic_facts)
    settings = AgenticRLConfig(
        max_new_tokens=cfg.agentic_max_new_tokens,
        max_turns=cfg.agentic_max_turns,
        seed=cfg.seed,
        env_threads=4,
    )
    trajs = greedy_trajectories(model, tokenizer, sets.agentic, envs, settings, pad)
    scores, rewards = success_of(trajs), rewards_by_task(trajs)
    for d in sorted({t.domain for t in sets.agentic}):
        out.scores[f"success/{d}"] = (scores[f"success/{d}"], scores[f"success_se/{d}"])
        out.items[f"success/{d}"] = {
            t.id: rewards[t.id] for t in sets.agentic if t.domain == d and t.id in rewards
        }


def paired_difference_se(metric: str, a: Score, a_items: Items, b: Score, b_items: Items) -> float | None:
    """The standard error of a - b over the items both were scored on (paired: an item both get right or
    both get wrong adds no noise). Perplexity by the delta method (d ppl = ppl · d mean NLL). None with
    fewer than two shared items."""
    shared = sorted(set(a_items) & set(b_items))
    if len(shared) < 2:
        return None
    ga, gb = (a[0], b[0]) if metric.removeprefix("test/").startswith("ppl/") else (1.0, 1.0)
    d = np.array([ga * a_items[i] - gb * b_items[i] for i in shared])
    return float(d.std(ddof=1) / math.sqrt(len(d)))


def score_checkpoints(
    checkpoints: Mapping[str, str | Path],
    sets: HeldoutSets,
    cfg: ReportConfig,
    score_general: GeneralScorer | None = None,
    tokenizer: Any = None,
    general_builder: Callable[[], GeneralScorer] | None = None,
) -> dict[str, CheckpointScores]:
    """name -> HF dir (chain order kept) -> name -> its scores and per-item values. The tokenizer defaults to
    the first checkpoint's (every stage of one chain shares it). `general_builder` (picklable: a module-level
    function or a partial of one) builds the general scorer once per scoring process; `score_general` is an
    already built one and keeps the scoring in this process."""
    from training.model import load_model
    from training.tokenizer import load_tokenizer

    if not checkpoints:
        raise ValueError("post-training report: no checkpoints; give name -> HF dir in chain order")
    workers = scoring_workers(cfg, len(checkpoints))
    if workers > 1 and score_general is None:
        return _score_in_workers(checkpoints, sets, cfg, general_builder, workers)
    tokenizer = tokenizer or load_tokenizer(str(next(iter(checkpoints.values()))))
    if score_general is None and general_builder is not None:
        score_general = general_builder()
    out = {}
    for name, path in checkpoints.items():
        log.info("report: scoring %s (%s)", name, path)
        out[name] = score_checkpoint(load_model(path), tokenizer, sets, cfg, score_general)
    return out


def scoring_workers(cfg: ReportConfig, n_checkpoints: int) -> int:
    return worker_count(cfg.workers, n_checkpoints)


_WORKER: dict[str, Any] = {}  # in a scoring process: its tokenizer and general scorer


def _init_worker(tokenizer_dir: str, general_builder) -> None:
    import os

    from infra.cpu import SOLE_RUN_ENV
    from training.tokenizer import load_tokenizer

    os.environ[SOLE_RUN_ENV] = "0"  # a local judge takes its share of the CPUs, not all of them
    _WORKER.update(
        tokenizer=load_tokenizer(tokenizer_dir), general=general_builder() if general_builder else None
    )


def _score_one(path: str, sets: HeldoutSets, cfg: ReportConfig) -> CheckpointScores:
    from training.model import load_model

    return score_checkpoint(load_model(path), _WORKER["tokenizer"], sets, cfg, _WORKER["general"])


def _score_in_workers(checkpoints, sets, cfg, general_builder, workers: int) -> dict[str, CheckpointScores]:
    """Each checkpoint scored in one of `workers` spawned processes; results in chain order."""
    first = str(next(iter(checkpoints.values())))
    jobs = {name: (_score_one, (str(p), sets, cfg)) for name, p in checkpoints.items()}
    return run_in_workers(jobs, workers, "post-training report", _init_worker, (first, general_builder))


def _cell(score: Score | None) -> str:
    if score is None:
        return "—"
    value, se = score
    digits = 2 if abs(value) >= 10 else 3
    return f"{value:.{digits}f} ± {se:.{digits}f}"


def report_table(scores: Mapping[str, Mapping[str, Score]]) -> str:
    """One row per checkpoint (in the given order), one column per metric, each cell `value ± se`."""
    from infra.stage import markdown_table

    metrics = _metric_order(scores)
    rows = [{"checkpoint": name, **{m: _cell(s.get(m)) for m in metrics}} for name, s in scores.items()]
    return markdown_table(rows)


def _metric_order(scores: Mapping[str, Mapping[str, Score]]) -> list[str]:
    seen: dict[str, None] = {}
    for s in scores.values():
        seen.update(dict.fromkeys(s))
    kinds = ("ppl/", "passkey/", "pass_at_1/", "test/", "success/", "general/")
    return sorted(
        seen, key=lambda m: (next((i for i, k in enumerate(kinds) if m.startswith(k)), len(kinds)), m)
    )


def recovery_rows(
    scores: Mapping[str, Mapping[str, Score]],
    parent: str,
    distilled: str,
    teachers: Sequence[str] | None = None,
    items: Mapping[str, Mapping[str, Items]] | None = None,
) -> list[dict[str, Any]]:
    """One distillation, per metric: its best teacher on that metric (of `teachers`; default every checkpoint
    before `parent`), the RL checkpoint `parent` it started from (without distillation) and `distilled` (the
    same parent with distillation); how much `parent` lost against that teacher (`drop`) and how much of it
    `distilled` won back (`recovered`); `within_se` when distilled is within the two SEs
    (sqrt(se_teacher² + se_distilled²)) of the teacher. With per-item values (`items`), the drop's and the
    recovery's paired SEs over the shared items, and `clear drop` when the drop exceeds twice its SE. Signs
    are "better is positive" (perplexity flipped). A metric no teacher has is left out. A `test/<metric>` row
    takes `<metric>`'s teacher."""
    names = list(scores)
    if parent not in scores or distilled not in scores:
        raise ValueError(
            f"recovery: {parent!r} and {distilled!r} must both be checkpoints of the table ({names})"
        )
    candidates = names[: names.index(parent)] if teachers is None else [t for t in teachers if t in scores]
    rows, chosen = [], {}
    for metric in _metric_order(scores):
        sign = 1.0 if higher_is_better(metric) else -1.0
        have = [n for n in candidates if metric in scores[n]]
        if not have or metric not in scores[parent] or metric not in scores[distilled]:
            continue
        dev = chosen.get(metric.removeprefix("test/")) if metric.startswith("test/") else None
        # a test-split row keeps its held-out row's teacher: picking the best teacher on the test split
        # would be a choice made on it
        best = dev if dev in have else max(have, key=lambda n: sign * scores[n][metric][0])
        chosen[metric] = best
        (b, b_se), (p, _), (d, d_se) = scores[best][metric], scores[parent][metric], scores[distilled][metric]
        drop, gain = sign * (b - p), sign * (d - p)
        row = {
            "distilled": distilled, "metric": metric, "teacher": best, "teacher score": _cell(scores[best][metric]),
            "RL stage": parent, "without distillation": _cell(scores[parent][metric]),
            "with distillation": _cell(scores[distilled][metric]),
            "drop": round(drop, 4), "recovered": round(gain, 4),
            "recovered share": round(gain / drop, 2) if drop > 0 else "—",
            "within_se": abs(d - b) <= math.hypot(b_se, d_se),
        }  # fmt: skip
        if items is not None:
            drop_se, gain_se = (
                _paired_se(metric, scores, items, best, parent),
                _paired_se(metric, scores, items, distilled, parent),
            )
            row["drop SE (paired)"] = round(drop_se, 4) if drop_se is not None else "—"
            row["recovered SE (paired)"] = round(gain_se, 4) if gain_se is not None else "—"
            row["clear drop"] = drop_se is not None and drop > 2 * drop_se
        rows.append(row)
    return rows


def _paired_se(metric: str, scores, items, a: str, b: str) -> float | None:
    a_items, b_items = items.get(a, {}).get(metric), items.get(b, {}).get(metric)
    if a_items is None or b_items is None:
        return None
    return paired_difference_se(metric, scores[a][metric], a_items, scores[b][metric], b_items)


def clear_recoveries(rows: Sequence[Mapping[str, Any]], share: float = 0.5) -> list[Mapping[str, Any]]:
    """The held-out (dev) rows where both the drop and distillation's recovery are clear (each over twice its
    paired SE) and the recovery is at least `share` of the drop. Test-split rows are never selected here:
    `test_split_row` looks up the one that checks a selected row."""
    return [r for r in rows if not r["metric"].startswith("test/") and _is_clear(r, share)]


def _is_clear(r: Mapping[str, Any], share: float) -> bool:
    return bool(
        r.get("clear drop") and isinstance(r["recovered share"], float) and r["recovered share"] >= share
        and isinstance(r["recovered SE (paired)"], float) and r["recovered"] > 2 * r["recovered SE (paired)"]
    )  # fmt: skip


def test_split_row(rows: Sequence[Mapping[str, Any]], row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The frozen test split's row for the same distillation and metric as the held-out `row` (None when the
    test split has no such metric), with `holds`: the same clear-recovery criteria met on the test split."""
    for r in rows:
        if r["distilled"] == row["distilled"] and r["metric"] == f"test/{row['metric']}":
            return {**r, "holds": _is_clear(r, 0.5)}
    return None


def plot_report(scores: Mapping[str, Mapping[str, Score]], path: Path, title: str = "") -> Path:
    """One panel per metric: the checkpoints in chain order left to right, each a bar with +-1 SE."""
    from infra.figures import pyplot, save_figure

    metrics = _metric_order(scores)
    cols = min(4, max(1, len(metrics)))
    nrows = max(1, math.ceil(len(metrics) / cols))
    fig, axes = pyplot().subplots(nrows, cols, figsize=(3.6 * cols, 3.0 * nrows), squeeze=False)
    names = list(scores)
    for ax, metric in zip(axes.flat, metrics, strict=False):
        values = [scores[n].get(metric, (float("nan"), 0.0)) for n in names]
        ax.bar(range(len(names)), [v for v, _ in values], yerr=[e for _, e in values], capsize=3,
               color=["tab:blue" if higher_is_better(metric) else "tab:orange"] * len(names))  # fmt: skip
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(metric + ("" if higher_is_better(metric) else " (lower is better)"), fontsize=8)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    return save_figure(fig, path, title)


def post_training_report(
    checkpoints: Mapping[str, str | Path],
    sets: HeldoutSets,
    cfg: ReportConfig,
    out_dir: Path,
    score_general: GeneralScorer | None = None,
    tokenizer: Any = None,
    title: str = "post-training checkpoints on the same held-out sets (±1 SE)",
    general_builder: Callable[[], GeneralScorer] | None = None,
) -> Report:
    """Score every checkpoint (see `score_checkpoints`), render the table and `out_dir/post_training_report.png`."""
    scored = score_checkpoints(checkpoints, sets, cfg, score_general, tokenizer, general_builder)
    scores = {name: c.scores for name, c in scored.items()}
    plot = plot_report(scores, Path(out_dir) / "post_training_report.png", title)
    items = {name: c.items for name, c in scored.items()}
    return Report(scores=scores, markdown=report_table(scores), plot=plot, items=items)
