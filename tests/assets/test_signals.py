"""A process that ignores SIGINT (a script's background job, a pytest-xdist worker) and runs Dagster in process
still starts children that a SIGTERM stops (infra/signals.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from infra.settings import REPO_ROOT

SCRIPT = textwrap.dedent(
    """
    import signal, subprocess, sys
    import dagster as dg
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the parent shell or pytest-xdist leaves it
    if sys.argv[1] == "fixed":
        from infra.signals import keep_children_stoppable
        keep_children_stoppable()

    @dg.asset
    def one():
        return 1

    assert dg.materialize([one], instance=dg.DagsterInstance.ephemeral()).success
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ignored = open(f"/proc/{child.pid}/status").read().split("SigIgn:")[1].split()[0]
    child.terminate()
    try:
        child.wait(3)
        print("stopped", child.returncode, int(ignored, 16) >> (signal.SIGTERM - 1) & 1)
    except subprocess.TimeoutExpired:
        child.kill()
        print("ignored", child.wait(), int(ignored, 16) >> (signal.SIGTERM - 1) & 1)
    """
)


@pytest.mark.parametrize(("arm", "expected"), [("plain", "ignored -9 1"), ("fixed", "stopped -15 0")])
def test_a_child_started_after_an_in_process_run_stops_on_sigterm(arm, expected):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, arm], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # plain: Dagster's SIGTERM mapping leaves the child ignoring SIGTERM (the bug this guards against)
    assert out.stdout.strip().splitlines()[-1] == expected
