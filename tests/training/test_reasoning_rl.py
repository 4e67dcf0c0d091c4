"""The Reasoning RL loop on a micro model: it raises the reward of a verifiable task it starts out bad at,
logs the IcePop statistics of a real bf16-engine / fp32-trainer mismatch, and never moves the DSA indexer."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from color_task import (  # pytest puts this directory on sys.path
    SayBlue,
    color_tasks,
    color_tokenizer_and_config,
)

from training.model import build_model
from training.rl.frozen_test import score_test_set
from training.rl.reasoning import ReasoningRLConfig, mixed_batches, resume_step, train_reasoning_rl
from training.rollout.engine import LocalRolloutEngine
from training.tasks.base import Task, Verdict


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok, cfg = color_tokenizer_and_config(tmp_path_factory.mktemp("tok"))
    return tok, cfg, color_tasks("train", 8)


def test_rl_raises_reward_and_keeps_the_indexer(setup):
    tok, cfg, tasks = setup
    model = build_model(cfg, seed=0)
    indexer_before = {n: p.detach().clone() for n, p in model.named_parameters() if ".indexer." in n}
    other_before = model.lm_head.weight.detach().clone() if not cfg.tie_word_embeddings else None
    emb_before = model.get_input_embeddings().weight.detach().clone()
    rows: list[tuple[int, dict]] = []
    config = ReasoningRLConfig(
        steps=30, prompts_per_step=4, group_size=8, max_new_tokens=4, max_turns=1,
        learning_rate=3e-3, eval_every=30, eval_tasks_per_domain=8, filter_samples=0, engine_dtype="bfloat16",
    )  # fmt: skip
    evals: dict[int, list] = {}
    final = train_reasoning_rl(
        model, tok, tasks, tasks, {"color": SayBlue()}, config, lambda m, s: rows.append((s, dict(m))),
        on_eval=lambda trajs, step: evals.setdefault(step, trajs),
    )  # fmt: skip
    assert sorted(evals) == [0, 30] and all(len(t) == 8 for t in evals.values())
    rewards = [m["reward/color"] for s, m in rows if "reward/color" in m]
    assert len(rewards) == 30
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.3, (first, last)
    assert final["heldout/pass_at_1/color"] >= 0.75  # greedy decoding now says blue
    step0 = next(m for s, m in rows if s == 0 and "heldout/pass_at_1/color" in m)
    assert "heldout/paired_gain/color" not in step0  # step 0 is the reference
    misses0 = sum(v for k, v in step0.items() if k.startswith("heldout/misses/color/"))
    assert (
        misses0 == round(8 * (1 - step0["heldout/pass_at_1/color"])) == sum(t.reward <= 0 for t in evals[0])
    )
    gain = final["heldout/pass_at_1/color"] - step0["heldout/pass_at_1/color"]
    assert final["heldout/paired_gain/color"] == pytest.approx(gain) and gain > 0.3
    assert final["heldout/fixed/color"] - final["heldout/broken/color"] == pytest.approx(gain * 8)
    # sampled pass@1 (4 samples per held-out task at the rollout temperature) at step 0 and at the end
    sampled = [
        m["heldout/sampled_pass_at_1/color"] for s, m in rows if "heldout/sampled_pass_at_1/color" in m
    ]
    assert len(sampled) == 2 and sampled[1] > sampled[0] + 0.3, sampled
    # same seeds at both evals, paired per task: the gain is the change in sampled pass@1
    assert final["heldout/sampled_paired_gain/color"] == pytest.approx(sampled[1] - sampled[0])
    assert 0 <= final["heldout/sampled_paired_gain_se/color"] < final["heldout/sampled_paired_gain/color"]
    # the test set, scored once after training, policy vs parent: on the held-out tasks it reproduces the
    # loop's own greedy eval and paired gain, and pairs the sampled rates the same way
    parent = LocalRolloutEngine(build_model(cfg, seed=0), dtype=torch.bfloat16, pad_id=1)
    policy = LocalRolloutEngine(model, dtype=torch.bfloat16, pad_id=1)
    tested = score_test_set(policy, parent, tok, tasks, {"color": SayBlue()}, config)
    assert tested["test/pass_at_1/color"] == final["heldout/pass_at_1/color"]
    assert tested["test/parent/pass_at_1/color"] == step0["heldout/pass_at_1/color"]
    assert tested["test/paired_gain/color"] == pytest.approx(final["heldout/paired_gain/color"])
    assert tested["test/sampled_paired_gain/color"] == pytest.approx(
        tested["test/sampled_pass_at_1/color"] - tested["test/parent/sampled_pass_at_1/color"]
    )
    assert tested["test/sampled_paired_gain/color"] > 0.3
    for name, before in indexer_before.items():
        assert torch.equal(dict(model.named_parameters())[name], before), name
    assert not torch.equal(model.get_input_embeddings().weight, emb_before)
    assert other_before is None or not torch.equal(model.lm_head.weight, other_before)
    step_rows = [m for s, m in rows if "rho/mean" in m]
    assert any(m["rho/min"] != m["rho/max"] for m in step_rows)  # bf16 engine (set above) vs fp32 trainer
    assert all(0 <= m["icepop/masked_fraction"] <= 1 for m in step_rows)
    assert all(k in step_rows[0] for k in ("entropy", "time/generate_s", "time/train_s", "tokens_per_s"))


def test_batches_mix_domains():
    tasks = [Task(f"{d}{i}", d, f"{d} {i}", "", 1, "train") for d in ("a", "b", "c") for i in range(5)]
    batch = next(mixed_batches(tasks, 6, seed=0))
    assert sorted(t.domain for t in batch) == ["a", "a", "b", "b", "c", "c"]


def test_domain_weights_give_a_domain_that_many_turns_per_round_and_are_checked_by_name():
    from collections import Counter

    tasks = [
        Task(f"{d}{i}", d, f"{d} {i}", "", 1, "train") for d in ("code", "math", "tool") for i in range(7)
    ]
    plain, weighted = mixed_batches(tasks, 8, seed=0), mixed_batches(tasks, 8, seed=0, weights={"tool": 3})
    drawn = [Counter(t.domain for _ in range(5) for t in next(stream)) for stream in (plain, weighted)]
    assert drawn[0] == {"code": 14, "math": 13, "tool": 13}  # 40 draws, one turn each per round of 3
    assert drawn[1] == {"code": 8, "math": 8, "tool": 24}  # tool 3 turns per round of 5
    assert next(mixed_batches(tasks, 8, seed=0, weights={})) == next(mixed_batches(tasks, 8, seed=0))
    for bad in ({"tools": 2}, {"tool": 0}):
        with pytest.raises(ValueError, match="domain_weights"):
            ReasoningRLConfig(domain_weights=bad)


def test_family_balanced_batches_draw_each_family_of_a_domain_in_turn():
    from collections import Counter

    tasks = [Task(f"big{i}", "code", f"big {i}", "", 1, "train", {"family": "big"}) for i in range(30)]
    tasks += [Task(f"few{i}", "code", f"few {i}", "", 1, "train", {"family": "few"}) for i in range(3)]
    tasks += [Task(f"m{i}", "math", f"m {i}", "", 1, "train") for i in range(5)]  # no family: one pool
    balanced = mixed_batches(tasks, 4, seed=0, by_family=True)
    draws = [t for _ in range(30) for t in next(balanced)]
    counts = Counter(t.meta.get("family", t.domain) for t in draws)
    assert counts == {"big": 30, "few": 30, "math": 60}
    assert Counter(t.id for t in draws if t.id.startswith("few")) == {"few0": 10, "few1": 10, "few2": 10}
    uniform = mixed_batches(tasks, 4, seed=0)
    plain = [t for _ in range(30) for t in next(uniform)]
    assert Counter(t.meta.get("family") for t in plain if t.domain == "code")["few"] < 10  # 3 of 33 prompts


class SaysE:
    """Reward 1 when the response has an 'e': about half an untrained model's samples, so every group has a
    non-zero advantage and every step moves the weights."""

    domain, version = "color", "t1"

    def verify(self, task: Task, response: str) -> Verdict:
        return Verdict(1.0, "correct") if "e" in response else Verdict(0.0, "wrong_answer")


def test_a_resumed_run_reaches_the_weights_of_an_uninterrupted_one(setup, tmp_path):
    tok, cfg, tasks = setup
    config = ReasoningRLConfig(
        steps=4, prompts_per_step=2, group_size=4, max_new_tokens=4, max_turns=1, learning_rate=3e-3,
        eval_every=4, eval_tasks_per_domain=2, filter_samples=2, filter_prompts_per_domain=8, checkpoint_every=2,
    )  # fmt: skip
    suites = {"color": SaysE()}

    def run(steps: int, ckpt) -> tuple[torch.nn.Module, list[int], dict]:
        model, logged = build_model(cfg, seed=0), []
        c = config.model_copy(update={"steps": steps})
        final = train_reasoning_rl(
            model, tok, tasks, tasks, suites, c, lambda m, s: logged.append(s), checkpoint_dir=ckpt
        )
        return model, logged, final

    whole, _, whole_final = run(4, None)
    killed, _, _ = run(3, tmp_path)  # saves step 2, then dies at step 3 (its step-3 update is lost)
    assert resume_step(tmp_path) == 2
    resumed, logged, final = run(4, tmp_path)
    assert min(logged) == 3  # no step-0 eval, no filter rerun: it starts after the checkpoint
    # the step-0 rewards came back with the checkpoint, so the gain is still paired with the parent's
    for key in ("paired_gain", "sampled_paired_gain"):
        assert final[f"heldout/{key}/color"] == whole_final[f"heldout/{key}/color"]
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(killed.lm_head.weight, whole.lm_head.weight)  # steps 3-4 do move the weights


class Never:
    """A domain the policy never solves: its groups have zero advantage."""

    domain, version = "never", "t1"

    def verify(self, task: Task, response: str) -> Verdict:
        return Verdict(0.0, "wrong_answer")


def test_a_domain_the_filter_finds_never_solved_is_left_out_not_the_whole_filter(setup):
    """One never-solved domain used to switch the filter off for every domain (the tiny run trained on
    all 256 prompts, 70% of groups with zero advantage); now only that domain is left out."""
    tok, cfg, tasks = setup
    never = [Task(f"n{i}", "never", f"pick a color {i}", "none", 1, "train") for i in range(8)]
    rows: list[dict] = []
    config = ReasoningRLConfig(
        steps=2, prompts_per_step=4, group_size=4, max_new_tokens=4, max_turns=1, learning_rate=3e-3,
        eval_every=2, eval_tasks_per_domain=2, filter_samples=4, filter_prompts_per_domain=8,
    )  # fmt: skip
    train_reasoning_rl(
        build_model(cfg, seed=0), tok, tasks + never, tasks + never, {"color": SaysE(), "never": Never()},
        config, lambda m, s: rows.append(dict(m)),
    )  # fmt: skip
    filt = next(r for r in rows if "filter/pool" in r)
    assert filt["filter/kept/never"] == 0 and 0 < filt["filter/kept/color"] <= 8
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 2 and all("reward/never" not in r and "reward/color" in r for r in steps)


def test_paired_gain_is_the_mean_per_task_difference_with_its_standard_error():
    from training.rl.reasoning import paired_gain

    tasks = [Task(f"t{i}", d, "", "", 1, "heldout") for i, d in enumerate(["a", "a", "a", "a", "b", "b"])]
    before = {"t0": 0.0, "t1": 1.0, "t2": 1.0, "t3": 0.0, "t4": 1.0, "t5": 1.0}
    after = {"t0": 1.0, "t1": 1.0, "t2": 0.0, "t3": 1.0, "t4": 1.0, "t5": 1.0}
    out = paired_gain(before, after, tasks + [Task("t9", "a", "", "", 1, "heldout")])  # t9: in neither
    assert out["paired_gain/a"] == 0.25  # differences +1, 0, -1, +1
    assert out["paired_gain_se/a"] == pytest.approx((((0.75**2) * 2 + 0.25**2 + 1.25**2) / 3 / 4) ** 0.5)
    assert (out["fixed/a"], out["broken/a"]) == (2.0, 1.0)
    assert out["paired_gain/b"] == 0.0 and out["paired_gain_se/b"] == 0.0  # both solved twice: no noise


def test_sampled_pass_at_1_is_the_mean_of_task_rates_with_its_standard_error():
    from training.rl.reasoning import sampled_pass_at_1

    tasks = [Task(f"t{i}", d, "", "", 1, "heldout") for i, d in enumerate(["a", "a", "a", "b"])]
    out = sampled_pass_at_1({"t0": 0.0, "t1": 0.5, "t2": 1.0, "t3": 0.25}, tasks)
    assert out["sampled_pass_at_1/a"] == 0.5 and out["sampled_pass_at_1/b"] == 0.25
    assert out["sampled_pass_at_1_se/a"] == pytest.approx((0.25 / 3) ** 0.5)  # sample variance 0.25, n = 3
    assert out["sampled_pass_at_1_se/b"] == 0.0


class OneInN:
    """Rewards every n-th verification of a task, whatever the response: any n consecutive samples of a task
    hold exactly one pass, so the difficulty filter (n samples) keeps every task (a verifier of the model's
    text made the kept counts depend on the sampling seed)."""

    version = "t1"

    def __init__(self, domain: str, n: int):
        import threading
        from collections import Counter

        self.domain, self.n, self.calls, self.lock = domain, n, Counter(), threading.Lock()

    def verify(self, task: Task, response: str) -> Verdict:
        with self.lock:
            self.calls[task.id] += 1
            hit = self.calls[task.id] % self.n == 0
        return Verdict(1.0, "correct") if hit else Verdict(0.0, "wrong_answer")


def test_a_domain_with_too_few_kept_prompts_is_left_out_of_training(setup):
    """Batches give every domain the same share: 2 kept prompts of a domain would take half of each step here
    (a quarter on tiny, where 2 knowledge prompts were memorised in 20 steps). Below `min_domain_prompts` the
    domain sits out; the other domain trains."""
    tok, cfg, tasks = setup
    rare = [Task(f"r{i}", "rare", f"pick a color rare {i}", "e", 1, "train") for i in range(2)]
    rows: list[dict] = []
    config = ReasoningRLConfig(
        steps=2, prompts_per_step=4, group_size=4, max_new_tokens=4, max_turns=1, learning_rate=3e-3,
        eval_every=2, eval_tasks_per_domain=2, filter_samples=4, filter_prompts_per_domain=8,
        min_domain_prompts=3,
    )  # fmt: skip
    train_reasoning_rl(
        build_model(cfg, seed=0), tok, tasks + rare, tasks + rare,
        {"color": OneInN("color", 4), "rare": OneInN("rare", 4)},
        config, lambda m, s: rows.append(dict(m)),
    )  # fmt: skip
    filt = next(r for r in rows if "filter/pool" in r)
    assert (filt["filter/kept/rare"], filt["filter/kept/color"]) == (2, 8), filt
    steps = [r for r in rows if "reward/mean" in r]
    assert len(steps) == 2 and all("reward/rare" not in r and "reward/color" in r for r in steps)


def test_rollout_verifies_on_several_threads_and_keeps_each_verdict_with_its_trajectory(setup):
    """Verdicts are computed concurrently (a code verdict is a sandboxed process start) and each lands on
    the trajectory whose response it judged."""
    import threading

    from training.rollout.engine import SamplingParams
    from training.rollout.multiturn import VERIFY_THREADS, rollout

    tok, cfg, tasks = setup
    threads, calls, lock, barrier = set(), [], threading.Lock(), threading.Barrier(2, timeout=10)

    def verify(task: Task, response: str) -> Verdict:
        with lock:
            threads.add(threading.get_ident())
            calls.append(task.id)
            first_two = len(calls) <= 2
        if first_two:
            barrier.wait()  # the first two calls can only both pass if they run at the same time
        score = float(int(task.id[1:]) % 3 == 0) + len(response) / 1e6
        return Verdict(score, f"{task.id}:{len(response)}")

    engine = LocalRolloutEngine(build_model(cfg, seed=0), dtype=torch.float32, pad_id=tok.pad_token_id)
    trajs = rollout(engine, tok, tasks, 2, SamplingParams(max_new_tokens=6, temperature=1.0, seed=3), verify)
    assert VERIFY_THREADS >= 2 and len(threads) >= 2
    for t in trajs:
        response = "\n".join(m["content"] for m in t.messages if m["role"] == "assistant")
        assert t.reward == float(int(t.prompt_id[1:]) % 3 == 0) + len(response) / 1e6
        assert t.status != "ok" or t.reason == f"{t.prompt_id}:{len(response)}"  # truncation keeps its reason


def test_solved_anchors_are_a_seeded_share_of_the_always_solved_prompts_of_trained_domains():
    """The filter drops always-solved prompts, so RL on a neighbouring skill can break them unseen; a share kept
    as anchors trains only once a sample fails. Only domains that train get anchors."""
    from training.rl.reasoning import solved_anchors

    pool = [Task(f"{d}{i}", d, "", "", 1, "train") for d in ("code", "math") for i in range(10)]
    rates = {t.id: 1.0 if int(t.id[-1]) < 6 else 0.5 for t in pool}  # 6 always solved per domain
    anchors = solved_anchors(pool, rates, {"code"}, 0.5, seed=0)
    assert len(anchors) == 3 and {t.domain for t in anchors} == {"code"}
    assert all(rates[t.id] == 1.0 for t in anchors)
    assert anchors == solved_anchors(pool, rates, {"code"}, 0.5, seed=0)
    assert solved_anchors(pool, rates, {"code"}, 0.0, seed=0) == []
    assert len(solved_anchors(pool, rates, {"code", "math"}, 1.0, seed=0)) == 12


class HalfAlways(OneInN):
    """Even-numbered tasks always pass (the filter drops them as solved), the others one sample in n."""

    def verify(self, task: Task, response: str) -> Verdict:
        if int(task.id[1:]) % 2 == 0:
            return Verdict(1.0, "correct")
        return super().verify(task, response)


def _filter_metrics_of_one_step(setup, domain: str, n: int, verifier, **config) -> dict:
    """The difficulty filter's logged metrics from one real step of `train_reasoning_rl` on `n` tasks."""
    tok, cfg, _ = setup
    tasks = [Task(f"{domain[0]}{i}", domain, f"pick a color {i}", "e", 1, "train") for i in range(n)]
    rows: list[dict] = []
    config = ReasoningRLConfig(
        steps=1, prompts_per_step=2, max_turns=1, eval_every=1, eval_tasks_per_domain=2,
        filter_prompts_per_domain=n, **config,
    )  # fmt: skip
    train_reasoning_rl(
        build_model(cfg, seed=0),
        tok,
        tasks,
        tasks,
        {domain: verifier},
        config,
        lambda m, s: rows.append(dict(m)),
    )
    return next(r for r in rows if "filter/pool" in r)


