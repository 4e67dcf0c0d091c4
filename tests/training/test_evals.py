"""Evals: perplexity of known models, passkey set construction, chance-level and oracle accuracy, plots."""

import math
import random

import numpy as np
import pytest
import torch

from training.evals import (
    EvalConfig,
    evaluate_checkpoint,
    heldout_rows,
    model_choice_scorer,
    passkey_accuracy,
    perplexity,
)
from training.recall_tasks import PASSKEY_INTRO, PASSKEY_NEEDLE, PASSKEY_QUESTION, FillerText, passkey_items
from training.tokenizer import TokenizerConfig, train_tokenizer

WORDS = "the a river stone light paper walks under over green quiet city old new market bridge".split()


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    # On a shared 2-core box, 2 intra-op threads spin against other processes and run ~10x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class UniformModel(torch.nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, input_ids):
        return torch.zeros(*input_ids.shape, self.vocab_size)


def tiny_glm(vocab_size, seed=0):
    from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

    torch.manual_seed(seed)
    config = GlmMoeDsaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4,
        num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=8, index_topk=32, index_head_dim=16, index_n_heads=2, first_k_dense_replace=1,
        max_position_embeddings=512, use_cache=False,
    )  # fmt: skip
    return GlmMoeDsaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tok(tok_dir):
    from training.data import load_corpus_tokenizer

    return load_corpus_tokenizer(tok_dir)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    rng = random.Random(0)
    template = PASSKEY_INTRO + PASSKEY_NEEDLE.format(key=12345) + PASSKEY_QUESTION
    texts = [" ".join(rng.choices(WORDS, k=200)) + template for _ in range(30)]
    return train_tokenizer(texts, TokenizerConfig(vocab_size=400), tmp_path_factory.mktemp("t"))


@pytest.fixture(scope="module")
def heldout(tmp_path_factory, tok):
    """Held-out token shards of two sources, written in the training.data shard format."""
    rng = random.Random(1)
    root = tmp_path_factory.mktemp("heldout")
    out = {}
    for source in ("web", "code"):
        docs = [tok.encode(" ".join(rng.choices(WORDS, k=rng.randint(20, 120)))).ids + [0] for _ in range(40)]
        path = root / f"{source}.tokens.npy"
        np.save(path, np.concatenate(docs).astype(np.uint16))
        np.save(root / f"{source}.docs.npy", np.concatenate([[0], np.cumsum([len(d) for d in docs])]))
        out[source] = [path]
    return out


def encoder(tok):
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def test_uniform_model_perplexity_is_vocab_size(heldout):
    rows = heldout_rows(heldout["web"], seq_len=64, max_tokens=1000)
    assert rows.shape == (15, 64)
    assert perplexity(UniformModel(400), rows) == pytest.approx(400, rel=1e-5)
    assert perplexity(UniformModel(1234), rows) == pytest.approx(1234, rel=1e-5)


def test_perfect_model_perplexity_is_one(heldout):
    class Peeking(torch.nn.Module):  # puts all mass on the true next token
        def forward(self, input_ids):
            logits = torch.full((*input_ids.shape, 400), -1e4)
            logits[:, :-1].scatter_(-1, input_ids[:, 1:, None], 1e4)
            return logits

    assert perplexity(Peeking(), heldout_rows(heldout["code"], 32, 500)) == pytest.approx(1.0)


def test_passkey_items_have_exact_length_and_needle_depth(tok, heldout):
    from training.data import iter_shard_documents

    filler = FillerText(list(iter_shard_documents(heldout["web"])), eos_id=0)
    encode = encoder(tok)
    items = passkey_items(encode, filler, [128, 300], [0.0, 0.5, 1.0], 3, num_choices=5, seed=0)
    assert len(items) == 2 * 3 * 3
    question = encode(PASSKEY_QUESTION)
    for item in items:
        assert len(item.prompt) + len(item.choices[item.answer]) == item.length
        assert list(item.prompt[-len(question) :]) == question
        assert len(item.choices) == 5 and len(set(map(tuple, item.choices))) == 5
        assert 0 not in item.prompt  # EOS stripped from filler
        needle = encode(" The pass key is " + item.key)
        starts = [i for i in range(len(item.prompt)) if list(item.prompt[i : i + len(needle)]) == needle]
        assert len(starts) == 1
        intro = encode(PASSKEY_INTRO)
        n_fill = (
            len(item.prompt) - len(intro) - len(question) - len(encode(PASSKEY_NEEDLE.format(key=item.key)))
        )
        assert starts[0] - len(intro) == round(item.depth * n_fill)


def test_oracle_scores_100_and_random_model_scores_chance(tok, heldout):
    from training.data import iter_shard_documents

    filler = FillerText(list(iter_shard_documents(heldout["web"])), eos_id=0)
    items = passkey_items(encoder(tok), filler, [96, 160], [0.25, 0.75], 30, num_choices=4, seed=3)

    def oracle(prompt, choices):  # knows to look for the key in the prompt
        text = tok.decode(prompt.tolist())
        return np.array([float(tok.decode(c).strip() in text) for c in choices])

    assert passkey_accuracy(oracle, items)["passkey/acc"] == 1.0
    acc = passkey_accuracy(model_choice_scorer(tiny_glm(400)), items)
    # 120 items, chance 0.25, binomial sd 0.04: a 3-sd band
    assert 0.13 <= acc["passkey/acc"] <= 0.37
    assert set(acc) >= {"passkey/acc/96", "passkey/acc/160", "passkey/acc/96/depth_0.25"}


