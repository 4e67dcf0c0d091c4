"""Tokenizer, token shards and pretraining of the GLM-5 architecture. These assets read every curated
partition that exists when they run (web, code, math, rescued knowledge) and record which ones in MLflow."""

from pathlib import Path

import dagster as dg

from assets.factory import Launches, tracked_asset
from assets.pipes_launch import CALLBACK, PipesLaunch
from assets.stage_config import launchpad_config
from infra.committed import commit, fetch_committed, is_committed, read_committed
from infra.settings import load_profile
from infra.store import ObjectStore
from training import data as token_data
from training import pretrain, tokenizer
from training.data import MixtureConfig
from training.job import DataSpec, job_key
from training.pretrain import PretrainConfig
from training.tokenizer import TokenizerConfig

PROFILE = load_profile()
TokenizerRunConfig = launchpad_config("tokenizer", TokenizerConfig, PROFILE)
TokenShardsRunConfig = launchpad_config("token_shards", MixtureConfig, PROFILE)
PretrainRunConfig = launchpad_config("pretrain", PretrainConfig, PROFILE)

CORPUS = ["web_deduped", "code_deduped", "math_filtered", "web_rescued"]
TOKENIZER_PREFIX = "training/tokenizer"
SHARDS_PREFIX = "training/token_shards"


def _committed_snapshots(store: ObjectStore, prefix: str) -> list[str]:
    return [s for s in store.list_prefixes(prefix) if is_committed(store, f"{prefix}/{s}")]


def corpus_sources(store: ObjectStore) -> dict[str, list[str]]:
    """Source -> store prefixes of every curated partition present now: deduplicated where dedup ran,
    else the filtered documents; math and rescued knowledge as their own sources."""
    deduped_web = set(_committed_snapshots(store, "dedup/web"))
    deduped_code = set(_committed_snapshots(store, "dedup/code"))
    web = [f"dedup/web/{s}/kept/" for s in sorted(deduped_web)] + [
        f"web/filtered/{s}/kept/" for s in _committed_snapshots(store, "web/filtered") if s not in deduped_web
    ]
    code = [f"dedup/code/{s}/kept/" for s in sorted(deduped_code)] + [
        f"code/files/{s}/" for s in _committed_snapshots(store, "code/files") if s not in deduped_code
    ]
    sources = {
        "web": web,
        "code": code,
        "math": [f"math/filtered/{tag}/kept/" for tag in _committed_snapshots(store, "math/filtered")],
        "knowledge": [f"knowledge/rescued/{s}/" for s in _committed_snapshots(store, "knowledge/rescued")],
    }
    return {name: prefixes for name, prefixes in sources.items() if prefixes}


def local_tokenizer(store: ObjectStore) -> Path:
    version = read_committed(store, TOKENIZER_PREFIX).version
    return fetch_committed(store, TOKENIZER_PREFIX, PROFILE.state_path / "cache" / "tokenizer" / version)[1]


def _train_tokenizer(cfg: TokenizerConfig, s, _, run):
    sources = corpus_sources(s)
    dg.get_dagster_logger().info("tokenizer sources: %s", sources)
    out_dir = PROFILE.state_path / "runs" / "tokenizer"
    result = tokenizer.tokenizer_stage(cfg, s, sources, out_dir, TOKENIZER_PREFIX)
    result.artifacts["tokenizer"] = Path(result.outputs["tokenizer_dir"])
    return result


corpus_tokenizer = tracked_asset(
    "corpus_tokenizer",
    "Byte-level BPE with chat / tool / thinking special tokens and a chat template (`tokenizer.json`).",
    config=TokenizerRunConfig,
    stage=_train_tokenizer,
    code_modules=[tokenizer],
    group="training",
    deps=CORPUS,
)


def _build_shards(cfg: MixtureConfig, s, _, run):
    tok = local_tokenizer(s)
    return token_data.build_token_shards(cfg, s, corpus_sources(s), tok / "tokenizer.json", SHARDS_PREFIX)


