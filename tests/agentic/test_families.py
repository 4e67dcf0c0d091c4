"""Agentic task families (terminal, codefix, search): worked solutions score 1 through real episodes (tools
executed, tests run in the real sandbox), wrong answers score 0 with a reason, splits are disjoint and seeded,
environment crashes raise EnvironmentCrash, and the agentic rollout loop masks observations from the loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest
from facts import synthetic_facts  # noqa: E402  (pytest puts this directory on sys.path)

import infra.sandbox
from infra.sandbox import SandboxResult, sandbox_available
from training.agentic.episodes import ExtraLatency
from training.agentic.families import (
    AgenticTasksConfig,
    agentic_suites,
    agentic_version,
    build_agentic_task_sets,
    read_agentic_facts,
    read_agentic_sft_tasks,
    read_agentic_tasks,
    rl_task_shortfalls,
    sft_tasks,
    write_agentic_tasks,
)
from training.agentic.protocol import AGENTIC_DOMAINS, EnvironmentCrash
from training.agentic.rollout import agentic_rollout, response_text, scripted_turns
from training.rollout.engine import Generation, SamplingParams
from training.sft import render_chat
from training.sft_data import SftDataConfig, build_sft_trajectories
from training.tasks.base import Task
from training.tasks.tools import ToolSuite
from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

needs_sandbox = pytest.mark.skipif(sandbox_available() is not None, reason=str(sandbox_available()))

FACTS = synthetic_facts()


@pytest.fixture(scope="module")
def families():
    return agentic_suites(FACTS)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, families):
    corpus = []
    for suite in families.values():
        for level in (1, 2, 3):
            for task in suite.generate("train", 10, 0, level):
                corpus.append(task.prompt)
                corpus += [json.dumps(m) for m in suite.solution(task)]
    return load_tokenizer(
        train_tokenizer(corpus * 3, TokenizerConfig(vocab_size=400), tmp_path_factory.mktemp("tok"))
    )


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


@pytest.mark.parametrize("level", [1, 2, 3])
def test_terminal_prompts_quote_what_the_tool_call_copies_so_both_tokenize_alike(families, tokenizer, level):
    """A tiny policy copies tokens, not characters: unquoted, ` owl15` in the prompt and `"owl15"` in the tool
    call's JSON are different token sequences (a leading-space word piece against a bare one)."""
    suite = families["terminal"]
    for task in suite.generate("train", 5, 0, level):
        prompt = tokenizer.encode(task.prompt, add_special_tokens=False)
        for message in suite.solution(task):
            for call in message.get("tool_calls", []):
                payload = tokenizer.encode(json.dumps(call), add_special_tokens=False)
                copied = [v for k, v in call["arguments"].items() if v in task.prompt]
                assert copied  # every call names something the prompt quotes (a path, a value, a word)
                for value in copied:
                    quoted = tokenizer.encode(' "' + value, add_special_tokens=False)
                    assert _contains(prompt, quoted) and _contains(payload, quoted), (task.prompt, value)


def _play(suite, task: Task) -> tuple[list[str], object]:
    """Run the worked solution's tool calls on a live episode; (observations, verdict of its final text)."""
    solution = suite.solution(task)
    episode = suite.open(task)
    try:
        observations = [
            episode.tool(json.dumps(m["tool_calls"][0]))
            for m in solution
            if m["role"] == "assistant" and m.get("tool_calls")
        ]
        response = "\n".join(m["content"] for m in solution if m["role"] == "assistant")
        return observations, episode.finish(response)
    finally:
        episode.close()


