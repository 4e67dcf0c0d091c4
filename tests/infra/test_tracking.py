from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from infra.settings import load_profile
from infra.tracking import (
    HOST_TAG,
    PID_TAG,
    UPSTREAM_RUNS_TAG,
    Tracker,
    process_gone,
    process_tags,
    redact,
)


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


def test_redact_matches_secret_words_not_substrings():
    """`max_new_tokens` was shown as *** in every RL run's params: only whole words of a key are secret."""
    secret = ["hf_token", "aws_secret_access_key", "store.s3.SECRET_KEY", "apiKey", "auth", "db.credentials",
              "ssh-private-key"]  # fmt: skip
    plain = ["max_new_tokens", "tokenizer", "author", "authority", "n_tokens_per_step", "keyword"]
    flat = redact({k: "v" for k in secret + plain})
    assert [k for k in secret if flat[k] != "***"] == []
    assert [k for k in plain if flat[k] != "v"] == []


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


def test_a_test_holds_no_open_file_on_its_mlflow_database_once_its_runs_end(tmp_path):
    """MLflow keeps one engine per database URI for the life of the process; with a pooled engine every test's
    database stayed open in the worker (two descriptors a test) until the suite hit the open-file limit.
    conftest.py sets NullPool: nothing stays open once the runs have ended."""
    tracker = Tracker.from_profile(load_profile())
    db = tracker.tracking_uri.removeprefix("sqlite:///")
    with tracker.stage_run("web", "crawl[s1]", {"dagster.asset_key": "web_warc"}) as run:
        run.log_metrics({"pages": 5})
    assert tracker.get_run(run.run_id).data.metrics["pages"] == 5

    def open_on(path: str) -> int:
        fds = os.listdir("/proc/self/fd")
        return sum(1 for fd in fds if _readlink(f"/proc/self/fd/{fd}").startswith(path))

    assert os.path.exists(db) and open_on(db) == 0


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed between listdir and readlink
        return ""


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


def test_free_text_metric_keys_are_not_logged_but_named_once():
    tracker = Tracker.from_profile(load_profile())
    free_text = "fetch_error/ConnectionError: [Errno 111] Connection refused by 127.0.0.1:8080 " * 3
    with tracker.stage_run("web", "crawl", {}) as run:
        run.log_metrics(
            {"pages/kept": 4, free_text: 1, "x" * 65: 2, "language_files/Emacs Lisp": 3, "ex/web:0": 5}
        )
        run.log_metrics({free_text: 1})
    data = tracker.get_run(run.run_id).data
    # on 98a639e both free-text keys were logged (the first as 'fetch_error/ConnectionError: _Errno 111_ ...')
    assert data.metrics == {"pages/kept": 4, "language_files/Emacs_Lisp": 3, "ex/web/0": 5}
    assert json.loads(data.tags["crucible.rejected_metric_keys"]) == [free_text, "x" * 65]


def test_run_links_only_when_the_ui_answers(port):
    closed = Tracker(Tracker.from_profile(load_profile()).tracking_uri, ui_url=f"http://127.0.0.1:{port}")
    with closed.stage_run("web", "crawl", {}) as run:
        pass
    assert run.url is None  # on 98a639e a link to a UI that was not running

    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)  # answers 501: something is there
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        live = Tracker(closed.tracking_uri, ui_url=f"http://127.0.0.1:{server.server_address[1]}")
        with live.stage_run("web", "crawl", {}) as run:
            pass
        assert run.url.endswith(f"/runs/{run.run_id}?workflowType=machine_learning")
    finally:
        server.shutdown()
    # an explicit tracking server is its own UI: no probe (nothing listens on this port either)
    server_tracker = Tracker(f"http://127.0.0.1:{port}")
    assert server_tracker.run_url("1", "abc") == (
        f"http://127.0.0.1:{port}/#/experiments/1/runs/abc?workflowType=machine_learning"
    )


def test_stale_running_runs_of_a_dead_process_are_marked_failed():
    tracker = Tracker.from_profile(load_profile())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tags = {"dagster.asset_key": "web_deduped", "dagster.partition_key": "s1", "dagster.run_id": "r0"}
        exp = tracker.experiment_id("dedup")
        runs = {}
        for name, pid, part in [
            ("dead", dead.pid, "s1"),
            ("alive", alive.pid, "s1"),
            ("other", dead.pid, "s2"),
        ]:
            run_tags = {**tags, **process_tags(), PID_TAG: str(pid), "dagster.partition_key": part}
            runs[name] = tracker.client.create_run(exp, tags=run_tags).info.run_id
        failed = tracker.fail_stale_runs(
            "dedup", "web_deduped", "s1", lambda r: "gone" if process_gone(r.data.tags) else None
        )
        assert failed == [runs["dead"]]
        assert tracker.get_run(runs["dead"]).data.tags["crucible.failed_reason"] == "gone"
        status = {name: tracker.get_run(run_id).info.status for name, run_id in runs.items()}
        assert status == {"dead": "FAILED", "alive": "RUNNING", "other": "RUNNING"}
        assert not process_gone({HOST_TAG: "elsewhere", PID_TAG: str(dead.pid)})  # another host: cannot tell
    finally:
        alive.kill()
        alive.wait()
