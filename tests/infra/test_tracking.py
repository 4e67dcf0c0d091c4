from __future__ import annotations

import pytest

from infra.settings import load_profile
from infra.tracking import UPSTREAM_RUNS_TAG, Tracker, redact


def test_redact_hides_secrets_and_url_credentials():
    flat = redact(
        {
            "api_key": "sk-123",
            "nested": {"password": "hunter2", "n": 3},
            "endpoint": "https://user:pw@host/x",
            "seeds": ["a", "b"],
            "token_budget": None,
        }
    )
    assert flat["api_key"] == "***" and flat["nested.password"] == "***"
    assert flat["nested.n"] == "3" and flat["seeds"] == '["a", "b"]'
    assert flat["endpoint"] == "https://***@host/x"
    assert "hunter2" not in str(flat) and "sk-123" not in str(flat)


def test_stage_runs_and_lineage(tmp_path):
    tracker = Tracker.from_profile(load_profile())
    assert tracker.tracking_uri.startswith("sqlite:///") and str(tmp_path) in tracker.tracking_uri
    with tracker.stage_run(
        "web",
        "crawl[s1]",
        {"dagster.asset_key": "web_warc", "dagster.partition_key": "s1"},
        params={"max_pages": 5, "secret_key": "zzz"},
    ) as up:
        up.log_metrics({"pages": 5})
    with tracker.stage_run(
        "web",
        "extract[s1]",
        {"dagster.asset_key": "web_documents", "dagster.partition_key": "s1", UPSTREAM_RUNS_TAG: up.run_id},
    ) as down:
        down.log_text("# report", "report.md")
    run = tracker.get_run(up.run_id)
    assert run.info.status == "FINISHED" and run.data.metrics["pages"] == 5
    assert run.data.params == {"max_pages": "5", "secret_key": "***"}
    tree = tracker.lineage(down.run_id)
    assert tree["asset"] == "web_documents" and tree["upstream"][0]["run_id"] == up.run_id
    assert tree["upstream"][0]["partition"] == "s1"

    down.log_text("weights", "model/weights.txt")
    tracker.register_model("crucible-test", down.run_id, "model", {"crucible.data_version": "abc"})
    assert tracker.model_version_run_id("crucible-test", "1") == down.run_id
    with pytest.raises(LookupError, match=r"no registered model version crucible-test/2; .*crucible-test"):
        tracker.model_version_run_id("crucible-test", "2")
    with pytest.raises(LookupError, match="no MLflow run 'nope'"):
        tracker.run_lineage("nope")


def test_metric_names_are_made_legal():
    tracker = Tracker.from_profile(load_profile())
    with tracker.stage_run("code", "crawl", {}) as run:
        run.log_metrics({"language_files/C++": 3, "language_files/C#": 2, "files/kept": 5})
    metrics = tracker.get_run(run.run_id).data.metrics
    assert metrics == {"language_files/Cpp": 3, "language_files/Csharp": 2, "files/kept": 5}


def test_failed_stage_marks_run_failed():
    tracker = Tracker.from_profile(load_profile())
    with pytest.raises(ValueError):
        with tracker.stage_run("web", "boom", {}) as run:
            raise ValueError("stage failed")
    assert tracker.get_run(run.run_id).info.status == "FAILED"
