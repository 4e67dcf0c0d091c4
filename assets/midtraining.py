"""Context-extension midtraining as staged assets (each stage raises the RoPE base or applies YaRN, up-samples
long documents and packs similar ones together), and the evals of every checkpoint (held-out perplexity,
RULER-style passkey retrieval at several lengths and depths, short-context regression)."""

import json
from pathlib import Path

from assets.factory import Check, Launches, tracked_asset
from assets.pipes_launch import CALLBACK, PipesLaunch
from assets.pretraining import SHARDS_PREFIX, local_tokenizer, tokenizer_files
from assets.stage_config import launchpad_config
from infra.committed import commit, fetch_committed, read_committed
from infra.settings import SettingsError, load_profile, validate_stage
from infra.stage import StageResult, markdown_table
from infra.store import ObjectStore
from training import context_extension, evals
from training import data as token_data
from training.context_extension import ContextExtensionConfig
from training.evals import EvalConfig
from training.job import job_key, read_metrics, tree_digest
from training.pretrain import PretrainConfig
from training.tokenizer import load_tokenizer

PROFILE = load_profile()
MidtrainConfig = launchpad_config("context_extension", ContextExtensionConfig, PROFILE)
EvalRunConfig = launchpad_config("checkpoint_evals", EvalConfig, PROFILE)
STAGES = 3  # the graph is the same in every profile: each profile defines three context stages
if len(validate_stage(PROFILE, "context_extension", ContextExtensionConfig).stages) != STAGES:
    raise SettingsError(
        f"{PROFILE.source} (stages.context_extension): field 'stages' must list {STAGES} stages"
    )

CHECKPOINTS = ["base_checkpoint", *[f"midtrain_stage{i}" for i in range(1, STAGES + 1)]]


def checkpoint_prefix(asset: str) -> str:
    return "checkpoints/base" if asset == "base_checkpoint" else f"checkpoints/{asset}"


def local_checkpoint(store: ObjectStore, asset: str) -> Path:
    version = read_committed(store, checkpoint_prefix(asset)).version
    cache = PROFILE.state_path / "cache" / "checkpoints" / asset / version
    return fetch_committed(store, checkpoint_prefix(asset), cache)[1]


def heldout_shards(store: ObjectStore) -> dict[str, list[str]]:
    cache = PROFILE.state_path / "cache" / "token_shards"
    paths = token_data.shard_paths(store, SHARDS_PREFIX, "heldout", cache)
    return {k: [str(p) for p in v] for k, v in paths.items()}


def _midtrain_asset(index: int):
    name, parent = f"midtrain_stage{index}", CHECKPOINTS[index - 1]

    def stage(launch: PipesLaunch, cfg: ContextExtensionConfig, s, _, run) -> StageResult:
        ctx = cfg.stages[index - 1]
        pre = validate_stage(PROFILE, "pretrain", PretrainConfig)
        tok = local_tokenizer(s)
        model_cfg = pre.model.model_copy(
            update={
                "vocab_size": len(load_tokenizer(tok)),
                "bos_token_id": 0,
                "eos_token_id": 0,
                "pad_token_id": 1,
            }
        )
        rows = context_extension.build_midtrain_shards(
            cfg,
            ctx.name,
            s,
            SHARDS_PREFIX,
            tok / "tokenizer.json",
            f"training/midtrain_rows/{ctx.name}",
            PROFILE.state_path / "cache" / "midtrain_rows",
        )
        shards = context_extension.midtrain_shard_paths(
            s, rows.outputs["prefix"], PROFILE.state_path / "cache" / "midtrain_rows"
        )
        parent_dir = local_checkpoint(s, parent)
        # the run dir names the whole job (rows, parent weights, settings): a rerun resumes only the same job
        key = job_key(rows.data_version, tree_digest(parent_dir), cfg.model_dump(mode="json"),
                      pre.model_dump(mode="json"), model_cfg.model_dump(mode="json"))  # fmt: skip
        run_dir = PROFILE.state_path / "runs" / name / key
        hf_dir = context_extension.midtrain_stage(
            parent_dir,
            model_cfg,
            pre.sparse,
            cfg,
            ctx.name,
            [shards.rows],
            run_dir,
            heldout=heldout_shards(s),
            tokenizer_dir=tok,
            distributed=pre.distributed,
            torch_extensions_dir=PROFILE.state_path / "torch_extensions",
            launch=launch,
            callbacks=[CALLBACK],
            recall_shards={n: [p] for n, p in shards.recall.items()},
            recall_eval_shards={n: [p] for n, p in shards.recall_eval.items()},
        )
        for fname, src in tokenizer_files(tok).items():
            if not (hf_dir / fname).exists():
                (hf_dir / fname).write_bytes(Path(src).read_bytes())
        metrics = {f"rows/{k}": v for k, v in rows.metrics.items()}
        final = (token_data_json(hf_dir.parent / "result.json") or {}).get("metrics", {})
        metrics.update({f"final/{k}": v for k, v in final.items() if isinstance(v, int | float)})
        for phase in ctx.recall_curriculum:  # how far the curriculum got: loss on its last batches
            done = (token_data_json(run_dir / f"recall_{phase.seq_len}" / "result.json") or {}).get(
                "metrics", {}
            )
            if "loss" in done:
                metrics[f"recall_curriculum/{phase.seq_len}/loss"] = done["loss"]
            if "eval_loss" in done:  # held-out passkey answers: ln 10 per digit is chance
                metrics[f"recall_curriculum/{phase.seq_len}/answer_nll"] = done["eval_loss"]
        metrics.update({"seq_len": ctx.seq_len, "rope_theta": ctx.rope_theta or 0.0})
        report = f"## {name}: {ctx.name} (seq_len {ctx.seq_len}, {cfg.rope_method})\n\n{rows.report_md}"
        return StageResult(
            metrics=metrics,
            outputs={"checkpoint": s.uri(commit(s, checkpoint_prefix(name), hf_dir).version_prefix)},
            report_md=report,
            artifacts={"checkpoint": hf_dir},
            data_version=rows.data_version + ":" + str(final.get("step", "")),
            history=_history(run_dir),
        )

    return tracked_asset(
        name,
        "One context-extension stage trained from the previous checkpoint (see `context_extension`).",
        config=MidtrainConfig,
        stage=Launches(stage),
        code_modules=[context_extension],
        group="training",
        deps=[parent, "token_shards"],
        register=lambda result: {f"crucible-{name}": "checkpoint"},
        tags={"crucible/resource": "gpu"},
    )


