"""Evals run on every checkpoint: held-out perplexity per source (short and long context) and RULER-style
passkey retrieval at several lengths and depths, scored as multiple choice by log-likelihood (chance =
1/num_choices, so the numbers mean something even for a few-million-parameter model). One PNG per eval."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tqdm import tqdm

from infra.stage import StageResult
from training.data import TokenStream, iter_shard_documents, load_shard
from training.dsa_indexer import collect_dsa_stats, current_dsa_mode, set_dsa_mode
from training.recall_tasks import FillerText, PasskeyItem, passkey_items, repeat_sequence
from training.worker_pool import Workers, run_in_workers, worker_count

log = logging.getLogger(__name__)

# (prompt ids, list of continuation ids) -> log-likelihood of each continuation
ChoiceScorer = Callable[[np.ndarray, list[list[int]]], np.ndarray]

# DSA mode asked for -> the mode the eval runs: the same attention, computed faster (no KV cache in evals).
EVAL_DSA_MODES = {"native": "sparse_gather"}


MIN_COPY_SEQ_LEN = 24  # repeat_sequence's passage is seq_len // 8 .. seq_len // 3 tokens


class EvalConfig(BaseModel):
    """Checkpoint eval settings (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    short_seq_len: int = Field(
        256, ge=8, description="Context of the short-context perplexity (pretraining length)"
    )
    long_seq_len: int | None = Field(
        None, description="Context of the long perplexity; None = the longest passkey length"
    )
    ppl_max_tokens: int = Field(
        32_768, ge=64, description="Held-out tokens scored per source and context length"
    )
    passkey_lengths: list[int] = Field(
        [256, 512, 1024], description="Passkey prompt lengths (tokens); 1024 = 4x the pretraining context"
    )
    passkey_depths: list[float] = Field([0.1, 0.3, 0.5, 0.7, 0.9], description="Needle depths (0 = start)")
    # 45 x 5 depths = 225 items per length: SE <= 0.034 per accuracy, so the SE of a gain between two
    # checkpoints is <= 0.047 and a 10-point change is outside 2 SE (> 2.1 SE; 200 items: exactly 2 SE)
    passkey_per_cell: int = Field(45, ge=1, description="Items per (length, depth) cell")
    passkey_choices: int = Field(4, ge=2, description="Candidate keys per item (chance = 1/choices)")
    passkey_digits: int = Field(5, ge=1, description="Digits per key")
    indexer_rows: int = Field(
        8,
        ge=0,
        description="Held-out rows (longest context) for the DSA indexer's top-k mass, trained vs fresh",
    )
    copy_rows: int = Field(
        32,
        ge=0,
        description="Held-out rows (short context) that repeat a passage after a gap, for the in-context copy "
        "eval (0 = off)",
    )
    filler_source: str = Field("web", description="Held-out source whose text fills the passkey haystack")
    batch_size: int = Field(4, ge=1, description="Sequences per forward pass")
    seed: int = Field(1234, description="Seed of the passkey set (same set for every checkpoint)")
    min_passkey_gain: float = Field(
        0.15, description="Check: final passkey accuracy at the longest length must beat the base by this"
    )
    max_short_ppl_ratio: float = Field(
        1.10, gt=0, description="Check: final / base short-context perplexity may not exceed this per source"
    )
    # One 256-token row is too few: per-row log-ratios of final / base spread with a standard deviation of
    # 0.16-0.33 in tiny (math, code), so a one-row ratio is +-15-30% noise against a 10% margin.
    min_ppl_rows: int = Field(
        16,
        ge=1,
        description="Check: every source's short-context perplexity averages at least this many held-out rows; "
        "fewer fail the short-perplexity check (raise the mixture's heldout_min_docs or heldout_fraction)",
    )
    checks_warn_only: bool = Field(
        False, description="Report failed checks as warnings (profiles whose models are too small to learn)"
    )
    # two midtrained stages on 2 cores: 133 s in turn at 2 threads, 92 s side by side at 1 thread each
    workers: Workers = Field(
        "auto",
        description="Processes evaluating checkpoints side by side, each with CPUs / workers torch threads; "
        "auto = min(CPUs, checkpoints); 1 = in this process",
    )

    @model_validator(mode="after")
    def _copy_rows_fit(self) -> EvalConfig:
        if self.copy_rows and self.short_seq_len < MIN_COPY_SEQ_LEN:
            raise ValueError(
                f"copy_rows needs short_seq_len >= {MIN_COPY_SEQ_LEN} (a passage, a gap and the passage again), "
                f"got {self.short_seq_len}; set copy_rows: 0 to turn the copy eval off"
            )
        return self


@dataclass
class EvalReport:
    metrics: dict[str, float] = field(default_factory=dict)
    plots: dict[str, Path] = field(default_factory=dict)
    tables: dict[str, list[dict]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- perplexity


def _logits(model: torch.nn.Module, input_ids: torch.Tensor, keep: int = 0) -> torch.Tensor:
    """Logits [B, T, V] (only the last `keep` positions if keep > 0) of an HF causal LM or any module."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        out = model(input_ids=input_ids, use_cache=False, logits_to_keep=keep)
    else:
        out = model(input_ids=input_ids)
    logits = out.logits if hasattr(out, "logits") else out
    return logits[:, -keep:] if keep else logits


@torch.no_grad()
def token_nll(model: torch.nn.Module, rows: torch.Tensor, batch_size: int = 4) -> tuple[float, int]:
    """Summed next-token negative log-likelihood over `rows` [N, T] and the number of predicted tokens."""
    total, count = 0.0, 0
    for i in range(0, len(rows), batch_size):
        batch = rows[i : i + batch_size]
        logits = _logits(model, batch)[:, :-1].float()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
        total += float(nll)
        count += batch[:, 1:].numel()
    return total, count


def heldout_rows(paths: Sequence[str | Path], seq_len: int, max_tokens: int) -> torch.Tensor:
    """Consecutive non-overlapping windows of `seq_len` from the start of the held-out stream (deterministic)."""
    stream = TokenStream(paths)
    n_rows = max(1, min(max_tokens, stream.num_tokens) // seq_len)
    return torch.from_numpy(np.stack([stream.read(i * seq_len, seq_len) for i in range(n_rows)]))


def tail_rows(paths: Sequence[str | Path], seq_len: int, max_tokens: int, after: int) -> torch.Tensor | None:
    """Consecutive windows of `seq_len` over up to `max_tokens` at the end of the held-out stream, from a
    document start at or after `after` (the latest one that leaves `max_tokens` to read, else the first):
    disjoint by document from every read of the stream's first `after` tokens. None when no whole window
    fits."""
    stream = TokenStream(paths)
    starts = np.concatenate(
        [base + load_shard(p)[1][:-1] for base, p in zip(stream.starts[:-1], stream.paths, strict=True)]
    )
    starts = starts[starts >= after]
    if not len(starts):
        return None
    fits = starts[starts <= stream.num_tokens - max_tokens]
    first = int(fits[-1] if len(fits) else starts[0])
    n_rows = min(max_tokens, stream.num_tokens - first) // seq_len
    if n_rows < 1:
        return None
    return torch.from_numpy(np.stack([stream.read(first + i * seq_len, seq_len) for i in range(n_rows)]))


def perplexity(model: torch.nn.Module, rows: torch.Tensor, batch_size: int = 4) -> float:
    """exp(mean next-token NLL) over `rows`."""
    total, count = token_nll(model, rows, batch_size)
    return math.exp(total / count)


# ---------------------------------------------------------------------------------------------- passkey


def model_choice_scorer(model: torch.nn.Module, batch_size: int = 4) -> ChoiceScorer:
    """Scores continuations by the model's summed log-probability given the prompt.

    An HF model reads the prompt once: every choice follows it in one packed row, attending to the prompt
    and to its own earlier tokens only, at the positions it would have after the prompt alone (the same keys
    and positions as a row of its own, so the same scores up to float rounding; ~n_choices x less compute).
    Other modules score `batch_size` rows of prompt + choice at a time."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return lambda prompt, choices: _packed_choice_scores(model, prompt, choices)

    @torch.no_grad()
    def score(prompt: np.ndarray, choices: list[list[int]]) -> np.ndarray:
        width = max(len(c) for c in choices)
        scores = []
        for i in range(0, len(choices), batch_size):
            group = choices[i : i + batch_size]
            rows = np.stack([np.concatenate([prompt, c + [0] * (width - len(c))]) for c in group])
            ids = torch.from_numpy(rows.astype(np.int64))
            # Only the positions that predict the choice tokens: the last `width + 1` minus the final one.
            logp = torch.log_softmax(_logits(model, ids, keep=width + 1)[:, :-1].float(), dim=-1)
            for j, c in enumerate(group):
                scores.append(float(logp[j, torch.arange(len(c)), torch.tensor(c)].sum()))
        return np.array(scores)

    return score


def packed_choices(prompt_len: int, choices: Sequence[Sequence[int]]) -> tuple[torch.Tensor, ...]:
    """The prompt followed by every choice in one row: (token positions [S], bool mask [S, S] (query, key),
    the index predicting each choice token [sum len(c)], the choice tokens [sum len(c)])."""
    lengths = [len(c) for c in choices]
    total = prompt_len + sum(lengths)
    positions = torch.arange(total)
    mask = torch.ones(total, total, dtype=torch.bool).tril()
    predictors, start = [], prompt_len
    for n in lengths:
        positions[start : start + n] = torch.arange(prompt_len, prompt_len + n)
        mask[start : start + n, prompt_len:start] = False  # earlier choices are not this choice's context
        predictors += [prompt_len - 1, *range(start, start + n - 1)]
        start += n
    targets = torch.tensor([t for c in choices for t in c], dtype=torch.int64)
    return positions, mask, torch.tensor(predictors), targets


@torch.no_grad()
def _packed_choice_scores(model: torch.nn.Module, prompt: np.ndarray, choices: list[list[int]]) -> np.ndarray:
    positions, mask, predictors, targets = packed_choices(len(prompt), choices)
    ids = torch.cat((torch.from_numpy(np.asarray(prompt, dtype=np.int64)), targets)).unsqueeze(0)
    logits = model(
        input_ids=ids,
        attention_mask=mask[None, None],
        position_ids=positions.unsqueeze(0),
        use_cache=False,
        logits_to_keep=predictors,
    ).logits[0]
    token_logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None])[:, 0]
    return np.array([float(x.sum()) for x in token_logp.split([len(c) for c in choices])])


