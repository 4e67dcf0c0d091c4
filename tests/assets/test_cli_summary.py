"""`crucible run` ends with the failed asset checks, where nobody can miss them."""

from __future__ import annotations

import dagster as dg

from assets.cli import _print_failed_checks, _print_summary


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
