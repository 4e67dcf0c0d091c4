"""The prefix-caching engine: on multi-turn prompts it reuses the previous turn's KV (hit counters prove it)
and its tokens and log-probs equal the no-cache local engine's at the same seed; the LRU stays under its
token budget; a weight sync empties the cache; a bounded-by-zero cache is the plain engine."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from training.model import ModelConfig, build_model
from training.rollout.engine import LocalRolloutEngine, SamplingParams, sequence_logprobs
from training.rollout.prefix_cache import PrefixCachingEngine, common_prefix, row_seed

EOS = 0
SAMPLED = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95, stop_token_ids=(EOS,), seed=11)
GREEDY = replace(SAMPLED, temperature=0)


@pytest.fixture(scope="module")
def model():
    # index_topk above every length here: DSA selects all keys, as in tests/training/test_rollout_engine.py
    cfg = ModelConfig.for_size(
        "micro", vocab_size=300, bos_token_id=0, eos_token_id=EOS, pad_token_id=1, index_topk=512
    )
    return build_model(cfg, seed=0).eval()


def multi_turn(engine, prompts, params, turns=3):
    """Each prompt's turns: prompt -> + generation + a 3-token observation -> ...; returns all generations."""
    seqs, outs = [list(p) for p in prompts], []
    for turn in range(turns):
        for i, seq in enumerate(seqs):
            (g,) = engine.generate([seq], replace(params, seed=params.seed + 100 * turn + i))
            outs.append((list(seq), g))
            seqs[i] = seq + g.token_ids + [40 + turn, 41, 42]
    return outs


@pytest.mark.parametrize("params", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_outputs_equal_the_plain_engine_and_later_turns_hit(model, params):
    plain = LocalRolloutEngine(model, dtype=torch.float32)
    cached = PrefixCachingEngine(model, dtype=torch.float32, max_cached_tokens=10_000)
    prompts = [[5, 6, 7, 8], [5, 6, 7, 9, 10], [20, 21]]
    worst = 0.0
    for (seq, a), (seq_b, b) in zip(
        multi_turn(plain, prompts, params), multi_turn(cached, prompts, params), strict=True
    ):
        assert seq == seq_b and a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        worst = max(worst, (torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs().max().item())
    assert worst < 1e-4, worst
    stats = cached.cache_stats()
    # turns 2 and 3 reuse everything but the new observation (and the last generated token); turn 1 of the
    # second prompt shares [5, 6, 7] with the first
    assert stats["hit_tokens"] >= 3
    assert 0.5 < stats["hit_rate"] < 1.0, stats
    assert stats["computed_tokens"] < stats["prompt_tokens"] + sum(
        len(g.token_ids) for _, g in multi_turn(plain, prompts, params)
    )


def test_a_batch_is_rows_with_their_own_seeds_and_logprobs_are_the_models(model):
    cached = PrefixCachingEngine(model, dtype=torch.float32, max_cached_tokens=10_000)
    plain = LocalRolloutEngine(model, dtype=torch.float32)
    group = [[5, 6, 7, 8]] * 4  # one prompt, four samples: they must differ
    outs = cached.generate(group, SAMPLED)
    assert len({tuple(g.token_ids) for g in outs}) > 1
    for i, (prompt, g) in enumerate(zip(group, outs, strict=True)):
        (ref,) = plain.generate([prompt], replace(SAMPLED, seed=row_seed(SAMPLED.seed, i)))
        assert g.token_ids == ref.token_ids
        full = sequence_logprobs(cached.model, prompt, g.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), full, atol=1e-4)
    assert (
        cached.cache_stats()["hit_tokens"] == 3 * 3
    )  # rows 1-3 reuse row 0's prompt (all but its last token)


def test_lru_budget_weight_sync_and_disabled_cache(model):
    cached = PrefixCachingEngine(model, dtype=torch.float32, max_cached_tokens=40)
    for start in range(6):
        cached.generate([[start + 50] * 6], GREEDY)
        assert cached.cached_tokens <= 40
    stats = cached.cache_stats()
    assert stats["evictions"] > 0 and stats["entries"] >= 1
    # the newest entry is still there: its next turn hits
    last = [55] * 6
    (g,) = cached.generate([last], GREEDY)
    before = cached.cache_stats()["hit_tokens"]
    cached.generate([last + g.token_ids + [7]], GREEDY)
    assert cached.cache_stats()["hit_tokens"] - before == len(last) + len(g.token_ids) - 1
    # a weight sync changes every KV: the cache is emptied and the same prompt misses
    noisy = {k: v + 0.01 * torch.randn_like(v) for k, v in model.state_dict().items()}
    cached.sync_weights(noisy, version=1)
    assert cached.cache_stats()["entries"] == 0 and cached.policy_version == 1
    before = cached.cache_stats()["hit_tokens"]
    (after_sync,) = cached.generate([last], GREEDY)
    assert cached.cache_stats()["hit_tokens"] == before
    plain = LocalRolloutEngine(model, dtype=torch.float32)
    plain.sync_weights(noisy, version=1)
    assert plain.generate([last], GREEDY)[0].token_ids == after_sync.token_ids
    off = PrefixCachingEngine(model, dtype=torch.float32, max_cached_tokens=0)
    off.generate([last], GREEDY)
    off.generate([last], GREEDY)
    assert off.cache_stats()["hit_tokens"] == 0 and off.cache_stats()["entries"] == 0


def test_common_prefix():
    t = torch.tensor
    assert common_prefix(t([1, 2, 3]), t([1, 2, 4, 5])) == 2
    assert common_prefix(t([1, 2]), t([1, 2, 3])) == 2
    assert common_prefix(t([9]), t([1])) == 0


def test_sparse_dsa_regime_stays_within_the_engines_own_cache_error():
    """Longer than index_topk: transformers' cached DSA path differs from a full pass; the prefix cache adds
    no more error than the plain engine's own decode has against a full forward."""
    cfg = ModelConfig.for_size(
        "micro", vocab_size=300, bos_token_id=0, eos_token_id=EOS, pad_token_id=1, index_topk=16
    )
    sparse = build_model(cfg, seed=0).eval()
    plain = LocalRolloutEngine(sparse, dtype=torch.float32)
    cached = PrefixCachingEngine(sparse, dtype=torch.float32, max_cached_tokens=10_000)
    seq, cache_err, engine_err = list(range(20, 60)), 0.0, 0.0
    for _ in range(3):
        (a,) = plain.generate([seq], GREEDY)
        (b,) = cached.generate([seq], GREEDY)
        assert a.token_ids == b.token_ids
        cache_err = max(cache_err, (torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs().max().item())
        full = sequence_logprobs(plain.model, seq, a.token_ids)
        engine_err = max(engine_err, (torch.tensor(a.logprobs) - full).abs().max().item())
        seq = seq + a.token_ids + [7, 8, 9]
    assert cached.cache_stats()["hit_rate"] > 0.5
    assert 0 < cache_err <= engine_err, (cache_err, engine_err)
