"""Rollout throughput: the local engine (training/rollout/engine.py) vs transformers' `generate` on the same
checkpoint, batch, prompt lengths and number of new tokens, greedy, in one run; prints tokens/s of each, the
ratio, and whether the greedy outputs are identical. Also, against the engine as it is: the engine
re-expanding MLA's cached latents at every step, as transformers does (without `training/rollout/mla_cache.py`),
the engine handing strided inputs to nn.Linear (the LM head at prefill, the cache's new positions), which
in bf16 copies the weight once per row, and the engine running DSA's indexer on generations short enough for
it to select every key, and transformers' own indexer (a broadcast matmul that copies the keys once per query)
against the engine's one GEMM where it runs (`training/rollout/dsa_decode.py`; give `--prompt-len` above
`index_topk` to see that case). With `--tasks` (a task suite's jsonl and a checkpoint that answers to the
chat template), sampled answers that stop at the end of their turn: the engine keeping finished rows in the
batch against the engine dropping them as they finish (`LocalRolloutEngine.leave_share`).

    .venv/bin/python benchmarks/rollout.py                    # a freshly initialised tiny model
    .venv/bin/python benchmarks/rollout.py --checkpoint DIR   # an HF dir written by the graph (e.g. SFT)
    .venv/bin/python benchmarks/rollout.py --checkpoint SFT_DIR --tasks .crucible/cache/task_suites/*/heldout.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from unittest import mock

import torch
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaIndexer

from training.model import ModelConfig, build_model, load_model
from training.rollout.engine import LocalRolloutEngine, SamplingParams


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(20, vocab, (length - (i % 4),), generator=g).tolist() for i in range(batch)]


def _hf_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            pad_token_id=pad_id, eos_token_id=None,
        )  # fmt: skip
    return [row[width:].tolist() for row in out]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="HF model dir (default: a freshly initialised tiny model)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument(
        "--tasks", help="Task-suite jsonl: also time sampled answers that stop (needs --checkpoint)"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.checkpoint:
        model = load_model(args.checkpoint)
    else:
        model = build_model(ModelConfig(bos_token_id=0, eos_token_id=0, pad_token_id=1), seed=0)
    model.eval()
    dtype = getattr(torch, args.dtype)
    engine = LocalRolloutEngine(model, dtype=dtype, pad_id=1)
    reexpanding = LocalRolloutEngine(model, dtype=dtype, pad_id=1)
    reexpanding.expanded_kv.decoding = contextlib.nullcontext
    strided = LocalRolloutEngine(model, dtype=dtype, pad_id=1)
    strided.model.get_output_embeddings()._forward_pre_hooks.clear()
    indexing = LocalRolloutEngine(model, dtype=dtype, pad_id=1)
    indexing.indexer.within = lambda length: contextlib.nullcontext()
    native = LocalRolloutEngine(model, dtype=dtype, pad_id=1)
    for module in native.model.modules():
        if isinstance(module, GlmMoeDsaIndexer):
            del module.forward  # the class's forward: transformers' indexer
    prompts = _prompts(args.batch, args.prompt_len, model.config.vocab_size, seed=0)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0)
    tokens = args.batch * args.new_tokens
    ours, theirs, again, copied, indexed, natively, same_rows = [], [], [], [], [], [], 0
    for _ in range(args.repeats):
        t = time.perf_counter()
        gens = engine.generate(prompts, params)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        reexpanding.generate(prompts, params)
        again.append(time.perf_counter() - t)
        with mock.patch.object(torch.Tensor, "contiguous", lambda x, *a, **k: x):
            t = time.perf_counter()
            strided.generate(prompts, params)
            copied.append(time.perf_counter() - t)
        t = time.perf_counter()
        indexing.generate(prompts, params)
        indexed.append(time.perf_counter() - t)
        t = time.perf_counter()
        native.generate(prompts, params)
        natively.append(time.perf_counter() - t)
        t = time.perf_counter()
        ref = _hf_generate(engine.model, prompts, args.new_tokens, pad_id=1)  # same weights, same dtype
        theirs.append(time.perf_counter() - t)
        same_rows = sum(g.token_ids == r for g, r in zip(gens, ref, strict=True))
    ours_tps, hf_tps = tokens / statistics.median(ours), tokens / statistics.median(theirs)
    print(
        f"checkpoint: {args.checkpoint or 'fresh tiny'}  dtype: {args.dtype}  batch {args.batch} x prompt ~{args.prompt_len} -> {args.new_tokens} new tokens, {args.repeats} repeats (medians)"
    )
    print(f"transformers generate (baseline): {hf_tps:8.1f} tokens/s")
    print(f"local rollout engine:             {ours_tps:8.1f} tokens/s")
    print(f"ratio: {ours_tps / hf_tps:.2f}x the baseline")
    slow_tps = tokens / statistics.median(again)
    print(f"engine re-expanding MLA every step (baseline): {slow_tps:8.1f} tokens/s")
    print(
        f"engine keeping expanded keys/values:           {ours_tps:8.1f} tokens/s, {ours_tps / slow_tps:.2f}x"
    )
    strided_tps = tokens / statistics.median(copied)
    print(f"engine with strided Linear inputs (baseline):  {strided_tps:8.1f} tokens/s")
    print(
        f"engine with contiguous Linear inputs:          {ours_tps:8.1f} tokens/s, {ours_tps / strided_tps:.2f}x"
    )
    indexed_tps = tokens / statistics.median(indexed)
    print(f"engine running the indexer on every forward (baseline): {indexed_tps:8.1f} tokens/s")
    print(
        f"engine skipping it while it keeps every key:            {ours_tps:8.1f} tokens/s, "
        f"{ours_tps / indexed_tps:.2f}x ({args.prompt_len}+{args.new_tokens} tokens <= index_topk "
        f"{model.config.index_topk}: {args.prompt_len + args.new_tokens <= model.config.index_topk})"
    )
    native_tps = tokens / statistics.median(natively)
    print(f"engine with transformers' indexer (baseline):  {native_tps:8.1f} tokens/s")
    print(
        f"engine with its own (skip / one GEMM):         {ours_tps:8.1f} tokens/s, {ours_tps / native_tps:.2f}x"
    )
    print(
        f"greedy outputs identical: {same_rows}/{args.batch} rows (bf16 rows can part at exactly tied logits)"
    )
    if args.tasks:
        _finished_rows(args, model, dtype)
    return 0


def _finished_rows(args, model, dtype: torch.dtype) -> None:
    """Answers sampled to the end of their turn: finished rows kept in the batch vs dropped from it."""
    from pathlib import Path

    from training.rollout.multiturn import END_OF_TURN, EOS, prompt_ids
    from training.tasks.suites import read_tasks
    from training.tokenizer import load_tokenizer

    tok = load_tokenizer(args.checkpoint)
    prompts = [prompt_ids(tok, t) for t in read_tasks(Path(args.tasks))[: args.batch]]
    stops = tuple(tok.convert_tokens_to_ids(t) for t in (END_OF_TURN, EOS))
    params = SamplingParams(args.new_tokens, temperature=1.0, seed=0, stop_token_ids=stops)
    leaving = LocalRolloutEngine(model, dtype=dtype, pad_id=tok.pad_token_id)
    staying = LocalRolloutEngine(model, dtype=dtype, pad_id=tok.pad_token_id)
    staying.leave_share = None
    kept, dropped = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        ref = staying.generate(prompts, params)
        kept.append(time.perf_counter() - t)
        t = time.perf_counter()
        gens = leaving.generate(prompts, params)
        dropped.append(time.perf_counter() - t)
    lengths = [len(g.token_ids) for g in gens]
    tokens = sum(lengths)
    kept_tps, dropped_tps = tokens / statistics.median(kept), tokens / statistics.median(dropped)
    print(
        f"sampled answers, {len(prompts)} tasks of {args.tasks}: {tokens} tokens, {min(lengths)}-{max(lengths)} per row"
    )
    print(f"engine keeping finished rows in the batch (baseline): {kept_tps:8.1f} tokens/s")
    print(
        f"engine dropping them as they finish:                  {dropped_tps:8.1f} tokens/s, {dropped_tps / kept_tps:.2f}x"
    )
    same = sum(a.token_ids == b.token_ids for a, b in zip(gens, ref, strict=True))
    print(f"same sampled tokens: {same}/{len(prompts)} rows")


if __name__ == "__main__":
    sys.exit(main())