def passkey_hits(scorer: ChoiceScorer, items: Sequence[PasskeyItem]) -> list[bool]:
    """Whether the scorer ranks each item's true key first."""
    return [
        int(np.argmax(scorer(item.prompt, item.choices))) == item.answer
        for item in tqdm(items, desc="passkey", leave=False)
    ]


def passkey_accuracy(scorer: ChoiceScorer, items: Sequence[PasskeyItem]) -> dict[str, float]:
    """Multiple-choice accuracy overall, per length and per (length, depth)."""
    hits: dict[tuple[int, float], list[bool]] = {}
    for item, hit in zip(items, passkey_hits(scorer, items), strict=True):
        hits.setdefault((item.length, item.depth), []).append(hit)
    metrics: dict[str, float] = {}
    for length in sorted({k[0] for k in hits}):
        cells = {d: h for (n, d), h in hits.items() if n == length}
        flat = [x for h in cells.values() for x in h]
        metrics[f"passkey/acc/{length}"] = float(np.mean(flat))
        # binomial standard error: with n items a change is real only well outside 2 * sqrt(se1^2 + se2^2)
        metrics[f"passkey/se/{length}"] = float(np.sqrt(np.mean(flat) * (1 - np.mean(flat)) / len(flat)))
        metrics[f"passkey/n/{length}"] = float(len(flat))
        for depth, h in sorted(cells.items()):
            metrics[f"passkey/acc/{length}/depth_{depth:.2f}"] = float(np.mean(h))
    metrics["passkey/acc"] = float(np.mean([x for h in hits.values() for x in h]))
    return metrics


