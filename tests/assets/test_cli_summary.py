"""`crucible run` ends with the failed asset checks, where nobody can miss them."""

from __future__ import annotations

import json
import time

import dagster as dg
import pytest

from assets.cli import EXIT_CHECK_FAILED, _print_failed_checks, _print_summary, run_exit_code


@dg.asset(check_specs=[dg.AssetCheckSpec("short_ppl_within_margin", asset="evals")])
def evals():
    return dg.MaterializeResult(
        check_results=[
            dg.AssetCheckResult(
                check_name="short_ppl_within_margin", passed=False, severity=dg.AssetCheckSeverity.ERROR
            )
        ]
    )


@dg.asset(check_specs=[dg.AssetCheckSpec("not_empty", asset="docs")])
def docs():
    return dg.MaterializeResult(check_results=[dg.AssetCheckResult(check_name="not_empty", passed=True)])


def test_failed_checks_are_collected_and_printed_last(capsys):
    result = dg.materialize([evals, docs], instance=dg.DagsterInstance.ephemeral())
    failed = _print_summary(result)
    assert failed == ["evals:short_ppl_within_margin (ERROR)"]
    _print_failed_checks(failed)
    err = capsys.readouterr().err
    assert "1 asset check(s) FAILED" in err and "evals:short_ppl_within_margin (ERROR)" in err
    _print_failed_checks([])
    assert "every asset check passed" in capsys.readouterr().out
    # a failed ERROR check fails `crucible run` (and so `make run`); a failed WARN check does not
    assert run_exit_code(failed) == EXIT_CHECK_FAILED != 0
    assert run_exit_code(["evals:short_ppl_within_margin (WARN)"]) == 0 == run_exit_code([])


@dg.asset
def slow_stage():
    time.sleep(1.0)


@dg.asset(deps=[slow_stage])
def quick_stage():
    pass


def test_the_run_report_splits_each_runs_wall_time_over_its_steps(tmp_path):
    from assets.run_report import INVOCATION_TAG, cli_run_ids, run_report, write_report

    instance = dg.DagsterInstance.ephemeral()
    runs = [
        dg.materialize(assets, instance=instance, tags={INVOCATION_TAG: inv}).run_id
        for assets, inv in (([slow_stage], "old"), ([slow_stage, quick_stage], "new"), ([quick_stage], "new"))
    ]
    assert cli_run_ids(instance, None) == runs[1:]  # the newest invocation, oldest run first
    assert cli_run_ids(instance, "old") == runs[:1] and cli_run_ids(instance, "all") == runs
    report = run_report(instance, runs[1:])
    steps = [(r["step"], r["status"]) for r in report.rows]
    assert steps == [("slow_stage", "ok"), ("quick_stage", "ok"), ("(orchestration)", ""),
                     ("quick_stage", "ok"), ("(orchestration)", "")]  # fmt: skip
    seconds = {(i, r["step"]): r["seconds"] for i, r in enumerate(report.rows)}
    # both steps pay the same step overhead (seconds on a loaded machine); only one sleeps 1 s
    assert seconds[(0, "slow_stage")] >= 1.0 and seconds[(1, "quick_stage")] < seconds[(0, "slow_stage")]
    assert sum(r["seconds"] for r in report.rows) == pytest.approx(report.total_s)
    assert sum(r["share"] for r in report.rows) == pytest.approx(1.0)
    assert report.total_s <= report.wall_s  # one after the other: the span holds every run
    path = write_report(report, tmp_path / "reports", "run_report-x")
    assert "| slow_stage |" in path.read_text() and "2 job run(s)" in path.read_text()
    assert json.loads((tmp_path / "reports" / "run_report-x.json").read_text())["runs"] == runs[1:]
    with pytest.raises(ValueError, match="no run nope"):
        run_report(instance, ["nope"])


def test_the_run_report_of_side_by_side_runs_gives_the_wall_span(tmp_path):
    """Two runs at once (code_corpus beside the web jobs): the header's minutes are first start to last
    end, and the summed job time is shown next to it."""
    import threading

    from assets.run_report import INVOCATION_TAG, cli_run_ids, run_report

    # no compute-log capture: it points the process's stdout at a log file (dup2) and tails it with `tail -F`,
    # and two runs in threads of one process restore each other's stdout wrongly and leave a tail running;
    # real runs each have their own process
    noop = {"module": "dagster._core.storage.noop_compute_log_manager", "class": "NoOpComputeLogManager"}
    instance = dg.DagsterInstance.local_temp(str(tmp_path), overrides={"compute_logs": noop})
    threads = [
        threading.Thread(target=dg.materialize, args=([slow_stage],),
                         kwargs={"instance": instance, "tags": {INVOCATION_TAG: "both"}})
        for _ in range(2)
    ]  # fmt: skip
    [t.start() for t in threads]
    [t.join() for t in threads]
    report = run_report(instance, cli_run_ids(instance, "both"))
    assert len(report.runs) == 2 and report.total_s > report.wall_s + 0.5  # each sleeps 1 s, together
    assert f"### Run report: {report.wall_s / 60:.1f} min ({report.total_s / 60:.1f} min of job runs" in (
        report.markdown()
    )