@needs_sandbox
@pytest.mark.parametrize("domain", AGENTIC_DOMAINS)
def test_worked_solutions_score_one_through_real_episodes(domain, families, monkeypatch):
    sandbox_runs = []
    real_run = infra.sandbox.run_python

    def counting_run(*args, **kwargs):
        result = real_run(*args, **kwargs)
        sandbox_runs.append(result.status)
        return result

    monkeypatch.setattr(f"training.agentic.{domain}.run_python", counting_run, raising=False)
    suite = families[domain]
    for level in (1, 2, 3):
        tasks = suite.generate("train", 3, 0, level)
        assert len(tasks) == 3, (domain, level)
        for task in tasks:
            observations, verdict = _play(suite, task)
            # the worked solution's tool messages are exactly what the live tools return
            assert observations == [m["content"] for m in suite.solution(task) if m["role"] == "tool"]
            assert all(len(o) <= 120 for o in observations)
            assert verdict.reward == 1.0 and verdict.reason == "correct", (task.prompt, verdict)
            assert 2 <= sum(m["role"] == "assistant" for m in suite.solution(task)) <= 3
    expected_runs = {"terminal": 9, "codefix": 9 + 3, "search": 0}[
        domain
    ]  # codefix level 3 runs the tests too
    assert len(sandbox_runs) == expected_runs and all(s == "ok" for s in sandbox_runs), sandbox_runs


@needs_sandbox
def test_wrong_answers_score_zero_with_a_reason(families):
    terminal, codefix, search = families["terminal"], families["codefix"], families["search"]
    task = terminal.generate("train", 1, 0, 2)[0]
    dst = task.meta["steps"][1][1]["path"]
    wrong = f'<tool_call>{{"name": "write", "arguments": {{"path": "{dst}", "content": "nope"}}}}</tool_call>'
    verdict = terminal.verify(task, wrong)
    assert verdict.reward == 0.0 and verdict.reason.startswith("tests_failed") and "nope" in verdict.reason
    assert terminal.verify(task, "Done.").reason.startswith("tests_failed")

    task = codefix.generate("train", 1, 0, 1)[0]
    n_f2p, n_p2p = len(task.meta["tests"]["fail_to_pass"]), len(task.meta["tests"]["pass_to_pass"])
    unfixed = codefix.verify(task, f"```python\n{task.meta['module']}```")
    assert unfixed.reward == 0.0 and f"fail_to_pass 0/{n_f2p}, pass_to_pass {n_p2p}/{n_p2p}" in unfixed.reason
    # the bug fixed but the other function broken: pass-to-pass catches it
    fixed_fn, helper_fn = task.meta["fixed"].split("\n\n")
    broken = f"{fixed_fn}\n\n{helper_fn.split(':')[0]}:\n    return 12345\n"
    verdict = codefix.verify(task, f"```python\n{broken}```")
    assert verdict.reward == 0.0 and f"fail_to_pass {n_f2p}/{n_f2p}, pass_to_pass 0/{n_p2p}" in verdict.reason
    assert codefix.verify(task, "I would fix it.").reason == "no_code"
    assert codefix.verify(task, "```python\nimport os\nos._exit(0)\n```").reason.startswith("no_test_report")

    task = search.generate("train", 1, 0, 2)[0]
    assert search.verify(task, "Answer: kalomi").reason == "wrong_answer"
    assert search.verify(task, "I do not know.").reason == "no_answer"
    assert search.verify(task, f"Answer: {task.answer}").reward == 1.0


def test_shortfall_names_the_family_and_level_sft_leaves_without_fresh_tasks(tmp_path):
    # 60 facts make 48 search tasks per level, not the 80 asked: SFT's 50 leave RL none of the 30 wanted
    config = AgenticTasksConfig(
        levels={"terminal": [1], "search": [1, 2]}, train_per_level=80, heldout_per_level=2, sft_per_level=50
    )
    write_agentic_tasks(build_agentic_task_sets(config, FACTS), tmp_path, FACTS, config.sft_per_level)
    counts = json.loads((tmp_path / "meta.json").read_text())["counts"]
    assert counts["train/terminal/level1"] == 80 and counts["train/search/level1"] < 50
    messages = rl_task_shortfalls(counts, config)
    assert [m.split(" has ")[0] for m in messages] == [
        "agentic_tasks: search level 1",
        "agentic_tasks: search level 2",
    ]
    assert "leaves Agentic RL 0 fresh tasks of the 30 asked for; raise max_facts" in messages[0]
    assert rl_task_shortfalls(counts, config.model_copy(update={"sft_per_level": 10})) == []  # 38 of 70


