"""What every post-training job entry shares (Reasoning RL, Agentic RL, General RL, distillation): the parent
writes the job's spec under its run dir and starts `python -m <module> --spec <file>`; the child runs and
writes `<run_dir>/result.json` last (temp + rename), which the parent reads. A rerun of a job that finished
(the same spec, run-time fields aside, and its exported checkpoint still there) returns that result instead of
resuming from the last periodic checkpoint and redoing the steps after it."""

from __future__ import annotations

import argparse
import hashlib
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
FINISHED = "finished.json"  # the digest of the spec whose run wrote result.json, written after it
RUN_TIME_FIELDS = {"callbacks", "threads"}  # how a job reports and how many threads: not what it computes

log = logging.getLogger(__name__)


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


def spec_digest(spec: BaseModel) -> str:
    """What a job computes: its spec without the run-time fields (paths inside are content-versioned)."""
    fields = RUN_TIME_FIELDS & set(type(spec).model_fields)
    return hashlib.sha256(spec.model_dump_json(exclude=fields).encode()).hexdigest()


def finished_result(run_dir: Path, digest: str) -> dict[str, Any] | None:
    """The result of the finished run of this spec in `run_dir`, or None (not finished, another spec, or
    its exported checkpoint gone)."""
    marker, result = run_dir / FINISHED, run_dir / RESULT
    if not (marker.exists() and result.exists()):
        return None
    try:
        if json.loads(marker.read_text()).get("spec_digest") != digest:
            return None
        out = json.loads(result.read_text())
    except (json.JSONDecodeError, AttributeError):
        return None
    hf = out.get("hf_dir")
    return out if hf is None or (Path(hf) / "config.json").exists() else None


def child_main(argv: list[str] | None, spec_class: type[S], run: Callable[[S], Any], description: str) -> int:
    """The `python -m <module> --spec FILE` entry of a job."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    run_once(spec_class.model_validate_json(args.spec.read_text()), run)
    return 0


def run_once(spec: S, run: Callable[[S], Any]) -> None:
    """`run(spec)`, unless this spec already finished in its run dir (then its result.json stands)."""
    run_dir, digest = Path(spec.run_dir), spec_digest(spec)
    if finished_result(run_dir, digest) is not None:
        log.info("%s: this job already finished; its %s is reused", run_dir, RESULT)
        return
    # until run() rewrites result.json, the one there is not this spec's
    (run_dir / FINISHED).unlink(missing_ok=True)
    run(spec)
    tmp = run_dir / f"{FINISHED}.tmp"
    tmp.write_text(json.dumps({"spec_digest": digest}))
    tmp.replace(run_dir / FINISHED)


def load_policy(init_from: str, model_cfg: Any, threads: int | None) -> tuple[Any, Any]:
    """The job's tokenizer and model from its parent checkpoint, torch on `threads` threads (None: its default)."""
    import torch

    from training.model import load_model
    from training.tokenizer import load_tokenizer

    if threads:
        torch.set_num_threads(threads)
    return load_tokenizer(init_from), load_model(init_from, model_cfg)