def test_the_filter_keeps_the_configured_share_of_solved_prompts_as_anchors(setup):
    filt = _filter_metrics_of_one_step(
        setup, "mix", 8, HalfAlways("mix", 4), group_size=4, max_new_tokens=4, filter_samples=4,
        min_domain_prompts=1, keep_solved_share=0.5,
    )  # fmt: skip
    counts = (filt["filter/kept/mix"], filt["filter/always_solved"], filt["filter/anchors/mix"])
    assert counts == (4, 4, 2), filt


def test_a_domain_named_in_filter_samples_for_is_scored_over_its_own_number_of_samples(setup):
    """A pass once in 8 samples: 4 samples (the default) never see it, 8 always do, so knowledge (8 samples
    here) keeps every prompt and math (4) none; unknown domains and counts below 1 are refused."""
    from pydantic import ValidationError

    from training.rl.reasoning import difficulty_filter_rates

    tok, cfg, _ = setup
    tasks = [
        Task(f"{d[0]}{i}", d, f"pick a color {d} {i}", "e", 1, "train")
        for d in ("math", "knowledge")
        for i in range(3)
    ]
    suites = {d: OneInN(d, 8) for d in ("math", "knowledge")}
    config = ReasoningRLConfig(
        max_new_tokens=2, max_turns=1, filter_samples=4, filter_samples_for={"knowledge": 8}
    )
    engine = LocalRolloutEngine(build_model(cfg, seed=0), dtype=torch.float32, pad_id=tok.pad_token_id)
    rates = difficulty_filter_rates(engine, tok, tasks, suites, config)
    assert rates == {f"k{i}": 1 / 8 for i in range(3)} | {f"m{i}": 0.0 for i in range(3)}
    assert {d: sum(suites[d].calls.values()) for d in suites} == {"math": 12, "knowledge": 24}
    for bad in ({"recall": 8}, {"knowledge": 0}):
        with pytest.raises(ValidationError, match="filter_samples_for"):
            ReasoningRLConfig(filter_samples_for=bad)