def test_splits_are_disjoint_seeded_and_versioned(tmp_path):
    config = AgenticTasksConfig(train_per_level=12, heldout_per_level=6, heldout_for={})
    sets = build_agentic_task_sets(config, FACTS)
    again = build_agentic_task_sets(config, FACTS)
    assert [t.to_json() for t in sets["train"]] == [t.to_json() for t in again["train"]]
    assert not {t.prompt for t in sets["train"]} & {t.prompt for t in sets["heldout"]}
    for domain in AGENTIC_DOMAINS:
        for level in (1, 2, 3):
            n_train = sum(t.domain == domain and t.difficulty == level for t in sets["train"])
            n_heldout = sum(t.domain == domain and t.difficulty == level for t in sets["heldout"])
            assert n_heldout == 6 and 9 <= n_train <= 12, (domain, level, n_train, n_heldout)
    # search splits by the answer term: no held-out answer is a train answer
    search_answers = {s: {t.answer for t in sets[s] if t.domain == "search"} for s in ("train", "heldout")}
    assert not search_answers["train"] & search_answers["heldout"]
    other = build_agentic_task_sets(config.model_copy(update={"seed": 1}), FACTS)
    assert {t.prompt for t in other["train"]} != {t.prompt for t in sets["train"]}
    version = write_agentic_tasks(sets, tmp_path / "agentic", FACTS[: config.max_facts], sft_per_level=5)
    assert version == agentic_version(read_agentic_tasks(tmp_path / "agentic")) != agentic_version(other)
    meta = json.loads((tmp_path / "agentic" / "meta.json").read_text())
    assert meta["version"] == version and meta["counts"]["heldout/search/level2"] == 6
    assert (
        build_agentic_task_sets(config, read_agentic_facts(tmp_path / "agentic"))["heldout"]
        == sets["heldout"]
    )
    assert [t.id for t in read_agentic_sft_tasks(tmp_path / "agentic")] == [
        t.id for t in sft_tasks(sets["train"], 5)
    ]
    with pytest.raises(ValueError, match="unknown family"):
        build_agentic_task_sets(AgenticTasksConfig(levels={"chess": [1]}), FACTS)
    with pytest.raises(ValueError, match="level"):
        build_agentic_task_sets(AgenticTasksConfig(levels={"search": [4]}), FACTS)
    with pytest.raises(ValueError):
        AgenticTasksConfig(trainn_per_level=3)


def test_search_tool_finds_the_linked_documents(families):
    search = families["search"]
    tasks = search.generate("train", 20, 0, 2) + search.generate("train", 20, 0, 3)
    assert len(tasks) == 40
    for task in tasks:
        first, second = task.meta["linked"][1], task.meta["linked"][0]  # B (from the clue), then A (names B)
        episode = search.open(task)
        clue = task.prompt.split('defined with "')[1].removesuffix('"?')
        hop1 = episode.tool(json.dumps({"name": "search", "arguments": {"query": clue}}))
        assert hop1.startswith(f'"{first}": ')
        hop2 = episode.tool(json.dumps({"name": "search", "arguments": {"query": first}}))
        assert hop2.startswith(f'"{second}": ') and task.answer == second
        # A's document names B; B's does not name itself
        texts = dict(search.docs)
        assert first in texts[second] and first not in texts[first]
        assert episode.finish(f"Answer: {second}").reward == 1.0
        episode.close()
    assert search.open(tasks[0]).finish(f'Answer: "{tasks[0].answer}"').reward == 1.0  # quoted, as taught
    bad = search.open(tasks[0])
    assert bad.tool('{"name": "search", "arguments": {"query": ""}}').startswith("error")
    assert bad.tool('{"name": "browse"}').startswith("error: unknown tool")
    assert bad.tool("not json").startswith("error")


def _tokens_of(tokenizer, text: str, region: tuple[int, int], needle: str) -> list[int] | None:
    """The ids of the tokens that spell the first `needle` inside `region` of `text`; None when its tokens do
    not cover it exactly (a token reaching over its edge, such as " will" for "will")."""
    at = text.index(needle, *region)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    inside = [
        (t, a, b)
        for t, (a, b) in zip(enc.input_ids, enc.offset_mapping, strict=True)
        if at <= a and b <= at + len(needle)
    ]
    return [t for t, _, _ in inside] if "".join(text[a:b] for _, a, b in inside) == needle else None


