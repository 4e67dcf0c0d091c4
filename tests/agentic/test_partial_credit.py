"""Partial credit (`Verdict.partial`, `AgenticRLConfig.partial_credit`): each real family grades a failed attempt
by how close it came, success stays the verifier's 0 / 1, and the trainer's reward ranks near misses inside a
group that failed every time."""

from __future__ import annotations

import json

import pytest
from facts import synthetic_facts  # noqa: E402  (pytest puts this directory on sys.path)

from infra.sandbox import sandbox_available
from training.agentic.buffer import TrajectoryBuffer, trained_reward
from training.agentic.codefix import CodefixSuite
from training.agentic.search import SearchSuite
from training.agentic.terminal import TerminalSuite
from training.rollout.trajectory import Trajectory

needs_sandbox = pytest.mark.skipif(sandbox_available() is not None, reason=str(sandbox_available()))


def _write(suite: TerminalSuite, task, content: str | None):
    episode = suite.open(task)
    try:
        path = next(a["path"] for name, a, _ in task.meta["steps"] if name == "write")
        if content is not None:
            episode.tool(json.dumps({"name": "write", "arguments": {"path": path, "content": content}}))
        return episode.finish("")
    finally:
        episode.close()


@needs_sandbox
@pytest.mark.parametrize("level", [1, 2, 3])
def test_terminal_credits_a_near_miss_more_than_a_wrong_text_and_success_is_still_binary(level):
    suite = TerminalSuite()
    task = suite.generate("train", 1, 0, level)[0]
    want = next(a["content"] for name, a, _ in task.meta["steps"] if name == "write")
    slip = want[:-1] + ("0" if want[-1] != "0" else "1")  # the last character wrong, as the policy slips
    right, near, far, missing = (_write(suite, task, c) for c in (want, slip, "zzzzzzzz", None))
    assert (right.reward, near.reward, far.reward, missing.reward) == (1.0, 0.0, 0.0, 0.0)
    assert 1.0 > near.partial >= 1 - 2 / len(want) - 1e-9 and far.partial < near.partial / 2
    assert missing.partial == 0.0


@needs_sandbox
def test_codefix_credits_fixed_cases_only_while_the_passing_tests_still_pass():
    suite = CodefixSuite()
    task = suite.generate("train", 1, 0, 1)[0]
    f2p = task.meta["tests"]["fail_to_pass"]
    fn, args, want = f2p[0]
    # the task's module with only the first failing case patched: 1 of len(f2p) fixed, nothing else broken
    one_fixed = task.meta["module"] + (
        f"\n_buggy = {fn}\n\ndef {fn}(*a):\n    return {want!r} if list(a) == {args!r} else _buggy(*a)\n"
    )
    broken = one_fixed + "\n" + "\n".join(f"{f} = None" for f, _, _ in task.meta["tests"]["pass_to_pass"])

    def finish(module: str):
        episode = suite.open(task)
        try:
            return episode.finish(f"```python\n{module}\n```")
        finally:
            episode.close()

    untouched, partly, partly_broken, fixed = map(
        finish, (task.meta["module"], one_fixed, broken, task.meta["fixed"])
    )
    assert (untouched.reward, partly.reward, partly_broken.reward, fixed.reward) == (0.0, 0.0, 0.0, 1.0)
    assert untouched.partial == 0.0 and partly_broken.partial == 0.0
    assert partly.partial == pytest.approx(1 / len(f2p))


def test_search_credits_an_answer_one_slip_from_the_term():
    suite = SearchSuite(synthetic_facts())
    task = suite.generate("train", 1, 0, 1)[0]
    episode = suite.open(task)
    try:
        right = episode.finish(f'Answer: "{task.answer}"')
        near = episode.finish(f'Answer: "{task.answer[:-1]}"')
        far = episode.finish('Answer: "qqqqqqqq"')
    finally:
        episode.close()
    assert (right.reward, near.reward, far.reward) == (1.0, 0.0, 0.0)
    assert near.partial > 0.8 > 0.2 > far.partial


def _traj(tid: str, reward: float, partial: float) -> Trajectory:
    t = Trajectory(tid, "terminal", "p", "g", [], [1, 2], [3], [-0.5], [1], [5], reward)
    t.reward_components = {"verifier": reward, "partial": partial}
    return t


def test_the_trained_reward_ranks_near_misses_and_keeps_an_all_failed_group_for_training():
    group = [_traj("a", 0.0, 0.9), _traj("b", 0.0, 0.2), _traj("c", 0.0, 0.2), _traj("d", 0.0, 0.0)]
    assert [trained_reward(t, 0.5) for t in group] == [0.45, 0.1, 0.1, 0.0]
    assert [trained_reward(t, 0.0) for t in group] == [0.0] * 4
    assert trained_reward(_traj("s", 1.0, 0.0), 0.5) == 1.0 > trained_reward(_traj("n", 0.0, 1.0), 0.5)
    for credit, trained in ((0.5, [4]), (0.0, [])):  # without credit the group is uniform and dropped
        buf = TrajectoryBuffer(group_size=4, max_staleness=1, drop_uniform=True, partial_credit=credit)
        for t in group:
            buf.add(t)
        assert [len(g) for g in buf.take(min_trajectories=1, version=5)] == trained
