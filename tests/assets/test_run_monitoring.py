"""The instance configs and the jobs agree: every `crucible/resource` a job sets is limited by the run queue
(local and production), no limit names a resource no job can set (local keeps `spark` for a profile that
dedups with Spark), and a dead run is failed, not resumed, with
its pool slots freed (the behaviour itself: tests/faults/test_killed_run.py)."""

import shutil

import pytest
import yaml
from dagster._core.instance.config import dagster_instance_config

from infra.settings import REPO_ROOT, load_profile

LOCAL, DEPLOY = REPO_ROOT / "dagster.yaml", REPO_ROOT / "infra" / "deploy" / "dagster.yaml"


def _config(path, tmp_path, monkeypatch) -> dict:
    for var in ("DAGSTER_PG_HOST", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD"):
        monkeypatch.setenv(var, "x")
    shutil.copy(path, tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))  # Dagster's own schema check
    return config


def _limited(config: dict) -> set[str]:
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    return {t["value"] for t in limits if t["key"] == "crucible/resource"}


@pytest.mark.parametrize(("path", "profiles"), [(LOCAL, ("tiny", "micro")), (DEPLOY, ("cluster",))])
def test_every_job_resource_tag_is_limited_and_every_limit_is_used(path, profiles, tmp_path, monkeypatch):
    from assets.definitions import job_resources

    config = _config(path, tmp_path, monkeypatch)
    used = {r for name in profiles for r in job_resources(load_profile(name)).values()}
    settable = {
        r for name in ("tiny", "micro", "cluster") for r in job_resources(load_profile(name)).values()
    }
    # on 98a639e `cpu` (three jobs) had no limit and no job ever set `spark`
    assert used <= _limited(config) <= settable == {"cpu", "spark", "llm", "gpu"}


def test_the_loaded_jobs_carry_the_profile_tags():
    from assets.definitions import JOBS, PROFILE, job_resources

    assert {job.name: job.tags["crucible/resource"] for job in JOBS} == job_resources(PROFILE)
    assert job_resources(load_profile("cluster"))["web_corpus"] == "spark"
    assert job_resources(load_profile("tiny"))["web_corpus"] == "cpu"


@pytest.mark.parametrize("path", [LOCAL, DEPLOY])
def test_dead_runs_fail_and_free_their_slots(path, tmp_path, monkeypatch):
    monitoring = _config(path, tmp_path, monkeypatch)["run_monitoring"]
    assert monitoring["enabled"] is True
    assert monitoring["max_resume_run_attempts"] == 0  # a resumed dedup step would run twice
    assert 0 < monitoring["free_slots_after_run_end_seconds"] <= 60
    assert yaml.safe_load(path.read_text())["concurrency"]["pools"]["default_limit"] == 1
