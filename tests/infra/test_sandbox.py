"""Every escape a model's code might try is stopped and reported with its reason; normal code still runs."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from infra.sandbox import SANDBOX_UIDS, SandboxLimits, run_python, sandbox_available
from infra.settings import REPO_ROOT

pytestmark = pytest.mark.skipif(sandbox_available() is not None, reason=str(sandbox_available()))

FAST = SandboxLimits(wall_s=8, cpu_s=2, memory_mb=256)


def test_ordinary_code_runs_with_stdin_files_and_collected_output():
    code = "import sys, json\nn = int(sys.stdin.read())\nopen('out.json','w').write(json.dumps(n * 2))\nprint(open('data/x.txt').read())"
    result = run_python(code, FAST, files={"data/x.txt": "hello"}, stdin="21", collect=["out.json"])
    assert result.status == "ok", result
    assert result.stdout.strip() == "hello"
    assert result.files == {"out.json": b"42"}


def test_errors_are_failed_samples_with_the_exception():
    result = run_python("raise ValueError('bad answer')", FAST)
    assert result.status == "error" and result.reason == "ValueError: bad answer"


@pytest.mark.parametrize("host", ["127.0.0.1", "10.0.0.1", "::1"])
def test_no_network_even_to_loopback(host):
    code = f"import socket\nsocket.create_connection(({host!r}, 80), timeout=2)"
    result = run_python(code, FAST)
    assert result.status == "error"
    assert "Network is unreachable" in result.reason or "Cannot assign requested address" in result.reason


def test_project_and_store_are_invisible(tmp_path):
    store_file = tmp_path / "state" / "store" / "secret.txt"
    store_file.parent.mkdir(parents=True)
    store_file.write_text("s3cret")
    for target in (REPO_ROOT / "README.md", store_file):
        result = run_python(f"print(open({str(target)!r}).read())", FAST)
        assert result.status == "error" and "No such file or directory" in result.reason, (target, result)
        assert "s3cret" not in result.stdout


def test_tmp_is_hidden_also_when_tmpdir_points_elsewhere(tmp_path, monkeypatch):
    secret = Path("/tmp") / f"crucible-secret-{os.getpid()}.txt"  # where other jobs' scratch files live
    secret.write_text("s3cret")
    try:
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # TMPDIR=<somewhere else>
        result = run_python(f"print(open({str(secret)!r}).read())", FAST)
    finally:
        secret.unlink()
    assert result.status == "error" and "No such file or directory" in result.reason, result
    assert "s3cret" not in result.stdout


@pytest.mark.parametrize("target", ["/etc/crucible-x", "/usr/crucible-x", "/tmp/crucible-x", "../escape"])
def test_no_writes_outside_the_working_directory(target):
    result = run_python(f"open({target!r}, 'w').write('x')", FAST)
    assert result.status == "error"
    assert "Permission denied" in result.reason or "Read-only file system" in result.reason
    assert not os.path.exists(target) or target == "/tmp/crucible-x" and not os.path.getsize(target)


def test_setuid_to_root_is_refused():
    result = run_python("import os\nos.setuid(0)\nprint(os.getuid())", FAST)
    assert result.status == "error" and "Operation not permitted" in result.reason


def test_infinite_loop_is_stopped_by_cpu_or_wall_limit():
    started = time.monotonic()
    result = run_python("while True: pass", SandboxLimits(wall_s=4, cpu_s=1))
    assert result.status in ("cpu_time", "timeout"), result
    assert time.monotonic() - started < 4 + 3


def test_sleeping_forever_is_stopped_at_the_wall_limit():
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(wall_s=1.5))
    assert result.status == "timeout" and 1.5 <= result.wall_s < 4


def test_a_gigabyte_of_output_is_cut_off():
    result = run_python("import sys\nwhile True: sys.stdout.write('x' * 65536)", FAST)
    assert result.status == "output_limit"
    assert len(result.stdout) <= FAST.output_bytes


def test_allocating_4_gb_fails_with_memory_status():
    result = run_python("a = bytearray(4 * 1024**3)", FAST)
    assert result.status == "memory", result


def test_fork_bomb_is_contained():
    started = time.monotonic()
    result = run_python(
        "import os\nwhile True:\n    os.fork()", SandboxLimits(wall_s=5, cpu_s=2, processes=8)
    )
    assert result.status != "ok"
    assert time.monotonic() - started < 10
    assert _sandbox_user_processes(result.uid) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="without root every sandbox runs as the caller")
def test_a_fork_bomb_does_not_starve_a_sandbox_running_beside_it():
    """Each run gets its own uid, so RLIMIT_NPROC counts its own processes only (with one shared uid the bomb
    holds every slot and the neighbour's fork fails with EAGAIN)."""
    limits = SandboxLimits(wall_s=6, cpu_s=3, processes=8)
    # A bomb that survives its failed forks, so it holds every process slot it can get until the wall limit.
    code = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.05)"
    bomb = threading.Thread(target=run_python, args=(code, limits))
    bomb.start()
    time.sleep(1.5)  # the bomb has filled its 8 process slots by now
    neighbour = (
        "import os\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n"
        "    os.waitpid(pid, 0)\nprint('forked 4')"
    )
    result = run_python(neighbour, limits)
    bomb.join()
    assert result.status == "ok" and result.stdout.strip() == "forked 4", result
    assert result.uid in SANDBOX_UIDS


