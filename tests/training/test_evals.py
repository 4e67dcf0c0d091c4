"""Evals: perplexity of known models, passkey set construction, chance-level and oracle accuracy, plots."""

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from tie_free import tie_free_glm  # noqa: E402  (pytest puts this directory on sys.path)

from training.data import load_corpus_tokenizer
from training.evals import (
    EvalConfig,
    copy_scores,
    evaluate_checkpoint,
    heldout_rows,
    model_choice_scorer,
    packed_choices,
    passkey_accuracy,
    perplexity,
)
from training.recall_tasks import PASSKEY_INTRO, PASSKEY_NEEDLE, PASSKEY_QUESTION, FillerText, passkey_items
from training.tokenizer import TokenizerConfig, train_tokenizer

WORDS = "the a river stone light paper walks under over green quiet city old new market bridge".split()


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


@pytest.mark.parametrize("mode", ["native", "sparse_gather", "dense"])
def test_model_scorer_matches_one_forward_per_choice(mode):
    """The packed row (prompt once, then every choice seeing only the prompt and itself, at its own
    positions) scores each choice as a row of prompt + choice alone does, in each DSA mode: the prompt is
    longer than index_topk (32), so the sparse modes pick top-k keys; the choices differ in length."""
    from training.dsa_indexer import set_dsa_mode

    model = tie_free_glm()
    set_dsa_mode(model, mode)
    prompt = np.random.default_rng(0).integers(5, 400, 150)
    choices = [[11, 12, 13], [14, 15], [16, 17, 18, 19], [20]]
    scores = model_choice_scorer(model)(prompt, choices)
    for choice, score in zip(choices, scores, strict=True):
        ids = torch.tensor([list(prompt) + choice])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        expected = sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(choice))
        assert score == pytest.approx(expected, abs=1e-4)


def test_packed_choices_layout():
    positions, mask, predictors, targets = packed_choices(3, [[7, 8], [9]])
    assert positions.tolist() == [0, 1, 2, 3, 4, 3]
    assert targets.tolist() == [7, 8, 9]
    assert predictors.tolist() == [2, 3, 2]  # the prompt's last token predicts each choice's first
    assert mask[5].tolist() == [True, True, True, False, False, True]  # choice 2 sees the prompt and itself
    assert mask[4].tolist() == [True, True, True, True, True, False]


class WindowedCopyModel(torch.nn.Module):
    """A hand-written induction head: at each position it predicts (logit 20) the token that followed the
    latest earlier occurrence of the last two tokens, if that occurrence is at most `window` positions back;
    otherwise its logits are all zero (uniform). So it retrieves a passkey exactly when the needle is within
    the window and scores every choice by its length alone when it is not."""

    def __init__(self, vocab_size, window):
        super().__init__()
        self.vocab_size, self.window = vocab_size, window

    def forward(self, input_ids):
        x = input_ids
        prev = torch.cat([torch.full_like(x[:, :1], -1), x[:, :-1]], dim=1)
        same = (x[:, :, None] == x[:, None, :]) & (prev[:, :, None] == prev[:, None, :])  # [B, i, j]
        i, j = torch.arange(x.shape[1])[:, None], torch.arange(x.shape[1])[None, :]
        ok = same & (j < i) & (i - j <= self.window)
        follower = torch.where(ok, j + 1, 0).max(-1).values  # position after the latest match (0 = none)
        logits = torch.zeros(*x.shape, self.vocab_size)
        logits.scatter_(-1, x.gather(1, follower)[..., None], 20.0 * (follower > 0)[..., None].float())
        return logits


