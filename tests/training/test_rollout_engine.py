"""The local rollout engine: greedy output equal to transformers' generate, log-probs equal to a full forward
pass of its own copy, a real precision mismatch against the fp32 trainer, seeded sampling, weight sync."""

from __future__ import annotations

import contextlib
import traceback
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaIndexer

from training.model import ModelConfig, build_model
from training.rollout import dsa_decode
from training.rollout.engine import (
    SAMPLE_BLOCK,
    LocalRolloutEngine,
    SamplingParams,
    engine_dtype,
    sample_tokens,
    sequence_logprobs,
)
from training.trainer import resolve_precision

EOS = 0
PROMPTS = [[5 + i, 6, 7, 8, 9][: 3 + i % 3] for i in range(6)]


@pytest.fixture(scope="module")
def model():
    # index_topk above every length here: DSA selects all keys, so cached and full passes see the same keys
    cfg = ModelConfig.for_size(
        "micro", vocab_size=300, bos_token_id=0, eos_token_id=EOS, pad_token_id=1, index_topk=512
    )
    return build_model(cfg, seed=0).eval()


def test_greedy_matches_transformers_generate(model):
    engine = LocalRolloutEngine(model, dtype=torch.float32)
    params = SamplingParams(max_new_tokens=24, temperature=0, stop_token_ids=(EOS,))
    batched = engine.generate(PROMPTS, params)
    for prompt, gen in zip(PROMPTS, batched, strict=True):
        ref = engine.model.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, pad_token_id=1
        )
        assert gen.token_ids == ref[0, len(prompt) :].tolist()[: len(gen.token_ids)]
        assert gen.token_ids == engine.generate([prompt], params)[0].token_ids  # padding changes nothing
        assert gen.finish_reason == ("stop" if gen.token_ids[-1] == EOS else "length")
        assert len(gen.token_ids) == 24 or gen.finish_reason == "stop"


def test_logprobs_are_the_engines_own(model):
    engine = LocalRolloutEngine(model, dtype=torch.float32)
    for gen, prompt in zip(
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=16, seed=3)), PROMPTS, strict=True
    ):
        ref = sequence_logprobs(engine.model, prompt, gen.token_ids)
        assert torch.allclose(torch.tensor(gen.logprobs), ref, atol=1e-4)


def test_bf16_engine_differs_from_the_fp32_trainer(model):
    engine = LocalRolloutEngine(model, dtype=torch.bfloat16)
    log_rho = []
    for gen, prompt in zip(
        engine.generate(PROMPTS, SamplingParams(max_new_tokens=16, seed=1)), PROMPTS, strict=True
    ):
        log_rho += (sequence_logprobs(model, prompt, gen.token_ids) - torch.tensor(gen.logprobs)).tolist()
    log_rho = torch.tensor(log_rho)
    assert log_rho.abs().max() > 1e-4  # the mismatch IcePop corrects is real
    assert log_rho.abs().max() < 0.2  # but small: same weights, another precision


def test_sampling_is_seeded_and_top_p_truncates(model):
    engine = LocalRolloutEngine(model, dtype=torch.float32)
    a = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=7))
    b = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=7))
    c = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=8))
    assert [g.token_ids for g in a] == [g.token_ids for g in b] != [g.token_ids for g in c]
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0))
    nucleus = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, top_p=1e-6, seed=9))
    assert [g.token_ids for g in greedy] == [g.token_ids for g in nucleus]


