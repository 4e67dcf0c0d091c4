"""Task suites: deterministic by seed, held-out disjoint from train, verifiers that accept equivalent answers
and reject wrong or hostile ones (code runs in the real sandbox)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from infra.sandbox import sandbox_available
from training.tasks.base import extract_answer
from training.tasks.code import ARGS, FAMILIES, CodeSuite
from training.tasks.knowledge import KnowledgeSuite
from training.tasks.math import MathSuite, equivalent
from training.tasks.suites import (
    TaskSuitesConfig,
    build_rl_pool,
    build_task_sets,
    difficulty_filter,
    eval_subset,
    frozen_test_sha256,
    knowledge_format_of,
    read_facts,
    read_tasks,
    sha256_of_test_set,
    suite_version,
    suites,
    write_facts,
    write_tasks,
)
from training.tasks.tools import calculator, call_tool

FACTS = [
    (f"term{i}", f"definition number {i} of something rather particular and long enough") for i in range(50)
]


def test_sets_are_deterministic_and_heldout_prompts_never_in_train():
    config = TaskSuitesConfig(train_per_level=30, heldout_per_level=10)
    a, b = build_task_sets(config, FACTS), build_task_sets(config, FACTS)
    assert suite_version(a) == suite_version(b)
    assert {t.prompt for t in a["train"]}.isdisjoint({t.prompt for t in a["heldout"]})
    assert {t.domain for t in a["heldout"]} == {"math", "code", "tool", "knowledge"}
    other = build_task_sets(config.model_copy(update={"seed": 1}), FACTS)
    assert suite_version(other) != suite_version(a)


def test_the_tiny_test_set_is_the_frozen_one_and_shares_no_prompt_with_train_or_heldout():
    sets = build_task_sets(TaskSuitesConfig(), FACTS)
    test = sets["test"]
    # a generator change that moves the test set must be a deliberate new frozen_test.json
    assert sha256_of_test_set(test) == frozen_test_sha256()
    seen = {t.prompt for t in sets["train"]} | {t.prompt for t in sets["heldout"]}
    assert not seen & {t.prompt for t in test}
    assert {t.split for t in test} == {"test"} and len({t.id for t in test}) == len(test)
    per = Counter((t.domain, t.difficulty) for t in test)
    assert {d for d, _ in per} == {"math", "code", "tool"}  # knowledge: see TEST_DOMAINS
    assert all(n == 25 for n in per.values()) and ("math", 1) not in per  # one-digit sums: all 100 taken
    # train and held-out do not depend on the test set: a checkpoint's suite version stays put
    without = build_task_sets(TaskSuitesConfig(test_per_level=0), FACTS)
    assert without["test"] == [] and suite_version(without) == suite_version(sets)
    assert sha256_of_test_set(build_task_sets(TaskSuitesConfig(test_per_level=24), FACTS)["test"]) != (
        frozen_test_sha256()
    )


def test_rl_pool_is_fresh_prompts_beside_the_frozen_splits():
    config = TaskSuitesConfig(
        train_per_level=30, heldout_per_level=10, test_per_level=5, rl_pool_per_level=40
    )
    sets = build_task_sets(config, FACTS)
    pool = build_rl_pool(config, sets, FACTS)
    assert pool == build_rl_pool(config, sets, FACTS)  # deterministic
    taken = {t.prompt for split in sets.values() for t in split}
    assert not taken & {t.prompt for t in pool} and len({t.prompt for t in pool}) == len(pool)
    per = Counter((t.domain, t.difficulty) for t in pool)
    assert per[("tool", 1)] == per[("code", 2)] == per[("math", 4)] == 40
    one_digit = sum(t.domain == "math" and t.difficulty == 1 for split in sets.values() for t in split)
    assert per[("math", 1)] == min(40, 100 - one_digit)  # one-digit sums: 100 prompts in all
    assert {t.split for t in pool} == {"train"}
    # the pool names the suite version (RL trains on it) but moves neither train, held-out nor test
    assert suite_version({**sets, "rl_pool": pool}) != suite_version(sets)
    assert build_task_sets(config.model_copy(update={"rl_pool_per_level": 0}), FACTS) == sets
    assert build_rl_pool(config.model_copy(update={"rl_pool_per_level": 0}), sets, FACTS) == []


def test_unknown_domain_is_a_config_error():
    with pytest.raises(ValueError, match="unknown domain.*'poetry'"):
        build_task_sets(TaskSuitesConfig(levels={"poetry": [1]}))


@pytest.mark.parametrize(
    "answer, reference, same",
    [
        ("5/2", "10/4", True),
        ("2.5", "5/2", True),
        ("5x", "5*x", True),
        ("x*5", "5*x", True),
        ("x = 3", "3", True),
        ("6", "5*x", False),
        ("7", "8", False),
        ("__import__('os').system('true')", "0", False),
        ("(1+", "1", False),
    ],
)
def test_math_equivalence(answer, reference, same):
    assert equivalent(answer, reference) is same


def test_math_verifier_every_level():
    suite = MathSuite()
    for level in (1, 2, 3, 4):
        for task in suite.generate("heldout", 10, 0, level):
            worked = suite.solution(task)[-1]["content"]
            assert suite.verify(task, worked).reward == 1.0, (task.prompt, worked)
            assert suite.verify(task, "Answer: 100000").reason == "wrong_answer"
            assert suite.verify(task, "I think so").reason == "no_answer"


def test_extract_answer_takes_the_last_one():
    assert extract_answer("Answer: 3\nno wait. Answer: 4<|end_of_turn|>") == "4"
    assert extract_answer("nothing here") is None
    assert extract_answer('Answer: "31186"') == "31186" and extract_answer('Answer: "') == '"'


@pytest.mark.skipif(sandbox_available() is not None, reason=str(sandbox_available()))
def test_code_verifier_runs_hidden_tests_in_the_sandbox():
    suite = CodeSuite()
    tasks = suite.generate("heldout", 12, 0, 4)
    assert len({t.meta["family"] for t in tasks}) >= 4
    for task in tasks[:4]:
        assert suite.verify(task, suite.solution(task)[0]["content"]).reward == 1.0
    task = tasks[0]
    name = task.meta["function"]
    wrong = f"```python\ndef {name}(*a):\n    return None\n```"
    assert suite.verify(task, wrong).reason.startswith("error: AssertionError")
    hostile = f"def {name}(*a):\n    import socket\n    socket.create_connection(('127.0.0.1', 80))"
    assert suite.verify(task, hostile).reward == 0.0
    assert suite.verify(task, "no code at all").reason == "no_code"


# Near misses a policy writes: every other constant, and the operator a family is confused with.
NEAR_MISSES = {
    "floor_div": ["return x / {k}", "return int(x / {k})"],
    "count_above": ["return sum(1 for v in xs if v >= {k})"],
    "count_pos": ["return sum(1 for v in xs if v >= 0)"],
    "prefix": ["return s[:{k} - 1]"],
}


def _near_misses(task) -> list[str]:
    body, k = FAMILIES[task.meta["family"]][2], task.meta.get("k")
    wrong = [body.format(k=other) for other in range(2, 10) if other != k] if k is not None else []
    return wrong + [m.format(k=k) for m in NEAR_MISSES.get(task.meta["family"], [])]


def test_code_tests_reject_every_wrong_constant_and_near_miss_operator():
    """code-v2's random cases passed `> 4` for "greater than 3" on 73% of count_above tasks: RL rewarded it."""
    suite, checked = CodeSuite(), Counter()
    for split in ("train", "heldout", "test"):
        for level in (1, 2, 3, 4):
            for task in suite.generate(split, 120, 0, level):
                name, args = task.meta["function"], ARGS.get(task.meta["family"], "x")
                exec(task.meta["solution"] + task.answer, {})  # the reference passes its own tests
                for body in _near_misses(task):
                    with pytest.raises(AssertionError):
                        exec(f"def {name}({args}):\n    {body}\n{task.answer}", {})
                    checked[task.meta["family"]] += 1
    assert set(checked) >= {"count_above", "prefix", "divisible", "floor_div", "max_or_const", "count_pos"}
    assert min(checked.values()) >= 50