def test_passkey_accuracy_of_a_windowed_copy_model_is_known_per_cell(tok, heldout, tmp_path):
    config = EvalConfig(
        short_seq_len=64, ppl_max_tokens=256, passkey_lengths=[96, 192], passkey_depths=[0.2, 0.8],
        passkey_per_cell=6, indexer_rows=0,
    )  # fmt: skip
    window = 80
    report = evaluate_checkpoint(
        WindowedCopyModel(400, window), encoder(tok), heldout, config, tmp_path, eos_id=0
    )

    # The same items, rebuilt: inside the window the model retrieves the key (a hit); outside it every
    # choice scores -len * log(400), so argmax takes the first shortest choice (a hit only if that is the key).
    from training.data import iter_shard_documents

    filler = FillerText(list(iter_shard_documents(heldout["web"])), eos_id=0)
    encode = encoder(tok)
    items = passkey_items(encode, filler, [96, 192], [0.2, 0.8], 6, num_choices=4, seed=config.seed)
    hits, inside = {}, {}
    for item in items:
        needle = encode(PASSKEY_NEEDLE.format(key=item.key))
        start = next(i for i in range(len(item.prompt)) if list(item.prompt[i : i + len(needle)]) == needle)
        reach = len(item.prompt) - 1 - (start + 3)  # prompt end -> " is" of " The pass key is <key>"
        beyond = len(item.prompt) + len(item.choices[item.answer]) - (start + len(needle))
        assert reach <= window or beyond > window + 1, "an item straddles the window edge"
        shortest = int(np.argmin([len(c) for c in item.choices]))
        hit = reach <= window or shortest == item.answer
        hits.setdefault((item.length, item.depth), []).append(hit)
        inside.setdefault((item.length, item.depth), []).append(reach <= window)
    # Deep needles (0.2) of the 192-token prompts are out of reach, everything else is inside.
    assert {cell: all(v) for cell, v in inside.items()} == {
        (96, 0.2): True, (96, 0.8): True, (192, 0.2): False, (192, 0.8): True,
    }  # fmt: skip
    expected = {f"passkey/acc/{n}/depth_{d:.2f}": float(np.mean(h)) for (n, d), h in hits.items()}
    for n in (96, 192):
        expected[f"passkey/acc/{n}"] = float(np.mean(hits[(n, 0.2)] + hits[(n, 0.8)]))
    expected["passkey/acc"] = float(np.mean([x for h in hits.values() for x in h]))
    got = {k: v for k, v in report.metrics.items() if k.startswith("passkey/acc")}
    assert got == pytest.approx(expected)
    assert got["passkey/acc/96"] == 1.0 and got["passkey/acc/192/depth_0.20"] < 1.0
    for n in (96, 192):  # binomial SE over the length's items
        p, items = expected[f"passkey/acc/{n}"], len(hits[(n, 0.2)] + hits[(n, 0.8)])
        assert report.metrics[f"passkey/n/{n}"] == items
        assert report.metrics[f"passkey/se/{n}"] == pytest.approx(math.sqrt(p * (1 - p) / items))


def test_copy_scores_tell_a_copying_model_from_one_that_cannot_look_back():
    """Filler of distinct tokens (a permutation of the vocabulary), so only the first copy can predict the
    second. The hand-written induction head predicts the second copy from its second token on: (L - 2) of the
    L - 1 scored tokens of a passage of L >= 8 tokens, so accuracy >= 6 / 7, and none of the first copy; a
    model whose logits ignore the context scores both copies alike."""
    vocab = 1000
    filler = FillerText([np.random.default_rng(0).permutation(vocab)])
    copier = copy_scores(WindowedCopyModel(vocab, window=64), filler, 16, 64, eos_id=0, seed=3)
    assert copier["copy/acc_first"] < 0.05 and copier["copy/acc_second"] >= 6 / 7
    assert copier["copy/nll_first"] == pytest.approx(math.log(vocab), abs=0.4)
    assert copier["copy/gain"] > 0.8 * math.log(vocab)
    flat = copy_scores(UniformModel(vocab), filler, 16, 64, eos_id=0, seed=3)
    assert flat["copy/nll_first"] == pytest.approx(math.log(vocab)) and flat["copy/gain"] == pytest.approx(
        0.0
    )
    assert flat["copy/tokens"] == copier["copy/tokens"] > 16 * 6  # the same rows for both models
    with pytest.raises(ValueError, match="copy_rows needs short_seq_len >= 24"):
        EvalConfig(short_seq_len=16)
    assert EvalConfig(short_seq_len=16, copy_rows=0).copy_rows == 0


