"""Context extension: RoPE stretching (ABF / YaRN), long-doc up-sampling, interleaved packing, recall rows."""

import json
import math
import random
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from training.context_extension import (
    ContextExtensionConfig,
    ContextStage,
    build_midtrain_rows,
    extend_rope,
    interleave_chunks,
    length_weights,
    midtrain_stage,
    pack_random,
    pack_similar,
    row_purity,
    similarity_clusters,
    similarity_order,
    stage_model_config,
)
from training.recall_tasks import FillerText, synthetic_recall_examples


def glm_config(**kw):
    from transformers import GlmMoeDsaConfig

    return GlmMoeDsaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
        kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, index_topk=32,
        index_head_dim=16, index_n_heads=2, first_k_dense_replace=1, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **kw,
    )  # fmt: skip


def rotary(config):
    from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaRotaryEmbedding

    return GlmMoeDsaRotaryEmbedding(config)


def test_abf_raises_rope_base():
    base = glm_config()
    stage = ContextStage(name="ctx_1024", seq_len=1024, rope_theta=40_000.0)
    cfg = extend_rope(base, stage, "abf", base_seq_len=256)
    assert cfg.rope_parameters == {"rope_type": "default", "rope_theta": 40_000.0}
    assert cfg.max_position_embeddings == 1024
    assert base.rope_parameters["rope_theta"] == 10_000.0 and base.max_position_embeddings == 256  # copy
    inv = rotary(cfg).inv_freq
    assert torch.allclose(inv, 1.0 / 40_000.0 ** (torch.arange(0, 8, 2).float() / 8))


def test_yarn_scales_low_frequencies_only():
    base = glm_config()
    stage = ContextStage(name="ctx_1024", seq_len=1024)
    cfg = extend_rope(base, stage, "yarn", base_seq_len=256)
    assert cfg.rope_parameters == {
        "rope_type": "yarn",
        "rope_theta": 10_000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 256,
    }
    assert cfg.max_position_embeddings == 1024
    old, new = rotary(base), rotary(cfg)
    assert new.attention_scaling == pytest.approx(0.1 * math.log(4.0) + 1.0)
    # The fastest rotation (dim 0) is kept, the slowest is interpolated by the full factor.
    assert float(new.inv_freq[0]) == pytest.approx(float(old.inv_freq[0]))
    assert float(new.inv_freq[-1]) == pytest.approx(float(old.inv_freq[-1]) / 4.0)
    # A second YaRN stage keeps the pretraining length as the original and grows the factor.
    cfg2 = extend_rope(cfg, ContextStage(name="ctx_2048", seq_len=2048), "yarn", base_seq_len=256)
    assert (
        cfg2.rope_parameters["factor"] == 8.0
        and cfg2.rope_parameters["original_max_position_embeddings"] == 256
    )


def test_stage_lengths_must_increase():
    with pytest.raises(ValidationError, match="must increase"):
        ContextExtensionConfig(base_seq_len=256, stages=[ContextStage(name="a", seq_len=256)])
    tiny = ContextExtensionConfig()
    # Three stages ending at 4x the pretraining context, where the passkey eval measures the gain.
    assert [s.seq_len for s in tiny.stages] == [512, 768, 1024] == sorted({512, 768, 4 * tiny.base_seq_len})
    assert [s.dsa_mode for s in tiny.stages] == ["dense", "sparse", "sparse"]


