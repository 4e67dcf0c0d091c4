"""The General RL rewards: each rule on hand-built answers, each component of the hybrid reward moving the total
in the right direction, the ORM trained on micro data scoring held-out pairs above chance, and the GRM scored by
the real embedded judge (SmolLM2-135M) through the judge client's cache and budget."""

from __future__ import annotations

import pytest

from infra.packaged import LID_176, packaged_file
from training.rewards.exemplars import ExemplarStyle
from training.rewards.hybrid import HybridReward, HybridRewardConfig
from training.rewards.rules import (
    Constraints,
    LanguageId,
    constraint_reward,
    forbidden_reward,
    format_reward,
    language_reward,
    length_reward,
)
from training.tasks.base import Task
from training.tasks.math import MathSuite
from training.tokenizer import END_OF_TURN

END = END_OF_TURN


@pytest.fixture(scope="module")
def lid() -> LanguageId:
    return LanguageId(packaged_file(LID_176))


def test_format_wants_an_end_of_turn_and_no_leftover_markup():
    assert format_reward(f"Paris.{END}").score == 1.0
    assert format_reward("Paris.").score == 0.5  # truncated: no end of turn
    left = format_reward(f'<tool_call>{{"name": "x"}}</tool_call>{END}')
    assert left.score == 0.5 and "<tool_call>" in left.reason
    assert format_reward(END).score == 0.5  # empty answer
    # one leading reasoning block is how SFT answers (worked solutions); an unclosed or stray one is leftover
    assert format_reward(f"<think>3 + 4 = 7</think>Answer: 7{END}").score == 1.0
    assert format_reward(f"<think>3 + 4 = 7 and then{END}").score == 0.5
    assert format_reward(f"Answer: 7 <think>hmm</think>{END}").score == 0.5


def test_length_is_one_inside_the_range_and_falls_off_outside():
    c = Constraints(length=(3, 10))
    assert length_reward("one two three four", c).score == 1.0
    assert length_reward("one", c).score == pytest.approx(1 / 3)
    assert length_reward(" ".join(["w"] * 15), c).score == pytest.approx(0.5)
    assert length_reward(" ".join(["w"] * 40), c).score == 0.0


def test_language_is_lid176s_probability_of_the_expected_language(lid):
    c = Constraints(language="en")
    en = language_reward(f"The capital of France is Paris, a large city on the Seine.{END}", c, lid)
    fr = language_reward(f"La capitale de la France est Paris, une grande ville sur la Seine.{END}", c, lid)
    assert en.score > 0.8 and fr.score < 0.1, (en, fr)
    assert "top fr" in fr.reason


def test_forbidden_words_match_whole_words_in_any_case():
    assert forbidden_reward("A kernel manages memory.").score == 1.0
    bad = forbidden_reward("That is a Stupid question.")
    assert bad.score == 0.0 and "stupid" in bad.reason
    assert forbidden_reward("The stupidity of crowds.").score == 1.0  # not a whole-word match


def test_constraints_check_word_counts_keywords_and_json():
    assert constraint_reward("anything", Constraints()) is None  # nothing to check
    c = Constraints(max_words=5, keywords=["rules"])
    assert constraint_reward("A protocol is rules.", c).score == 1.0
    assert constraint_reward("A protocol is an agreement.", c).score == 0.5
    assert constraint_reward("A protocol is a set of rules computers follow.", c).score == 0.5
    j = Constraints(json_keys=["term", "definition"])
    assert constraint_reward('{"term": "cache", "definition": "a fast store"}', j).score == 1.0
    assert constraint_reward('```json\n{"term": "cache", "definition": "x"}\n```', j).score == 1.0
    assert constraint_reward('{"term": "cache", "definition": "a fast store"', j).score == 0.0
    assert constraint_reward('{"term": "cache"}', j).score == 0.0


def _task(
    prompt: str, category: str = "chat", domain: str | None = None, answer: str = "", **constraints
) -> Task:
    meta = {"category": category, "constraints": Constraints(**constraints).model_dump()}
    return Task(f"t-{abs(hash(prompt))}", domain or category, prompt, answer, 1, "train", meta)


def _without_models(config: HybridRewardConfig, drop: tuple[str, ...] = ("orm", "grm")) -> HybridRewardConfig:
    weights = {d: {c: w for c, w in comps.items() if c not in drop} for d, comps in config.weights.items()}
    return config.model_copy(update={"weights": weights})


