"""What every post-training job entry shares (Reasoning RL, Agentic RL, General RL, distillation): the parent
writes the job's spec under its run dir and starts `python -m <module> --spec <file>`; the child runs and
writes `<run_dir>/result.json` last (temp + rename), which the parent reads."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from infra.launcher import LaunchCommand, build_launch_command

S = TypeVar("S", bound=BaseModel)
RESULT = "result.json"


def child_command(
    spec: BaseModel,
    module: str,
    run_dir: Path,
    spec_name: str,
    torch_extensions_dir: Path | None,
    threads: int,
    leading_args: tuple[str, ...] = (),
) -> LaunchCommand:
    """Write `spec` to `<run_dir>/<spec_name>` (atomically) and the command that runs `module` on it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / spec_name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(spec.model_dump_json(indent=1))
    tmp.replace(path)
    return build_launch_command(
        module, [*leading_args, "--spec", str(path)], launcher="python", nproc=1, torch_extensions_dir=torch_extensions_dir,
        threads_per_process=threads,
    )  # fmt: skip


def run_child(cmd: LaunchCommand, run_dir: Path, launch: Any, what: str) -> dict[str, Any]:
    """Run the child (through `launch`, an asset's Pipes launcher, when given) and read its result."""
    from infra.launcher import run_command

    if launch is None:
        run_command(cmd, log_path=run_dir / "train.log", timeout_s=None)
    else:
        launch(cmd, run_dir / "train.log", None)
    result = run_dir / RESULT
    if not result.exists():
        raise RuntimeError(
            f"{what} job in {run_dir} exited without writing {RESULT}; see {run_dir / 'train.log'}"
        )
    return json.loads(result.read_text())


def metrics_logger(
    run_dir: Path, spec: Any, callbacks: list[str], resume_after: int | None = None
) -> Callable[[dict[str, float], int], None]:
    """`log(metrics, step)`: one JSON line per call in `<run_dir>/metrics.jsonl`, then each `module:function`
    callback (built with the spec; e.g. the Pipes reporter that streams metrics to the asset). With
    `resume_after`, lines of later steps from an earlier attempt are dropped first (they are rewritten)."""
    from training.job import import_object
    from training.trainer import JsonlMetricsWriter

    writer = JsonlMetricsWriter(run_dir / "metrics.jsonl")
    if resume_after is not None:
        writer.drop_after(resume_after)
    sinks = [writer] + [import_object(p)(spec) for p in callbacks]

    def log(metrics: dict[str, float], step: int) -> None:
        for sink in sinks:
            sink(step, metrics)

    return log


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    tmp = run_dir / f"{RESULT}.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(run_dir / RESULT)


def child_main(argv: list[str] | None, spec_class: type[S], run: Callable[[S], Any], description: str) -> int:
    """The `python -m <module> --spec FILE` entry of a job."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    run(spec_class.model_validate_json(args.spec.read_text()))
    return 0
