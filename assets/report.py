"""The post-training results table: every checkpoint from the last midtraining stage to the distilled one,
scored on the same held-out sets (perplexity, passkey at the longest length, reasoning pass@1, agentic
success, General RL's hybrid-reward components), each cell with its standard error, as Markdown and one PNG.
Each distillation's parent RL checkpoint is in the table too, so its effect is shown against the same parent
without it."""

import functools
import hashlib
import json
from pathlib import Path

from assets.distill import DISTILLATIONS, TEACHER_STAGES
from assets.factory import tracked_asset
from assets.midtraining import heldout_shards, local_checkpoint
from assets.post_training import AGENTIC_TASKS_PREFIX, PARENT, TASKS_PREFIX, _local
from assets.pretraining import SHARDS_PREFIX
from assets.stage_config import launchpad_config
from infra.committed import is_committed
from infra.figures import artifact_dir
from infra.settings import load_profile, validate_stage
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from training import report
from training.agentic.families import read_agentic_facts, read_agentic_tasks
from training.report import (
    ReportConfig,
    build_heldout_sets,
    clear_recoveries,
    post_training_report,
    recovery_rows,
    test_split_row,
)
from training.tasks.suites import read_facts, read_tasks
from training.tokenizer import load_tokenizer

PROFILE = load_profile()
ReportRunConfig = launchpad_config("post_training_report", ReportConfig, PROFILE)


def _chain_prefixes() -> dict[str, str]:
    """Table name -> checkpoint prefix in chain order: each RL stage, then its distillation."""
    after = {d.parent: d for d in DISTILLATIONS}
    out = {}
    for stage in TEACHER_STAGES:
        out[stage] = f"checkpoints/{stage}_checkpoint"
        if stage in after:
            out[after[stage].name] = f"checkpoints/{after[stage].asset}"
    return out


def _chain(s: ObjectStore) -> dict[str, Path]:
    """name -> local HF dir in chain order: the midtrained parent of SFT, each committed post-training stage."""
    out = {PARENT: local_checkpoint(s, PARENT)}
    for name, prefix in _chain_prefixes().items():
        if is_committed(s, prefix):
            out[name] = _local(s, prefix, prefix)
    return out


def _general_builder(s: ObjectStore, cfg: ReportConfig, facts: list):
    """A picklable builder of General RL's hybrid reward scorer (the stage's own config, ORM and judge) on
    its held-out prompts, when its prompts and ORM are committed; None otherwise (the table then has no
    general/ columns). Built once in each scoring process."""
    from assets.general import GENERAL_PROMPTS_PREFIX, ORM_PREFIX
    from infra.packaged import LID_176, packaged_file
    from training.rl.general import heldout_subset
    from training.rl.general_job import GeneralRLStageConfig, build_general_scorer

    if not (is_committed(s, GENERAL_PROMPTS_PREFIX) and is_committed(s, ORM_PREFIX)):
        return None
    stage = validate_stage(PROFILE, "general_rl", GeneralRLStageConfig)
    prompts = read_tasks(_local(s, GENERAL_PROMPTS_PREFIX, "general_prompts") / "heldout.jsonl")
    return functools.partial(
        build_general_scorer, stage.reward, facts, str(_local(s, ORM_PREFIX, "outcome_reward_model")),
        stage.judge, str(PROFILE.state_path / "cache" / "judge_general"), str(packaged_file(LID_176)),
        heldout_subset(prompts, cfg.general_prompts), cfg.general_max_new_tokens,
    )  # fmt: skip


