"""The post-training results table on micro checkpoints: one row per checkpoint in chain order, a `value ± se`
cell per metric, a PNG, and a checkpoint trained on the held-out behaviour scores better where it should."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from infra.tracking import metric_name
from training.agentic.terminal import TerminalSuite
from training.checkpoint import export_hf
from training.model import ModelConfig, build_model
from training.recall_tasks import FillerText, passkey_items
from training.report import HeldoutSets, ReportConfig, post_training_report, report_table, row_nlls
from training.rollout.multiturn import prompt_ids
from training.tasks.base import Task, Verdict
from training.tokenizer import END_OF_TURN, TokenizerConfig, load_tokenizer, train_tokenizer

WORDS = ["red", "blue", "green", "gold", "pink", "gray"]


class SaysBlue:
    domain, version = "color", "t1"

    def verify(self, task: Task, response: str) -> Verdict:
        return Verdict(1.0, "correct") if "blue" in response else Verdict(0.0, "wrong_answer")


def _answer_rows(tok, tasks, word: str) -> list[list[int]]:
    answer = list(tok(word, add_special_tokens=False)["input_ids"]) + [tok.convert_tokens_to_ids(END_OF_TURN)]
    return [prompt_ids(tok, t) + answer for t in tasks]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Two checkpoints of one chain: `base` (untrained) and `sft` (a few language-modelling steps on chats answering 'blue')."""
    root = tmp_path_factory.mktemp("report")
    corpus = [" ".join(WORDS) + " pick a color" for _ in range(50)]
    tok_dir = train_tokenizer(corpus, TokenizerConfig(vocab_size=320), root / "tok")
    tok = load_tokenizer(tok_dir)
    cfg = ModelConfig.for_size(
        "micro", vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=1, index_topk=512
    )
    train = [Task(f"c{i}", "color", f"pick a color {i}", "blue", 1, "train") for i in range(8)]
    base = build_model(cfg, seed=1)
    sft = build_model(cfg, seed=1)
    sft.load_state_dict(base.state_dict())
    opt = torch.optim.AdamW(sft.parameters(), lr=3e-3)
    for _ in range(40):
        loss = 0.0
        for row in _answer_rows(tok, train, " blue"):  # every token: the chat format and the answer
            logits = sft(input_ids=torch.tensor([row])).logits[0, :-1]
            loss = loss + torch.nn.functional.cross_entropy(logits.float(), torch.tensor(row[1:]))
        opt.zero_grad()
        (loss / len(train)).backward()
        opt.step()
    files = {n: tok_dir / n for n in ("tokenizer.json", "tokenizer_config.json")}
    dirs = {
        "base": export_hf(base.eval(), root / "base", files),
        "sft": export_hf(sft.eval(), root / "sft", files),
    }
    return tok, dirs


