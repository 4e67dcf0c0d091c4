"""DSA attention forward time on CPU: dense vs `native` vs `sparse_gather`, at the same length.

Baseline ("dense"): dense causal attention (`set_dsa_mode(model, "dense")`, the indexer unused), the cheapest
attention the model can run. `native` is `transformers`' DSA (dense scores masked to the indexer's top-k),
what eval ran before. `sparse_gather` (training.dsa_gather) is what eval runs now: a GEMM indexer, then
per length either native's masked SDPA (T <= 8 x index_topk, bit-identical) or attention over each query's
gathered top-k keys; `gather (forced)` is the gather path at every length. The max |logit difference| to
native is printed next to native's own change when its input moves by one ulp (the discrete top-k can
amplify any rounding difference). Model: the `tiny` profile (`PretrainConfig().model`), eval mode, no grad.
Two timings per mode, in one process with the modes interleaved per repeat, median over repeats (the box
is shared; CPU time is the stabler clock there):

- `attention`: one DSA attention module (layer 1) on fixed hidden states, indexer included;
- `model`: a full forward to logits (what the perplexity / passkey evals pay per batch).

    .venv/bin/python benchmarks/dsa_attention.py [--lengths 1024 2048] [--batch 4] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import training.dsa_gather as dsa_gather
from training.dsa_indexer import set_dsa_mode
from training.model import build_model
from training.pretrain import PretrainConfig

# label -> (DSA mode, GATHER_MIN_KEYS_PER_TOPK)
MODES = {
    "dense": ("dense", None),
    "native": ("native", None),
    "sparse_gather": ("sparse_gather", dsa_gather.GATHER_MIN_KEYS_PER_TOPK),
    "gather (forced)": ("sparse_gather", 0),
}


def set_mode(model: torch.nn.Module, label: str) -> None:
    mode, min_keys = MODES[label]
    set_dsa_mode(model, mode)
    if min_keys is not None:
        dsa_gather.GATHER_MIN_KEYS_PER_TOPK = min_keys


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call; CPU time is the stabler one when other jobs share the box."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def attention_call(model: torch.nn.Module, batch: int, seq_len: int) -> Callable[[], object]:
    """One forward of layer 1's attention on random hidden states with the model's own causal mask."""
    attn = model.model.layers[1].self_attn
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(batch, seq_len, model.config.hidden_size, generator=generator)
    positions = torch.arange(seq_len).unsqueeze(0)
    rope = model.model.rotary_emb(hidden, positions)
    mask = torch.ones(seq_len, seq_len, dtype=torch.bool).tril().expand(batch, 1, seq_len, seq_len)
    return lambda: attn(hidden, rope, mask, position_ids=positions)


def bench_length(model: torch.nn.Module, batch: int, seq_len: int, repeats: int) -> dict[str, dict]:
    """Median seconds per (mode, what) and the max |logits - native logits| per mode."""
    ids = torch.randint(
        2, model.config.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(1)
    )
    calls = {
        "attention": attention_call(model, batch, seq_len),
        "model": lambda: model(input_ids=ids, use_cache=False).logits,
    }
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    logits: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for mode in MODES:  # warm-up, and the logits for the parity column
            set_mode(model, mode)
            logits[mode] = calls["model"]()
        for _ in range(repeats):
            for mode in MODES:
                set_mode(model, mode)
                for what, call in calls.items():
                    times.setdefault((mode, what), []).append(timed(call))
    medians = {
        (mode, what, clock): statistics.median(t[i] for t in ts)
        for (mode, what), ts in times.items()
        for i, clock in enumerate(("wall", "cpu"))
    }
    diffs = {mode: float((logits[mode] - logits["native"]).abs().max()) for mode in MODES}
    return {"median": medians, "diff": diffs, "native_noise": native_noise(model, ids, logits["native"])}


@torch.no_grad()
def native_noise(model: torch.nn.Module, ids: torch.Tensor, native: torch.Tensor) -> float:
    """Max |logit change| of `native` itself when the embeddings move by one float32 ulp (x (1 + 2^-23)):
    the top-k is discrete, so any rounding difference can swap a near-tied key. The scale against which
    sparse_gather's difference from native is read."""
    set_dsa_mode(model, "native")
    weight = model.model.embed_tokens.weight
    saved = weight.clone()
    weight.mul_(1 + 2**-23)
    try:
        return float((model(input_ids=ids, use_cache=False).logits - native).abs().max())
    finally:
        weight.copy_(saved)


def report(batch: int, seq_len: int, result: dict, index_topk: int) -> None:
    print(f"\nseq_len={seq_len} batch={batch} index_topk={index_topk}   (seconds; ratio = / dense)")
    columns = [(what, clock) for what in ("attention", "model") for clock in ("wall", "cpu")]
    header = "".join(f"{f'{what} {clock}':>16} {'ratio':>6}" for what, clock in columns)
    print(f"{'mode':<16}{header} {'max|dlogit| vs native':>22}")
    med = result["median"]
    for mode in MODES:
        cells = "".join(
            f"{med[(mode, what, clock)]:>16.4f} {med[(mode, what, clock)] / med[('dense', what, clock)]:>6.2f}"
            for what, clock in columns
        )
        print(f"{mode:<16}{cells} {result['diff'][mode]:>22.2e}")
    print(f"native with embeddings x (1 + 2^-23), max|dlogit| vs native: {result['native_noise']:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--batch", type=int, default=4, help="Sequences per forward (the eval batch size)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="Torch threads (1 is stabler on a shared box)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = PretrainConfig().model
    model = build_model(cfg, seed=0).eval()
    print(
        f"tiny model: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} heads, "
        f"threads {args.threads}, median of {args.repeats} repeats"
    )
    for seq_len in args.lengths:
        report(args.batch, seq_len, bench_length(model, args.batch, seq_len, args.repeats), cfg.index_topk)


if __name__ == "__main__":
    main()