@pytest.mark.skipif(sandbox_available() is not None, reason=str(sandbox_available()))
def test_code_verifier_fails_a_wrong_constant_in_the_sandbox():
    suite = CodeSuite()
    task = next(t for t in suite.generate("heldout", 60, 0, 4) if t.meta["family"] == "count_above")
    name, k = task.meta["function"], task.meta["k"]
    assert suite.verify(task, suite.solution(task)[0]["content"]).reward == 1.0
    off_by_one = f"```python\ndef {name}(xs):\n    return sum(1 for v in xs if v > {k + 1})\n```"
    assert suite.verify(task, off_by_one).reason.startswith("error: AssertionError")


@pytest.mark.skipif(sandbox_available() is not None, reason=str(sandbox_available()))
def test_code_verdicts_are_reused_for_the_same_program_but_not_after_a_timeout(monkeypatch):
    """Checkpoints that answer alike are verified once per program (each run is a process start); a
    timeout may be the machine's load, so that program runs again."""
    import training.tasks.code as code
    from infra.sandbox import SandboxLimits

    runs = []

    def counted(program, limits):
        runs.append(program)
        return code.run_python.__wrapped__(program, limits)

    counted.__wrapped__ = code.run_python
    monkeypatch.setattr(code, "run_python", counted)
    monkeypatch.setattr(code, "_VERDICTS", {})
    suite = CodeSuite()
    task = suite.generate("heldout", 2, 5, 1)[0]
    right, name = suite.solution(task)[0]["content"], task.meta["function"]
    wrong = f"```python\ndef {name}(*a):\n    return None\n```"
    verdicts = [suite.verify(task, answer) for answer in (right, wrong, right, f"Here:\n{right}", wrong)]
    assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert verdicts[4].reason == verdicts[1].reason and verdicts[1].reason.startswith("error: AssertionError")
    assert len(runs) == 2  # the same extracted program is one run, whatever text surrounds it
    other = suite.generate("heldout", 2, 6, 1)[0]  # the same code against other tests is another program
    suite.verify(other, right)
    assert len(runs) == 3
    slow = CodeSuite(SandboxLimits(wall_s=0.5, cpu_s=1, memory_mb=256))
    loop = f"```python\ndef {name}(*a):\n    while True:\n        pass\n```"
    first, again = slow.verify(task, loop), slow.verify(task, loop)
    assert first.reward == again.reward == 0.0 and first.reason.split(":")[0] in ("timeout", "cpu_time")
    assert len(runs) == 5  # not kept: it ran twice