def test_what_a_search_policy_copies_is_tokenized_alike_where_it_reads_and_where_it_writes(
    families, tokenizer
):
    """A tiny policy learns to copy tokens, not to re-spell a word: the clue (prompt -> first query), the linked
    term (first result -> second query) and the answer (last result -> answer) are the same token ids in both
    places of the rendered worked solution."""
    from training.sft import _render

    search = families["search"]
    checked = 0
    for level in (1, 2, 3):
        for task in search.generate("train", 10, 0, level):
            messages = [{"role": "user", "content": task.prompt}, *search.solution(task)]
            ends = [len(_render(tokenizer, messages[: k + 1])) for k in range(len(messages))]
            region = {k: (ends[k - 1] if k else 0, ends[k]) for k in range(len(messages))}
            text = _render(tokenizer, messages)
            (clue, _), *second = task.meta["steps"]
            copies = [(clue, 0, 1), (task.answer, len(messages) - 2, len(messages) - 1)]
            if second:  # the linked term: read in the first result, written in the second query
                copies.append((second[0][0], 2, 3))
            for needle, read, written in copies:
                source = _tokens_of(tokenizer, text, region[read], needle)
                assert source and source == _tokens_of(tokenizer, text, region[written], needle), (
                    needle,
                    text,
                )
                checked += 1
    assert checked >= 60


def test_terminal_tools_and_limits(families):
    terminal = families["terminal"]
    task = terminal.generate("train", 1, 0, 3)[0]
    episode = terminal.open(task)
    try:
        assert episode.tool('{"name": "ls", "arguments": {}}') == " ".join(sorted(task.meta["files"]))
        assert episode.tool('{"name": "cat", "arguments": {"path": "../etc/passwd"}}').startswith("error")
        assert episode.tool('{"name": "write", "arguments": {"path": "main.py", "content": "x"}}').startswith(
            "error"
        )
        assert episode.tool('{"name": "cat", "arguments": {"path": "zzz.txt"}}') == "error: no file zzz.txt"
    finally:
        episode.close()
    assert not episode.dir.exists()


@needs_sandbox
def test_crashes_raise_environment_crash(families, monkeypatch):
    terminal, codefix, search = families["terminal"], families["codefix"], families["search"]
    task = terminal.generate("train", 1, 0, 1)[0]
    episode = terminal.open(task)
    episode.close()  # the episode's dir is deleted
    with pytest.raises(EnvironmentCrash, match="is gone"):
        episode.tool('{"name": "ls", "arguments": {}}')
    with pytest.raises(EnvironmentCrash, match="is gone"):
        episode.finish("Done.")
    closed = search.open(search.generate("train", 1, 0, 1)[0])
    closed.close()
    with pytest.raises(EnvironmentCrash):
        closed.tool('{"name": "search", "arguments": {"query": "x"}}')

    with monkeypatch.context() as patch:  # no room for a throwaway dir
        patch.setattr("tempfile.mkdtemp", lambda **kw: (_ for _ in ()).throw(OSError(28, "No space left")))
        with pytest.raises(EnvironmentCrash, match="No space left"):
            terminal.open(task)
    with (
        monkeypatch.context() as patch
    ):  # a sandbox run that times out: on our module a crash, on the policy's a 0
        timeout = SandboxResult("timeout", None, "", "", "wall-clock limit 10s", 10.0)
        patch.setattr("training.agentic.codefix.run_python", lambda *a, **kw: timeout)
        episode = codefix.open(codefix.generate("train", 1, 0, 3)[0])
        with pytest.raises(EnvironmentCrash, match="timeout"):
            episode.tool('{"name": "run_tests", "arguments": {}}')
        verdict = episode.finish("```python\nwhile True: pass\n```")
        assert verdict.reward == 0.0 and verdict.reason.startswith("no_test_report: timeout")

    monkeypatch.setattr(infra.sandbox, "sandbox_available", lambda: "unshare is gone")
    task = codefix.generate("train", 1, 0, 3)[0]
    episode = codefix.open(task)
    with pytest.raises(EnvironmentCrash, match="unshare is gone"):
        episode.tool('{"name": "run_tests", "arguments": {}}')
    with pytest.raises(EnvironmentCrash, match="unshare is gone"):
        episode.finish(f"```python\n{task.meta['fixed']}```")
    with pytest.raises(EnvironmentCrash, match="unshare is gone"):
        terminal.verify(terminal.generate("train", 1, 0, 1)[0], "Done.")