# ---------------------------------------------------------------------------------------------- in-context copy


@torch.no_grad()
def copy_scores(
    model: torch.nn.Module,
    filler: FillerText,
    n_rows: int,
    seq_len: int,
    eos_id: int,
    seed: int,
    batch_size: int = 4,
) -> dict[str, float]:
    """How much better the model predicts a passage the second time it reads it (induction / copy heads).

    Rows are `repeat_sequence`'s (a passage, unrelated text, the passage again); each copy is scored on its
    tokens after the first, by mean NLL and top-1 accuracy. `copy/gain` = NLL of the first copy - NLL of the
    second: about 0 for a model that cannot look back for a match, large for one that copies."""
    rng = np.random.default_rng(seed)
    rows, firsts, seconds = [], [], []
    for _ in range(n_rows):
        row, second = repeat_sequence(filler, rng, seq_len, eos_id)
        start, length = int(np.argmax(second)), int(second.sum())
        first = np.zeros_like(second)
        first[1:length] = True
        second = np.zeros_like(second)
        second[start + 1 : start + length] = True
        rows.append(row)
        firsts.append(first)
        seconds.append(second)
    sums = {"nll_first": 0.0, "nll_second": 0.0, "acc_first": 0.0, "acc_second": 0.0}
    for i in range(0, n_rows, batch_size):
        batch = torch.from_numpy(np.stack(rows[i : i + batch_size]))
        logits = _logits(model, batch)[:, :-1].float()
        nll = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")  # [B, T - 1]
        hit = (logits.argmax(-1) == batch[:, 1:]).float()
        for name, masks in (("first", firsts), ("second", seconds)):
            # token t is predicted at position t - 1
            mask = torch.from_numpy(np.stack(masks[i : i + batch_size]))[:, 1:]
            sums[f"nll_{name}"] += float(nll[mask].sum())
            sums[f"acc_{name}"] += float(hit[mask].sum())
    tokens = float(sum(int(m.sum()) for m in firsts))  # both copies score the same number of tokens
    metrics = {f"copy/{k}": v / tokens for k, v in sums.items()}
    metrics["copy/gain"] = metrics["copy/nll_first"] - metrics["copy/nll_second"]
    metrics["copy/tokens"] = tokens
    return metrics