def test_dense_stage_warms_the_indexer_up_after_training_and_sparse_before(tmp_path):
    from training.context_extension import midtrain_job_specs
    from training.model import ModelConfig
    from training.trainer import TrainerConfig

    config = ContextExtensionConfig()
    recall = {n: [f"recall-{n}.tokens.npy"] for n in (96, 160, 256)}
    names, specs = {}, {}
    for stage in ("ctx_512", "ctx_768"):
        specs[stage] = midtrain_job_specs(
            tmp_path,
            ModelConfig(),
            TrainerConfig(),
            config,
            stage,
            ["rows.tokens.npy"],
            tmp_path / stage,
            recall_shards=recall,
            recall_eval_shards={96: ["recall-eval-96.tokens.npy"]},
        )
        names[stage] = [(Path(s.run_dir).name, s.trainer.dsa_mode) for s in specs[stage]]
        for parent, child in zip(specs[stage], specs[stage][1:], strict=False):
            assert child.init_from == str(Path(parent.run_dir) / "hf")
    # ctx_512 opens with the recall curriculum: dense, short to long, each on its own rows.
    assert names["ctx_512"] == [
        ("recall_96", "dense"),
        ("recall_160", "dense"),
        ("recall_256", "dense"),
        ("main", "dense"),
        ("indexer_warmup", "indexer_warmup"),
    ]
    first = specs["ctx_512"][0]
    assert first.init_from == str(tmp_path)
    assert first.data.kwargs["shard_paths"] == ["recall-96.tokens.npy"]
    assert (first.data.kwargs["seq_len"], first.trainer.steps) == (96, 400)
    # The curriculum has its own LR; the main phase runs at the stage's (lower, to keep what it learned).
    stage = config.stage("ctx_512")
    expected = [p.learning_rate for p in stage.recall_curriculum] + [stage.learning_rate]
    assert [s.trainer.optim.lr for s in specs["ctx_512"][:4]] == expected
    assert expected[2] != expected[3]
    assert specs["ctx_512"][3].data.kwargs["shard_paths"] == ["rows.tokens.npy"]
    assert names["ctx_768"] == [("indexer_warmup", "indexer_warmup"), ("main", "sparse")]
    # the held-out recall rows are the curriculum phase's eval data (its eval_loss: the answers' NLL)
    assert first.eval_data.factory == "training.data:heldout_batches"
    assert first.eval_data.kwargs["shard_paths"] == ["recall-eval-96.tokens.npy"]
    assert first.eval_data.kwargs["seq_len"] == 96 and specs["ctx_512"][1].eval_data is None  # none for 160
    # The 96-token phase sets its own replay (2); the others take curriculum_replay_rows.
    assert stage.recall_curriculum[0].replay_rows == 2 and stage.recall_curriculum[1].replay_rows is None
    assert first.data.kwargs["batch_size"] == stage.recall_curriculum[0].batch_size + 2
    # replay rows are added to each curriculum step's batch; the main phase keeps its batch
    replayed = config.model_copy(update={"curriculum_replay_rows": 3})
    with_replay = midtrain_job_specs(tmp_path, ModelConfig(), TrainerConfig(), replayed, "ctx_512",
                                     ["rows.tokens.npy"], tmp_path / "r", recall_shards=recall)  # fmt: skip
    assert [s.data.kwargs["batch_size"] for s in with_replay[:4]] == [
        *(p.batch_size + (2 if p.seq_len == 96 else 3) for p in stage.recall_curriculum),
        stage.batch_size,
    ]
    with pytest.raises(ValueError, match=r"no recall-curriculum rows for seq_len \[160\]"):
        midtrain_job_specs(
            tmp_path,
            ModelConfig(),
            TrainerConfig(),
            config,
            "ctx_512",
            ["r"],
            tmp_path,
            recall_shards={96: ["a"], 256: ["b"]},
        )


def test_recall_curriculum_must_fit_the_stage():
    with pytest.raises(ValidationError, match=r"recall_curriculum seq_len \[600\] exceeds"):
        ContextStage(name="a", seq_len=512, recall_curriculum=[{"seq_len": 600, "steps": 1}])
    with pytest.raises(ValidationError, match="recall_curriculum seq_len must increase"):
        ContextStage(
            name="a",
            seq_len=512,
            recall_curriculum=[{"seq_len": 160, "steps": 1}, {"seq_len": 96, "steps": 1}],
        )


def test_filler_comes_from_the_largest_source():
    from training.context_extension import filler_source_of

    small, large = [np.arange(10)] * 3, [np.arange(1000)] * 2
    # A small source as filler is memorised: repeated passages become predictable without looking back.
    assert filler_source_of({"web": small, "code": large}) == "code"


def test_interleave_chunks_round_robin():
    a, b = np.arange(0, 5), np.arange(100, 103)
    assert interleave_chunks([a, b], 2).tolist() == [0, 1, 100, 101, 2, 3, 102, 4]
    assert interleave_chunks([a, b], 0).tolist() == [0, 1, 2, 3, 4, 100, 101, 102]