def test_extra_latency_is_seeded_with_a_long_tail(families):
    latency = ExtraLatency(mean_s=1.0, sigma=1.5, seed=3)
    rng = latency.rng("t")
    draws = sorted(latency.sample(rng) for _ in range(20000))
    assert 0.85 < sum(draws) / len(draws) < 1.15  # the configured mean, tail included
    assert draws[len(draws) // 2] < 0.5 and draws[-200] > 5.0  # median well below the mean, p99 far above
    first = latency.rng("t")
    second = latency.rng("t")
    assert [latency.sample(first) for _ in range(5)] == [latency.sample(second) for _ in range(5)]
    assert ExtraLatency().sample(latency.rng("t")) == 0.0
    slow = agentic_suites(FACTS, ExtraLatency(mean_s=0.05, sigma=0.0))["search"]
    episode = slow.open(slow.generate("train", 1, 0, 1)[0])
    started = time.perf_counter()
    episode.tool('{"name": "search", "arguments": {"query": "device"}}')
    episode.finish("Answer: x")
    assert 0.1 <= time.perf_counter() - started < 0.5
    assert episode.delay.total_s == pytest.approx(0.1)


def _scripted_generate(tokenizer, tasks, families, calls):
    """A policy that emits each task's worked solution, turn by turn, with made-up log-probs."""
    turns = {
        tuple(_prompt_ids(tokenizer, t)): scripted_turns(tokenizer, families[t.domain].solution(t))
        for t in tasks
    }

    def generate(prompts, params):
        calls.append(len(prompts))
        out = []
        for ids in prompts:
            key = next(k for k in turns if tuple(ids[: len(k)]) == k)
            turn = turns[key][len(calls) - 1]
            out.append(Generation(turn, [-0.25] * len(turn), "stop", policy_version=7))
        return out

    return generate


def _prompt_ids(tokenizer, task):
    from training.rollout.multiturn import prompt_ids

    return prompt_ids(tokenizer, task)


@needs_sandbox
def test_agentic_rollout_with_a_scripted_policy(families, tokenizer):
    tasks = [families[d].generate("heldout", 1, 0, level)[0] for d in AGENTIC_DOMAINS for level in (1, 3)]
    calls: list[int] = []
    generate = _scripted_generate(tokenizer, tasks, families, calls)
    trajs = agentic_rollout(generate, tokenizer, tasks, families, 2, SamplingParams(max_new_tokens=80), max_turns=4,
                            env_threads=4)  # fmt: skip
    assert len(trajs) == 12 and calls[0] == 12
    for traj, task in zip(trajs, [t for t in tasks for _ in range(2)], strict=True):
        solution = families[task.domain].solution(task)
        assert traj.status == "ok" and traj.reward == 1.0 and traj.reason == "correct", (
            task.prompt,
            traj.reason,
        )
        assert [m["role"] for m in traj.messages[1:]] == [m["role"] for m in solution]
        assert [m["content"] for m in traj.messages if m["role"] == "tool"] == [
            m["content"] for m in solution if m["role"] == "tool"
        ]
        # loss mask: 1 on exactly the policy's tokens, 0 on every observation token
        policy = sum(len(t) for t in scripted_turns(tokenizer, solution))
        assert sum(traj.loss_mask) == policy and len(traj.loss_mask) == len(traj.response_ids)
        masked = tokenizer.decode(
            [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if not m]
        )
        for m in solution:
            if m["role"] == "tool":
                assert f"<tool_response>{m['content']}</tool_response>" in masked
        assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if not m)
        assert traj.policy_versions == [7] * sum(m["role"] == "assistant" for m in solution)
        # the token stream decodes to the chat template's rendering of the same conversation
        rendered = tokenizer.apply_chat_template([traj.messages[0], *solution], tokenize=False)
        assert tokenizer.decode(traj.token_ids) == rendered.rstrip("\n")
        assert traj.timings["verify_s"] > 0
    assert response_text(trajs[0]).split("\n")[-1].startswith("Done.")