def token_data_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


midtrain_assets = [_midtrain_asset(i) for i in range(1, STAGES + 1)]


def _gate(cfg: EvalConfig, result: StageResult) -> list[tuple[str, bool, dict]]:
    return evals.context_extension_checks(cfg, result.extra["final_vs_base"])


def _evaluate(cfg: EvalConfig, s, _, run) -> StageResult:
    tok, heldout = local_tokenizer(s), heldout_shards(s)
    out_root = PROFILE.state_path / "runs" / "evals"
    metrics: dict[str, float] = {}
    artifacts: dict[str, Path] = {}
    rows = []
    modes = {asset: "dense" if asset == "base_checkpoint" else "native" for asset in CHECKPOINTS}
    per = evals.evaluate_checkpoint_dirs(
        {asset: (local_checkpoint(s, asset), mode) for asset, mode in modes.items()},
        tok,
        heldout,
        cfg,
        out_root,
    )
    for asset, result in per.items():
        metrics.update({f"{asset}/{k}": v for k, v in result.metrics.items()})
        artifacts.update({f"{asset}/{Path(k).name}": v for k, v in result.artifacts.items()})
        rows.append(
            {
                "checkpoint": asset,
                **{
                    k: round(v, 3)
                    for k, v in result.metrics.items()
                    if k.startswith(("passkey/acc/", "ppl/", "dsa/"))
                },
            }
        )
    for parent, child in zip(CHECKPOINTS, CHECKPOINTS[1:], strict=False):
        delta = evals.compare_to_parent(per[parent].metrics, per[child].metrics, cfg.short_seq_len)
        metrics.update({f"{child}/vs_parent/{k}": v for k, v in delta.items()})
    delta = evals.compare_to_parent(
        per[CHECKPOINTS[0]].metrics, per[CHECKPOINTS[-1]].metrics, cfg.short_seq_len
    )
    metrics.update({f"final_vs_base/{k}": v for k, v in delta.items()})
    report = (
        "## Checkpoint evals\n\n"
        + markdown_table(rows)
        + "\n\n### Final vs base\n\n"
        + markdown_table([{"metric": k, "value": round(v, 4)} for k, v in sorted(delta.items())])
    )
    return StageResult(
        metrics=metrics,
        report_md=report,
        artifacts=artifacts,
        data_version=",".join(r.data_version for r in per.values()),
        extra={"final_vs_base": delta},
    )


checkpoint_evals = tracked_asset(
    "checkpoint_evals",
    "Every checkpoint's held-out perplexity and passkey accuracy, and each stage against its parent.",
    config=EvalRunConfig,
    stage=_evaluate,
    code_modules=[evals],
    group="training",
    deps=[*CHECKPOINTS, "token_shards"],
    upstream=CHECKPOINTS,
    checks=[
        Check(
            "passkey_gain_at_longest",
            "Passkey accuracy at the longest length: final checkpoint >= base + min_passkey_gain",
            blocking=False,
        ),
        Check(
            "short_ppl_within_margin",
            "Short-context perplexity: final / base <= max_short_ppl_ratio for every source",
            blocking=False,
        ),
    ],
    evaluate=_gate,
)


def _history(run_dir: Path) -> list[dict]:
    """Per-step metrics of the stage's phases: `main` as is, the others (indexer warm-up, the recall
    curriculum's lengths) under their phase name."""
    rows = []
    for phase_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        prefix = "" if phase_dir.name == "main" else f"{phase_dir.name}/"
        for r in read_metrics(phase_dir):
            rows.append(
                {"step": r["step"], **{prefix + k: v for k, v in r.items() if k not in ("step", "time")}}
            )
    return rows