# ---------------------------------------------------------------------------------------------- DSA indexer


@torch.no_grad()
def indexer_topk_mass(model: torch.nn.Module, rows: torch.Tensor, batch_size: int = 4, seed: int = 0) -> dict:
    """Share of the dense main attention mass that falls inside the indexer's top-k (queries with more than
    `index_topk` keys), for the model's own indexer and for a freshly initialised copy of it (what
    `transformers` leaves untrained), plus the best any top-k could hold. Dense forward, so both indexers see
    the same hidden states; the model's DSA mode is restored afterwards."""

    def mass(m: torch.nn.Module) -> tuple[float, float]:
        totals = np.zeros(3)
        for i in range(0, len(rows), batch_size):
            m(input_ids=rows[i : i + batch_size], use_cache=False)
            stats = collect_dsa_stats(m)
            totals += [float(stats[k]) for k in ("topk_mass_sum", "oracle_mass_sum", "long_queries")]
        return totals[0] / max(totals[2], 1), totals[1] / max(totals[2], 1)

    mode = current_dsa_mode(model)
    fresh = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for name, param in fresh.named_parameters():
        if ".indexer." in name:  # transformers' init: normal(0, initializer_range) weights, unit norms
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * model.config.initializer_range)
            else:
                param.fill_(1.0 if "norm.weight" in name else 0.0)
    set_dsa_mode(fresh, "indexer_warmup")
    untrained, _ = mass(fresh)
    set_dsa_mode(model, "indexer_warmup")
    try:
        trained, oracle = mass(model)
    finally:
        set_dsa_mode(model, mode)
    return {
        "dsa/topk_mass": float(trained),
        "dsa/topk_mass_untrained_indexer": float(untrained),
        "dsa/topk_mass_oracle": float(oracle),
    }