def test_agentic_rollout_records_environment_failures(families, tokenizer):
    task = families["search"].generate("train", 1, 0, 2)[0]
    closed: list[str] = []

    class FlakyEpisode:
        def __init__(self, fail_on: str):
            self.fail_on = fail_on

        def tool(self, payload):
            if self.fail_on == "tool":
                raise EnvironmentCrash("task service died")
            return "ok"

        def finish(self, response):
            raise EnvironmentCrash("sandbox would not start")

        def close(self):
            closed.append(self.fail_on)

    class FlakyEnvironment:
        domain, version = "search", "flaky"

        def __init__(self):
            self.opened = 0

        def open(self, task):
            self.opened += 1
            if self.opened == 1:
                raise EnvironmentCrash("no free sandbox")
            return FlakyEpisode("tool" if self.opened == 2 else "finish")

    calls: list[int] = []
    generate = _scripted_generate(tokenizer, [task], families, calls)
    trajs = agentic_rollout(generate, tokenizer, [task], {"search": FlakyEnvironment()}, 3,
                            SamplingParams(max_new_tokens=80), max_turns=3)  # fmt: skip
    assert [t.status for t in trajs] == ["env_failure"] * 3
    assert ["no free sandbox" in trajs[0].reason, "task service died" in trajs[1].reason] == [True, True]
    assert "sandbox would not start" in trajs[2].reason and trajs[2].reward == 0.0
    assert sorted(closed) == ["finish", "tool"]  # every opened episode is closed


def test_rl_only_levels_give_sft_a_foothold_and_leave_the_rest_of_train_to_rl(tmp_path):
    config = AgenticTasksConfig(
        levels={"terminal": [1, 3], "codefix": [3]}, train_per_level=40, heldout_per_level=2,
        sft_per_level=20, rl_only_levels={"terminal": [3]}, rl_level_rows=3,
    )  # fmt: skip
    sets = build_agentic_task_sets(config, FACTS)
    write_agentic_tasks(sets, tmp_path, FACTS, config.sft_rows)
    sft = Counter((t.domain, t.difficulty) for t in read_agentic_sft_tasks(tmp_path))
    assert sft == {("terminal", 1): 20, ("terminal", 3): 3, ("codefix", 3): 20}
    assert rl_task_shortfalls(json.loads((tmp_path / "meta.json").read_text())["counts"], config) == []
    # the shortfall check counts a foothold level's fresh tasks against its own SFT share: 60 facts make 48
    # search tasks per level, so SFT's 50 leave level 1 none, and a foothold of 5 leaves level 2 most of them
    search = AgenticTasksConfig(
        levels={"search": [1, 2]}, train_per_level=80, heldout_per_level=2, sft_per_level=50,
        rl_only_levels={"search": [2]}, rl_level_rows=5,
    )  # fmt: skip
    write_agentic_tasks(build_agentic_task_sets(search, FACTS), tmp_path / "s", FACTS, search.sft_rows)
    short = rl_task_shortfalls(json.loads((tmp_path / "s" / "meta.json").read_text())["counts"], search)
    assert len(short) == 1 and "search level 1" in short[0] and "sft_per_level=50" in short[0]
    for bad in ({"codefix": [4]}, {"shell": [1]}):
        with pytest.raises(ValueError, match=r"rl_only_levels: .* is not a family's levels"):
            build_agentic_task_sets(config.model_copy(update={"rl_only_levels": bad}), FACTS)


