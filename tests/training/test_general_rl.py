"""The General RL loop on a micro model: the hybrid reward (rule components here) rises in a few steps, every
component is logged per step, and the held-out evaluation reports each component with its standard error."""

from __future__ import annotations

import pytest
import torch

from training.model import ModelConfig, build_model
from training.rewards.general_prompts import GeneralPromptsConfig, general_prompts
from training.rewards.hybrid import HybridReward, HybridRewardConfig
from training.rewards.rules import Constraints
from training.rl.general import GeneralRLConfig, train_general_rl
from training.tasks.base import Task
from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

COLORS = ["red", "blue", "green", "gold", "pink", "gray"]
FACTS = [(f"term{i}", f"a word number {i} that people use for the thing they see") for i in range(30)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    corpus = [" ".join(COLORS) + " name a color" for _ in range(50)]
    return load_tokenizer(
        train_tokenizer(corpus, TokenizerConfig(vocab_size=320), tmp_path_factory.mktemp("tok"))
    )


def test_general_prompts_split_by_fact_and_carry_their_constraints():
    prompts = general_prompts(FACTS, GeneralPromptsConfig(per_category=20, heldout_fraction=0.2))
    train, held = prompts["train"], prompts["heldout"]
    assert {t.domain for t in train} == {"chat", "instruction", "writing"} == {t.domain for t in held}
    assert not {t.meta["term"] for t in train} & {t.meta["term"] for t in held}
    assert all(Constraints.model_validate(t.meta["constraints"]) for t in train)
    assert any(t.meta["constraints"]["json_keys"] for t in train) and any(
        t.meta["constraints"]["keywords"] for t in train
    )
    again = general_prompts(FACTS, GeneralPromptsConfig(per_category=20, heldout_fraction=0.2))
    assert [t.id for t in again["train"]] == [t.id for t in train]


def test_suite_prompts_cover_every_domain_and_level_in_a_math_first_suite_file():
    from collections import Counter

    # task_suites writes math first, every math level before any knowledge task
    suite = [
        Task(f"m{lv}-{i}", "math", f"sum {lv} {i}", "1", lv, "train") for lv in (1, 2, 3) for i in range(40)
    ]
    suite += [
        Task(f"k{lv}-{i}", "knowledge", f"what is {i}", "x", lv, "train") for lv in (1, 2) for i in range(40)
    ]
    prompts = general_prompts(FACTS, GeneralPromptsConfig(per_category=5, max_suite_tasks=12), suite)
    picked = Counter((t.domain, t.difficulty) for t in prompts["train"] if t.domain in ("math", "knowledge"))
    assert picked == {
        ("math", 1): 2,
        ("math", 2): 2,
        ("math", 3): 2,
        ("knowledge", 1): 3,
        ("knowledge", 2): 3,
    }


def test_general_rl_raises_the_hybrid_reward(tok):
    cfg = ModelConfig.for_size(
        "micro", vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=1, index_topk=512
    )
    model = build_model(cfg, seed=0)
    # toy prompts: a good answer says "blue" (an instruction an untrained model meets by chance now and then)
    # in a few words and ends its turn
    constraints = Constraints(keywords=["blue"], length=(1, 4)).model_dump()
    tasks = [
        Task(
            f"p{i}",
            "instruction",
            f"name a color {i}",
            "",
            1,
            "train",
            {"category": "instruction", "constraints": constraints},
        )
        for i in range(8)
    ]
    weights = {"instruction_style": {"constraints": 1.0, "format": 0.1, "length": 0.1, "forbidden": 0.1}}
    reward = HybridReward(HybridRewardConfig(weights=weights, dimension_weights={"instruction_style": 1.0}))
    rows: list[tuple[int, dict]] = []
    # 60 steps: at 30 the rise depended on the sampling seed (4 of 5 seeds stayed within +0.1 of the start);
    # at 60 every seed of 0-5 ended at total 0.96, constraints 0.99-1.0
    config = GeneralRLConfig(
        steps=60,
        prompts_per_step=4,
        group_size=8,
        max_new_tokens=4,
        learning_rate=3e-3,
        eval_every=60,
        eval_prompts=8,
    )
    final = train_general_rl(model, tok, tasks, tasks, reward, config, lambda m, s: rows.append((s, dict(m))))
    steps = [m for s, m in rows if "loss" in m]
    assert len(steps) == 60 and all(
        k in steps[0] for k in ("reward/constraints", "reward/format", "reward/length", "reward/forbidden")
    )
    totals = [m["reward/total"] for m in steps]
    first, last = sum(totals[:4]) / 4, sum(totals[-4:]) / 4
    assert last > first + 0.15, (first, last)
    kw = [
        m["reward/constraints"] for m in steps
    ]  # measured (seed 0): 0.05 over the first 4 steps, 1.0 over the last 4
    assert sum(kw[-4:]) / 4 > sum(kw[:4]) / 4 + 0.3, kw
    evals = [m for s, m in rows if "heldout/reward/total" in m]
    assert len(evals) == 2 and evals[1]["heldout/reward/total"] > evals[0]["heldout/reward/total"]
    assert final["heldout/reward_se/total"] >= 0 and final["heldout/n/format"] == 8


def test_a_resumed_general_rl_run_reaches_the_weights_of_an_uninterrupted_one(tok, tmp_path):
    from training.rl.loop import resume_step

    cfg = ModelConfig.for_size(
        "micro", vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=1, index_topk=512
    )
    constraints = Constraints(keywords=["blue"], length=(1, 4)).model_dump()
    meta = {"category": "instruction", "constraints": constraints}
    tasks = [Task(f"p{i}", "instruction", f"name a color {i}", "", 1, "train", meta) for i in range(6)]
    weights = {"instruction_style": {"constraints": 1.0, "format": 0.1, "length": 0.1, "forbidden": 0.1}}
    reward = HybridReward(HybridRewardConfig(weights=weights, dimension_weights={"instruction_style": 1.0}))
    config = GeneralRLConfig(steps=4, prompts_per_step=2, group_size=4, max_new_tokens=4, learning_rate=3e-3,
                             eval_every=4, eval_prompts=2, checkpoint_every=2)  # fmt: skip

    def run(steps: int, ckpt, job="j1"):
        model, logged = build_model(cfg, seed=0), []
        c = config.model_copy(update={"steps": steps})
        train_general_rl(model, tok, tasks, tasks, reward, c, lambda m, s: logged.append(s),
                         checkpoint_dir=ckpt, job=job)  # fmt: skip
        return model, logged

    whole, _ = run(4, None)
    killed, _ = run(3, tmp_path)  # saves step 2, dies at step 3
    assert resume_step(tmp_path) == 2
    resumed, logged = run(4, tmp_path)
    assert min(logged) == 3  # no step-0 evaluation again: it goes on after the checkpoint
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(killed.lm_head.weight, whole.lm_head.weight)
    with pytest.raises(RuntimeError, match="different job"):  # another config or inputs: never resumed
        run(4, tmp_path, job="j2")


def test_general_jobs_train_an_orm_then_run_general_rl_with_it(tok, tmp_path):
    """The job entries (`python -m training.rl.general_job orm|rl --spec ...`), run in-process: spec JSON ->
    result.json with metrics, the ORM dir and the exported checkpoint."""
    import json

    from infra.packaged import LID_176, packaged_file
    from training.checkpoint import export_hf
    from training.rewards.orm import ORMConfig
    from training.rl.general_job import GeneralRLJobSpec, ORMJobSpec, main
    from training.tasks.suites import write_tasks

    cfg = ModelConfig.for_size(
        "micro", vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=1, index_topk=512
    )
    tok_dir = tmp_path / "tok"
    tok.save_pretrained(tok_dir, save_jinja_files=False)
    parent = export_hf(
        build_model(cfg, seed=0),
        tmp_path / "parent",
        {n: tok_dir / n for n in ("tokenizer.json", "tokenizer_config.json")},
    )
    prompts = general_prompts(FACTS, GeneralPromptsConfig(per_category=8, heldout_fraction=0.25))
    train, held = (
        write_tasks(prompts["train"], tmp_path / "train.jsonl"),
        write_tasks(prompts["heldout"], tmp_path / "held.jsonl"),
    )
    orm_spec = ORMJobSpec(
        run_dir=str(tmp_path / "orm"), tokenizer_dir=str(parent), train_prompts=str(train), heldout_prompts=str(held),
        config=ORMConfig(steps=4, batch_size=4, max_len=48, eval_every=4), threads=1,
    )  # fmt: skip
    (tmp_path / "orm").mkdir()
    (tmp_path / "orm" / "orm_spec.json").write_text(orm_spec.model_dump_json())
    assert main(["orm", "--spec", str(tmp_path / "orm" / "orm_spec.json")]) == 0
    orm_result = json.loads((tmp_path / "orm" / "result.json").read_text())
    assert 0 <= orm_result["metrics"]["heldout/pair_accuracy"] <= 1
    spec = GeneralRLJobSpec(
        run_dir=str(tmp_path / "rl"), init_from=str(parent), model=cfg, train_prompts=str(train), heldout_prompts=str(held),
        config=GeneralRLConfig(steps=2, prompts_per_step=3, group_size=2, max_new_tokens=4, eval_every=2, eval_prompts=3),
        reward=HybridRewardConfig(weights={
            "instruction_style": {"constraints": 1.0, "format": 0.5, "language": 0.5, "exemplar": 0.2},
            "task_quality": {"orm": 1.0},
        }),
        orm_dir=orm_result["orm_dir"], lid_model=str(packaged_file(LID_176)), threads=1, compare={"parent": str(parent)},
    )  # fmt: skip
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "general_spec.json").write_text(spec.model_dump_json())
    assert main(["rl", "--spec", str(tmp_path / "rl" / "general_spec.json")]) == 0
    result = json.loads((tmp_path / "rl" / "result.json").read_text())
    m = result["metrics"]
    for c in ("total", "orm", "language", "exemplar", "format", "constraints", "dim/task_quality"):
        assert f"heldout/reward/{c}" in m and f"heldout/reward_se/{c}" in m, c
    assert "compare/parent/reward/total" in m
    assert (tmp_path / "rl" / "hf" / "model.safetensors").exists()
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]


def test_a_capped_heldout_evaluation_covers_every_category():
    from training.rl.general import heldout_subset

    held = general_prompts(FACTS, GeneralPromptsConfig(per_category=40, heldout_fraction=0.25))["heldout"]
    picked = heldout_subset(held, 9)
    assert sorted(t.domain for t in picked) == ["chat"] * 3 + ["instruction"] * 3 + ["writing"] * 3