def test_calculator_evaluates_only_arithmetic():
    assert calculator("12 * 34 + 5") == "413"
    assert calculator("-3 * 4") == "-12"
    assert calculator("__import__('os')").startswith("error")
    assert calculator("2 ** 1000").startswith("error")
    assert calculator("1" * 100).startswith("error")
    assert call_tool('{"name": "calculator", "arguments": {"expression": "6 * 7"}}') == "42"
    assert calculator("(-6 - 14) / 5") == "-4" and calculator("18 / 6") == "3"
    assert calculator("7 / 2").startswith("error") and calculator("3 / (2 - 2)").startswith("error")
    assert call_tool('{"name": "shell", "arguments": {}}').startswith("error: bad tool call")
    assert call_tool("not json").startswith("error: bad tool call")


def test_tool_suite_worked_solution_calls_the_calculator():
    registry = suites()
    task = registry["tool"].generate("train", 1, 0, 2)[0]
    messages = registry["tool"].solution(task)
    assert messages[0]["tool_calls"][0]["arguments"]["expression"] == task.meta["expression"]
    assert messages[1] == {"role": "tool", "content": task.answer}
    assert registry["tool"].verify(task, messages[2]["content"]).reward == 1.0
    assert registry["tool"].verify(task, f"Answer: {task.answer}").reward == 1.0  # unquoted is right too


def test_a_copied_tool_result_is_the_same_tokens_in_the_answer_as_in_the_result(tmp_path):
    """Digits are single tokens, but a number's first digit carries the space before it (" 3" vs "3"):
    `Answer: 31186` would start the copy of `<tool_response>31186` from a token the result does not hold;
    the worked solutions quote the number, so the answer repeats the result's tokens exactly."""
    from training.sft_data import SftDataConfig, build_sft_trajectories
    from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

    sets = build_task_sets(TaskSuitesConfig(train_per_level=20, heldout_per_level=1, test_per_level=0))
    tasks = [t for t in sets["train"] if t.domain in ("tool", "math")]
    cfg = SftDataConfig(definition_chats=0, error_share=0.0, math_calculator_share=1.0)
    rows, _ = build_sft_trajectories(tasks, suites(), [], cfg)
    chats = [r["messages"] for r in rows if any(m["role"] == "tool" for m in r["messages"])]
    assert {"Use", "What", "Solve"} <= {c[0]["content"].split()[0] for c in chats}
    tok = load_tokenizer(
        train_tokenizer([json.dumps(c) for c in chats] * 3, TokenizerConfig(vocab_size=400), tmp_path)
    )

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    for chat in chats:
        result, answer = chat[-2]["content"], chat[-1]["content"]
        digits = ids(f"<tool_response>{result}</tool_response>")[1:-1]
        if result.startswith("-"):  # BPE merges a quote and a minus; the digits after it are what is copied
            digits = digits[1:]
        else:
            assert not _holds(ids(f"Answer: {result}"), digits)  # unquoted: the first digit differs
        assert _holds(ids(answer), digits), (result, answer)