class AlwaysPass:
    domain, version = "all", "t1"

    def verify(self, task: Task, response: str) -> Verdict:
        return Verdict(1.0, "correct")


def test_no_anchor_repeats_a_prompt_when_the_filter_falls_back_to_the_whole_pool(setup):
    filt = _filter_metrics_of_one_step(
        setup, "all", 4, AlwaysPass(), group_size=2, max_new_tokens=2, filter_samples=2, keep_solved_share=1.0
    )
    assert filt["filter/always_solved"] == 4 and "filter/anchors/all" not in filt, filt


class ScriptedEngine:
    """Answers each prompt with a fixed text per turn: the model's part is scripted, the rollout loop, the
    tokenizer, the calculator and the verifier are the real ones."""

    policy_version = 0

    def __init__(self, tok, turns_for):
        self.tok, self.turns_for = tok, turns_for

    def generate(self, prompts, params):
        from training.rollout.engine import Generation

        outs = []
        for ids in prompts:
            text = self.tok.decode(ids)
            prompt = next(p for p in self.turns_for if p in text)
            turn = text.count("<tool_response>")
            reply = self.tok(self.turns_for[prompt][turn] + "<|end_of_turn|>", add_special_tokens=False)
            token_ids = list(reply["input_ids"])
            outs.append(Generation(token_ids, [0.0] * len(token_ids), "stop", 0, token_ids[-1]))
        return outs