def test_each_component_moves_the_total_in_the_right_direction(lid):
    suites = {"math": MathSuite()}
    reward = HybridReward(
        _without_models(HybridRewardConfig()), lid=lid, exemplars=ExemplarStyle(), suites=suites
    )
    cases = {  # component: (task, better answer, worse answer), the two answers differing in that component
        "verifier": (_task("What is 3 + 4?", "math", answer="7"), f"3 + 4 = 7\nAnswer: 7{END}", f"3 + 4 = 8\nAnswer: 8{END}"),
        "constraints": (
            _task("Explain 'cache' in at most 8 words.", "instruction", max_words=8),
            f"A cache is a small fast store.{END}",
            f"A cache is a small fast store that keeps copies of data.{END}",
        ),
        "language": (_task("What is a city?"), f"A city is a large town where many people live.{END}",
                     f"Une ville est une grande commune où vivent beaucoup de gens.{END}"),
        "forbidden": (_task("What is a bug?"), f"A bug is a mistake in a program.{END}",
                      f"A bug is a stupid mistake in a program.{END}"),
        "json": (
            _task("Give the meaning of 'pixel' as JSON with keys term and definition.", "instruction", json_keys=["term", "definition"]),
            f'{{"term": "pixel", "definition": "the smallest dot of an image"}}{END}',
            f'{{"term": "pixel", "definition": "the smallest dot of an image"{END}',
        ),
        "format": (_task("What is a byte?"), f"A byte is eight bits of data.{END}", "A byte is eight bits of data."),
        "length": (_task("What is a byte?", length=(4, 20)), f"A byte is eight bits.{END}", f"Byte.{END}"),
        "exemplar": (
            _task("Write two sentences about the rain.", "writing"),
            f"The rain fell all night on the quiet town. By morning the streets were shining.{END}",
            f"rain: 9mm/h; 03:00-07:00 UTC; p=0.93; ref#7731-b{END}",
        ),
    }  # fmt: skip
    for name, (task, good, bad) in cases.items():
        better, worse = reward.score([task, task], [good, bad])
        component = "constraints" if name == "json" else name
        assert better.components[component] > worse.components[component], (name, better, worse)
        assert better.total > worse.total, (
            name,
            better.total,
            worse.total,
            better.components,
            worse.components,
        )
    # components that do not apply drop out instead of scoring 0: a chat prompt has no verifier or constraints
    chat = reward.score([cases["format"][0]], [cases["format"][1]])[0]
    assert "verifier" not in chat.components and "constraints" not in chat.components
    assert set(chat.dimensions) == {"instruction_style"}  # no ORM / GRM here: task quality has no component


def test_a_weighted_component_without_its_model_is_an_error():
    with pytest.raises(ValueError, match=r"\['grm', 'language', 'orm'\]"):
        HybridReward(HybridRewardConfig(), lid=None, exemplars=ExemplarStyle())
    with pytest.raises(ValueError, match="unknown component"):
        HybridRewardConfig(weights={"correctness": {"bleu": 1.0}})


@pytest.fixture(scope="module")
def orm_data(tmp_path_factory):
    from pipelines.knowledge.facts import dictionary_facts
    from training.rewards.general_prompts import GeneralPromptsConfig, general_prompts
    from training.rewards.orm import preference_pairs
    from training.tasks.suites import TaskSuitesConfig, build_task_sets
    from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

    facts = dictionary_facts(["dict-jargon", "dict-foldoc"], 300, 0)
    tasks = build_task_sets(TaskSuitesConfig(levels={"math": [1]}, train_per_level=20, heldout_per_level=10))
    prompts = general_prompts(
        facts, GeneralPromptsConfig(per_category=40, max_suite_tasks=10), tasks["train"] + tasks["heldout"]
    )
    pairs = preference_pairs(prompts)
    corpus = [f"{p.prompt} {p.chosen} {p.rejected}" for p in pairs["train"]]
    tok = load_tokenizer(
        train_tokenizer(corpus, TokenizerConfig(vocab_size=512), tmp_path_factory.mktemp("tok"))
    )
    return pairs, tok


def test_orm_learns_held_out_preferences_and_round_trips(orm_data, tmp_path):
    from training.rewards.orm import ORM, ORMConfig, pair_accuracy, train_orm

    pairs, tok = orm_data
    assert not {p.prompt for p in pairs["train"]} & {p.prompt for p in pairs["heldout"]}
    logged: list[int] = []
    orm, metrics = train_orm(
        pairs,
        tok,
        ORMConfig(steps=100, batch_size=8, max_len=96, eval_every=100),
        lambda m, s: logged.append(s),
    )
    assert logged == list(range(1, 101))
    acc = metrics["heldout/pair_accuracy"]
    # measured: 0.76 ± 0.06 on 58 held-out pairs (garbled 0.83, forbidden words / JSON / too many words 1.0;
    # wrong definitions 0.38 and wrong math answers 0.6 ± 0.15: a 100-step micro model cannot tell a wrong fact
    # from a right one)
    assert acc > 0.6, metrics
    assert metrics["heldout/pair_accuracy/garbled"] > 0.65, metrics
    loaded = ORM.load(orm.save(tmp_path / "orm"))
    assert pair_accuracy(loaded, pairs["heldout"])["pair_accuracy"] == acc
    sample = pairs["heldout"][:4]
    assert loaded.score([p.prompt for p in sample], [p.chosen for p in sample]) == pytest.approx(
        orm.score([p.prompt for p in sample], [p.chosen for p in sample])
    )
    # in the hybrid reward the ORM moves the total: its chosen answers score higher than their rejected ones
    config = HybridRewardConfig(
        weights={"task_quality": {"orm": 1.0}}, dimension_weights={"task_quality": 1.0}
    )
    reward = HybridReward(config, orm=loaded)
    garbled = [p for p in pairs["heldout"] if p.kind == "garbled"][:10]
    tasks = [_task(p.prompt) for p in garbled]
    good = reward.score(tasks, [p.chosen for p in garbled])
    bad = reward.score(tasks, [p.rejected for p in garbled])
    assert sum(g.total for g in good) > sum(b.total for b in bad)
    assert all(g.total == g.components["orm"] for g in good)