# ---------------------------------------------------------------------------------------------- plots


def _plot_perplexity(metrics: Mapping[str, float], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(k for k in metrics if k.startswith("ppl/"))
    sources = sorted({k.split("/")[2] for k in keys})
    contexts = sorted({int(k.split("/")[1].removeprefix("ctx_")) for k in keys})
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.8 / max(len(contexts), 1)
    for i, ctx in enumerate(contexts):
        values = [metrics.get(f"ppl/ctx_{ctx}/{s}", np.nan) for s in sources]
        ax.bar(np.arange(len(sources)) + i * width, values, width, label=f"context {ctx}")
    ax.set_xticks(np.arange(len(sources)) + width * (len(contexts) - 1) / 2, sources)
    ax.set_ylabel("held-out perplexity")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_passkey(metrics: Mapping[str, float], config: EvalConfig, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths, depths = config.passkey_lengths, config.passkey_depths
    grid = np.array(
        [[metrics.get(f"passkey/acc/{n}/depth_{d:.2f}", np.nan) for n in lengths] for d in depths]
    )
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2, 0.5 * len(depths) + 2))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    for (r, c), v in np.ndenumerate(grid):
        ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(f"{title} (chance {1 / config.passkey_choices:.2f})")
    fig.colorbar(im, ax=ax, label="accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------- entry point


def evaluate_checkpoint(
    model: torch.nn.Module,
    encode: Callable[[str], list[int]],
    heldout: Mapping[str, Sequence[str | Path]],
    config: EvalConfig,
    out_dir: str | Path,
    eos_id: int,
    label: str = "checkpoint",
) -> EvalReport:
    """Held-out perplexity per source at short and long context, passkey accuracy on the RULER-style grid, and
    in-context copy (`copy_scores`) at the short context.

    heldout: source -> held-out token shard paths (from `training.data.shard_paths(..., "heldout")`).
    encode: text -> token ids (the checkpoint's tokenizer). Returns metrics, plot paths and tables.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    was_training = model.training
    model.eval()
    report = EvalReport()
    long_len = config.long_seq_len or max(config.passkey_lengths)
    contexts = sorted({config.short_seq_len, long_len})
    rows = []
    for source, paths in sorted(heldout.items()):
        for ctx in contexts:
            data = heldout_rows(paths, ctx, config.ppl_max_tokens)
            ppl = perplexity(model, data, config.batch_size)
            report.metrics[f"ppl/ctx_{ctx}/{source}"] = ppl
            report.metrics[f"ppl_rows/ctx_{ctx}/{source}"] = float(len(data))
            rows.append(
                {"source": source, "context": ctx, "tokens": int(data.numel()), "perplexity": round(ppl, 3)}
            )
    report.tables["perplexity"] = rows
    if config.indexer_rows and getattr(getattr(model, "config", None), "index_topk", None):
        per_source = -(-config.indexer_rows // len(heldout))
        long_rows = torch.cat([heldout_rows(p, long_len, per_source * long_len) for p in heldout.values()])
        report.metrics.update(indexer_topk_mass(model, long_rows, config.batch_size))
    report.plots["evals/perplexity.png"] = _plot_perplexity(report.metrics, out_dir / "perplexity.png", label)

    filler_paths = heldout.get(config.filler_source) or next(iter(heldout.values()))
    filler = FillerText(list(iter_shard_documents(filler_paths)), eos_id=eos_id)
    items = passkey_items(
        encode,
        filler,
        config.passkey_lengths,
        config.passkey_depths,
        config.passkey_per_cell,
        config.passkey_choices,
        config.seed,
        config.passkey_digits,
    )
    report.metrics.update(passkey_accuracy(model_choice_scorer(model, config.batch_size), items))
    if config.copy_rows:
        report.metrics.update(
            copy_scores(
                model, filler, config.copy_rows, config.short_seq_len, eos_id, config.seed, config.batch_size
            )
        )
    report.metrics["passkey/chance"] = 1 / config.passkey_choices
    report.tables["passkey"] = [
        {
            "length": n,
            "items": int(report.metrics[f"passkey/n/{n}"]),
            "accuracy": round(report.metrics[f"passkey/acc/{n}"], 3),
            "se": round(report.metrics[f"passkey/se/{n}"], 3),
        }  # fmt: skip
        for n in config.passkey_lengths
    ]
    report.plots["evals/passkey.png"] = _plot_passkey(report.metrics, config, out_dir / "passkey.png", label)
    model.train(was_training)
    return report


def evaluate_checkpoint_dir(
    checkpoint_dir: str | Path,
    tokenizer_dir: str | Path,
    heldout: Mapping[str, Sequence[str | Path]],
    config: EvalConfig,
    out_dir: str | Path,
    dsa_mode: str = "native",
) -> StageResult:
    """Evaluate an HF checkpoint dir (as exported by the trainer) and package the result for the asset layer.

    dsa_mode: attention used for the eval (`native` = transformers' DSA top-k, what a deployed checkpoint runs;
    `dense` = full attention, e.g. for a base model whose indexer was never trained). `native` is computed by
    `sparse_gather` (the same top-k keys and softmax, ~3.5x faster on CPU for the tiny model at 1024 tokens;
    bit-identical to native in our tests up to T = 8 x index_topk, float rounding beyond; see dsa_gather).
    """
    from transformers import AutoModelForCausalLM

    from infra.stage import markdown_table
    from training.data import load_corpus_tokenizer
    from training.dsa_indexer import set_dsa_mode
    from training.tokenizer import EOS

    tok = load_corpus_tokenizer(tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint_dir), dtype=torch.float32)
    set_dsa_mode(model, EVAL_DSA_MODES.get(dsa_mode, dsa_mode))
    label = f"{Path(checkpoint_dir).name} ({dsa_mode})"
    report = evaluate_checkpoint(
        model,
        lambda text: tok.encode(text, add_special_tokens=False).ids,
        heldout,
        config,
        out_dir,
        eos_id=tok.token_to_id(EOS),
        label=label,
    )
    md = (
        f"## Evals: {label}\n\n### Held-out perplexity\n\n{markdown_table(report.tables['perplexity'])}"
        f"\n\n### Passkey retrieval (chance {1 / config.passkey_choices:.2f})\n\n"
        f"{markdown_table(report.tables['passkey'])}"
    )
    if "copy/gain" in report.metrics:
        m = report.metrics
        md += (
            f"\n\n### In-context copy\n\nA passage read a second time: NLL {m['copy/nll_first']:.3f} -> "
            f"{m['copy/nll_second']:.3f} (gain {m['copy/gain']:.3f} nats / token), top-1 {m['copy/acc_first']:.3f} "
            f"-> {m['copy/acc_second']:.3f}"
        )
    return StageResult(
        metrics=report.metrics,
        report_md=md,
        sample=report.tables["passkey"],
        artifacts=dict(report.plots),
        extra={"tables": report.tables},
    )


def evaluate_checkpoint_dirs(
    checkpoints: Mapping[str, tuple[str | Path, str]],
    tokenizer_dir: str | Path,
    heldout: Mapping[str, Sequence[str | Path]],
    config: EvalConfig,
    out_root: str | Path,
) -> dict[str, StageResult]:
    """name -> (HF dir, dsa_mode) evaluated as `evaluate_checkpoint_dir` does, into `out_root/<name>`, in
    `config.workers` processes; results in the order given."""
    jobs = {
        name: (evaluate_checkpoint_dir, (str(path), str(tokenizer_dir), heldout, config, str(Path(out_root) / name), mode))
        for name, (path, mode) in checkpoints.items()
    }  # fmt: skip
    workers = worker_count(config.workers, len(jobs))
    if workers == 1:
        return {name: fn(*args) for name, (fn, args) in jobs.items()}
    return run_in_workers(jobs, workers, "checkpoint evals")


def compare_to_parent(
    parent: Mapping[str, float], child: Mapping[str, float], short_seq_len: int
) -> dict[str, float]:
    """Midtraining deltas against the parent checkpoint's eval metrics: short-context perplexity ratio per
    source (child / parent; > 1 = regression) with the held-out rows it averages, and passkey accuracy gain
    per length."""
    out: dict[str, float] = {}
    prefix = f"ppl/ctx_{short_seq_len}/"
    for key, value in child.items():
        if key.startswith(prefix) and parent.get(key):
            source = key[len(prefix) :]
            out[f"short_ppl_ratio/{source}"] = value / parent[key]
            if f"ppl_rows/ctx_{short_seq_len}/{source}" in child:
                out[f"short_ppl_rows/{source}"] = child[f"ppl_rows/ctx_{short_seq_len}/{source}"]
        elif key.startswith("passkey/acc/") and key.count("/") == 2 and key in parent:
            length = key.rsplit("/", 1)[1]
            out[f"passkey_gain/{length}"] = value - parent[key]
            se = (parent.get(f"passkey/se/{length}"), child.get(f"passkey/se/{length}"))
            if None not in se:
                out[f"passkey_gain_se/{length}"] = float(np.hypot(*se))
    ratios = [v for k, v in out.items() if k.startswith("short_ppl_ratio/")]
    if ratios:
        out["short_ppl_ratio/max"] = max(ratios)
    return out


def context_extension_checks(
    config: EvalConfig, final_vs_base: Mapping[str, float]
) -> list[tuple[str, bool, dict]]:
    """The issue's bar for midtraining, from `compare_to_parent(base, final)`: (check name, passed, details).

    passkey_gain_at_longest: retrieval at the longest passkey length (4x the pretraining context in tiny)
    rose by at least `min_passkey_gain`; short_ppl_within_margin: short-context perplexity of every source
    grew by at most `max_short_ppl_ratio`, each measured on at least `min_ppl_rows` held-out rows."""
    longest = max(config.passkey_lengths)
    gain = final_vs_base.get(f"passkey_gain/{longest}")
    ratio = final_vs_base.get("short_ppl_ratio/max")
    rows = {k.split("/", 1)[1]: int(v) for k, v in final_vs_base.items() if k.startswith("short_ppl_rows/")}
    too_few = {s: n for s, n in sorted(rows.items()) if n < config.min_ppl_rows}
    warn = {"warn_only": config.checks_warn_only}
    return [
        (
            "passkey_gain_at_longest",
            gain is not None and gain >= config.min_passkey_gain,
            {
                "length": longest,
                "gain": gain,
                "gain_se": final_vs_base.get(f"passkey_gain_se/{longest}"),
                "min_gain": config.min_passkey_gain,
                **warn,
            },  # fmt: skip
        ),
        (
            "short_ppl_within_margin",
            ratio is not None and ratio <= config.max_short_ppl_ratio and not too_few,
            {
                "ratio": ratio,
                "max_ratio": config.max_short_ppl_ratio,
                "min_rows": min(rows.values(), default=None),
                **({"too_few_rows": too_few} if too_few else {}),
                **warn,
            },
        ),
    ]