def _report(cfg: ReportConfig, s, _, run) -> StageResult:
    checkpoints = _chain(s)
    tok = load_tokenizer(str(checkpoints[PARENT]))
    tasks_dir, agentic_dir = (
        _local(s, TASKS_PREFIX, "task_suites"),
        _local(s, AGENTIC_TASKS_PREFIX, "agentic_tasks"),
    )
    facts = read_facts(tasks_dir / "facts.jsonl")
    text = (
        heldout_shards(s) if is_committed(s, SHARDS_PREFIX) else None
    )  # perplexity and passkey need the shards
    test = tasks_dir / "test.jsonl"
    sets = build_heldout_sets(
        tok, cfg, text, read_tasks(tasks_dir / "heldout.jsonl"), facts,
        read_agentic_tasks(agentic_dir)["heldout"], read_agentic_facts(agentic_dir),
        read_tasks(test) if test.exists() else [],
    )  # fmt: skip
    out = artifact_dir("post-training-report-")
    general = _general_builder(s, cfg, facts)
    result = post_training_report(checkpoints, sets, cfg, out, tokenizer=tok, general_builder=general)
    md = (
        "## Post-training checkpoints on the same held-out sets (value ± standard error)\n\n"
        + result.markdown
    )
    recovery = [
        row
        for d in DISTILLATIONS
        if d.name in checkpoints and d.parent in checkpoints
        for row in recovery_rows(
            result.scores, d.parent, d.name, [t for t in d.teachers if t != d.parent], result.items
        )
    ]
    if recovery:
        md += _recovery_md(recovery)
    counts = {
        "texts": sum(len(r) for r in sets.text_rows.values()), "passkey": len(sets.passkey),
        "reasoning": len(sets.reasoning), "agentic": len(sets.agentic), "test split tasks": len(sets.test),
    }  # fmt: skip
    md += "\n\nheld-out items: " + ", ".join(f"{k} {v}" for k, v in counts.items())
    md += _ppl_test_md(sets.test_text_rows, cfg)
    if general is None:
        md += "\n\nno committed General RL prompts / outcome reward model: general-reward components left out"
    if text is None:
        md += f"\n\nno committed token shards ({SHARDS_PREFIX}): perplexity and passkey left out"
    items = out / "report_items.json"  # every checkpoint's per-item values: the paired SEs can be redone
    items.write_text(json.dumps(result.items, sort_keys=True))
    return StageResult(
        metrics=result.flat_metrics(),
        report_md=md,
        artifacts={"plots/post_training_report.png": result.plot, "report_items.json": items},
        data_version=",".join(p.name for p in checkpoints.values()),
    )


def _ppl_test_md(rows: dict, cfg: ReportConfig) -> str:
    """Which sources have a perplexity test split, and the digest of its rows (the same for every checkpoint)."""
    if not cfg.test_split or not cfg.ppl_test_tokens:
        return ""
    parts = [
        f"{s} {len(r)} rows (sha256 {hashlib.sha256(r.numpy().tobytes()).hexdigest()[:16]})"
        for s, r in sorted(rows.items())
    ]
    return f"\n\nperplexity test split (held-out tokens past {cfg.ppl_test_after_tokens:,}): " + (
        "; ".join(parts) or "none: no source has that many held-out tokens"
    )


def _recovery_md(rows: list[dict]) -> str:
    clear = clear_recoveries(rows)
    headline = (
        "Drops larger than twice their paired SE that distillation recovered, by more than twice the "
        "recovery's paired SE and by at least half the drop, on the held-out (dev) items: "
        + ("; ".join(_recovery_line(r, test_split_row(rows, r)) for r in clear) or "none")
    )
    return (
        "\n\n### Each distillation against the same RL checkpoint without it (drop = the best earlier "
        "teacher minus the RL checkpoint; recovered = distilled minus the RL checkpoint; paired SEs over the "
        "same items; `test/` rows: the frozen test split, with the held-out row's teacher)\n\n"
        + headline + "\n\n" + markdown_table(rows)
    )  # fmt: skip


def _recovery_line(r: dict, test: dict | None) -> str:
    line = (
        f"{r['metric']} after {r['RL stage']}: drop {r['drop']} ± {r['drop SE (paired)']}, "
        f"recovered {r['recovered']} ± {r['recovered SE (paired)']} ({r['recovered share']:.0%}) "
        f"by {r['distilled']}"
    )
    if test is None:
        return line + " (no test-split check: not scored)"
    verdict = "holds" if test["holds"] else "does not hold"
    return (
        f"{line}; on the frozen test split it {verdict}: drop {test['drop']} ± {test['drop SE (paired)']}, "
        f"recovered {test['recovered']} ± {test['recovered SE (paired)']}"
    )


post_training_report_asset = tracked_asset(
    "post_training_report",
    "Every post-training checkpoint (midtrained parent to distilled) on the same held-out sets, each number\n"
    "with its standard error: perplexity, passkey, reasoning pass@1, agentic success, general-reward components.",
    config=ReportRunConfig,
    stage=_report,
    code_modules=[report],
    group="post_training",
    deps=[
        PARENT,
        *[f"{stage}_checkpoint" for stage in TEACHER_STAGES],
        *[d.asset for d in DISTILLATIONS],
        "general_prompts",
        "outcome_reward_model",
        "task_suites",
        "agentic_tasks",
        "token_shards",
    ],  # fmt: skip
)

report_assets = [post_training_report_asset]