@pytest.mark.skipif(os.geteuid() != 0, reason="without root every sandbox runs as the caller")
def test_sandboxed_code_runs_as_an_unprivileged_uid_of_its_own():
    code = "import os\nprint(os.getuid(), os.getgid())\ntry:\n    os.setuid(0)\nexcept PermissionError:\n    print('no setuid')"
    first, second = run_python(code, FAST), run_python(code, FAST)
    assert first.stdout.split() == [str(first.uid), str(first.uid), "no", "setuid"], first
    assert first.uid in SANDBOX_UIDS and second.uid in SANDBOX_UIDS and first.uid != second.uid


def test_a_child_never_outlives_the_sandbox():
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\nelse:\n    print('parent done')"
    started = time.monotonic()
    result = run_python(code, FAST)
    assert result.status == "ok" and result.stdout.strip() == "parent done"
    assert time.monotonic() - started < 5
    assert _sandbox_user_processes(result.uid) == 0


def test_file_size_limit():
    code = "f = open('big', 'wb')\nfor _ in range(64):\n    f.write(b'0' * 1024 * 1024)"
    result = run_python(code, SandboxLimits(wall_s=8, file_size_mb=2))
    assert result.status in ("file_size", "error"), result
    assert result.status == "file_size" or "File too large" in result.reason


def test_the_code_runs_under_every_configured_limit_and_without_site():
    """The limits reach the sandboxed interpreter itself (set by `prlimit` before the namespaces are made),
    and it sees the standard library only."""
    limits = SandboxLimits(wall_s=8, cpu_s=3, memory_mb=300, file_size_mb=5, open_files=40, processes=20)
    code = (
        "import resource, sys\n"
        "names = ['CPU', 'AS', 'FSIZE', 'NOFILE', 'NPROC', 'CORE']\n"
        "print(*[resource.getrlimit(getattr(resource, 'RLIMIT_' + n))[0] for n in names])\n"
        "print('site' in sys.modules, any('site-packages' in p for p in sys.path))"
    )
    result = run_python(code, limits)
    assert result.status == "ok", result
    mb = 1024 * 1024
    assert result.stdout.split("\n")[0].split() == [str(v) for v in (3, 300 * mb, 5 * mb, 40, 20, 0)]
    assert result.stdout.split("\n")[1] == "False False"


def _owner(proc_dir: Path) -> int | None:
    try:
        return proc_dir.stat().st_uid
    except FileNotFoundError:  # the process ended while we looked
        return None


def _sandbox_user_processes(uid: int | None, within_s: float = 3.0) -> int:
    """Processes left of a run's sandbox uid once the kernel has torn the pid namespace down (it is async)."""
    if uid is None:
        return (
            0  # without root the code runs as the caller in a user namespace; the pid namespace still holds
        )
    deadline = time.monotonic() + within_s
    while True:
        left = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == uid)
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