def test_sft_rows_include_agentic_trajectories_with_masked_observations(tokenizer):
    """The wiring of sft_data_set: reasoning train tasks + the agentic SFT share, reasoning suites | agentic."""
    config = AgenticTasksConfig(train_per_level=4, heldout_per_level=2, sft_per_level=2)
    agentic = build_agentic_task_sets(config, FACTS)
    chosen = sft_tasks(agentic["train"], config.sft_per_level)
    assert len(chosen) == 18 and {(t.domain, t.difficulty) for t in chosen} == {
        (d, lvl) for d in AGENTIC_DOMAINS for lvl in (1, 2, 3)
    }
    reasoning = ToolSuite().generate("train", 3, 0, 1)
    registry = {"tool": ToolSuite()} | agentic_suites(FACTS)
    rows, kinds = build_sft_trajectories(
        reasoning + chosen, registry, [], SftDataConfig(definition_chats=0, error_share=0.0)
    )
    assert kinds == {"tool": 3, "terminal": 6, "codefix": 6, "search": 6}
    rows = [r for r in rows if r["kind"] != "tool"]
    for row in rows:
        chat = render_chat(tokenizer, row["messages"])
        trained = tokenizer.decode([t for t, m in zip(chat.input_ids, chat.loss_mask, strict=True) if m])
        assert "<tool_call>" in trained and "<tool_response>" not in trained
        untrained = tokenizer.decode(
            [t for t, m in zip(chat.input_ids, chat.loss_mask, strict=True) if not m]
        )
        for m in row["messages"]:
            if m["role"] == "tool":
                assert f"<tool_response>{m['content']}</tool_response>" in untrained


def test_task_sets_are_the_same_in_every_process(tmp_path):
    """A task service in another process (another PYTHONHASHSEED) rebuilds the same tasks, search results
    included."""
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(FACTS))
    script = (
        "import json, sys\n"
        "from training.agentic.families import AgenticTasksConfig, build_agentic_task_sets\n"
        "facts = [tuple(f) for f in json.load(open(sys.argv[1]))]\n"
        "sets = build_agentic_task_sets(AgenticTasksConfig(train_per_level=5, heldout_per_level=3), facts)\n"
        "print(json.dumps({s: [t.to_json() for t in ts] for s, ts in sets.items()}, sort_keys=True))\n"
    )
    versions = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", script, str(facts)], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
        versions.add(out.stdout.strip())
    sets = build_agentic_task_sets(AgenticTasksConfig(train_per_level=5, heldout_per_level=3), FACTS)
    here = {s: [t.to_json() for t in ts] for s, ts in sets.items()}
    assert len(versions) == 1 and json.loads(versions.pop()) == json.loads(json.dumps(here))


def test_search_unwritten_tasks_drop_every_task_that_writes_what_sft_wrote(tmp_path):
    """`agentic_rl.search_unwritten_only`'s rule on the real task sets: the search tasks left to RL write (query
    or answer) nothing an SFT worked solution wrote; the others are exactly those that share such a string."""
    from training.agentic.search import unwritten_tasks, written_strings
    from training.tasks.base import normalise_text

    config = AgenticTasksConfig(
        levels={"search": [1, 2], "terminal": [1]}, train_per_level=40, heldout_per_level=2, sft_per_level=12
    )
    write_agentic_tasks(build_agentic_task_sets(config, FACTS), tmp_path, FACTS, config.sft_rows)
    sft = read_agentic_sft_tasks(tmp_path)
    rl = [t for t in read_agentic_tasks(tmp_path)["train"] if t.id not in {s.id for s in sft}]
    written = set().union(*(written_strings(t) for t in sft if t.domain == "search"))
    kept = unwritten_tasks(rl, sft)
    dropped = [t for t in rl if t not in kept]
    search_rl = [t for t in rl if t.domain == "search"]
    assert search_rl and dropped and len(dropped) < len(search_rl)  # the rule bites, and leaves some
    assert all(not written_strings(t) & written for t in kept if t.domain == "search")
    assert all(written_strings(t) & written and t.domain == "search" for t in dropped)
    assert [t for t in kept if t.domain == "terminal"] == [t for t in rl if t.domain == "terminal"]
    level1 = next(t for t in sft if t.domain == "search" and t.difficulty == 1)
    assert written_strings(level1) == {
        normalise_text(level1.meta["steps"][0][0]),
        normalise_text(level1.answer),
    }
    assert unwritten_tasks(rl, []) == rl