def test_tool_call_rates_count_the_greedy_rollouts_that_called_the_calculator(setup):
    from training.rl.reasoning import greedy_trajectories, tool_call_rates
    from training.tasks.math import MathSuite
    from training.tasks.tools import ToolSuite

    tok = setup[0]
    math = MathSuite().generate("heldout", 4, 0, 3)
    tool = ToolSuite().generate("heldout", 2, 0, 1)
    call = '<tool_call>{{"name": "calculator", "arguments": {{"expression": "{}"}}}}</tool_call>'
    script = {  # math: the first three call the calculator (one with a wrong expression), the fourth reasons
        **{t.prompt: [call.format(MathSuite().calculator_solution(t)[0]["tool_calls"][0]["arguments"]
                                  ["expression"]), f"Answer: {t.answer}"] for t in math[:2]},
        math[2].prompt: [call.format("1 + 1"), "Answer: 2"],
        math[3].prompt: [f"Answer: {math[3].answer}"],
        **{t.prompt: ["Answer: 0"] for t in tool},  # tool: never called
    }  # fmt: skip
    trajs = greedy_trajectories(
        ScriptedEngine(tok, script), tok, math + tool, {"math": MathSuite(), "tool": ToolSuite()}, 64, 3
    )
    assert tool_call_rates(trajs) == {"tool_calls/math": 0.75, "tool_calls/tool": 0.0}
    rewards = {t.prompt_id: t.reward for t in trajs}
    assert [rewards[t.id] for t in math] == [1.0, 1.0, float(math[2].answer == "2"), 1.0]
    observations = [m["content"] for t in trajs for m in t.messages if m["role"] == "tool"]
    assert observations[2] == "2" and observations[:2] == [t.answer for t in math[:2]]


