"""`crucible` command line: run the whole graph, open the UIs, walk a checkpoint's lineage."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.cpu import cpu_share, sole_run
from infra.partition_keys import InvalidPartitionKey, validate_partition_key
from infra.settings import REPO_ROOT, SettingsError, load_profile
from infra.signals import keep_children_stoppable
from infra.tracking import process_tags

CLI_TAG = "crucible/cli_run"  # runs `crucible run` executes in its own process

LINEAGE_EXIT_CODES = """exit status:
  0  every link followed, every read is the output's current committed version
  2  no such registered model version or MLflow run
  3  broken: a declared upstream with no recorded read, an upstream run MLflow does not know, a read whose
     producer run is not recorded, or a read output whose committed pointer is gone (3 wins over 4)
  4  stale: an upstream output was re-committed after a run in the tree read it
  78 the profile is invalid (the message names the file and field)"""

RUN_EXIT_CODES = """exit status:
  0  every job ran and no check of ERROR severity failed
  1  a job failed
  2  a quality gate failed: a check of ERROR severity (listed last)
  64 --only named a job that does not exist (the message lists them)
  78 the profile is invalid (the message names the file and field)"""

# Partitions definition each job runs on (None = unpartitioned); the order is `assets.definitions.JOBS`.
JOB_PARTITIONS = {"web_corpus": "web_snapshot", "code_corpus": "code_snapshot", "web_rescue": "web_snapshot"}


def _ensure_dagster_home(profile) -> Path:
    home = Path(os.environ.get("DAGSTER_HOME") or profile.state_path / "dagster")
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        shutil.copyfile(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


# A job that shares no asset with the jobs it runs beside: `crucible run` starts it in a child process while
# those run here, and waits for it before the first job outside them. The code crawl waits on the network
# (~200 s on tiny) and the judge's filter keeps one core busy: overlapped, neither waits for the other.
BESIDE = {"code_corpus": ("web_corpus", "knowledge", "web_rescue")}


def cmd_run(args: argparse.Namespace) -> int:
    """Materialize every job of the graph in order, recording the runs in the local Dagster instance. One job
    at a time in this process: its stages may take every CPU (`infra.cpu.sole_run`), except while a job of
    BESIDE runs in a child process (`--sequential` turns that off)."""
    if args.shared_cpu:
        return _run_jobs(args)
    with sole_run():
        return _run_jobs(args)


def _run_jobs(args: argparse.Namespace) -> int:
    profile = load_profile()
    _ensure_dagster_home(profile)
    import dagster as dg

    from assets.definitions import JOBS
    from assets.partitions import add_partition

    names = [job.name for job in JOBS]
    unknown = [name for name in args.only or () if name not in names]
    if unknown:
        print(f"crucible run: --only {' '.join(unknown)}: no such job; the jobs are {', '.join(names)}",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    instance = dg.DagsterInstance.get()
    for run_id in fail_dead_cli_runs(instance):
        print(f"crucible: run {run_id} was left STARTED by a killed `crucible run`: marked FAILURE, its pool "
              "slots freed", file=sys.stderr)  # fmt: skip
    partitions = {"web_snapshot": args.snapshot, "code_snapshot": args.code_snapshot}
    started = time.time()
    failed_checks: list[str] = []
    invocation = args.invocation or time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
    run_ids: list[str] = []
    print(
        f"crucible: profile={profile.name} state={profile.state_path} DAGSTER_HOME={os.environ['DAGSTER_HOME']}"
    )
    jobs = [job.name for job in JOBS if not args.only or job.name in args.only]
    for job_name in jobs:
        partition_def = JOB_PARTITIONS.get(job_name)
        if partitions.get(partition_def):
            add_partition(instance, partition_def, partitions[partition_def])
    beside = {} if args.sequential else _start_beside(jobs, args, profile, invocation)
    for job_name in jobs:
        if job_name in beside:
            continue
        for name, child in list(beside.items()):
            if job_name not in BESIDE[name]:
                ok = _join_beside(name, child, instance, invocation, run_ids, failed_checks)
                del beside[name]
                if not ok:
                    return _failed(instance, run_ids, profile, invocation, failed_checks)
        with cpu_share(sole=not beside and not args.shared_cpu):
            ok = _run_job(job_name, dg, instance, partitions, invocation, run_ids, failed_checks)
        if not ok:
            for name, child in beside.items():
                _join_beside(name, child, instance, invocation, run_ids, failed_checks)
            return _failed(instance, run_ids, profile, invocation, failed_checks)
    for name, child in beside.items():
        if not _join_beside(name, child, instance, invocation, run_ids, failed_checks):
            return _failed(instance, run_ids, profile, invocation, failed_checks)
    print(f"crucible: whole graph done in {time.time() - started:.0f}s; `make ui` to browse runs and MLflow")
    _print_run_report(instance, run_ids, profile, invocation)
    _print_failed_checks(failed_checks)
    return run_exit_code(failed_checks)


def _run_job(job_name, dg, instance, partitions, invocation, run_ids, failed_checks) -> bool:
    from assets.definitions import defs
    from assets.run_report import INVOCATION_TAG

    partition_def = JOB_PARTITIONS.get(job_name)
    key = partitions.get(partition_def) if partition_def else None
    t0 = time.time()
    print(f"crucible: == {job_name}" + (f" [{partition_def}={key}]" if key else ""), flush=True)
    tags = {CLI_TAG: "1", INVOCATION_TAG: invocation, **process_tags()}
    result = defs.resolve_job_def(job_name).execute_in_process(
        instance=instance, partition_key=key, raise_on_error=False, tags=tags
    )
    run_ids.append(result.run_id)
    failed_checks += _print_summary(result)
    if not result.success:
        print(f"crucible: {job_name} FAILED after {time.time() - t0:.0f}s (run {result.run_id}); "
              "see `make ui` or the log above", file=sys.stderr)  # fmt: skip
        return False
    print(f"crucible: {job_name} done in {time.time() - t0:.0f}s", flush=True)
    return True


def _failed(instance, run_ids, profile, invocation, failed_checks) -> int:
    _print_run_report(instance, run_ids, profile, invocation)
    _print_failed_checks(failed_checks)
    return EXIT_JOB_FAILED


def _start_beside(jobs: list[str], args, profile, invocation: str) -> dict[str, tuple]:
    """Start each BESIDE job that runs with at least one of its companions: a `crucible run --only JOB` child
    (same instance, same invocation id, CPUs shared), its output in a log under the reports dir."""
    out = {}
    for name, companions in BESIDE.items():
        if name not in jobs or not set(companions) & set(jobs):
            continue
        log_path = profile.state_path / "reports" / f"{name}-{invocation}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "assets.cli", "run", "--only", name, "--shared-cpu",
               f"--invocation={invocation}", f"--snapshot={args.snapshot}",
               f"--code-snapshot={args.code_snapshot}"]  # fmt: skip
        log = log_path.open("w")
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        log.close()
        print(f"crucible: == {name} started beside {', '.join(c for c in companions if c in jobs)} "
              f"(pid {child.pid}, log {log_path})", flush=True)  # fmt: skip
        out[name] = (child, log_path, time.time())
    return out


def _join_beside(name, beside, instance, invocation, run_ids, failed_checks) -> bool:
    """Wait for a BESIDE child; print its summary lines, take its runs and failed checks. False if it failed."""
    from assets.run_report import cli_run_ids, failed_check_lines

    child, log_path, t0 = beside
    print(f"crucible: waiting for {name} (pid {child.pid}), which runs beside", flush=True)
    code = child.wait()
    lines = log_path.read_text(errors="replace").splitlines()
    print("\n".join(line for line in lines if line.startswith(("  ", f"crucible: {name}"))), flush=True)
    mine = [r for r in cli_run_ids(instance, invocation) if instance.get_run_by_id(r).job_name == name]
    run_ids += [r for r in mine if r not in run_ids]
    for run_id in mine:
        failed_checks += failed_check_lines(instance, run_id)
    if code not in (0, EXIT_CHECK_FAILED):
        print(f"crucible: {name} FAILED after {time.time() - t0:.0f}s (exit {code}); its log: {log_path}\n"
              + "\n".join(lines[-30:]), file=sys.stderr)  # fmt: skip
        return False
    return True


EXIT_JOB_FAILED, EXIT_CHECK_FAILED = 1, 2
EXIT_USAGE = 64  # a job name --only does not know (sysexits EX_USAGE; 2 is taken by a failed quality gate)
EXIT_CONFIG = 78  # an invalid profile (sysexits EX_CONFIG)


def run_exit_code(failed_checks: list[str]) -> int:
    """0, or EXIT_CHECK_FAILED when a check of ERROR severity failed (a quality gate the run did not pass);
    failed WARN checks (e.g. `micro`, whose models are too small to learn) are printed but do not fail it."""
    return EXIT_CHECK_FAILED if any(line.endswith("(ERROR)") for line in failed_checks) else 0


def _print_run_report(instance, run_ids: list[str], profile, name: str) -> None:
    from assets.run_report import run_report, write_report

    report = run_report(instance, run_ids)
    path = write_report(report, profile.state_path / "reports", f"run_report-{name}")
    print(f"\n{report.markdown()}\n(saved as {path})", flush=True)


def cmd_report(args: argparse.Namespace) -> int:
    """Print the run report of the newest `crucible run` (or of every run in the instance)."""
    profile = load_profile()
    _ensure_dagster_home(profile)
    import dagster as dg

    from assets.run_report import cli_run_ids, run_report

    instance = dg.DagsterInstance.get()
    run_ids = cli_run_ids(instance, "all" if args.all else args.invocation)
    if not run_ids:
        print(f"crucible report: no matching `crucible run` runs in {os.environ['DAGSTER_HOME']} "
              "(run `crucible run` first, or pass --all for every run)", file=sys.stderr)  # fmt: skip
        return 1
    print(run_report(instance, run_ids).markdown())
    return 0


def fail_dead_cli_runs(instance) -> list[str]:
    """Runs that an earlier `crucible run` executed in process and that are still STARTED although their
    process is gone (killed): no daemon watches in-process runs, so mark them FAILURE and free the pool slots
    they hold, or the next run of that pool would wait forever. Returns their run ids."""
    import dagster as dg

    from infra.tracking import process_gone

    healed = []
    filters = dg.RunsFilter(
        statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING], tags={CLI_TAG: "1"}
    )
    for record in instance.get_run_records(filters=filters):
        run = record.dagster_run
        if process_gone(dict(run.tags)):
            instance.report_run_failed(run, "its `crucible run` process is gone (killed)")
            instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
            healed.append(run.run_id)
    return healed


def _print_failed_checks(failed: list[str]) -> None:
    """A failed quality gate is the last thing `make run` prints, so nobody mistakes the run for a clean one."""
    if not failed:
        print("crucible: every asset check passed")
        return
    bar = "!" * 78
    print(f"\n{bar}\ncrucible: {len(failed)} asset check(s) FAILED:", file=sys.stderr)
    for line in failed:
        print(f"  {line}", file=sys.stderr)
    print(f"see the check's metadata in `make ui` (asset -> Checks)\n{bar}", file=sys.stderr)


def _print_summary(result) -> list[str]:
    """Print each materialization and check of a job run; returns the failed checks, one line each."""
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        meta = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
        shown = {k: v for k, v in meta.items() if isinstance(v, int | float) and "/" not in k}
        part = f"[{mat.partition}]" if mat.partition else ""
        print(
            f"  {mat.asset_key.to_user_string()}{part}: mlflow_run={meta.get('mlflow_run_id')} "
            + " ".join(f"{k}={v:g}" for k, v in list(shown.items())[:12])
        )
    failed = []
    for check in result.get_asset_check_evaluations():
        name = f"{check.asset_key.to_user_string()}:{check.check_name}"
        print(f"  check {name} {'passed' if check.passed else 'FAILED'}")
        if not check.passed:
            severity = getattr(check.severity, "value", check.severity)
            failed.append(f"{name} ({severity})")
    return failed


def cmd_lineage(args: argparse.Namespace) -> int:
    """Print the upstream tree of a registered model version (name/version) or an MLflow run id, with each
    recorded read checked against the store's current committed versions. Exit: 0 ok, 2 unknown target,
    3 broken link, 4 stale lineage (EXIT_BROKEN / EXIT_STALE)."""
    from infra.lineage_report import exit_code, problems, render_html, render_text
    from infra.store import open_store
    from infra.tracking import Tracker

    profile = load_profile()
    tracker = Tracker.from_profile(profile)
    try:
        if "/" in args.target:
            run_id = tracker.model_version_run_id(*args.target.rsplit("/", 1))
        else:
            run_id = args.target
        tree = tracker.run_lineage(run_id, open_store(profile.store, profile.state_path))
    except LookupError as exc:
        print(f"crucible lineage: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(tree, indent=2))
    elif args.html:
        _write_html(render_html(tree, f"Lineage of {args.target}"), args.html)
    else:
        print(render_text(tree))
    broken, stale = problems(tree)
    for line in broken:  # a link the walk cannot follow: it cannot say what the checkpoint was built from
        print(f"crucible lineage: incomplete, {line}", file=sys.stderr)
    for line in stale:  # every link follows, but an upstream output was re-committed after it was read
        print(f"crucible lineage: stale, {line}", file=sys.stderr)
    return exit_code(tree)


def _write_html(page: str, dest: str) -> None:
    if dest == "-":
        sys.stdout.write(page)
        return
    Path(dest).write_text(page)
    print(f"crucible lineage: wrote {dest}", file=sys.stderr)


def cmd_ui(args: argparse.Namespace) -> int:
    """Start the Dagster webserver + daemon and the MLflow UI on the loopback host; Ctrl-C stops both."""
    from infra.tracking import default_tracking_uri

    profile = load_profile()
    _ensure_dagster_home(profile)
    tracking_uri = default_tracking_uri(profile)
    mlflow_url = f"http://{args.host}:{args.mlflow_port}"
    env = {**os.environ, "CRUCIBLE_MLFLOW_UI_URL": mlflow_url, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    bin_dir = Path(sys.executable).parent
    artifacts = profile.state_path / "mlflow" / "artifacts"
    procs = [
        subprocess.Popen(
            [
                str(bin_dir / "dagster"),
                "dev",
                "-m",
                "assets.definitions",
                "-h",
                args.host,
                "-p",
                str(args.dagster_port),
            ],
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,
        ),
        subprocess.Popen(
            [
                str(bin_dir / "mlflow"),
                "ui",
                "--backend-store-uri",
                tracking_uri,
                "--default-artifact-root",
                artifacts.as_uri(),
                "--host",
                args.host,
                "--port",
                str(args.mlflow_port),
            ],
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,
        ),
    ]
    print(
        f"Dagster UI: http://{args.host}:{args.dagster_port}\nMLflow UI:  {mlflow_url}\n(Ctrl-C stops both)",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))  # stop both on TERM
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        for proc in procs:  # `dagster dev` ignores signals unless sent to its whole process group
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    return 0


def _partition_key(value: str) -> str:
    try:
        return validate_partition_key(value)
    except InvalidPartitionKey as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    keep_children_stoppable()  # before the first in-process Dagster run
    parser = argparse.ArgumentParser(prog="crucible", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="materialize the whole graph on the active profile ($CRUCIBLE_PROFILE)",
        epilog=RUN_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--snapshot",
        type=_partition_key,
        default="local-docs-0001",
        help="web crawl snapshot partition to create/run",
    )
    run.add_argument(
        "--code-snapshot", type=_partition_key, default="code-0001", help="code source snapshot partition"
    )
    run.add_argument(
        "--only", nargs="*", metavar="JOB", help="run only these jobs (a name it does not know lists them)"
    )
    run.add_argument(
        "--sequential",
        action="store_true",
        help="one job at a time (code_corpus does not run beside the web jobs)",
    )
    run.add_argument("--shared-cpu", action="store_true", help=argparse.SUPPRESS)  # a child run beside others
    run.add_argument("--invocation", help=argparse.SUPPRESS)  # the parent's id: one run report for both
    run.set_defaults(fn=cmd_run)
    lineage = sub.add_parser(
        "lineage",
        help="walk a checkpoint back to the crawl snapshots",
        description="Walk a checkpoint's recorded reads back to the crawl and code snapshots, checking each "
        "read against the output's current committed version.",
        epilog=LINEAGE_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lineage.add_argument("target", help="<registered model>/<version> or an MLflow run id")
    fmt = lineage.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the tree as JSON")
    fmt.add_argument(
        "--html",
        nargs="?",
        const="-",
        metavar="PATH",
        help="write the tree as a self-contained HTML page to PATH (no PATH or '-': stdout)",
    )
    lineage.set_defaults(fn=cmd_lineage)
    report = sub.add_parser(
        "report", help="where the time of the newest `crucible run` went: wall time per job and asset step"
    )
    which = report.add_mutually_exclusive_group()
    which.add_argument(
        "--invocation", help="the run report of this `crucible run` (its crucible/invocation tag)"
    )
    which.add_argument("--all", action="store_true", help="every finished run in the instance")
    report.set_defaults(fn=cmd_report)
    ui = sub.add_parser("ui", help="Dagster UI (webserver + daemon) and MLflow UI on 127.0.0.1")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--dagster-port", type=int, default=3000)
    ui.add_argument("--mlflow-port", type=int, default=5000)
    ui.set_defaults(fn=cmd_ui)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except SettingsError as exc:  # a bad profile or stage config: the message names the file and the field
        print(f"crucible {args.command}: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