def topic_docs(n_per_topic=60, seed=0):
    """Three topics with disjoint vocabularies (ids 10-59, 60-109, 110-159) plus shared 'stop words' 2-9."""
    rng = random.Random(seed)
    docs, labels = [], []
    for topic in range(3):
        for _ in range(n_per_topic):
            n = rng.randint(20, 60)
            ids = [rng.randrange(10 + 50 * topic, 60 + 50 * topic) if rng.random() < 0.6 else rng.randrange(2, 10)
                   for _ in range(n)]  # fmt: skip
            docs.append(np.array(ids + [0]))
            labels.append(topic)
    order = list(range(len(docs)))
    rng.shuffle(order)
    return [docs[i] for i in order], [labels[i] for i in order]


def test_interleaved_packing_groups_similar_docs():
    docs, labels = topic_docs()
    order = similarity_order(docs, vocab_size=200, docs_per_cluster=8, seed=0)
    probs = length_weights(np.array([len(d) for d in docs]), 1.0)
    rng = np.random.default_rng(0)
    similar = [pack_similar(docs, order, probs, 256, 16, rng)[1] for _ in range(60)]
    random_rows = [pack_random(docs, probs, 256, rng)[1] for _ in range(60)]
    purity_similar, purity_random = row_purity(similar, labels), row_purity(random_rows, labels)
    assert purity_similar > 0.9
    assert purity_random < 0.6  # 3 balanced topics: ~0.45 by chance for ~7 docs per row
    # Adjacent docs in similarity order share a topic far more often than in corpus order.
    assert np.mean([labels[order[i]] == labels[order[i + 1]] for i in range(len(order) - 1)]) > 0.9


def test_similarity_clusters_match_a_per_cluster_kmeans_and_the_order_is_a_permutation():
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((6, 16))
    vecs = centres[rng.integers(0, 6, 300)] + 0.3 * rng.standard_normal((300, 16))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    # Reference: the plain loop (one centroid per cluster, empty clusters keep theirs), 12 clusters for 6 blobs.
    k, centroids = 12, vecs[np.random.default_rng(7).choice(300, size=12, replace=False)].copy()
    for _ in range(10):
        expected = np.argmax(vecs @ centroids.T, axis=1)
        for c in range(k):
            if (expected == c).any():
                mean = vecs[expected == c].sum(0)
                centroids[c] = mean / np.linalg.norm(mean)
    labels = similarity_clusters(vecs, k, seed=7)
    assert np.array_equal(labels, expected)
    docs, _ = topic_docs()
    order = similarity_order(docs, vocab_size=200, docs_per_cluster=8, seed=0)
    assert sorted(order.tolist()) == list(range(len(docs)))


def test_length_weighted_sampler_upsamples_long_docs():
    lengths = np.array([10] * 90 + [1000] * 10)
    for alpha, expected in [
        (0.0, 0.10),
        (1.0, 10_000 / 10_900),
        (2.0, 10 * 1000**2 / (10 * 1000**2 + 90 * 100)),
    ]:
        assert length_weights(lengths, alpha)[90:].sum() == pytest.approx(expected)


def test_midtrain_rows_mix_and_lengths():
    docs, _ = topic_docs(40)
    long_docs = [np.arange(2, 1200) % 150 + 10 for _ in range(4)]
    filler = FillerText(docs, eos_id=0)

    def encode(text):  # a byte "tokenizer": ids 160-255 never clash with the topic ids
        return [160 + (b % 96) for b in text.encode()]

    config = ContextExtensionConfig(
        base_seq_len=128, rows_per_stage=80, synthetic_share=0.25, long_doc_alpha=2.0,
        stages=[ContextStage(name="s1", seq_len=512)],
    )  # fmt: skip
    rows, metrics = build_midtrain_rows(
        {"web": docs + long_docs}, {"web": 1.0}, filler, encode, 0, 256, config, config.stages[0]
    )
    assert rows.shape == (80, 512)
    assert metrics["rows/synthetic"] == 20
    assert metrics["rows/interleaved"] + metrics["rows/random"] == 60
    # alpha=2 makes the 4 long docs dominate the natural rows, well above their share of corpus tokens: they
    # are drawn with probability 4 * 1198^2 / (4 * 1198^2 + sum of short len^2) ~ 0.97 (measured token share
    # 0.983; alpha=1 gives 0.82, alpha=0 0.13, the corpus share is 0.49).
    assert metrics["long_doc_token_share/corpus"] == pytest.approx(0.49, abs=0.01)
    assert metrics["long_doc_token_share/sampled"] > 0.95
    again, _ = build_midtrain_rows(
        {"web": docs + long_docs}, {"web": 1.0}, filler, encode, 0, 256, config, config.stages[0]
    )
    assert (again == rows).all()  # seeded