def test_grm_with_the_embedded_judge_scores_good_answers_higher_and_caches(tmp_path):
    """SmolLM2-135M (the tiny profile's judge) reading general_rubric_levels_v1; ~15-40 s to load."""
    from classifiers.judge.client import JudgeClientConfig
    from classifiers.judge.judge_config import JudgeConfig, build_backend
    from infra.store import LocalStore
    from training.rewards.grm import build_grm

    config = JudgeConfig(client=JudgeClientConfig(show_progress=False, max_calls=4))
    backend = build_backend(config)
    grm = build_grm(config, LocalStore(tmp_path), backend)
    assert grm.judge.prompt.name == "general_rubric_levels_v1"
    q, c = "What is the capital of France?", "Explain what a compiler is in one sentence."
    prompts = [q, q, c, c]
    answers = [
        f"The capital of France is Paris.{END}",
        "fjdk qqq zzq blorp 77 <tool_call>",
        f"A compiler is a program that translates source code into machine code.{END}",
        f"I like turtles and the weather is nice today.{END}",
    ]
    scores = grm.score(prompts, answers)
    # measured: 0.77 vs 0.10 and 0.86 vs 0.77 (judge score / 5)
    assert scores[0] > scores[1] + 0.3 and scores[2] > scores[3], scores
    reward = HybridReward(
        HybridRewardConfig(weights={"task_quality": {"grm": 1.0}}, dimension_weights={"task_quality": 1.0}),
        grm=grm,
    )
    again = reward.score([_task(p) for p in prompts], answers)  # from the cache: no call, the budget is spent
    assert [r.total for r in again] == pytest.approx(scores)
    assert grm.metrics()["grm/calls"] == 4 and grm.metrics()["grm/cache_hits"] == 4
    over = reward.score([_task(q)], [f"Paris.{END}"])[
        0
    ]  # a 5th document is over the budget: no GRM component
    assert "grm" not in over.components and over.total == 0.0
    assert grm.metrics()["grm/status/over_budget"] == 1


def test_grm_through_an_openai_compatible_endpoint_asks_the_chat_rubric(tmp_path, monkeypatch):
    """The endpoint path: `infra.llm_server` with its deterministic keyword scorer (0-5 by the density of math
    words) behind the real OpenAI chat API. It checks the plumbing, not judgement: the rubric prompt reaches
    the server with the request and answer inside <document>, the digit comes back and is scaled to [0, 1]."""
    import requests

    from classifiers.judge.client import JudgeClientConfig
    from classifiers.judge.judge_config import JudgeConfig
    from infra.llm_server import llm_server_process
    from infra.store import LocalStore
    from training.rewards.grm import build_grm

    with llm_server_process("--keyword-scorer") as url:
        monkeypatch.setenv("CRUCIBLE_JUDGE_URL", url)
        monkeypatch.setenv("CRUCIBLE_JUDGE_MODEL", "keyword-scorer")
        config = JudgeConfig(backend="openai", client=JudgeClientConfig(show_progress=False))
        grm = build_grm(config, LocalStore(tmp_path))
        assert grm.judge.prompt.name == "general_rubric_v1"
        q = "How do I solve 2x + 3 = 7?"
        scores = grm.score(
            [q, q],
            [f"Subtract 3: 2x = 4, divide by 2: x = 2, the equation's solution.{END}", f"No idea.{END}"],
        )
        assert scores[0] > scores[1] and all(0.0 <= s <= 1.0 for s in scores), scores
        assert requests.get(f"{url}/stats", timeout=5).json()["requests/chat"] == 2
        assert grm.score([q], [f"No idea.{END}"]) == [scores[1]]  # cached: no third request
        assert requests.get(f"{url}/stats", timeout=5).json()["requests/chat"] == 2