token_shards = tracked_asset(
    "token_shards",
    "Tokenized train / held-out shards per source with document boundaries and the mixture's weights.",
    config=TokenShardsRunConfig,
    stage=_build_shards,
    code_modules=[token_data],
    group="training",
    deps=[*CORPUS, "corpus_tokenizer"],
)


def shard_specs(s: ObjectStore, seed: int, repeat_share: float = 0.0) -> tuple[DataSpec, DataSpec, str]:
    """Train / held-out batch factories over the current token shards, and the shards' data version.
    `repeat_share` of the training rows repeat a passage (see `training.data.TokenBatches`)."""
    cache = PROFILE.state_path / "cache" / "token_shards"
    train = {
        k: [str(p) for p in v] for k, v in token_data.shard_paths(s, SHARDS_PREFIX, "train", cache).items()
    }
    held = {
        k: [str(p) for p in v] for k, v in token_data.shard_paths(s, SHARDS_PREFIX, "heldout", cache).items()
    }
    manifest = token_data.token_manifest(s, SHARDS_PREFIX)
    weights = {k: w for k, w in manifest.get("weights", {}).items() if k in train}
    version = manifest.get("data_version", "")
    kwargs = {"shard_paths": train, "seed": seed, "weights": weights or None, "repeat_share": repeat_share}
    return (
        DataSpec(factory="training.data:token_batches", kwargs=kwargs),
        DataSpec(factory="training.data:heldout_batches", kwargs={"shard_paths": held}),
        version,
    )


def tokenizer_files(tok: Path) -> dict[str, str]:
    return {p.name: str(p) for p in tok.iterdir() if p.is_file()}


def _pretrain(launch: PipesLaunch, cfg: PretrainConfig, s, _, run):
    tok = local_tokenizer(s)
    vocab = len(tokenizer.load_tokenizer(tok))
    cfg = cfg.model_copy(
        update={
            "model": cfg.model.model_copy(
                update={"vocab_size": vocab, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 1}
            )
        }
    )
    data, eval_data, version = shard_specs(s, seed=cfg.dense.seed, repeat_share=cfg.repeat_share)
    manifest = token_data.token_manifest(s, SHARDS_PREFIX)
    tokens = {k: v["train_tokens"] for k, v in manifest["sources"].items() if k in data.kwargs["shard_paths"]}
    weights, mixture_metrics = pretrain.pretrain_mixture(cfg, data.kwargs["weights"] or tokens, tokens)
    data = DataSpec(factory=data.factory, kwargs={**data.kwargs, "weights": weights})
    # named by data and settings both: a rerun with other settings must not resume this run's checkpoints
    run_root = PROFILE.state_path / "runs" / "pretrain" / job_key(version, cfg.model_dump(mode="json"))
    result = pretrain.run_pretraining(
        cfg,
        run_root,
        data,
        eval_data,
        extra_files=tokenizer_files(tok),
        torch_extensions_dir=PROFILE.state_path / "torch_extensions",
        callbacks=[CALLBACK],
        launch=launch,
    )
    result.metrics.update(mixture_metrics)
    hf_dir = Path(result.outputs["hf_dir"])
    result.outputs["checkpoint"] = s.uri(commit(s, "checkpoints/base", hf_dir).version_prefix)
    result.artifacts["checkpoint"] = hf_dir
    return result


base_checkpoint = tracked_asset(
    "base_checkpoint",
    "GLM-5 (MLA + DSA + MoE) pretrained in three phases: dense LM, DSA indexer warm-up on its KL loss,\n"
    "sparse training; each phase is a separate process launched over Dagster Pipes.",
    config=PretrainRunConfig,
    stage=Launches(_pretrain),
    code_modules=[pretrain],
    group="training",
    deps=["token_shards", "corpus_tokenizer"],
    register=lambda result: {"crucible-base": "checkpoint"},
    tags={"crucible/resource": "gpu"},
)
