"""The Agentic RL job's sampled held-out metrics: what `sampled_success` averages and what it leaves out."""

import math

import pytest

from training.agentic.job import sampled_success
from training.tasks.base import Task


def _task(i: int, domain: str) -> Task:
    return Task(id=f"{domain}-{i}", domain=domain, prompt=f"p{i}", answer="", difficulty=1, split="heldout")


def test_sampled_success_averages_the_rates_of_tasks_that_have_one():
    tasks = [_task(i, "codefix") for i in range(3)] + [_task(i, "terminal") for i in range(2)]
    # codefix-2 has no rate: every rollout of it was an environment failure, which says nothing of the policy
    rates = {"codefix-0": 1.0, "codefix-1": 0.5, "terminal-0": 0.0, "terminal-1": 0.5}
    out = sampled_success(rates, tasks)
    assert out["sampled_success/codefix"] == pytest.approx(0.75)
    assert out["sampled_success_se/codefix"] == pytest.approx(math.sqrt(0.125 / 2))  # sample var 0.125, n 2
    assert out["sampled_success/terminal"] == pytest.approx(0.25)
    assert set(out) == {f"sampled_success{s}/{d}" for s in ("", "_se") for d in ("codefix", "terminal")}
    assert sampled_success({}, tasks) == {}  # eval_samples 0: nothing measured, nothing reported


def test_success_by_level_splits_each_family_by_its_tasks_levels_and_leaves_out_env_failures():
    from training.agentic.async_loop import success_by_level
    from training.rollout.trajectory import Trajectory

    tasks = [Task(f"codefix-{i}", "codefix", f"p{i}", "", 1 + i % 2, "heldout") for i in range(4)]
    outcome = {"codefix-0": 1.0, "codefix-1": 0.0, "codefix-2": 0.0, "codefix-3": 1.0}
    trajs = [Trajectory(f"t{k}", "codefix", k, k, [], [], reward=r) for k, r in outcome.items()]
    trajs.append(Trajectory("t-crash", "codefix", "codefix-1", "g", [], [], status="env_failure"))
    assert success_by_level(trajs, tasks) == {"success/codefix/level1": 0.5, "success/codefix/level2": 0.5}
    trajs[1].reward = 1.0  # codefix-1 is level 2
    assert success_by_level(trajs, tasks)["success/codefix/level2"] == 1.0


def test_the_agentic_report_lists_each_family_once_beside_its_per_level_scores():
    from assets.agentic import held_out_families
    from training.agentic.async_loop import success_by_level, success_of
    from training.rollout.trajectory import Trajectory

    tasks = [
        Task(f"{d}-{i}", d, f"p{i}", "", 1 + i % 2, "heldout")
        for d in ("codefix", "search")
        for i in range(2)
    ]
    trajs = [Trajectory(f"t-{t.id}", t.domain, t.id, t.id, [], [], reward=1.0) for t in tasks]
    metrics = {f"heldout/{k}": v for k, v in (success_of(trajs) | success_by_level(trajs, tasks)).items()}
    assert "heldout/success/codefix/level2" in metrics
    assert held_out_families(metrics) == ["codefix", "search"]


def test_held_out_failures_are_counted_by_kind_and_reported_parent_to_trained():
    from assets.agentic import failure_changes
    from training.agentic.async_loop import failure_kind, success_of
    from training.rollout.trajectory import Trajectory

    assert failure_kind("tests_failed: out.txt holds 'nope'") == "tests_failed"
    assert failure_kind("fail_to_pass 0/3, pass_to_pass 3/3; g(1) == 2 got 1") == "fail_to_pass"
    assert failure_kind("wrong_answer_found") == "wrong_answer_found" and failure_kind("") == "unknown"
    reasons = ["correct", "wrong_answer_found", "wrong_answer_found", "no_answer", "tests_failed: x"]
    trajs = [
        Trajectory(f"t{i}", "search", f"s{i}", f"s{i}", [], [], reward=float(r == "correct"), reason=r)
        for i, r in enumerate(reasons)
    ]
    trajs.append(Trajectory("crash", "search", "s9", "s9", [], [], status="env_failure", reason="env: boom"))
    out = success_of(trajs)
    failures = {k: v for k, v in out.items() if k.startswith("failures/")}
    assert failures == {
        "failures/search/wrong_answer_found": 2.0,
        "failures/search/no_answer": 1.0,
        "failures/search/tests_failed": 1.0,
    }  # the success and the environment failure are not failures of the policy
    metrics = {f"parent/{k}": v for k, v in failures.items()} | {"heldout/failures/search/no_answer": 3.0}
    assert (
        failure_changes(metrics, "search")
        == "no_answer 1 -> 3, tests_failed 1 -> 0, wrong_answer_found 2 -> 0"
    )