def ascii_encode(text):  # printable ASCII -> ids 160..255, clear of the topic-doc ids
    return [160 + ord(c) - 32 for c in text.replace("\n", " ")]


def ascii_decode(row):
    return "".join(chr(t - 160 + 32) if t >= 160 else ("|" if t == 0 else "#") for t in row)


def test_synthetic_recall_rows_answer_from_context():
    docs, _ = topic_docs(20)
    rows, targets = synthetic_recall_examples(
        ascii_encode, FillerText(docs, eos_id=0), n_rows=40, seq_len=700, eos_id=0, seed=1, multikey_share=0.5
    )
    assert rows.shape == targets.shape == (40, 700)
    again, _ = synthetic_recall_examples(ascii_encode, FillerText(docs, eos_id=0), 40, 700, 0, seed=1)
    assert (again == rows).all()  # seeded: the same rows again
    kinds = {"passkey": 0, "multikey": 0}
    for row, mask in zip(rows, targets, strict=True):
        text = ascii_decode(row)
        # the mask marks the asked keys only: each answer's characters, spaces between answers
        answers = ascii_decode(np.where(mask, row, 160)).replace("#", "").split()
        assert text.endswith("|")  # the answer, then EOS
        if "What is the pass key?" in text:
            kinds["passkey"] += 1
            needle = re.search(r"The pass key is (\d{5})\. Remember it", text).group(1)
            assert text.endswith(f"What is the pass key? The pass key is {needle}|")
            assert answers == [needle] and mask.sum() == 6  # " 12345" in this one-character-per-token code
        else:
            kinds["multikey"] += 1
            codes = dict(re.findall(r" The secret code of (\w+) is (\d{5})\. ", text))
            asked = re.findall(r"What is the secret code of (\w+)\? The secret code of \1 is (\d{5})\.", text)
            assert 2 <= len(codes) <= 16 and 1 <= len(asked) <= len(codes)
            assert all(codes[name] == key for name, key in asked)
            assert answers == [key for _, key in asked] and mask.sum() == 6 * len(asked)
    assert 10 <= kinds["passkey"] <= 30 and 10 <= kinds["multikey"] <= 30