def test_model_scorer_matches_full_forward(tok):
    model = tiny_glm(400, seed=2)
    prompt = np.array(encoder(tok)("river stone light the pass key is"))
    choices = [encoder(tok)(" 12345"), encoder(tok)(" 99")]
    scores = model_choice_scorer(model, batch_size=1)(prompt, choices)
    for choice, score in zip(choices, scores, strict=True):
        ids = torch.tensor([list(prompt) + choice])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        expected = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(choice))
        assert score == pytest.approx(expected, abs=1e-4)


def test_evaluate_checkpoint_metrics_and_plots(tok, heldout, tmp_path):
    config = EvalConfig(
        short_seq_len=64,
        ppl_max_tokens=512,
        passkey_lengths=[96, 192],
        passkey_depths=[0.2, 0.8],
        passkey_per_cell=2,
    )
    model = tiny_glm(400)
    report = evaluate_checkpoint(
        model, encoder(tok), heldout, config, tmp_path, eos_id=0, label="random init"
    )
    m = report.metrics
    for source in ("web", "code"):
        for ctx in (64, 192):
            # A random init predicts close to uniformly.
            assert 0.8 * 400 < m[f"ppl/ctx_{ctx}/{source}"] < 1.2 * 400
    assert m["passkey/chance"] == 0.25
    assert {"passkey/acc/96", "passkey/acc/192", "passkey/acc"} <= set(m)
    # the indexer's top-k mass at the longest context, own vs fresh indexer (both random here), and its ceiling
    assert 0 < m["dsa/topk_mass_untrained_indexer"] <= m["dsa/topk_mass_oracle"] <= 1
    assert 0 < m["dsa/topk_mass"] <= m["dsa/topk_mass_oracle"]
    for path in report.plots.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(report.plots) == {"evals/perplexity.png", "evals/passkey.png"}
    assert model.training is False and math.isfinite(m["passkey/acc"])


def test_evaluate_checkpoint_dir_returns_stage_result(tok_dir, heldout, tmp_path):
    from training.evals import evaluate_checkpoint_dir

    tiny_glm(400).save_pretrained(tmp_path / "ckpt")
    config = EvalConfig(
        short_seq_len=64, ppl_max_tokens=256, passkey_lengths=[128], passkey_depths=[0.5], passkey_per_cell=2
    )
    result = evaluate_checkpoint_dir(
        tmp_path / "ckpt", tok_dir, heldout, config, tmp_path / "ev", dsa_mode="dense"
    )
    assert set(result.artifacts) == {"evals/perplexity.png", "evals/passkey.png"}
    assert "Passkey retrieval (chance 0.25)" in result.report_md and "| web | 64 |" in result.report_md
    assert result.metrics["passkey/acc/128"] in (0.0, 0.5, 1.0)


def test_compare_to_parent():
    from training.evals import compare_to_parent

    parent = {
        "ppl/ctx_256/web": 100.0,
        "ppl/ctx_256/code": 20.0,
        "passkey/acc/1024": 0.25,
        "passkey/acc": 0.4,
    }
    child = {"ppl/ctx_256/web": 105.0, "ppl/ctx_256/code": 19.0, "passkey/acc/1024": 0.75, "passkey/acc": 0.8}
    assert compare_to_parent(parent, child, 256) == pytest.approx(
        {"short_ppl_ratio/web": 1.05, "short_ppl_ratio/code": 0.95, "short_ppl_ratio/max": 1.05,
         "passkey_gain/1024": 0.5}
    )  # fmt: skip


def test_context_extension_checks_gate_passkey_gain_and_short_ppl():
    from training.evals import EvalConfig, context_extension_checks

    cfg = EvalConfig(passkey_lengths=[256, 1024], min_passkey_gain=0.15, max_short_ppl_ratio=1.1)

    def outcome(delta):
        return {name: passed for name, passed, _ in context_extension_checks(cfg, delta)}

    good = {"passkey_gain/1024": 0.3, "passkey_gain/256": -0.1, "short_ppl_ratio/max": 1.04}
    assert outcome(good) == {"passkey_gain_at_longest": True, "short_ppl_within_margin": True}
    # The gain that counts is at the longest length, not at a shorter one.
    weak = {**good, "passkey_gain/1024": 0.1, "passkey_gain/256": 0.6}
    assert outcome(weak)["passkey_gain_at_longest"] is False
    assert outcome({**good, "short_ppl_ratio/max": 1.2})["short_ppl_within_margin"] is False
    # Missing numbers fail rather than pass.
    assert outcome({}) == {"passkey_gain_at_longest": False, "short_ppl_within_margin": False}
    (_, _, meta), _ = context_extension_checks(EvalConfig(checks_warn_only=True), good)
    assert meta["warn_only"] is True and meta["length"] == 1024
