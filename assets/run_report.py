"""The run report `crucible run` prints at its end (and `crucible report` prints for past runs): where the wall
time of a whole-graph run went, per job and per asset step, read from the Dagster instance's event log.

Step time is STEP_START to STEP_SUCCESS / STEP_FAILURE; a run's time outside its steps (process start-up, the
event log, the launcher) is shown as that job's `(orchestration)` row."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from infra.stage import markdown_table

INVOCATION_TAG = "crucible/invocation"  # one `crucible run`: every job run it starts carries the same id
_STEP_END = {dg.DagsterEventType.STEP_SUCCESS: "ok", dg.DagsterEventType.STEP_FAILURE: "FAILED"}


@dataclass
class RunReport:
    rows: list[dict[str, Any]] = field(default_factory=list)  # job, step, seconds, share, status
    total_s: float = 0.0  # the job runs' wall times, summed (shares are of this)
    runs: list[str] = field(default_factory=list)
    wall_s: float = 0.0  # first run's start to last run's end: less than total_s when runs overlapped

    def markdown(self) -> str:
        shown = [{**r, "seconds": f"{r['seconds']:.0f}", "share": f"{r['share']:.1%}"} for r in self.rows]
        overlap = (
            f" ({self.total_s / 60:.1f} min of job runs, some side by side)"
            if self.total_s > self.wall_s + 1
            else ""
        )
        return (
            f"### Run report: {self.wall_s / 60:.1f} min{overlap} in {len(self.runs)} job run(s)\n\n"
            + markdown_table(shown)
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def step_times(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, float, str]]:
    """(step key, seconds, ok / FAILED) of every step of a run that ended, in the order they ended."""
    types = {dg.DagsterEventType.STEP_START, *_STEP_END}
    started: dict[str, float] = {}
    out = []
    for entry in instance.all_logs(run_id, of_type=types):
        kind = entry.dagster_event.event_type
        if kind == dg.DagsterEventType.STEP_START:
            started[entry.step_key] = entry.timestamp
        elif entry.step_key in started:
            out.append((entry.step_key, entry.timestamp - started.pop(entry.step_key), _STEP_END[kind]))
    return out


def run_report(instance: dg.DagsterInstance, run_ids: list[str]) -> RunReport:
    """Per job run (in the order given): each step's wall time and the run's time outside its steps."""
    report = RunReport(runs=list(run_ids))
    spans = []
    for run_id in run_ids:
        record = instance.get_run_record_by_id(run_id)
        if record is None:
            raise ValueError(
                f"run report: no run {run_id} in the Dagster instance ({instance.root_directory})"
            )
        job = record.dagster_run.job_name
        steps = step_times(instance, run_id)
        for step, seconds, status in steps:
            report.rows.append({"job": job, "step": step, "seconds": seconds, "status": status})
        if record.start_time and record.end_time:
            wall = record.end_time - record.start_time
            spans.append((record.start_time, record.end_time))
            report.total_s += wall
            outside = max(0.0, wall - sum(s for _, s, _ in steps))
            report.rows.append({"job": job, "step": "(orchestration)", "seconds": outside, "status": ""})
    if spans:
        report.wall_s = max(e for _, e in spans) - min(s for s, _ in spans)
    for row in report.rows:
        row["share"] = row["seconds"] / report.total_s if report.total_s else 0.0
    return report


def cli_run_ids(instance: dg.DagsterInstance, invocation: str | None) -> list[str]:
    """The runs of one `crucible run` (its invocation id; None = the newest invocation), oldest first; with
    invocation "all", every finished run in the instance."""
    records = instance.get_run_records(order_by="create_timestamp", ascending=True)
    if invocation == "all":
        return [r.dagster_run.run_id for r in records if r.end_time]
    tagged = [r for r in records if INVOCATION_TAG in r.dagster_run.tags]
    if invocation is None and tagged:
        invocation = tagged[-1].dagster_run.tags[INVOCATION_TAG]
    return [r.dagster_run.run_id for r in tagged if r.dagster_run.tags[INVOCATION_TAG] == invocation]


def failed_check_lines(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """`asset:check (SEVERITY)` for each failed asset check of a run, from its event log."""
    out = []
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        check = entry.dagster_event.event_specific_data
        if not check.passed:
            severity = getattr(check.severity, "value", check.severity)
            out.append(f"{check.asset_key.to_user_string()}:{check.check_name} ({severity})")
    return out


def write_report(report: RunReport, directory: Path, name: str) -> Path:
    """`<name>.json` and `<name>.md` under `directory`, each written to a temp file and renamed."""
    directory.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", report.to_json()), (".md", report.markdown() + "\n")):
        tmp = directory / f".{name}{suffix}.tmp"
        tmp.write_text(text)
        tmp.replace(directory / f"{name}{suffix}")
    return directory / f"{name}.md"