def test_misses_count_each_failed_greedy_rollout_by_domain_and_reason_and_keep_its_conversation(setup):
    from training.rl.reasoning import greedy_trajectories, miss_counts, missed
    from training.tasks.math import MathSuite
    from training.tasks.tools import ToolSuite

    tok = setup[0]
    math = MathSuite().generate("heldout", 2, 0, 1)
    tool = ToolSuite().generate("heldout", 3, 0, 1)
    call = '<tool_call>{{"name": "calculator", "arguments": {{"expression": "{}"}}}}</tool_call>'
    slip = str(int(tool[0].answer) + 1)  # the result read back one off: a copy slip
    script = {
        tool[0].prompt: [call.format(tool[0].meta["expression"]), f'Answer: "{slip}"'],
        tool[1].prompt: [call.format(tool[1].meta["expression"]), f'Answer: "{tool[1].answer}"'],
        tool[2].prompt: ["I think so."],  # no answer at all
        math[0].prompt: [f"Answer: {math[0].answer}"],
        math[1].prompt: ["Answer: x +"],  # not an expression
    }
    suites = {"math": MathSuite(), "tool": ToolSuite()}
    trajs = greedy_trajectories(ScriptedEngine(tok, script), tok, math + tool, suites, 64, 3)
    assert miss_counts(trajs) == {
        "misses/math/unparsable_answer": 1.0, "misses/tool/no_answer": 1.0, "misses/tool/wrong_answer": 1.0,
    }  # fmt: skip
    cut = dataclasses.replace(trajs[0], reward=0.0, status="truncated", reason="no end of turn in 64 tokens")
    assert miss_counts([cut]) == {"misses/math/truncated": 1.0}
    shown = {m["prompt_id"]: m for m in missed(trajs)}
    assert set(shown) == {tool[0].id, tool[2].id, math[1].id}
    slipped = shown[tool[0].id]
    assert slipped["reason"] == "wrong_answer" and slipped["task"] == "tool"
    # the conversation a person reads: the call, the calculator's true result, the slipped copy
    assert [m["role"] for m in slipped["messages"]][-3:] == ["assistant", "tool", "assistant"]
    assert slipped["messages"][-2]["content"] == tool[0].answer
    assert slip in slipped["messages"][-1]["content"]


