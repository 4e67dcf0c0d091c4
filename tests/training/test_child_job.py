"""A finished job is not redone: a rerun of the same spec returns its result; another spec, a lost export or
a run that died before finishing runs again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from training.child_job import RESULT, child_main, write_result


class ToySpec(BaseModel):
    run_dir: str
    steps: int
    threads: int | None = None  # run-time: does not change what the job computes


def _job(calls: list[int]):
    def run(spec: ToySpec) -> None:
        calls.append(spec.steps)
        hf = Path(spec.run_dir) / "hf"
        hf.mkdir(parents=True, exist_ok=True)
        (hf / "config.json").write_text("{}")
        write_result(Path(spec.run_dir), {"hf_dir": str(hf), "step": spec.steps})

    return run


def _spec(tmp_path: Path, **fields) -> list[str]:
    path = tmp_path / "spec.json"
    path.write_text(ToySpec(run_dir=str(tmp_path / "run"), **fields).model_dump_json())
    return ["--spec", str(path)]


def test_a_finished_job_is_reused_and_any_change_runs_it_again(tmp_path):
    calls: list[int] = []
    run = _job(calls)
    child_main(_spec(tmp_path, steps=3), ToySpec, run, "toy")
    child_main(_spec(tmp_path, steps=3, threads=2), ToySpec, run, "toy")  # same job, other thread count
    assert calls == [3]
    child_main(_spec(tmp_path, steps=4), ToySpec, run, "toy")  # another job in the same dir
    assert calls == [3, 4] and json.loads((tmp_path / "run" / RESULT).read_text())["step"] == 4
    (tmp_path / "run" / "hf" / "config.json").unlink()  # its export is gone: the result is no use
    child_main(_spec(tmp_path, steps=4), ToySpec, run, "toy")
    assert calls == [3, 4, 4]


def test_a_job_that_died_is_run_again(tmp_path):
    calls: list[int] = []

    def dies(spec: ToySpec) -> None:
        calls.append(spec.steps)
        raise RuntimeError("killed")

    child_main(_spec(tmp_path, steps=3), ToySpec, _job([]), "toy")
    with pytest.raises(RuntimeError, match="killed"):  # dies once the marker of step 3's run is gone
        child_main(_spec(tmp_path, steps=5), ToySpec, dies, "toy")
    child_main(_spec(tmp_path, steps=3), ToySpec, _job(calls), "toy")  # result.json is step 3's, but unmarked
    assert calls == [5, 3]
