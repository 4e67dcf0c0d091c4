"""The local judge's thread share: every CPU under `crucible run`, else an equal share among the judge runs
Dagster's queue allows at once, which is the number dagster.yaml sets."""

from __future__ import annotations

import os

import yaml

from classifiers.judge.judge_config import JudgeConfig, local_threads_of
from infra.cpu import JUDGE_RUNS_AT_ONCE, SOLE_RUN_ENV, cpus, judge_threads, sole_run
from infra.settings import REPO_ROOT


def test_a_sole_run_gives_the_judge_every_cpu_and_puts_the_environment_back(monkeypatch):
    monkeypatch.delenv(SOLE_RUN_ENV, raising=False)
    shared = max(1, cpus() // JUDGE_RUNS_AT_ONCE)
    assert judge_threads() == shared and local_threads_of(JudgeConfig()) == shared  # "auto", the default
    with sole_run():
        assert judge_threads() == cpus() == local_threads_of(JudgeConfig())
        assert local_threads_of(JudgeConfig(local_threads=1)) == 1  # an explicit count stays
        assert local_threads_of(JudgeConfig(local_threads=None)) is None
    assert SOLE_RUN_ENV not in os.environ and judge_threads() == shared
    monkeypatch.setenv(SOLE_RUN_ENV, "0")
    with sole_run():
        assert judge_threads() == cpus()
    assert os.environ[SOLE_RUN_ENV] == "0"


def test_the_judge_share_matches_the_run_queue_limit_in_dagster_yaml():
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    (llm,) = [x for x in limits if x["key"] == "crucible/resource" and x["value"] == "llm"]
    assert llm["limit"] == JUDGE_RUNS_AT_ONCE