def test_a_wrong_search_answer_says_whether_a_search_had_returned_the_answer(families):
    """`wrong_answer_found` (the policy read the answer and wrote another: a copying failure) against
    `wrong_answer` (no search it made returned the answer), through a real episode's tool calls."""
    search = families["search"]
    task = search.generate("train", 1, 0, 1)[0]
    clue = task.meta["steps"][0][0]
    call = f'<tool_call>{{"name": "search", "arguments": {{"query": "{clue}"}}}}</tool_call>'
    assert f'"{task.answer}"' in search.search_text(clue)
    assert search.verify(task, f"{call}\nAnswer: kalomi").reason == "wrong_answer_found"
    assert search.verify(task, f"{call}\nAnswer: {task.answer}").reward == 1.0
    assert search.verify(task, "Answer: kalomi").reason == "wrong_answer"
    unrelated = next(
        t for t in search.generate("train", 20, 1, 1) if t.answer not in search.search_text(clue)
    )
    other = f'<tool_call>{{"name": "search", "arguments": {{"query": "{unrelated.meta["steps"][0][0]}"}}}}</tool_call>'
    assert search.verify(task, f"{other}\nAnswer: kalomi").reason == "wrong_answer"


def test_found_credit_ranks_a_failed_search_that_returned_the_answer_above_one_that_did_not(families):
    """`Verdict.found` through a real episode's tool calls, and the trained reward it gives with
    `found_credit` (0 by default: success alone)."""
    from training.agentic.buffer import trained_reward
    from training.rollout.trajectory import Trajectory

    search = families["search"]
    task = search.generate("train", 1, 0, 1)[0]
    call = (
        f'<tool_call>{{"name": "search", "arguments": {{"query": "{task.meta["steps"][0][0]}"}}}}</tool_call>'
    )
    verdicts = {
        "right": search.verify(task, f"{call}\nAnswer: {task.answer}"),
        "found_wrong": search.verify(task, f"{call}\nAnswer: kalomi"),
        "found_silent": search.verify(task, call),
        "blind": search.verify(task, "Answer: kalomi"),
    }
    assert {k: (v.reward, v.found) for k, v in verdicts.items()} == {
        "right": (1.0, 1.0), "found_wrong": (0.0, 1.0), "found_silent": (0.0, 1.0), "blind": (0.0, 0.0),
    }  # fmt: skip

    def reward(verdict, credit: float) -> float:
        traj = Trajectory("t", "search", task.id, "g", [], [1], [2], [-0.1], [1], [1], verdict.reward)
        traj.reward_components = verdict.components()
        return trained_reward(traj, 0.0, credit)

    assert [reward(v, 0.3) for v in verdicts.values()] == [1.0, 0.3, 0.3, 0.0]
    assert [reward(v, 0.0) for v in verdicts.values()] == [1.0, 0.0, 0.0, 0.0]


def test_credits_that_would_pay_a_failure_as_much_as_a_success_are_rejected():
    from pydantic import ValidationError

    from training.agentic.async_loop import AgenticRLConfig

    assert AgenticRLConfig(partial_credit=0.4, found_credit=0.5).found_credit == 0.5
    with pytest.raises(ValidationError, match=r"partial_credit \(0.5\) \+ found_credit \(0.5\) must be < 1"):
        AgenticRLConfig(partial_credit=0.5, found_credit=0.5)


def test_more_search_heldout_tasks_continue_its_heldout_stream_and_take_nothing_from_train():
    base = AgenticTasksConfig(train_per_level=12, heldout_per_level=4, heldout_for={})
    more = base.model_copy(update={"heldout_for": {"search": 8}})
    a, b = build_agentic_task_sets(base, FACTS), build_agentic_task_sets(more, FACTS)
    assert [t.to_json() for t in a["train"]] == [t.to_json() for t in b["train"]]
    for domain in AGENTIC_DOMAINS:
        for level in (1, 2, 3):
            old, new = (
                [t.prompt for t in s["heldout"] if (t.domain, t.difficulty) == (domain, level)]
                for s in (a, b)
            )
            assert new[: len(old)] == old and len(old) == 4
            assert len(new) == (8 if domain == "search" else 4), (domain, level, len(new))
    with pytest.raises(ValueError, match=r"agentic_tasks.heldout_for: chess: 3 must name a family"):
        build_agentic_task_sets(base.model_copy(update={"heldout_for": {"chess": 3}}), FACTS)