def _sets(tok) -> HeldoutSets:
    heldout = [Task(f"h{i}", "color", f"pick a color {i + 100}", "blue", 1, "heldout") for i in range(6)]
    rows = _answer_rows(tok, heldout, " blue")
    width = min(len(r) for r in rows)
    filler = FillerText([np.array(r) for r in rows])
    encode = lambda text: list(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    return HeldoutSets(
        text_rows={"chat": torch.tensor([r[:width] for r in rows])},
        passkey=passkey_items(encode, filler, [256], [0.2, 0.8], 3, 4, seed=0, key_digits=2),
        reasoning=heldout,
        test=[Task(f"t{i}", "color", f"pick a color {i + 300}", "blue", 1, "test") for i in range(4)],
        verifiers={"color": SaysBlue()},
        agentic=TerminalSuite().generate("heldout", 2, 0, 1),
    )


def test_table_has_a_row_per_checkpoint_and_a_cell_with_se_per_metric(chain, tmp_path):
    tok, dirs = chain
    cfg = ReportConfig(max_new_tokens=4, max_turns=1, agentic_max_new_tokens=8, agentic_max_turns=2)

    def general(model, tokenizer):  # a stand-in for the general-reward scorer: one component, per prompt
        return {"helpfulness": {"g1": 0.4, "g2": 0.6}}

    report = post_training_report(dirs, _sets(tok), cfg, tmp_path, score_general=general, tokenizer=tok)
    lines = report.markdown.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    metrics = ["ppl/chat", "passkey/256", "pass_at_1/color", "test/pass_at_1/color", "success/terminal",
               "general/helpfulness"]  # fmt: skip
    assert header == ["checkpoint", *metrics]
    body = lines[2:]
    assert [r.split("|")[1].strip() for r in body] == ["base", "sft"]  # chain order, one row each
    for row in body:
        cells = [c.strip() for c in row.strip("|").split("|")][1:]
        assert len(cells) == len(metrics)
        assert all(re.fullmatch(r"-?\d+\.\d+ ± \d+\.\d+", c) for c in cells), cells
    assert report.plot is not None and report.plot.stat().st_size > 5_000
    assert report.plot.read_bytes()[:4] == b"\x89PNG"
    flat = report.flat_metrics()
    assert {"sft/pass_at_1/color", "sft/pass_at_1/color_se", "base/ppl/chat_se"} <= set(flat)
    assert all(metric_name(k) == k for k in flat)  # MLflow takes every key as is (it refused 'pass@1/...')

    # the checkpoint taught to answer 'blue' scores higher where it should, by more than the SEs
    base, sft = report.scores["base"], report.scores["sft"]
    assert sft["pass_at_1/color"][0] == 1.0 and base["pass_at_1/color"][0] == 0.0
    assert sft["test/pass_at_1/color"][0] == 1.0 and base["test/pass_at_1/color"][0] == 0.0
    assert sft["ppl/chat"][0] + 2 * sft["ppl/chat"][1] < base["ppl/chat"][0] - 2 * base["ppl/chat"][1]
    assert base["ppl/chat"][1] > 0  # a real SE over rows
    p = base["passkey/256"][0]
    assert base["passkey/256"][1] == pytest.approx((p * (1 - p) / 6) ** 0.5)
    assert base["general/helpfulness"] == pytest.approx((0.5, 0.1))  # mean and SE of its per-prompt values

    # per-item values behind every cell: their means are the cells (perplexity: exp of the mean row NLL)
    items = report.items["sft"]
    assert set(items) == set(metrics)
    assert sum(items["pass_at_1/color"].values()) / 6 == sft["pass_at_1/color"][0]
    assert np.exp(np.mean(list(items["ppl/chat"].values()))) == pytest.approx(sft["ppl/chat"][0])
    assert set(items["test/pass_at_1/color"]) == {"t0", "t1", "t2", "t3"}  # the whole test split
    assert len(items["passkey/256"]) == 6 and set(items["success/terminal"]) <= {
        t.id for t in _sets(tok).agentic
    }


def test_test_split_is_whole_and_can_be_switched_off(chain):
    from training.report import build_heldout_sets

    tok, _ = chain
    test = [Task(f"t{i}", "color", f"pick {i}", "blue", 1 + i % 3, "test") for i in range(70)]
    heldout = [Task(f"h{i}", "color", f"pick {i}", "blue", 1, "heldout") for i in range(70)]
    cfg = ReportConfig(reasoning_tasks_per_domain=10, reasoning_tasks_for={})
    sets = build_heldout_sets(tok, cfg, None, heldout, test=test)
    assert len(sets.reasoning) == 10 and [t.id for t in sets.test] == [t.id for t in test]  # never capped
    off = build_heldout_sets(tok, cfg.model_copy(update={"test_split": False}), None, heldout, test=test)
    assert off.test == [] and len(off.reasoning) == 10


def test_missing_metrics_render_as_a_dash():
    md = report_table({"a": {"ppl/web": (12.345, 0.5)}, "b": {"pass_at_1/math": (0.25, 0.05)}})
    assert "| a | 12.35 ± 0.50 | — |" in md and "| b | — | 0.250 ± 0.050 |" in md


def test_recovery_rows_measure_the_drop_and_what_distillation_won_back():
    from training.report import recovery_rows

    scores = {
        "sft": {"pass_at_1/math": (0.50, 0.05), "ppl/web": (20.0, 0.5)},
        "reasoning_rl": {"pass_at_1/math": (0.40, 0.05), "ppl/web": (22.0, 0.5)},
        "agentic_rl": {"pass_at_1/math": (0.20, 0.05), "ppl/web": (30.0, 0.5)},
        "distilled": {"pass_at_1/math": (0.45, 0.05), "ppl/web": (29.0, 0.5)},
    }
    rows = {r["metric"]: r for r in recovery_rows(scores, "agentic_rl", "distilled")}
    math_row, ppl_row = rows["pass_at_1/math"], rows["ppl/web"]
    assert math_row["teacher"] == "sft" and math_row["drop"] == pytest.approx(0.3)
    assert math_row["teacher score"] == "0.500 ± 0.050" and math_row["RL stage"] == "agentic_rl"
    assert math_row["without distillation"] == "0.200 ± 0.050"
    assert math_row["with distillation"] == "0.450 ± 0.050"
    assert math_row["recovered share"] == pytest.approx(0.83, abs=0.01) and math_row["within_se"]
    assert ppl_row["teacher"] == "sft" and ppl_row["drop"] == pytest.approx(10.0)  # lower is better
    assert ppl_row["recovered"] == pytest.approx(1.0) and not ppl_row["within_se"]
    # only the distillation's own teachers are compared against
    only = {r["metric"]: r for r in recovery_rows(scores, "agentic_rl", "distilled", ["reasoning_rl"])}
    assert only["pass_at_1/math"]["teacher"] == "reasoning_rl"
    assert only["pass_at_1/math"]["drop"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="must both be checkpoints"):
        recovery_rows(scores, "general_rl", "distilled")


def test_recovery_rows_pair_the_drop_and_the_recovery_over_the_same_items():
    from training.report import clear_recoveries, mean_with_se, recovery_rows

    ids = [str(i) for i in range(40)]
    teacher = dict.fromkeys(ids, 1.0)
    rl = {k: float(int(k) >= 8) for k in ids}  # the RL stage breaks 8 of 40
    distilled = {k: float(int(k) >= 2) for k in ids}  # distillation wins 6 of them back
    items = {n: {"pass_at_1/math": v} for n, v in (("sft", teacher), ("rl", rl), ("distilled", distilled))}
    scores = {n: {"pass_at_1/math": mean_with_se(v["pass_at_1/math"])} for n, v in items.items()}
    (row,) = recovery_rows(scores, "rl", "distilled", items=items)
    d = np.array([teacher[k] - rl[k] for k in ids])
    assert row["drop"] == pytest.approx(0.2) and row["recovered"] == pytest.approx(0.15)
    assert row["drop SE (paired)"] == pytest.approx(d.std(ddof=1) / np.sqrt(40), abs=1e-4)
    assert row["clear drop"] and row["recovered share"] == pytest.approx(0.75)
    assert clear_recoveries([row]) == [row]
    # a clear drop recovered by less than half of it, or by less than twice the recovery's SE, is not
    assert clear_recoveries([row], share=0.8) == []
    assert clear_recoveries([dict(row, **{"recovered SE (paired)": 0.08})]) == []
    # a drop that is not over twice its SE is not a clear one, however it recovers
    rl_small = dict(teacher, **{"0": 0.0})
    items["rl"] = {"pass_at_1/math": rl_small}
    scores["rl"] = {"pass_at_1/math": mean_with_se(rl_small)}
    (row,) = recovery_rows(scores, "rl", "distilled", items=items)
    assert not row["clear drop"] and clear_recoveries([row]) == []
    # no per-item values: no paired columns
    assert "clear drop" not in recovery_rows(scores, "rl", "distilled")[0]


def test_test_split_rows_keep_the_held_out_teacher_and_are_never_selected():
    """The held-out (dev) row chooses the teacher; the frozen test split's row is measured against that same
    teacher (choosing the best teacher on the test split would be a choice made on it) and only checks it."""
    from training.report import clear_recoveries, mean_with_se, recovery_rows, test_split_row

    ids = [str(i) for i in range(40)]

    def passing(n: int) -> dict[str, float]:
        return {k: float(int(k) >= n) for k in ids}

    items = {  # dev: sft is the better teacher; test: reasoning_rl would be
        "sft": {"pass_at_1/code": passing(0), "test/pass_at_1/code": passing(10)},
        "reasoning_rl": {"pass_at_1/code": passing(4), "test/pass_at_1/code": passing(0)},
        "agentic_rl": {"pass_at_1/code": passing(16), "test/pass_at_1/code": passing(12)},
        "distilled": {"pass_at_1/code": passing(2), "test/pass_at_1/code": passing(11)},
    }
    scores = {n: {m: mean_with_se(v) for m, v in ms.items()} for n, ms in items.items()}
    rows = recovery_rows(scores, "agentic_rl", "distilled", ["sft", "reasoning_rl"], items)
    dev, test = rows
    assert dev["metric"] == "pass_at_1/code" and dev["teacher"] == "sft" and dev["drop"] == pytest.approx(0.4)
    assert test["metric"] == "test/pass_at_1/code" and test["teacher"] == "sft"  # not reasoning_rl's 1.0
    assert test["drop"] == pytest.approx(0.05) and test["recovered"] == pytest.approx(0.025)
    assert clear_recoveries(rows) == [dev]  # the test row is never selected, even if it were clear
    checked = test_split_row(rows, dev)
    assert checked["metric"] == "test/pass_at_1/code" and checked["holds"] is False
    # the same recovery on the test split as on dev: it holds
    items["agentic_rl"]["test/pass_at_1/code"], items["distilled"]["test/pass_at_1/code"] = (
        passing(26),
        passing(12),
    )
    scores = {n: {m: mean_with_se(v) for m, v in ms.items()} for n, ms in items.items()}
    rows = recovery_rows(scores, "agentic_rl", "distilled", ["sft", "reasoning_rl"], items)
    assert test_split_row(rows, rows[0])["holds"] is True
    assert test_split_row([rows[0]], rows[0]) is None  # no test split scored


def test_paired_se_removes_the_noise_two_checkpoints_share():
    """Same items for both: an item both get right adds nothing, so the paired SE of a small, consistent
    difference is far below the unpaired sqrt(se_a² + se_b²); perplexity goes by the delta method."""
    from training.report import mean_with_se, paired_difference_se, perplexity_of

    rng = np.random.default_rng(0)
    hard = rng.random(200) < 0.5  # what both checkpoints fail
    a = {str(i): float(not h) for i, h in enumerate(hard)}
    b = dict(a, **{k: 0.0 for k in list(a)[:40] if a[k] == 1.0})  # b breaks some of a's successes
    sa, sb = mean_with_se(a), mean_with_se(b)
    broken = sum(a[k] - b[k] for k in a)
    diffs = np.array([a[k] - b[k] for k in a])
    se = paired_difference_se("pass_at_1/math", sa, a, sb, b)
    assert se == pytest.approx(diffs.std(ddof=1) / np.sqrt(200))
    assert sa[0] - sb[0] == pytest.approx(broken / 200) and broken > 10
    assert se < 0.5 * np.hypot(sa[1], sb[1]) and sa[0] - sb[0] > 2 * se
    # only the shared items are paired; fewer than two shares nothing
    assert paired_difference_se("x", sa, {"0": 1.0}, sb, {"0": 0.0}) is None
    # perplexity: rows whose NLL rises by the same 0.1 everywhere differ with (almost) no paired noise
    nll = {str(i): float(x) for i, x in enumerate(rng.normal(3.0, 0.5, 100))}
    worse = {k: v + 0.1 for k, v in nll.items()}
    pa, pb = perplexity_of(list(worse.values())), perplexity_of(list(nll.values()))
    se = paired_difference_se("ppl/web", pa, worse, pb, nll)
    assert pa[0] - pb[0] > 10 * se and pa[1] > 1.0  # unpaired SEs are large, the paired one is not


def _write_heldout(root, docs, prefix="heldout/code", shard_tokens=300):
    """Held-out shards written by the token_shards producer's own shard writer."""
    from training.data import _ShardBuffer

    buf = _ShardBuffer(root, prefix, np.dtype(np.uint16), shard_tokens)
    for i, d in enumerate(docs):
        buf.add(d, {"id": f"d{i}"})
    buf.flush()
    return [root / k for k in buf.keys]


def test_perplexity_test_split_is_the_held_out_tail_and_switches_off(chain, tmp_path):
    from training.report import build_heldout_sets

    tok, _ = chain
    rng = np.random.default_rng(3)
    docs = [rng.integers(2, len(tok), int(rng.integers(20, 90))).tolist() + [0] for _ in range(80)]
    paths = {"code": _write_heldout(tmp_path, docs)}
    cfg = ReportConfig(ppl_seq_len=16, ppl_max_tokens=256, ppl_test_tokens=512, ppl_test_after_tokens=1024,
                       passkey_length=256, passkey_per_depth=1)  # fmt: skip
    sets = build_heldout_sets(tok, cfg, paths)
    dev, test = sets.text_rows["code"], sets.test_text_rows["code"]
    stream = np.concatenate(docs)
    assert dev.shape == (16, 16) and np.array_equal(dev.flatten().numpy(), stream[:256])
    starts = np.cumsum([0] + [len(d) for d in docs])[:-1]
    start = int(starts[starts <= len(stream) - 512][-1])  # the last document that leaves 512 tokens
    assert start >= 1024 and len(test) == 512 // 16
    assert np.array_equal(test.flatten().numpy(), stream[start : start + 16 * len(test)])
    off = build_heldout_sets(tok, cfg.model_copy(update={"test_split": False}), paths)
    assert off.test_text_rows == {} and torch.equal(off.text_rows["code"], dev)
    short = build_heldout_sets(tok, cfg.model_copy(update={"ppl_test_after_tokens": len(stream)}), paths)
    assert short.test_text_rows == {}  # no held-out tokens past the reserve: no test split


def test_perplexity_test_rows_may_not_overlap_the_dev_rows():
    with pytest.raises(ValueError, match="ppl_test_after_tokens=100 is below ppl_max_tokens=200"):
        ReportConfig(ppl_max_tokens=200, ppl_test_after_tokens=100)
    assert ReportConfig(ppl_max_tokens=200, ppl_test_after_tokens=100, ppl_test_tokens=0).ppl_test_tokens == 0


def test_test_perplexity_rows_are_lower_is_better_with_the_delta_method():
    """A test/ppl row is measured like its held-out twin: lower is better, the drop is positive when the RL
    stage's perplexity rose, and its paired SE goes by the delta method."""
    from training.report import higher_is_better, perplexity_of, recovery_rows, test_split_row

    rng = np.random.default_rng(1)
    base = rng.normal(3.0, 0.4, 60)
    nlls = {"sft": base, "rl": base + 0.3 + rng.normal(0, 0.02, 60), "distilled": base + 0.05}
    items = {n: {m: {str(i): float(x) for i, x in enumerate(v)} for m in ("ppl/code", "test/ppl/code")}
             for n, v in nlls.items()}  # fmt: skip
    scores = {n: {m: perplexity_of(list(v.values())) for m, v in ms.items()} for n, ms in items.items()}
    dev, test = recovery_rows(scores, "rl", "distilled", ["sft"], items)
    assert not higher_is_better("test/ppl/code") and higher_is_better("test/pass_at_1/code")
    assert test["metric"] == "test/ppl/code" and test["drop"] == dev["drop"] > 0
    assert test["drop SE (paired)"] == dev["drop SE (paired)"] and test["recovered"] > 0
    assert test_split_row([dev, test], dev)["holds"] is True


def _constant_general(model, tokenizer):
    return {"helpfulness": {"g1": 0.4, "g2": 0.6}}


def _build_constant_general():  # a picklable builder: what a scoring process receives
    return _constant_general


def test_checkpoints_scored_in_two_processes_equal_scoring_in_this_one(chain):
    """workers: 2 spawns two scoring processes (one torch thread each here); the table is the same as one
    process's, item by item (perplexity to float rounding: another thread count sums in another order)."""
    from training.report import score_checkpoints

    tok, dirs = chain
    cfg = ReportConfig(max_new_tokens=4, max_turns=1, agentic_max_new_tokens=8, agentic_max_turns=2)
    one = score_checkpoints(dirs, _sets(tok), cfg.model_copy(update={"workers": 1}), tokenizer=tok,
                            general_builder=_build_constant_general)  # fmt: skip
    two = score_checkpoints(dirs, _sets(tok), cfg.model_copy(update={"workers": 2}),
                            general_builder=_build_constant_general)  # fmt: skip
    assert list(two) == list(dirs)  # chain order
    for name in dirs:
        assert set(two[name].items) == set(one[name].items) >= {"general/helpfulness", "pass_at_1/color"}
        for metric, items in one[name].items.items():
            assert two[name].items[metric] == pytest.approx(items, rel=1e-5), (name, metric)


def test_row_nlls_are_each_rows_mean_next_token_nll():
    model = build_model(ModelConfig.for_size("micro", vocab_size=300), seed=0).eval()
    rows = torch.randint(2, 300, (5, 12), generator=torch.Generator().manual_seed(0))
    got = row_nlls(model, rows, batch_size=2)  # the last batch holds one row
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=rows).logits[:, :-1].float(), dim=-1)
    want = -logp.gather(2, rows[:, 1:, None])[..., 0].mean(1)
    assert len(got) == 5 and torch.allclose(torch.tensor(got), want, atol=1e-5)
    assert len(set(got)) == 5  # each row its own