def test_midtrain_stage_trains_from_parent_with_extended_rope(tmp_path):
    from transformers import AutoConfig

    from training.model import ModelConfig, build_model, load_model
    from training.trainer import TrainerConfig

    model_cfg = ModelConfig.for_size("micro", vocab_size=256, max_position_embeddings=64, eos_token_id=0)
    parent = tmp_path / "parent"
    build_model(model_cfg, seed=0).save_pretrained(parent)
    docs, _ = topic_docs(30)
    config = ContextExtensionConfig(
        base_seq_len=64, rows_per_stage=16, synthetic_share=0.0,
        stages=[ContextStage(name="ctx_128", seq_len=128, rope_theta=40_000.0, steps=3, batch_size=2,
                             indexer_warmup_steps=2)],
    )  # fmt: skip
    rows, _ = build_midtrain_rows(
        {"web": docs}, {"web": 1.0}, FillerText(docs, 0), ascii_encode, 0, 256, config, config.stages[0]
    )
    shard = tmp_path / "rows.tokens.npy"
    np.save(shard, rows.reshape(-1).astype(np.uint16))
    np.save(tmp_path / "rows.docs.npy", np.arange(len(rows) + 1) * 128)
    trainer_cfg = TrainerConfig(
        precision="fp32", progress=False, eval_every=0, checkpoint_every=0, log_every=1
    )
    out = midtrain_stage(
        parent, model_cfg, trainer_cfg, config, "ctx_128", [shard], tmp_path / "run",
        heldout={"web": [shard]}, in_process=True,
    )  # fmt: skip
    assert out == tmp_path / "run" / "main" / "hf"
    hf = AutoConfig.from_pretrained(out)
    assert hf.rope_parameters["rope_theta"] == 40_000.0 and hf.max_position_embeddings == 128
    before, warm, after = (
        load_model(parent),
        load_model(tmp_path / "run" / "indexer_warmup" / "hf"),
        load_model(out),
    )
    name_idx = next(n for n, _ in before.named_parameters() if ".indexer." in n)
    name_main = "model.embed_tokens.weight"
    params = [dict(m.named_parameters()) for m in (before, warm, after)]
    # Warm-up trains only the indexer; the main phase trains the model.
    assert not torch.equal(params[0][name_idx], params[1][name_idx])
    assert torch.equal(params[0][name_main], params[1][name_main])
    assert not torch.equal(params[1][name_main], params[2][name_main])
    metrics = [
        json.loads(line) for line in (tmp_path / "run" / "main" / "metrics.jsonl").read_text().splitlines()
    ]
    assert max(m["step"] for m in metrics) == 3
    assert any("eval_loss" in m for m in metrics) and any("topk_mass" in m for m in metrics)


def test_repeat_rows_copy_a_passage():
    from training.recall_tasks import repeat_sequence

    docs, _ = topic_docs(20)
    rng = np.random.default_rng(0)
    for _ in range(10):
        row, targets = repeat_sequence(FillerText(docs, eos_id=0), rng, 300, eos_id=0)
        assert len(row) == 300 and row[-1] == 0
        body = row[:-1]
        # the longest n with body[:n] == body[-n:] is the passage length: 1/8 .. 1/3 of the row
        n = max(k for k in range(1, 150) if (body[:k] == body[-k:]).all())
        assert 300 // 8 <= n <= 300 // 3
        assert targets.sum() == n and targets[-1 - n : -1].all()  # the second copy is the answer
    rows, _ = synthetic_recall_examples(ascii_encode, FillerText(docs, 0), 200, 700, 0, seed=2, multikey_share=0.3,
                                 repeat_share=0.4)  # fmt: skip
    n_repeat = sum("What is" not in ascii_decode(r) for r in rows)
    n_passkey = sum("What is the pass key?" in ascii_decode(r) for r in rows)
    # Binomial(200, 0.4): sd 6.9, 2.5 sd = 17 (measured 77; seeds 0-4: 77-84). Swapped repeat and multi-key
    # shares would give ~60. Passkey rows are the remaining 0.3 (measured 70: multi-key rows that do not fit
    # fall back to passkey).
    assert 80 - 17 <= n_repeat <= 80 + 17
    assert 60 - 16 <= n_passkey <= 60 + 16