def test_sample_tokens_draws_each_token_at_its_probability():
    """Frequencies over 200k draws within 5 binomial SEs of the (unnormalised) row's probabilities; a token
    of probability 0 (e.g. cut by top-p), first or last or between, is never drawn."""
    weights = torch.tensor([0.0, 0.1, 0.0, 0.6, 0.3, 0.0]) * 2  # rows need not sum to 1
    n = 200_000
    tokens = sample_tokens(weights.expand(n, -1), torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=6).double() / n
    p = weights.double() / weights.sum()
    assert torch.all((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-12)
    assert freq[[0, 2, 5]].sum() == 0
    per_row = sample_tokens(weights.expand(3, -1), [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    alone = [int(sample_tokens(weights[None], [torch.Generator().manual_seed(s)])[0]) for s in (1, 2, 3)]
    assert per_row.tolist() == alone


def test_sample_tokens_inverts_across_blocks():
    """With V over several sampling blocks (and not a multiple of one), mass on the first and last token of a
    block, on the vocabulary's last token and on one lone token: frequencies within 5 binomial SEs, zero-mass
    tokens never drawn."""
    vocab = 2 * SAMPLE_BLOCK + 44
    weights = torch.zeros(vocab)
    mass = {0: 0.05, SAMPLE_BLOCK - 1: 0.25, SAMPLE_BLOCK: 0.2, 2 * SAMPLE_BLOCK + 7: 0.1, vocab - 1: 0.4}
    for token, w in mass.items():
        weights[token] = w
    n = 200_000
    freq = torch.bincount(
        sample_tokens(weights.expand(n, -1), torch.Generator().manual_seed(1)), minlength=vocab
    )
    freq = freq.double() / n
    p = weights.double() / weights.sum()
    assert torch.all((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt() + 1e-12)
    assert freq[weights == 0].sum() == 0


def test_expanded_kv_projects_only_new_positions_and_decodes_the_same(model):
    """A sparse model (index_topk 4 < the lengths here): with the expanded keys and values kept, each layer's
    kv_b_proj sees every position once (prefill + one per step) instead of all of them at every step, and
    tokens and log-probs are those of re-expanding every step."""
    sparse = build_model(
        ModelConfig.for_size("micro", vocab_size=300, eos_token_id=EOS, pad_token_id=1, index_topk=4), seed=0
    ).eval()
    engine = LocalRolloutEngine(sparse, dtype=torch.float32)
    rows = []
    attn = next(m for m in engine.model.modules() if hasattr(m, "kv_b_proj"))
    attn.kv_b_proj.register_forward_hook(lambda mod, args, out: rows.append(args[0].shape[-2]))
    params = SamplingParams(max_new_tokens=16, seed=4)
    kept = engine.generate(PROMPTS, params)
    kept_rows, rows[:] = sum(rows), []
    engine.expanded_kv.decoding = contextlib.nullcontext  # transformers' own path: re-expand every step
    again = engine.generate(PROMPTS, params)
    width, steps = max(map(len, PROMPTS)), len(again[0].token_ids)
    assert kept_rows == width + steps - 1
    assert sum(rows) == sum(width + t for t in range(steps))
    assert [g.token_ids for g in kept] == [g.token_ids for g in again]
    for a, b in zip(kept, again, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)


def test_expanded_kv_refuses_a_cropped_cache(model):
    engine = LocalRolloutEngine(model, dtype=torch.float32)
    attn = next(m for m in engine.model.modules() if hasattr(m, "kv_b_proj"))
    latent, k_rot = torch.randn(1, 1, 6, attn.kv_lora_rank), torch.randn(1, 1, 6, attn.qk_rope_head_dim)
    with engine.expanded_kv.decoding():
        attn.expand_kv(latent, k_rot)
        with pytest.raises(RuntimeError, match="layer 0 got 4 cached positions after 6"):
            attn.expand_kv(latent[:, :, :4], k_rot[:, :, :4])
    keys, _ = attn.expand_kv(latent[:, :, :4], k_rot[:, :, :4])  # outside the block: the original
    assert keys.shape[2] == 4


class _LinearBatchedMatmuls(TorchDispatchMode):
    """Records the batched matmuls an `nn.Linear` turns into: torch's path for a strided 3-D input, which
    copies the weight once per row (in bf16 the copy dominated a decode step)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.bmm.default and any(
            f.filename.endswith("modules/linear.py") for f in traceback.extract_stack()
        ):
            self.shapes.append((tuple(args[0].shape), tuple(args[1].shape)))
        return func(*args, **(kwargs or {}))


def test_decoding_feeds_every_linear_a_contiguous_input(model):
    """Prefill (the LM head on the last position) and each step's key / value expansion (a slice of the
    cache) hand nn.Linear contiguous rows: a plain matmul, never a weight copied per row. Outputs are those
    of the strided path."""
    engine = LocalRolloutEngine(model, dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    with _LinearBatchedMatmuls() as seen:
        ours = engine.generate(PROMPTS, params)
    assert seen.shapes == []
    strided = LocalRolloutEngine(model, dtype=torch.bfloat16)
    strided.model.get_output_embeddings()._forward_pre_hooks.clear()
    with _LinearBatchedMatmuls() as seen, mock.patch.object(torch.Tensor, "contiguous", lambda t, *a, **k: t):
        theirs = strided.generate(PROMPTS, params)
    assert {b for _, b in seen.shapes} >= {(len(PROMPTS), model.config.hidden_size, model.config.vocab_size)}
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]


def _sparse_model(topk: int):
    cfg = ModelConfig.for_size("micro", vocab_size=300, eos_token_id=EOS, pad_token_id=1, index_topk=topk)
    return build_model(cfg, seed=0).eval()


def test_the_indexer_is_skipped_only_while_it_would_select_every_key():
    """index_topk 8: a generation of at most 8 tokens in all never runs the indexer (it would keep every key)
    and gives the tokens and log-probs of one that does; a longer one runs it at every forward."""
    sparse = _sparse_model(8)
    engine = LocalRolloutEngine(sparse, dtype=torch.float32)
    always = LocalRolloutEngine(sparse, dtype=torch.float32)
    always.indexer.within = lambda length: contextlib.nullcontext()
    layers = sum(isinstance(m, GlmMoeDsaIndexer) for m in sparse.modules())
    width = max(map(len, PROMPTS))
    for new_tokens, skipped in ((8 - width, True), (12, False)):
        params = SamplingParams(max_new_tokens=new_tokens, seed=2)
        with mock.patch.object(
            dsa_decode, "cached_indexer_topk", wraps=dsa_decode.cached_indexer_topk
        ) as run:
            ours = engine.generate(PROMPTS, params)
        steps = max(len(g.token_ids) for g in ours)
        assert run.call_count == (0 if skipped else layers * steps)
        theirs = always.generate(PROMPTS, params)
        assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
        for a, b in zip(ours, theirs, strict=True):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_engines_indexer_selects_natives_keys_through_a_kv_cache(dtype):
    """index_topk 4, prompts of up to 5 tokens and 16 new ones: most forwards select a strict subset of the
    keys (the prefill of several queries, then one per step), with the indexer's keys read from its KV cache.
    One GEMM for the scores gives transformers' own key sets: the same tokens and the same log-probs."""
    sparse = _sparse_model(4)
    ours = LocalRolloutEngine(sparse, dtype=dtype)
    native = LocalRolloutEngine(sparse, dtype=dtype)
    for module in native.model.modules():
        if isinstance(module, GlmMoeDsaIndexer):
            del module.forward  # the class's forward again
    params = SamplingParams(max_new_tokens=16, seed=5)
    a, b = ours.generate(PROMPTS, params), native.generate(PROMPTS, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    assert min(len(g.token_ids) for g in a) > 4  # past index_topk: the indexer chose


def test_row_seeds_make_each_rows_samples_independent_of_its_batch(model):
    """With one seed per prompt a row samples the same tokens alone, in another batch or in another order;
    with one seed for the batch it does not (its random stream depends on the rows before it)."""
    engine = LocalRolloutEngine(model, dtype=torch.float32)
    params = SamplingParams(max_new_tokens=12, seed=3)
    seeds = tuple(100 + i for i in range(len(PROMPTS)))
    whole = engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, seed=3, row_seeds=seeds))
    alone = [
        engine.generate([p], SamplingParams(max_new_tokens=12, seed=3, row_seeds=(s,)))[0]
        for p, s in zip(PROMPTS, seeds, strict=True)
    ]
    backwards = engine.generate(
        PROMPTS[::-1], SamplingParams(max_new_tokens=12, seed=3, row_seeds=seeds[::-1])
    )
    assert (
        [g.token_ids for g in whole] == [g.token_ids for g in alone] == [g.token_ids for g in backwards[::-1]]
    )
    shared = engine.generate(PROMPTS, params)
    by_one = [engine.generate([p], params)[0] for p in PROMPTS]
    assert [g.token_ids for g in shared] != [g.token_ids for g in by_one]
    with pytest.raises(ValueError, match="2 row_seeds for 6 prompts"):
        engine.generate(PROMPTS, SamplingParams(row_seeds=(1, 2)))


@pytest.mark.parametrize(
    "topk", [512, 4]
)  # 4: DSA selects from the indexer's own KV cache, which rows leave too
@pytest.mark.parametrize("row_seeds", [False, True])
def test_finished_rows_leave_the_batch_with_the_same_tokens_and_logprobs(topk, row_seeds):
    """Rows that stopped leave the batch and every cache (keys / values, the indexer's keys, the expanded
    MLA buffers) as they finish; the rows left sample exactly what they would have in the whole batch."""
    sparse = _sparse_model(topk)
    prompts = [[5 + i, 6 + i % 5, 7, 8, 9][: 2 + i % 4] for i in range(24)]
    seeds = tuple(range(24)) if row_seeds else ()
    params = SamplingParams(
        max_new_tokens=20, seed=4, stop_token_ids=tuple(range(0, 300, 9)), row_seeds=seeds
    )
    leaving = LocalRolloutEngine(sparse, dtype=torch.float32)
    staying = LocalRolloutEngine(sparse, dtype=torch.float32)
    staying.leave_share = None
    sizes: list[int] = []
    hook = leaving.model.register_forward_pre_hook(
        lambda _m, _a, kw: sizes.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    ours = leaving.generate(prompts, params)
    hook.remove()
    theirs = staying.generate(prompts, params)
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert [g.finish_reason for g in ours] == [g.finish_reason for g in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    lengths = sorted(len(g.token_ids) for g in ours)
    assert lengths[0] < lengths[-1] and sizes[0] == 24  # rows finished at different steps
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < 24 / 2  # and the batch shrank as they did
    # never below the rows still decoding at that step
    assert all(size >= sum(len(g.token_ids) > step for g in ours) for step, size in enumerate(sizes))


def test_weight_sync_copies_casts_and_versions(model):
    engine = LocalRolloutEngine(model, dtype=torch.bfloat16)
    trained = build_model(ModelConfig.for_size("micro", vocab_size=300, index_topk=512), seed=5)
    engine.sync_weights(trained.state_dict(), version=3)
    name, tensor = next(iter(trained.state_dict().items()))
    assert engine.model.state_dict()[name].dtype == torch.bfloat16
    assert torch.equal(engine.model.state_dict()[name], tensor.to(torch.bfloat16))
    assert engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))[0].policy_version == 3
    with pytest.raises(KeyError, match="missing"):
        engine.sync_weights({}, version=4)
    reshaped = {k: (v.reshape(1, -1) if v.dim() == 2 else v) for k, v in trained.state_dict().items()}
    with pytest.raises(ValueError, match="another shape"):  # copy_ would broadcast it silently
        engine.sync_weights(reshaped, version=5)
    assert engine.policy_version == 3


def test_auto_engine_dtype_follows_the_hardware_and_explicit_names_are_kept():
    cpu = torch.device("cpu")
    native_bf16 = resolve_precision("auto", cpu) == "bf16"
    assert engine_dtype("auto", cpu) == (torch.bfloat16 if native_bf16 else torch.float32)
    assert engine_dtype("bfloat16", cpu) == torch.bfloat16 and engine_dtype("float32", cpu) == torch.float32
    with pytest.raises(ValueError, match="engine_dtype 'fp16'"):
        engine_dtype("fp16", cpu)


def test_sharded_engine_splits_large_batches_over_a_worker_process_with_the_same_outputs(model):
    """A batch of at least `min_rows` is decoded in two processes: the same tokens and log-probs as one engine
    (greedy, and sampled with per-row seeds), rows in order; weights re-sent when the policy version moves;
    a smaller batch never starts a worker; a worker's error names it."""
    from training.rollout.sharded import ShardedRolloutEngine

    engine = LocalRolloutEngine(model, dtype=torch.float32)
    prompts = [[5 + i % 50, 6, 7, 8][: 2 + i % 3] for i in range(20)]
    greedy = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(EOS,))
    sampled = SamplingParams(max_new_tokens=12, seed=4, row_seeds=tuple(range(100, 120)))
    with ShardedRolloutEngine(engine, workers=1, min_rows=8) as sharded:
        sharded.generate(prompts[:7], greedy)
        assert sharded._procs == []  # below min_rows: this process alone
        for params in (greedy, sampled):
            one, split = engine.generate(prompts, params), sharded.generate(prompts, params)
            assert [g.token_ids for g in split] == [g.token_ids for g in one]
            for a, b in zip(one, split, strict=True):
                assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
        assert len(sharded._procs) == 1 and sharded._procs[0].is_alive()
        # one batch seed: shard k draws with seed + k, the same every call
        batch_seeded = SamplingParams(max_new_tokens=12, seed=4)
        first = [g.token_ids for g in sharded.generate(prompts, batch_seeded)]
        assert first == [g.token_ids for g in sharded.generate(prompts, batch_seeded)]
        assert first[:10] == [g.token_ids for g in engine.generate(prompts[:10], batch_seeded)]
        # new weights and version: the worker's share follows them
        state = {k: v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v
                 for k, v in engine.model.state_dict().items()}  # fmt: skip
        sharded.sync_weights(state, 3)
        one, split = engine.generate(prompts, greedy), sharded.generate(prompts, greedy)
        assert [g.token_ids for g in split] == [g.token_ids for g in one]
        assert {g.policy_version for g in split} == {3}
        with pytest.raises(RuntimeError, match="worker 1 failed: ValueError: every prompt needs"):
            sharded.generate(prompts[:19] + [[]], greedy)
        with pytest.raises(ValueError, match="every prompt needs"):  # this process's share fails
            sharded.generate([[]] + prompts[1:], greedy)
        # neither failure left a reply in a pipe: the next call (other params) gets its own rows
        expected = [g.token_ids for g in engine.generate(prompts, sampled)]
        assert [g.token_ids for g in sharded.generate(prompts, sampled)] == expected
    assert sharded._procs == []