def _holds(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def test_knowledge_questions_split_by_fact():
    suite = KnowledgeSuite(FACTS)
    train = {t.answer for t in suite.generate("train", 100, 0, 1)}
    heldout = {t.answer for t in suite.generate("heldout", 100, 0, 1)}
    assert train and heldout and train.isdisjoint(heldout) and len(train) + len(heldout) == len(FACTS)
    task = suite.generate("heldout", 1, 0, 2)[0]
    assert suite.verify(task, f"Answer: The {task.answer.upper()}.").reward == 1.0
    assert suite.verify(task, "Answer: something else").reward == 0.0


def test_facts_read_back_as_written_and_a_malformed_line_names_its_file_and_line(tmp_path):
    facts = [("café", 'a room "with" coffee\nand a tab\t'), *FACTS[:3]]
    path = write_facts(facts, tmp_path / "facts.jsonl")
    assert read_facts(path) == facts and read_facts(None) == []
    path.write_text(path.read_text() + '["term only"]\n')
    with pytest.raises(ValueError, match=r"facts\.jsonl:5: a fact must be a \[term, definition\] pair"):
        read_facts(path)
    path.write_text('["a", "b"]\n{not json\n')
    with pytest.raises(ValueError, match=r"facts\.jsonl:2: a fact must be a \[term, definition\] pair"):
        read_facts(path)


def test_knowledge_v2_lists_the_term_among_choices_of_its_own_split_and_quotes_the_pick(tmp_path):
    config = TaskSuitesConfig(levels={"knowledge": [1, 2]}, train_per_level=20, heldout_per_level=5)
    open_sets = build_task_sets(config, FACTS)
    sets = build_task_sets(config.model_copy(update={"knowledge_choices": 4}), FACTS)
    heldout_terms = {t.answer for t in KnowledgeSuite(FACTS).generate("heldout", 100, 0, 1)}  # every one
    places = Counter()
    for split in ("train", "heldout"):
        for task in sets[split]:
            choices = task.meta["choices"]
            assert len(set(choices)) == 4 and task.answer in choices
            assert all(
                (c in heldout_terms) == (split == "heldout") for c in choices
            )  # no term crosses splits
            assert task.prompt.endswith("Choose one of: " + ", ".join(f'"{c}"' for c in choices) + ".")
            places[choices.index(task.answer)] += 1
    assert len(places) == 4  # the answer is not always in one place
    # the same facts and clues as the open questions: only the choices are new
    assert [t.answer for t in sets["heldout"]] == [t.answer for t in open_sets["heldout"]]
    assert all(t.meta == {} for t in open_sets["heldout"])
    task = sets["heldout"][0]
    registry = suites(FACTS)  # any registry solves and verifies it: the choices travel with the task
    solution = registry["knowledge"].solution(task)[-1]["content"]
    assert solution == f'Answer: "{task.answer}"'
    assert registry["knowledge"].verify(task, solution).reward == 1.0
    listed = ", ".join(f'"{c}"' for c in task.meta["choices"])
    assert registry["knowledge"].verify(task, f"Answer: {listed}").reward == 0.0  # naming them all is wrong
    # the choices survive the task file every stage reads
    assert read_tasks(write_tasks(sets["heldout"], tmp_path / "t.jsonl")) == sets["heldout"]
    with pytest.raises(ValueError, match="knowledge choices: 1"):
        KnowledgeSuite(FACTS, 1)


def test_knowledge_v3_letters_the_choices_and_accepts_the_right_letter_or_term(tmp_path):
    from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

    config = TaskSuitesConfig(
        levels={"knowledge": [1]}, train_per_level=20, heldout_per_level=5, knowledge_choices=4
    )
    v2 = build_task_sets(config, FACTS)
    sets = build_task_sets(config.model_copy(update={"knowledge_labels": True}), FACTS)
    assert [t.meta["choices"] for t in sets["train"]] == [t.meta["choices"] for t in v2["train"]]
    assert knowledge_format_of(sets["train"]) == (4, True, False, False)
    assert knowledge_format_of(v2["train"]) == (4, False, False, False)
    registry = suites(FACTS)  # the letters travel with the task too
    letters = Counter()
    for task in sets["train"]:
        choices = task.meta["choices"]
        shown = ", ".join(f'{"ABCD"[i]}) "{c}"' for i, c in enumerate(choices))
        assert task.prompt.endswith(f"Choose one of: {shown}. Answer with the letter.")
        right = "ABCD"[choices.index(task.answer)]
        letters[right] += 1
        assert registry["knowledge"].solution(task) == [{"role": "assistant", "content": f"Answer: {right}"}]
        for said in (right, f"({right.lower()})", f"{right})", task.answer):
            assert registry["knowledge"].verify(task, f"Answer: {said}").reward == 1.0, said
        for wrong in "ABCD".replace(right, ""):
            assert registry["knowledge"].verify(task, f"Answer: {wrong}").reward == 0.0
        assert registry["knowledge"].verify(task, "Answer: A, B, C, D").reward == 0.0
    assert len(letters) == 4
    assert KnowledgeSuite(FACTS, 4, labels=True).version == "knowledge-v3-labelled4"
    with pytest.raises(ValueError, match="knowledge_labels needs knowledge_choices"):
        build_task_sets(TaskSuitesConfig(knowledge_labels=True), FACTS)
    # the answer's letter is the token the prompt shows it as (" B"), so picking needs no re-segmentation
    texts = [t.prompt + " " + registry["knowledge"].solution(t)[0]["content"] for t in sets["train"]]
    tok = load_tokenizer(train_tokenizer(texts * 3, TokenizerConfig(vocab_size=400), tmp_path))
    for task in sets["train"]:
        answer = tok.encode(registry["knowledge"].solution(task)[0]["content"], add_special_tokens=False)
        assert _holds(tok.encode(task.prompt, add_special_tokens=False), answer[-1:]), task.prompt


def test_difficulty_filter_keeps_sometimes_solved():
    tasks = MathSuite().generate("train", 4, 0, 1)
    rates = {tasks[0].id: 0.0, tasks[1].id: 0.5, tasks[2].id: 1.0}
    assert difficulty_filter(tasks, rates) == [tasks[1]]


def test_eval_subset_covers_every_level_of_each_domain():
    sets = build_task_sets(
        TaskSuitesConfig(levels={"math": [1, 2, 3, 4], "code": [1, 2]}, heldout_per_level=10)
    )
    picked = eval_subset(sets["heldout"], 6)
    by = {}
    for t in picked:
        by.setdefault(t.domain, []).append(t.difficulty)
    # 6 math tasks over 4 levels: levels 1, 2 twice, 3, 4 once (round-robin), not the first 6 of level 1
    assert sorted(by["math"]) == [1, 1, 2, 2, 3, 4]
    assert sorted(by["code"]) == [1, 1, 1, 2, 2, 2]
    assert len({t.id for t in picked}) == len(picked) == 12
    # a cap above the pool takes everything once
    assert len(eval_subset(sets["heldout"], 1000)) == len(sets["heldout"])
    # a per-domain exception: all 20 code tasks, math still capped at 6
    wide = eval_subset(sets["heldout"], 6, {"code": 100})
    assert sum(t.domain == "code" for t in wide) == 20 and sum(t.domain == "math" for t in wide) == 6


@pytest.mark.parametrize("answer", ["15x1.", "15x1.2", "15x..1", "15x1 .", "x =.", "(((", "1/0", "x^^2"])
def test_math_verifier_scores_unparsable_answers_zero_instead_of_raising(answer):
    # "15x1." once crashed a tiny Reasoning RL run at step 40: sympy built code naming `Number`
    suite = MathSuite()
    task = suite.generate("train", 1, seed=0, difficulty=1)[0]
    verdict = suite.verify(task, f"Answer: {answer}")
    assert verdict.reward == 0.0 and verdict.reason
    assert not equivalent(answer, "15*x")


def test_code_train_split_keeps_every_family_at_every_level():
    """Held-out takes no family away from train: with the default sizes every level keeps most of its train
    tasks and every family has train prompts (a level of 8 distinct prompts once left train 3 tasks)."""

    from training.tasks.code import FAMILIES

    sets = build_task_sets(TaskSuitesConfig())
    train = [t for t in sets["train"] if t.domain == "code"]
    per_level = Counter(t.difficulty for t in train)
    assert min(per_level[level] for level in (1, 2, 3, 4)) >= 150, per_level
    families = Counter(t.meta["family"] for t in train)
    assert set(families) == set(FAMILIES) and min(families.values()) >= 5, families
    assert all(t.difficulty == FAMILIES[t.meta["family"]][0] for t in train)


def test_sft_rows_leave_out_the_rl_only_code_families():
    from training.sft_data import SftDataConfig, build_sft_trajectories

    code = [t for t in build_task_sets(TaskSuitesConfig(train_per_level=40, heldout_per_level=5))["train"]
            if t.domain == "code"]  # fmt: skip
    cfg = SftDataConfig(definition_chats=0, rl_only_families=["floor_div", "count_above"], rl_family_rows=0)
    rows, kinds = build_sft_trajectories(code, suites(), [], cfg)
    family = {t.id: t.meta["family"] for t in code}
    kept = {family[r["task_id"]] for r in rows}
    assert kept and not kept & {"floor_div", "count_above"}
    assert kinds["code"] == sum(family[t.id] not in {"floor_div", "count_above"} for t in code)
    with pytest.raises(ValueError, match="unknown code famil.*'flor_div'"):
        SftDataConfig(rl_only_families=["flor_div"])

    foothold = SftDataConfig(
        definition_chats=0, rl_only_families=["floor_div", "count_above"], rl_family_rows=2
    )
    rows, _ = build_sft_trajectories(code, suites(), [], foothold)
    per_family = Counter(family[r["task_id"]] for r in rows)
    assert per_family["floor_div"] == per_family["count_above"] == 2
    assert per_family["add_const"] == sum(family[t.id] == "add_const" for t in code) > 2


def test_domain_repeats_copy_one_domains_worked_solutions_and_leave_the_others_as_they_were():
    from training.sft_data import SftDataConfig, build_sft_trajectories

    tasks = [
        t
        for t in build_task_sets(TaskSuitesConfig(train_per_level=10))["train"]
        if t.domain in ("tool", "code")
    ]
    plain = SftDataConfig(definition_chats=0, error_share=0.0)
    base, _ = build_sft_trajectories(tasks, suites(), [], plain)
    rows, _ = build_sft_trajectories(
        tasks, suites(), [], plain.model_copy(update={"domain_repeats": {"tool": 3}})
    )
    per_task = Counter(r["task_id"] for r in rows)
    domain = {t.id: t.domain for t in tasks}
    assert {per_task[t] for t in per_task if domain[t] == "tool"} == {3}
    assert Counter(r["task_id"] for r in base) == {
        t: n for t, n in per_task.items() if domain[t] == "code"
    } | {t: 1 for t in per_task if domain[t] == "tool"}
    with pytest.raises(ValueError, match="domain_repeats.*unknown: \\['tol'\\]"):
        SftDataConfig(domain_repeats={"tol": 2})
    with pytest.raises(ValueError, match="at least 1"):
        SftDataConfig(domain_repeats={"tool": 0})


def test_math_drill_adds_fresh_math_rows_and_never_a_heldout_or_test_prompt():
    from training.sft_data import SftDataConfig, build_sft_trajectories, drill

    sets = build_task_sets(TaskSuitesConfig(train_per_level=40, heldout_per_level=20, test_per_level=10))
    math = [t for t in sets["train"] if t.domain == "math"]
    excluded = {t.prompt for split in ("heldout", "test") for t in sets[split]}
    plain = SftDataConfig(definition_chats=0, error_share=0.0, math_calculator_share=0.0)
    base_rows, base_kinds = build_sft_trajectories(math, suites(), [], plain, excluded)
    assert base_rows == build_sft_trajectories(math, suites(), [], plain)[0]  # no drill: rows as before
    assert "math_drill" not in base_kinds

    drilled_tasks = {t.id: t for t in drill(math, MathSuite(), 60, 0, excluded)}
    per_level = Counter(t.difficulty for t in drilled_tasks.values())
    # one-digit sums have 100 prompts in all, most of them held-out, test or train already
    assert per_level[1] < 60 and per_level[2] == per_level[3] == per_level[4] == 60, per_level
    assert not {t.prompt for t in drilled_tasks.values()} & (excluded | {t.prompt for t in math})

    cfg = plain.model_copy(update={"math_drill_per_level": 60})
    rows, kinds = build_sft_trajectories(math, suites(), [], cfg, excluded)
    drilled = [r for r in rows if r["kind"] == "math_drill"]
    assert kinds["math"] == base_kinds["math"] == len(math)
    assert sorted(r["task_id"] for r in drilled) == sorted(drilled_tasks)
    for r in drilled:  # a worked solution the suite's own verifier accepts
        answer = r["messages"][-1]["content"]
        assert MathSuite().verify(drilled_tasks[r["task_id"]], answer).reward == 1.0, answer


def test_knowledge_drill_asks_about_train_terms_the_train_questions_do_not_name():
    from training.sft_data import DRILL_SEED_OFFSET, SftDataConfig, build_sft_trajectories

    facts = [(f"term{i}", f"the {i}th thing of a long list of things") for i in range(200)]
    config = TaskSuitesConfig(train_per_level=10, heldout_per_level=10, knowledge_choices=4)
    sets = build_task_sets(config, facts)
    knowledge = [t for t in sets["train"] if t.domain == "knowledge"]
    # the sft_data asset's registry: the choices read back from the task suites' own train tasks
    assert knowledge_format_of(knowledge) == (4, False, False, False)
    opened = build_task_sets(config.model_copy(update={"knowledge_choices": 0}), facts)["train"]
    assert knowledge_format_of(opened) == (0, False, False, False)
    registry = suites(facts, *knowledge_format_of(knowledge))
    cfg = SftDataConfig(definition_chats=0, knowledge_drill_per_level=30)
    rows, kinds = build_sft_trajectories(knowledge, registry, facts, cfg)
    drilled = [r for r in rows if r["kind"] == "knowledge_drill"]
    assert kinds["knowledge"] == len(knowledge) and len(drilled) == 30 * len(config.levels["knowledge"])
    by_id = {
        t.id: t
        for level in (1, 2)
        for t in registry["knowledge"].generate("train", 120, DRILL_SEED_OFFSET, level)
    }
    drill_terms = [by_id[r["task_id"]].answer for r in drilled]
    heldout_terms = {t.answer for t in sets["heldout"] if t.domain == "knowledge"}
    train_terms = {t.answer for t in knowledge}
    assert not set(drill_terms) & (heldout_terms | train_terms)
    for r in drilled:  # four listed terms, the answer quoted as listed and accepted by the verifier
        task = by_id[r["task_id"]]
        assert len(task.meta["choices"]) == 4 and task.answer in task.meta["choices"]
        assert r["messages"][-1]["content"] == f'Answer: "{task.answer}"'
        assert registry["knowledge"].verify(task, r["messages"][-1]["content"]).reward == 1.0


def test_copy_drill_asks_to_repeat_quoted_phrases_of_definition_words():
    import random
    import re

    from training.sft_data import SftDataConfig, build_sft_trajectories, copy_drill

    facts = [("alpha", "a small boat with two masts"), ("beta", "the harbor where boats anchor in winter")]
    words = {w for _, d in facts for w in re.findall(r"[A-Za-z]{3,12}", d)}
    rows = copy_drill(facts, 200, random.Random(0))
    assert len(rows) == 200 and rows == copy_drill(facts, 200, random.Random(0))
    lengths = Counter()
    for row in rows:
        user, assistant = row["messages"]
        phrase = re.fullmatch(r'Repeat "(.+)"', user["content"]).group(1)
        assert assistant == {"role": "assistant", "content": f'"{phrase}"'} and row["kind"] == "copy_drill"
        assert set(phrase.split()) <= words
        lengths[len(phrase.split())] += 1
    assert set(lengths) == {1, 2, 3}
    assert copy_drill([], 5, random.Random(0)) == []

    cfg = SftDataConfig(definition_chats=0, copy_drill_rows=30)
    _, kinds = build_sft_trajectories([], suites(), facts, cfg)
    assert kinds == {"copy_drill": 30}
    assert build_sft_trajectories([], suites(), facts, cfg.model_copy(update={"copy_drill_rows": 0}))[1] == {}


def test_column_steps_are_true_one_digit_facts_ending_in_the_answer():
    import re

    from training.sft_data import SftDataConfig, build_sft_trajectories
    from training.tasks.math import column_steps

    tasks = [t for level in (1, 2, 3) for t in MathSuite().generate("train", 200, 0, level)]
    stepped = {t.id: column_steps(t.prompt) for t in tasks}
    assert all(stepped[t.id] is None for t in tasks if t.difficulty == 1 or "x" in t.prompt)
    arithmetic = [t for t in tasks if stepped[t.id]]
    assert len(arithmetic) > 250 and {t.difficulty for t in arithmetic} == {2, 3}
    borrows = 0
    for t in arithmetic:
        *columns, last = stepped[t.id].split(", ")
        assert last.endswith(f"= {t.answer}") and equivalent(last.split(" = ")[-1], t.answer), stepped[t.id]
        for step in columns:  # each column: digits (and a carry or a borrowed ten) and its true value
            lhs, rhs = step.split(" = ")
            assert re.fullmatch(r"\d+ [-+*] \d( \+ \d)?", lhs) and eval(lhs) == int(rhs), step
        borrows += columns[0].startswith("1") and " - " in columns[0]
    assert borrows > 10  # differences that borrow were generated and checked
    assert column_steps("What is 68 + 55?") == "8 + 5 = 13, 6 + 5 + 1 = 12, 68 + 55 = 123"
    assert column_steps("What is 72 - 38?") == "12 - 8 = 4, 6 - 3 = 3, 72 - 38 = 34"

    cfg = SftDataConfig(
        definition_chats=0, error_share=0.0, math_column_steps=True, math_calculator_share=0.0
    )
    rows, _ = build_sft_trajectories(arithmetic[:20], suites(), [], cfg)
    plain, _ = build_sft_trajectories(
        arithmetic[:20], suites(), [], cfg.model_copy(update={"math_column_steps": False})
    )
    by_id = {t.id: t for t in arithmetic}
    for row, before in zip(rows, plain, strict=True):
        assert row["messages"][1]["reasoning_content"] == stepped[row["task_id"]]
        assert before["messages"][1]["reasoning_content"] == by_id[row["task_id"]].meta["steps"]
        assert (
            row["messages"][1]["content"]
            == before["messages"][1]["content"]
            == f"Answer: {by_id[row['task_id']].answer}"
        )


def test_math_solved_with_the_calculator_checks_out_through_the_real_tool_and_verifier():
    from training.sft_data import SftDataConfig, build_sft_trajectories
    from training.tasks.math import calculator_expression

    sets = build_task_sets(TaskSuitesConfig(train_per_level=60, heldout_per_level=10, test_per_level=0))
    math = [t for t in sets["train"] if t.domain == "math"]
    forms = Counter()
    for task in math:  # every generated form has a calculator set-up
        expression, form = calculator_expression(task.prompt)
        forms[(task.difficulty, form, "/" in expression)] += 1
    assert {(4, "{}x", False), (4, "{}", True), (3, "{}", False), (1, "{}", False)} <= set(forms), forms
    assert calculator_expression("Simplify: 3x^2 + x") is None

    cfg = SftDataConfig(definition_chats=0, error_share=0.25, math_calculator_share=1.0)
    rows, kinds = build_sft_trajectories(math, suites(), [], cfg)
    assert kinds["math_tool"] + kinds["math_tool_failed"] == len(math) and kinds["math_tool_failed"] > 0
    by_id = {t.id: t for t in math}
    for row in rows:
        *turns, final = row["messages"][1:]
        call, result = turns[-2]["tool_calls"][0], turns[-1]["content"]
        assert call_tool(json.dumps(call)) == result  # the tool the rollout loop runs says the same
        assert MathSuite().verify(by_id[row["task_id"]], final["content"]).reward == 1.0, row
        if row["kind"] == "math_tool_failed":
            assert turns[0]["train"] is False  # the malformed call carries no loss

    half, _ = build_sft_trajectories(
        math, suites(), [], cfg.model_copy(update={"math_calculator_share": 0.5})
    )
    tooled = sum(r["kind"].startswith("math_tool") for r in half)
    assert 0.4 * len(math) < tooled < 0.6 * len(math)
    off = cfg.model_copy(update={"math_calculator_share": 0.0})
    assert build_sft_trajectories(math, suites(), [], off)[1]["math_tool"] == 0


def test_knowledge_choices_beyond_a_splits_facts_fail_naming_the_setting():
    with pytest.raises(
        ValueError, match="task_suites.knowledge_choices: 4 choices, but the heldout split has only 1"
    ):
        KnowledgeSuite(FACTS[:2], 4).generate("heldout", 1, 0, 1)


def test_knowledge_v4_asks_about_glossary_facts_whose_clue_is_what_sft_read():
    from training.sft_data import GLOSSARY_PROMPT, SftDataConfig, build_sft_trajectories

    facts = [(t, r"n 1: \Ab*a`cus\ " + d) for t, d in FACTS] + [
        ("adipsia", ', Adipsy ([a^]d"[i^]p*s[y^]), n')
    ]
    config = TaskSuitesConfig(levels={"knowledge": [1, 4]}, train_per_level=30, heldout_per_level=8)
    sets = build_task_sets(config.model_copy(update={"knowledge_glossary": True}), facts)
    knowledge = [t for s in ("train", "heldout") for t in sets[s]]
    assert knowledge_format_of(sets["train"]) == (0, False, True, False)
    assert {t.split for t in knowledge} == {"train", "heldout"}
    assert {t.answer for t in sets["train"]}.isdisjoint({t.answer for t in sets["heldout"]})
    registry = suites(facts, *knowledge_format_of(sets["train"]))
    assert registry["knowledge"].version == "knowledge-v4-glossary"
    rows, kinds = build_sft_trajectories(sets["train"], registry, facts, SftDataConfig(glossary_copies=3))
    read = [r["messages"][1]["content"] for r in rows if r["kind"] == "glossary"]
    assert {r["messages"][0]["content"] for r in rows if r["kind"] == "glossary"} == {GLOSSARY_PROMPT}
    assert kinds["glossary"] == len(read) == 2 * 3 * len(FACTS)  # the unreadable "adipsia" entry is left out
    assert not any("adipsia" in entry or "\\" in entry or "n 1:" in entry for entry in read)
    for task in knowledge:  # held-out too: a question about a fact the model read, starting as the entry does
        clue = task.prompt.removeprefix("Which term is defined as: ").removesuffix("?")
        assert clue and any(e.startswith(clue) and e.endswith(f": {task.answer}.") for e in read), task.prompt
        assert task.meta == {"glossary": True}
    # a foothold: SFT keeps 2 knowledge worked solutions per level and still reads every fact
    foothold = SftDataConfig(glossary_copies=3, knowledge_rows_per_level=2)
    rows, kinds = build_sft_trajectories(sets["train"], registry, facts, foothold)
    asked = [r["task_id"] for r in rows if r["kind"] == "knowledge"]
    by_id = {t.id: t for t in sets["train"]}
    assert sorted(by_id[i].difficulty for i in asked) == [1, 1, 4, 4] and kinds["glossary"] == len(read)
    # v1 reads no glossary: the same facts give no glossary rows and keep their markup in the questions
    v1 = build_task_sets(config, facts)
    rows, kinds = build_sft_trajectories(v1["train"], suites(facts), facts, SftDataConfig(glossary_copies=3))
    assert kinds["glossary"] == 0 and "n 1:" in v1["heldout"][0].prompt
    with pytest.raises(ValueError, match="knowledge_choices to 0"):
        KnowledgeSuite(facts, choices=4, glossary=True)


def test_knowledge_v5_worked_solutions_recite_the_read_entry_then_answer_and_are_verified_correct():
    from training.sft_data import SftDataConfig, build_sft_trajectories

    long = (
        "zymurgy",
        "the branch of chemistry that deals with fermentation, as in wine making and brewing beer",
    )
    facts = [*FACTS, long]
    config = TaskSuitesConfig(
        levels={"knowledge": [1, 4]}, train_per_level=30, heldout_per_level=8, knowledge_glossary=True,
        knowledge_recite=True,
    )  # fmt: skip
    sets = build_task_sets(config, facts)
    assert knowledge_format_of(sets["train"]) == (0, False, True, True)
    registry = suites(facts, *knowledge_format_of(sets["train"]))
    suite = registry["knowledge"]
    assert suite.version == "knowledge-v5-recite" and len(long[1]) > suite.RECITE_CHARS
    assert "zymurgy" not in {t for t, _ in suite.facts} and len(suite.facts) == len(FACTS)
    entries = set(suite.glossary_entries())
    for task in sets["train"] + sets["heldout"]:
        (turn,) = suite.solution(task)
        recited, answer_line = turn["content"].split("\n")
        assert recited in entries and recited == f"{task.meta['recite']}: {task.answer}."
        clue = task.prompt.removeprefix("Which term is defined as: ").removesuffix("?")
        assert recited.startswith(clue) and answer_line == f"Answer: {task.answer}"
        assert suite.verify(task, turn["content"]).reward == 1.0
        assert suite.verify(task, f"{recited}\nAnswer: {long[0]}").reward == 0.0
    rows, _ = build_sft_trajectories(sets["train"], registry, facts, SftDataConfig(glossary_copies=1))
    answered = [r["messages"][-1]["content"] for r in rows if r["kind"] == "knowledge"]
    assert answered and all(a.split("\n")[0] in entries for a in answered)
    with pytest.raises(ValueError, match="set knowledge_glossary to true"):
        KnowledgeSuite(facts, recite=True)
