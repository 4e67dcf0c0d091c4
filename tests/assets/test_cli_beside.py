"""`crucible run` with code_corpus running beside the web jobs: when a job in the parent fails, the parent
still waits for the child, folds its runs and summary into its own report, and exits 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.settings import REPO_ROOT

BIN = Path(sys.executable).parent


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_failed_job_waits_for_the_job_beside_it_and_reports_both(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_JUDGE_")}
    # no judge URL: the micro math filter (knowledge job) fails at once; code_corpus runs beside it
    env.update(CRUCIBLE_STATE_DIR=str(tmp_path / "state"), DAGSTER_HOME=str(tmp_path / "state" / "dagster"))
    run = subprocess.run(
        [str(BIN / "crucible"), "run", "--only", "web_corpus", "code_corpus", "knowledge"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 1, out[-3000:] + run.stderr[-3000:]
    assert "crucible: == code_corpus started beside web_corpus, knowledge" in out
    assert "crucible: knowledge FAILED" in run.stderr
    assert out.index("crucible: waiting for code_corpus") < out.index("crucible: code_corpus done in")
    assert "  code_quality[code-0001]: mlflow_run=" in out  # the child's summary, printed by the parent
    report = out[out.index("### Run report") :]
    assert "in 3 job run(s)" in report and "| code_corpus | code_quality |" in report
    assert "| knowledge | math_filtered |" in report and "FAILED" in report
    assert list((tmp_path / "state" / "reports").glob("code_corpus-*.log"))


def test_an_unknown_job_name_is_a_usage_error_that_lists_the_jobs_and_runs_nothing(tmp_path):
    env = {
        **os.environ,
        "CRUCIBLE_STATE_DIR": str(tmp_path / "state"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    run = subprocess.run(
        [str(BIN / "crucible"), "run", "--only", "web_corpus", "post_traning"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 64, run.stdout[-2000:] + run.stderr[-2000:]
    assert "--only post_traning: no such job" in run.stderr and "post_training" in run.stderr
    assert "web_corpus" in run.stderr.split("the jobs are")[1]
    assert not (tmp_path / "state" / "reports").exists() and "Run report" not in run.stdout


def test_an_unknown_profile_is_a_config_error_naming_the_profiles_without_a_traceback(tmp_path):
    env = {**os.environ, "CRUCIBLE_PROFILE": "tiny2", "CRUCIBLE_STATE_DIR": str(tmp_path / "state")}
    run = subprocess.run(
        [str(BIN / "crucible"), "run"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 78, run.stdout[-2000:] + run.stderr[-2000:]
    assert "crucible run: unknown profile 'tiny2' (CRUCIBLE_PROFILE); choose one of" in run.stderr
    assert "'tiny'" in run.stderr and "Traceback" not in run.stderr and not (tmp_path / "state").exists()