def test_midtrain_shards_commit_rows_and_recall_as_one_version(tmp_path):
    """The stage's rows, its recall-curriculum rows with their loss masks, and the held-out eval rows are
    one committed version: read back through the pointer they have the built shapes and train on the
    answers only, and a rebuild with the same inputs is the same version."""
    import gzip

    from infra.committed import commit, read_committed
    from infra.store import LocalStore
    from training.context_extension import RecallPhase, build_midtrain_shards, midtrain_shard_paths
    from training.data import (
        MixtureConfig,
        TokenBatches,
        build_token_shards,
        heldout_batches,
        load_corpus_tokenizer,
        load_shard,
    )
    from training.tokenizer import TokenizerConfig, train_tokenizer

    store = LocalStore(tmp_path / "store")
    rng = random.Random(0)
    words = "river stone light paper code math sum prime graph node alpha beta".split()
    docs = [{"id": str(i), "text": " ".join(rng.choices(words, k=rng.randint(20, 400)))} for i in range(60)]
    (tmp_path / "web" / "kept").mkdir(parents=True)
    with gzip.open(tmp_path / "web/kept/00000.jsonl.gz", "wt") as fh:
        fh.writelines(json.dumps(d) + "\n" for d in docs)
    commit(store, "web/filtered/s1", tmp_path / "web")  # as web_filtered does
    tok = train_tokenizer((d["text"] for d in docs), TokenizerConfig(vocab_size=300), tmp_path / "tok")
    build_token_shards(
        MixtureConfig(weights={"web": 1.0}, heldout_fraction=0.2), store, {"web": ["web/filtered/s1/kept/"]},
        tok, "tokens",
    )  # fmt: skip
    stage = ContextStage(
        name="s1", seq_len=512, recall_curriculum=[RecallPhase(seq_len=256, steps=2, batch_size=3)]
    )  # the passkey template alone is ~190 tokens of this 300-token vocabulary
    config = ContextExtensionConfig(
        base_seq_len=128, rows_per_stage=10, synthetic_share=0.2, stages=[stage], curriculum_replay_rows=0
    )  # replay comes in below
    result = build_midtrain_shards(config, "s1", store, "tokens", tok / "tokenizer.json", "rows/s1", tmp_path)
    out = read_committed(store, "rows/s1")
    assert out.version == result.outputs["version"] and out.meta["data_version"] == result.data_version
    assert out.names() == [
        "recall-256/shard-00000.docs.npy", "recall-256/shard-00000.targets.npy",
        "recall-256/shard-00000.tokens.npy", "recall-eval-256/shard-00000.docs.npy",
        "recall-eval-256/shard-00000.targets.npy", "recall-eval-256/shard-00000.tokens.npy",
        "shard-00000.docs.npy", "shard-00000.tokens.npy",
    ]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:  # a local store is read in place: no cache dir is made
        mp.setattr(tempfile, "mkdtemp", lambda *a, **k: pytest.fail("a cache dir for a local store"))
        shards = midtrain_shard_paths(store, "rows/s1")
    tokens, offsets = load_shard(shards.rows)
    assert tokens.shape == (10 * 512,) and list(offsets) == list(range(0, 11 * 512, 512))
    recall = shards.recall
    assert list(recall) == [256] and load_shard(recall[256])[0].shape == (2 * 3 * 256,)
    # Training batches of the curriculum carry labels on the asked keys only (5 digits, each a key in the text).
    decode = load_corpus_tokenizer(tok).decode
    batch = TokenBatches([recall[256]], 256, 6, aligned=True).batch_at(0)
    for ids, labels in zip(batch["input_ids"], batch["labels"], strict=True):
        keep = labels != -100
        assert 0 < int(keep.sum()) < 256 and (labels[keep] == ids[keep]).all()
        answers = decode(ids[keep].tolist()).split()
        assert answers and all(a.isdigit() and len(a) == 5 and a in decode(ids.tolist()) for a in answers)
    # Held-out eval rows: passkey rows in held-out text, scored on their answer (the eval's metric is its NLL).
    assert list(shards.recall_eval) == [256]
    (evals,) = heldout_batches([shards.recall_eval[256]], 256, 32, max_batches=1)
    assert evals["input_ids"].shape == (config.curriculum_eval_rows, 256)
    for ids, labels in zip(evals["input_ids"], evals["labels"], strict=True):
        key = decode(ids[labels != -100].tolist()).strip()
        assert len(key) == 5 and key.isdigit() and f"The pass key is {key}." in decode(ids.tolist())
    again = build_midtrain_shards(config, "s1", store, "tokens", tok / "tokenizer.json", "rows/s1", tmp_path)
    assert again.outputs["version"] == out.version  # seeded: same rows, same content hash
    # additive replay: 2 natural rows per curriculum step on top of its 3 recall rows
    replayed = config.model_copy(update={"curriculum_replay_rows": 2})
    result = build_midtrain_shards(
        replayed, "s1", store, "tokens", tok / "tokenizer.json", "rows/r", tmp_path
    )
    assert result.metrics["replay_rows/256"] == 4 and result.metrics["recall_rows/256"] == 2 * (3 + 2)
    replay_tokens = load_shard(midtrain_shard_paths(store, "rows/r").recall[256])[0].reshape(-1, 256)
    recall_tokens = load_shard(recall[256])[0].reshape(-1, 256)
    natural = [r for r in replay_tokens.tolist() if r not in recall_tokens.tolist()]
    assert len(replay_tokens) == 10 and len(natural) == 4  # the recall rows are the same ones as without
    # a phase's own multi-key share wins over the config's: 0 = passkey rows only
    kinds = {}
    for share in (None, 0.0):
        phase = RecallPhase(seq_len=256, steps=4, batch_size=3, multikey_share=share)
        one = config.model_copy(update={"stages": [stage.model_copy(update={"recall_curriculum": [phase]})]})
        build_midtrain_shards(one, "s1", store, "tokens", tok / "tokenizer.json", f"rows/m{share}", tmp_path)
        texts = [
            decode(r.tolist())
            for r in load_shard(midtrain_shard_paths(store, f"rows/m{share}").recall[256])[0].reshape(-1, 256)
        ]
        kinds[share] = sum("What is the pass key?" in t for t in texts) / len(texts)
    assert kinds[0.0] == 1.0 and kinds[None] < 1.0  # the config's 0.5 draws multi-key rows too
    # a copy phase: every row repeats a passage and only its second copy is trained on and evaluated, so it
    # may be shorter than the passkey template (~190 tokens here)
    phase = RecallPhase(seq_len=128, steps=4, batch_size=3, repeat_share=1.0)
    one = config.model_copy(update={"stages": [stage.model_copy(update={"recall_curriculum": [phase]})]})
    build_midtrain_shards(one, "s1", store, "tokens", tok / "tokenizer.json", "rows/copy", tmp_path)
    copy_shards = midtrain_shard_paths(store, "rows/copy")
    batch = TokenBatches([copy_shards.recall[128]], 128, 12, aligned=True).batch_at(0)
    (evals,) = heldout_batches([copy_shards.recall_eval[128]], 128, 32, max_batches=1)
    for rows in (batch, evals):
        for ids, labels in zip(rows["input_ids"], rows["labels"], strict=True):
            keep = (labels != -100).nonzero()[:, 0]
            length = len(keep)
            assert 128 // 8 <= length <= 128 // 3 and (keep == torch.arange(keep[0], keep[0] + length)).all()
            assert keep[0] > length and (ids[keep] == ids[:length]).all()  # the passage, after a gap, again