class SomeFamilies:
    """Family `some` passes every 4th verification of a task (the filter's 4 samples hold one pass), family
    `never` never passes: the per-family metrics must tell them apart."""

    domain, version = "color", "t1"

    def __init__(self):
        self.inner = OneInN("color", 4)

    def verify(self, task: Task, response: str) -> Verdict:
        if task.meta["family"] == "never":
            return Verdict(0.0, "wrong_answer")
        return self.inner.verify(task, response)


def test_held_out_and_filter_scores_are_broken_down_by_family(setup):
    from training.rl.by_family import family_rows

    tok, cfg, _ = setup
    tasks = [
        Task(f"f{i}", "color", f"pick a color {i}", "blue", 1, "train", {"family": fam})
        for i, fam in enumerate(["some"] * 6 + ["never"] * 4)
    ]
    rows: list[dict] = []
    config = ReasoningRLConfig(
        steps=2, prompts_per_step=4, group_size=4, max_new_tokens=4, max_turns=1, learning_rate=3e-3,
        eval_every=2, eval_tasks_per_domain=10, eval_samples=4, filter_samples=4, filter_prompts_per_domain=10,
        min_domain_prompts=2, keep_solved_share=0.0,
    )  # fmt: skip
    final = train_reasoning_rl(
        build_model(cfg, seed=0), tok, tasks, tasks, {"color": SomeFamilies()}, config,
        lambda m, s: rows.append({"step": s, **m}),
    )  # fmt: skip
    filt = next(r for r in rows if "filter/pool" in r)
    assert filt["filter/pass_rate/color/some"] == 0.25 and filt["filter/pass_rate/color/never"] == 0.0
    assert filt["filter/kept/color/some"] == 6 and "filter/kept/color/never" not in filt
    assert final["heldout/family_n/color/some"] == 6 and final["heldout/family_n/color/never"] == 4
    assert final["heldout/family/color/never"] == final["heldout/family_sampled/color/never"] == 0.0
    assert final["heldout/family_sampled/color/some"] == 0.25  # 4 samples per task, one pass each
    # the families' greedy scores add up to the domain's
    weighted = sum(
        final[f"heldout/family/color/{f}"] * final[f"heldout/family_n/color/{f}"] for f in ("some", "never")
    )
    assert weighted / 10 == pytest.approx(final["heldout/pass_at_1/color"])
    table = {r["family"]: r for r in family_rows(rows, "SFT", "RL")}
    assert set(table) == {"color/some", "color/never"}
    assert (table["color/never"]["filter: kept"], table["color/some"]["filter: kept"]) == (0, 6)
    assert table["color/some"]["n"] == 6 and table["color/some"]["RL sampled"] == 0.25
    assert table["color/never"]["SFT"] == table["color/never"]["RL"] == 0.0