def test_topk_and_oracle_mass_on_a_hand_built_attention_matrix():
    """Two heads, 4 causal keys, k = 2: the indexer's top-k mass and the oracle (best top-k) mass of the
    head-averaged attention, over the queries that see more than k keys (queries 2 and 3)."""
    from types import SimpleNamespace

    from training.dsa_indexer import IndexerTrainingAttention

    head0 = [[1.0], [0.5, 0.5], [0.5, 0.3, 0.2], [0.1, 0.4, 0.2, 0.3]]
    head1 = [[1.0], [0.5, 0.5], [0.1, 0.3, 0.6], [0.3, 0.4, 0.2, 0.1]]
    # query . key = log p with one-hot keys and scaling 1, so softmax(q k^T) over the causal keys is p.
    query = torch.full((1, 2, 4, 4), -1e4)
    for h, rows in enumerate((head0, head1)):
        for s, row in enumerate(rows):
            query[0, h, s, : len(row)] = torch.tensor(row).log()
    key = torch.eye(4).expand(1, 2, 4, 4)
    allowed = torch.ones(4, 4, dtype=torch.bool).tril()[None]
    topk = torch.tensor([[[0, 1], [0, 1], [1, 2], [0, 3]]])  # the indexer's choice per query
    attn = SimpleNamespace(scaling=1.0, dsa_mode="indexer_warmup")
    stats = IndexerTrainingAttention._indexer_stats(
        attn, query, key, allowed, allowed, torch.zeros(1, 4, 4), topk
    )
    # mean over heads: query 2 -> [0.3, 0.3, 0.4], query 3 -> [0.2, 0.4, 0.2, 0.2]
    assert int(stats["long_queries"]) == 2
    assert float(stats["topk_mass_sum"]) == pytest.approx((0.3 + 0.4) + (0.2 + 0.2), abs=1e-5)
    assert float(stats["oracle_mass_sum"]) == pytest.approx((0.4 + 0.3) + (0.4 + 0.2), abs=1e-5)
    assert float(stats["oracle_mass_sum"]) >= float(stats["topk_mass_sum"])


def test_evaluate_checkpoint_metrics_and_plots(tok, heldout, tmp_path):
    config = EvalConfig(
        short_seq_len=64,
        ppl_max_tokens=512,
        passkey_lengths=[96, 192],
        passkey_depths=[0.2, 0.8],
        passkey_per_cell=2,
    )
    model = tiny_glm(400)
    with torch.no_grad():  # peaked main attention: the best 32 keys hold far more than 32 / (t + 1)
        for name, p in model.named_parameters():
            if name.endswith(("q_b_proj.weight", "kv_a_proj_with_mqa.weight")):
                p.mul_(10.0)
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
    # A random init reads a passage the second time no better than the first.
    assert m["copy/tokens"] > 0 and abs(m["copy/gain"]) < 0.05
    # The indexer's top-k mass at the longest context (192), own vs fresh indexer, and its ceiling. A random
    # indexer picks its 32 keys independently of where the attention peaks, so it holds ~32 / (t + 1) of
    # query t's mass: 0.3558 averaged over the long queries t = 32..191 (measured: own 0.3515, fresh 0.3544).
    # The oracle takes the 32 heaviest keys of the peaked attention: measured 0.514.
    uniform = float(np.mean([32 / (t + 1) for t in range(32, 192)]))
    assert m["dsa/topk_mass"] == pytest.approx(uniform, abs=0.01)
    assert m["dsa/topk_mass_untrained_indexer"] == pytest.approx(uniform, abs=0.01)
    assert 0.45 < m["dsa/topk_mass_oracle"] < 0.6
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
    # The loaded checkpoint, in the requested DSA mode, with the checkpoint's tokenizer and EOS, gives the
    # numbers of the in-memory model: same perplexities (dense differs from native past index_topk = 32
    # keys, so a dropped dsa_mode shows at context 128) and the same passkey items and answers.
    from training.dsa_indexer import set_dsa_mode

    model = tiny_glm(400)
    set_dsa_mode(model, "dense")
    expected = evaluate_checkpoint(
        model, encoder(load_corpus_tokenizer(tok_dir)), heldout, config, tmp_path, 0
    )
    assert result.metrics == pytest.approx(expected.metrics, rel=1e-5)
    assert {"ppl/ctx_128/web", "passkey/acc/128", "dsa/topk_mass"} <= set(result.metrics)