def test_a_small_source_is_replayed_at_most_max_source_epochs_over_the_whole_extension(tmp_path):
    """Natural rows are drawn with the mixture's weights capped so that a tiny source is not repeated many
    times over: built by the real token-shard producer, the web rows' share follows the capped weight, not 0.9."""
    import gzip

    from infra.committed import commit
    from infra.store import LocalStore
    from training.context_extension import RecallPhase, build_midtrain_shards, natural_tokens
    from training.data import MixtureConfig, build_token_shards
    from training.tokenizer import TokenizerConfig, train_tokenizer

    store = LocalStore(tmp_path / "store")
    rng = random.Random(0)
    words = "river stone light paper code math sum prime graph node alpha beta".split()
    texts = {"web": [20] * 6, "code": [200] * 60}
    for source, lengths in texts.items():
        (tmp_path / source / "kept").mkdir(parents=True)
        with gzip.open(tmp_path / source / "kept/00000.jsonl.gz", "wt") as fh:
            for i, n in enumerate(lengths):
                fh.write(json.dumps({"id": f"{source}{i}", "text": " ".join(rng.choices(words, k=n))}) + "\n")
        commit(store, f"{source}/s1", tmp_path / source)
    tok = train_tokenizer(iter(words * 20), TokenizerConfig(vocab_size=300), tmp_path / "tok")
    shards = build_token_shards(
        MixtureConfig(weights={"web": 0.9, "code": 0.1}, heldout_fraction=0.0), store,
        {"web": ["web/s1/kept/"], "code": ["code/s1/kept/"]}, tok, "tokens",
    )  # fmt: skip
    web_tokens = shards.metrics["train_tokens/web"]
    stage = ContextStage(
        name="s1", seq_len=512, steps=10, recall_curriculum=[RecallPhase(seq_len=256, steps=5, batch_size=2)]
    )  # the passkey template alone is ~190 tokens of this 300-token vocabulary
    config = ContextExtensionConfig(
        base_seq_len=128, rows_per_stage=400, synthetic_share=0.0, stages=[stage], curriculum_replay_rows=2,
        max_source_epochs=2.0,
    )  # fmt: skip
    assert natural_tokens(config) == 10 * 4 * 512 + 5 * 2 * 256  # main-phase rows and curriculum replay
    result = build_midtrain_shards(config, "s1", store, "tokens", tok / "tokenizer.json", "rows/c", tmp_path)
    m = result.metrics
    assert m["source_epochs/web"] == pytest.approx(2.0)
    assert (
        m["mixture_midtrain/web"] == pytest.approx(2 * web_tokens / natural_tokens(config))
        and m["mixture_midtrain/web"] < 0.2
    )
    web_share = m["rows/source/web"] / 400
    p = m["mixture_midtrain/web"]
    assert abs(web_share - p) < 4 * (p * (1 - p) / 400) ** 0.5
    uncapped = config.model_copy(update={"max_source_epochs": None})
    m = build_midtrain_shards(
        uncapped, "s1", store, "tokens", tok / "tokenizer.json", "rows/u", tmp_path
    ).metrics
    assert m["mixture_midtrain/web"] == pytest.approx(0.9) and m["rows/source/web"] / 400 > 0.8


