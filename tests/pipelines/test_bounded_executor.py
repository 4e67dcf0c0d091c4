"""datatrove tasks in our own worker processes: results merged, and a slow, crashing or killed task fails the
stage within its deadline with the reason, leaving no process behind."""

from __future__ import annotations

import os
import signal
import time

import multiprocess
import pytest
from datatrove.data import Document
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.base import PipelineStep

from pipelines.bounded_executor import TaskDeadlineExceeded, TaskFailed, run_tasks_bounded


class CountDocs(PipelineStep):
    """Makes `3 * (rank + 1)` documents and counts them in its stats."""

    name = "count docs"

    def run(self, data, rank: int = 0, world_size: int = 1):
        for i in range(3 * (rank + 1)):
            self.stat_update("made")
            yield Document(text=f"doc {rank}-{i}", id=f"{rank}-{i}")


def sleep_forever(data, rank, world_size):
    time.sleep(600)


def raise_in_task(data, rank, world_size):
    if rank == 1:
        raise ValueError("bad shard in task 1")
    return data


def sigkill_self(data, rank, world_size):
    os.kill(os.getpid(), signal.SIGKILL)


def _executor(tmp_path, pipeline, tasks=2) -> LocalPipelineExecutor:
    return LocalPipelineExecutor(
        pipeline, tasks=tasks, workers=2, logging_dir=str(tmp_path / "logs"), skip_completed=False
    )


def test_tasks_run_in_worker_processes_and_stats_merge(tmp_path):
    stats = run_tasks_bounded(_executor(tmp_path, [CountDocs()], tasks=3), workers=2, deadline_s=120)
    assert stats.stats[0].stats["made"].total == 3 + 6 + 9
    assert (tmp_path / "logs" / "stats.json").exists()
    assert sorted(os.listdir(tmp_path / "logs" / "completions")) == ["00000", "00001", "00002"]
    assert multiprocess.active_children() == []


def test_a_task_over_the_deadline_fails_the_stage_and_is_killed(tmp_path):
    start = time.monotonic()
    with pytest.raises(TaskDeadlineExceeded, match=r"web: tasks still running after the deadline of 3 s"):
        run_tasks_bounded(_executor(tmp_path, [sleep_forever]), workers=2, deadline_s=3, stage="web")
    assert time.monotonic() - start < 15  # 3 s deadline + kill and reap, not the task's 600 s
    assert multiprocess.active_children() == []


def test_a_raising_task_fails_the_stage_with_its_traceback(tmp_path):
    with pytest.raises(TaskFailed, match=r"(?s)task 1 failed:.*ValueError: bad shard in task 1"):
        run_tasks_bounded(_executor(tmp_path, [raise_in_task]), workers=2, deadline_s=120)
    assert multiprocess.active_children() == []


def test_a_killed_task_fails_the_stage_naming_the_signal(tmp_path):
    with pytest.raises(TaskFailed, match=r"task [01] was killed by signal 9"):
        run_tasks_bounded(_executor(tmp_path, [sigkill_self]), workers=2, deadline_s=120)
    assert multiprocess.active_children() == []


def test_web_extract_over_its_deadline_fails_naming_it(tmp_path):
    from web_extract_pages import PAGES, write_warc  # tests/pipelines is on sys.path

    from infra.committed import commit, is_committed
    from infra.store import LocalStore
    from pipelines.web.extract import ExtractConfig, extract_documents

    store = LocalStore(tmp_path / "store")
    warcs = {name: write_warc(tmp_path / name, pages) for name, pages in [("a.warc.gz", PAGES[::2]),
                                                                         ("b.warc.gz", PAGES[1::2])]}  # fmt: skip
    commit(store, "web/warc/s1", warcs)
    config = ExtractConfig(tasks=2, workers=2, task_deadline_s=0.2)  # less than starting a worker takes
    with pytest.raises(TaskDeadlineExceeded, match=r"web extract/filter: .*deadline of 0.2 s"):
        extract_documents(config, store, "s1", "web/warc/s1", "web/extract/s1")
    assert multiprocess.active_children() == []
    assert not is_committed(store, "web/extract/s1")  # nothing published