def test_checkpoints_evaluated_in_two_processes_equal_evaluating_them_here(tok_dir, heldout, tmp_path):
    """workers: 2 evaluates two checkpoints in two spawned processes (one torch thread each here): the same
    metrics as in this process, in the order given, each in its own output dir."""
    from training.evals import evaluate_checkpoint_dirs

    for seed in (0, 1):
        tiny_glm(400, seed=seed).save_pretrained(tmp_path / f"ckpt{seed}")
    config = EvalConfig(
        short_seq_len=64, ppl_max_tokens=256, passkey_lengths=[128], passkey_depths=[0.5], passkey_per_cell=2
    )
    checkpoints = {"second": (tmp_path / "ckpt1", "native"), "first": (tmp_path / "ckpt0", "dense")}
    runs = {}
    for workers in (1, 2):
        cfg = config.model_copy(update={"workers": workers})
        runs[workers] = evaluate_checkpoint_dirs(
            checkpoints, tok_dir, heldout, cfg, tmp_path / f"ev{workers}"
        )
    assert list(runs[2]) == ["second", "first"]
    for name in checkpoints:
        assert runs[2][name].metrics == pytest.approx(runs[1][name].metrics, rel=1e-5), name
        for path in runs[2][name].artifacts.values():
            assert Path(path).is_relative_to(tmp_path / "ev2" / name) and Path(path).stat().st_size > 0
    # two different models: a mix-up of jobs and results would show
    assert runs[2]["first"].metrics["ppl/ctx_64/web"] != runs[2]["second"].metrics["ppl/ctx_64/web"]


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
    # with each side's SE the gain gets its own: sqrt(0.03^2 + 0.04^2)
    gains = compare_to_parent({**parent, "passkey/se/1024": 0.03}, {**child, "passkey/se/1024": 0.04}, 256)
    assert gains["passkey_gain_se/1024"] == pytest.approx(0.05)
    # the rows each ratio averages come along (the child's, at the short context only)
    rows = {"ppl_rows/ctx_256/web": 1.0, "ppl_rows/ctx_256/code": 64.0, "ppl_rows/ctx_1024/web": 0.0}
    with_rows = compare_to_parent(parent, {**child, **rows}, 256)
    assert {k: v for k, v in with_rows.items() if "rows" in k} == {
        "short_ppl_rows/web": 1.0,
        "short_ppl_rows/code": 64.0,
    }


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
    # a ratio over too few held-out rows is noise, not a pass: it fails and names the source
    rows = {"short_ppl_rows/web": 1.0, "short_ppl_rows/code": 64.0}
    assert outcome({**good, **rows})["short_ppl_within_margin"] is False
    _, (_, _, ppl_meta) = context_extension_checks(cfg, {**good, **rows})
    assert ppl_meta["too_few_rows"] == {"web": 1} and ppl_meta["min_rows"] == 1
    assert outcome({**good, **rows, "short_ppl_rows/web": 16.0})["short_ppl_within_margin"] is True
    (_, _, meta), _ = context_extension_checks(EvalConfig(checks_warn_only=True), good)
    assert meta["warn_only"] is True and meta["length"] == 1024


def test_the_default_passkey_set_resolves_a_ten_point_change():
    """The tiny gate compares two checkpoints' passkey accuracy: with the default items per length, a
    10-point gain is outside 2 standard errors of the gain even at the worst case p = 0.5 for both."""
    config = EvalConfig()
    n = config.passkey_per_cell * len(config.passkey_depths)
    worst_se = math.sqrt(0.5 * 0.5 / n)
    assert 2 * math.hypot(worst_se, worst_se) < 0.10, n


def test_tail_rows_start_at_a_document_past_the_head_and_span_shards(tmp_path):
    from training.data import _ShardBuffer
    from training.evals import tail_rows

    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 400, int(rng.integers(20, 90))).tolist() + [0] for _ in range(60)]
    buf = _ShardBuffer(tmp_path, "heldout/code", np.dtype(np.uint16), 300)  # the token_shards writer
    for i, d in enumerate(docs):
        buf.add(d, {"id": str(i)})
    buf.flush()
    paths = [tmp_path / k for k in buf.keys]
    stream, starts = np.concatenate(docs), np.cumsum([0] + [len(d) for d in docs])[:-1]
    assert len(paths) >= 4  # document starts come from every shard
    # the latest document start that leaves max_tokens to read; the first one past `after` if none does
    for max_tokens, after, first in (
        (600, 1000, int(starts[starts <= len(stream) - 600][-1])),
        (10**6, 1000, int(starts[starts >= 1000][0])),
    ):
        rows = tail_rows(paths, 32, max_tokens, after)
        assert first >= after and rows.shape == (min(max_tokens, len(stream) - first) // 32, 32)
        assert np.array_equal(rows.flatten().numpy(), stream[first : first + rows.numel()])
    assert len(tail_rows(paths, 32, 600, 1000)) == 600 // 32  # the whole budget, not a partial tail
    assert tail_rows(paths, 32, 600, after=int(starts[-1]) + 1) is None  # no document starts past `after`