def test_curriculum_replay_mixes_natural_rows_by_the_mixture():
    from training.context_extension import curriculum_rows, replay_rows

    rng = np.random.default_rng(0)
    docs = {"web": [np.full(50, 7, np.int64)] * 4, "code": [np.full(30, 9, np.int64)] * 4}
    rows = replay_rows(docs, {"web": 3.0, "code": 1.0}, 400, 16, rng)
    assert rows.shape == (400, 16)
    web_share = float((rows[:, 0] == 7).mean())
    assert abs(web_share - 0.75) < 4 * (0.75 * 0.25 / 400) ** 0.5  # the mixture's share, within 4 SE
    recall = np.arange(32, dtype=np.int64).reshape(2, 16)
    assert curriculum_rows(recall, replay_rows(docs, {"web": 1.0}, 0, 16, rng), rng)[0] is recall  # no replay
    mixed, no_mask = curriculum_rows(recall, rows[:6], rng)
    assert no_mask is None
    assert len(mixed) == 8 and sorted(map(tuple, mixed.tolist())) == sorted(
        map(tuple, np.concatenate([recall, rows[:6]]).tolist())
    )
    # with masks: each row keeps its own through the shuffle; replay rows train on every token
    targets = np.zeros(recall.shape, dtype=bool)
    targets[:, -3:] = True
    mixed, mask = curriculum_rows(recall, rows[:6], np.random.default_rng(1), targets)
    for row, keep in zip(mixed, mask, strict=True):
        natural = not (row[:13] == np.arange(16)[:13] + row[0]).all()
        assert keep.all() if natural else (keep.sum() == 3 and keep[-3:].all())


@pytest.mark.parametrize("method", ["abf", "yarn"])
def test_a_stage_after_midtraining_keeps_the_extended_rope(tmp_path, method):
    """SFT (and every post-training stage) builds its config from the profile's pretraining model; before
    `with_checkpoint_rope` it trained the 1024-token, theta-40k midtrained checkpoint under the base's
    theta 10k and exported it so (on tiny: passkey at 1024 0.475 -> 0.325 and web perplexity 135 -> 521)."""
    from training.checkpoint import export_hf
    from training.model import ModelConfig, build_model, with_checkpoint_rope

    base = ModelConfig.for_size("micro")
    stage = ContextStage(name="ctx_1024", seq_len=1024, rope_theta=40_000.0)
    extended = stage_model_config(base, stage, method, base_seq_len=256)
    parent = export_hf(build_model(extended), tmp_path / "midtrained", {})
    kept = with_checkpoint_rope(base, parent)
    fields = ("rope_theta", "rope_scaling", "max_position_embeddings")
    assert {f: getattr(kept, f) for f in fields} == {f: getattr(extended, f) for f in fields}
    assert kept.rope_theta != base.rope_theta or kept.rope_scaling != base.rope_scaling
    assert kept.model_copy(update={f: getattr(base, f) for f in fields}) == base  # nothing else changed
