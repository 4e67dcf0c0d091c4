"""Run untrusted (model-generated) Python in a sandbox: its own network, mount and pid namespaces, resource
limits, a throwaway working directory, no view of the project or the state dir, and capped output.

How it holds (Linux, util-linux `unshare`/`setpriv`):
- network: a new network namespace with no interface up, so even 127.0.0.1 is unreachable;
- files: a private mount namespace where the project, the state dir, /tmp, /root and /home are covered by
  empty tmpfs mounts, the throwaway directory is bound at /mnt/work (the working directory) and the Python
  installation is mounted back read-only;
- privileges: as root, the code runs as a uid of its own (drawn from `SANDBOX_UIDS`, no passwd entry, so
  concurrent sandboxes never share RLIMIT_NPROC's count) with no capabilities and no_new_privs (os.setuid
  fails);
  without root, inside a user namespace where "root" owns nothing outside it;
- processes: a new pid namespace whose init is the code itself: when it exits or is killed, every process
  it started dies with it; RLIMIT_NPROC stops fork bombs;
- limits: CPU seconds, address space, file size, open files, processes, wall clock, output bytes;
- interpreter: the base installation's Python with `-I -S -B`: the standard library only, without `site`
  (no site-packages, no `exit()` / `quit()` helpers: `sys.exit` works). `site` ran whatever `.pth` files the
  host installation carries (here one imports certifi): 30 of a run's 65 ms.
Every run returns a `SandboxResult` whose `status` says why it ended; nothing here raises for bad code.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# Unprivileged uids for sandboxed code, one drawn per run: far above login users and the usual
# /etc/subuid ranges (100000 + 65536 per user). Sharing one uid (e.g. nobody) would let a fork bomb in one
# sandbox exhaust RLIMIT_NPROC for every sandbox running beside it.
SANDBOX_UIDS = range(2_000_000_000, 2_001_000_000)
WORKDIR = "/mnt/work"

# Runs inside the new namespaces; data arrives only as positional arguments ("$@"), never interpolated.
_INNER = r"""
set -e
workdir="$1"; python="$2"; prefix="$3"; uid="$4"; shift 4
mount --make-rprivate /
mount -t tmpfs -o size=1m,mode=0755 tmpfs /mnt
mkdir /mnt/work /mnt/python
mount --bind "$workdir" /mnt/work
mount --rbind "$prefix" /mnt/python
mount -o remount,bind,ro /mnt/python
for hidden in "$@"; do
  if [ -d "$hidden" ]; then mount -t tmpfs -o size=1m,mode=0755 tmpfs "$hidden"; fi
done
if [ ! -x "$python" ]; then mkdir -p "$prefix" && mount --bind /mnt/python "$prefix"; fi
cd /mnt/work
if [ "$uid" != - ]; then
  exec setpriv --reuid="$uid" --regid="$uid" --clear-groups --no-new-privs --inh-caps=-all -- "$python" -I -S -B main.py
fi
exec "$python" -I -S -B main.py
"""


class SandboxLimits(BaseModel):
    """Resource limits of one sandboxed run."""

    model_config = ConfigDict(extra="forbid")
    wall_s: float = Field(
        10.0, gt=0, description="Wall-clock limit (seconds); the process tree is killed after it"
    )
    cpu_s: int = Field(5, ge=1, description="CPU-time limit (seconds, RLIMIT_CPU)")
    memory_mb: int = Field(512, ge=64, description="Address-space limit (MiB, RLIMIT_AS)")
    file_size_mb: int = Field(16, ge=1, description="Largest file the code may write (MiB, RLIMIT_FSIZE)")
    open_files: int = Field(64, ge=16, description="Open file descriptors (RLIMIT_NOFILE)")
    processes: int = Field(16, ge=1, description="Processes of the sandbox user (RLIMIT_NPROC)")
    output_bytes: int = Field(64_000, ge=1024, description="stdout + stderr kept; more kills the run")


@dataclass
class SandboxResult:
    """status: ok | error | timeout | cpu_time | memory | file_size | output_limit | killed | unavailable."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    reason: str
    wall_s: float
    files: dict[str, bytes] = field(default_factory=dict)
    uid: int | None = None  # the uid the code ran as (None: the caller's, inside a user namespace)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def sandbox_available() -> str | None:
    """None if sandboxed runs work on this machine, else why not (what to install or enable)."""
    if sys.platform != "linux":
        return "the sandbox needs Linux namespaces"
    for tool in ("prlimit", "unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: install util-linux and mount"
    return None


def _hidden_paths(extra: list[Path]) -> list[str]:
    from infra.settings import REPO_ROOT

    paths = [REPO_ROOT, Path(tempfile.gettempdir()), Path("/tmp"), Path("/root"), Path("/home"), *extra]
    state = os.environ.get("CRUCIBLE_STATE_DIR")
    if state:
        paths.append(Path(state))
    seen: list[str] = []
    for p in paths:
        resolved = str(p.resolve())
        if resolved != "/" and resolved not in seen:
            seen.append(resolved)
    return seen


def _python() -> tuple[str, str]:
    """(interpreter, its installation prefix): the base installation's, not the project's venv. The prefix
    is mounted back read-only if it lies under a hidden tree (e.g. a pyenv build under /root)."""
    prefix = Path(sys.base_prefix).resolve()
    return str(prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"), str(prefix)


def _limit_args(limits: SandboxLimits) -> list[str]:
    """`prlimit` options setting the limits before it execs the sandbox. A `preexec_fn` would do the same but
    makes Python fork() instead of vfork(): copying the page tables of a training process holding 2 GB took a
    run from 39 to 111 ms."""
    mb = 1024 * 1024
    return [
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
        f"--as={limits.memory_mb * mb}",
        f"--fsize={limits.file_size_mb * mb}",
        f"--nofile={limits.open_files}",
        f"--nproc={limits.processes}",
        "--core=0",
    ]


class _CappedReader(threading.Thread):
    """Drains a pipe, keeping at most `cap` bytes; sets `overflow` once more arrives."""

    def __init__(self, pipe, cap: int, on_overflow):
        super().__init__(daemon=True)
        self.pipe, self.cap, self.on_overflow = pipe, cap, on_overflow
        self.data = bytearray()
        self.overflow = False

    def run(self) -> None:
        while chunk := self.pipe.read(65536):
            room = self.cap - len(self.data)
            self.data += chunk[: max(room, 0)]
            if len(chunk) > room and not self.overflow:
                self.overflow = True
                self.on_overflow()


def run_python(
    code: str,
    limits: SandboxLimits | None = None,
    files: dict[str, str | bytes] | None = None,
    stdin: str = "",
    hide: list[Path] | None = None,
    collect: list[str] | None = None,
) -> SandboxResult:
    """Run `code` as main.py in a fresh directory holding `files`; return how it ended.

    `collect` names files the code may write, returned in `result.files` (capped by the file-size limit)."""
    limits = limits or SandboxLimits()
    missing = sandbox_available()
    if missing:
        return SandboxResult("unavailable", None, "", "", missing, 0.0)
    workdir = Path(tempfile.mkdtemp(prefix="crucible-sandbox-"))
    try:
        (workdir / "main.py").write_text(code)
        for name, content in (files or {}).items():
            target = (workdir / name).resolve()
            if not str(target).startswith(str(workdir) + "/"):
                return SandboxResult(
                    "error", None, "", "", f"file name {name!r} escapes the sandbox dir", 0.0
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode() if isinstance(content, str) else content)
        uid = SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))] if os.geteuid() == 0 else None
        if uid is not None:
            for path in [workdir, *workdir.rglob("*")]:
                os.chown(path, uid, uid)
        argv = [
            "prlimit",
            *_limit_args(limits),
            "--",
            "unshare",
            "--mount",
            "--net",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--ipc",
            "--uts",
        ]
        if uid is None:
            argv.append("--map-root-user")
        python, prefix = _python()
        argv += [
            "--",
            "sh",
            "-c",
            _INNER,
            "sandbox",
            str(workdir),
            python,
            prefix,
            str(uid) if uid is not None else "-",
        ]
        argv += _hidden_paths(hide or [])
        return dataclasses.replace(_supervise(argv, limits, stdin, workdir, collect or []), uid=uid)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _supervise(
    argv: list[str], limits: SandboxLimits, stdin: str, workdir: Path, collect: list[str]
) -> SandboxResult:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": WORKDIR}
    started = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    killed_for: list[str] = []

    def kill(reason: str) -> None:
        if not killed_for:
            killed_for.append(reason)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    cap = limits.output_bytes
    out = _CappedReader(proc.stdout, cap, lambda: kill("output_limit"))
    err = _CappedReader(proc.stderr, cap, lambda: kill("output_limit"))
    out.start()
    err.start()
    try:
        proc.stdin.write(stdin.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    cpu_s = _wait(proc, started + limits.wall_s, lambda: kill("timeout"))
    out.join(timeout=5)
    err.join(timeout=5)
    wall = time.monotonic() - started
    stdout = out.data.decode(errors="replace")
    stderr = err.data.decode(errors="replace")
    if not killed_for and proc.returncode != 0 and cpu_s >= limits.cpu_s - 0.05:
        killed_for.append("cpu_time")  # SIGXCPU hit the code; unshare reports it as its own exit status
    status, reason = _classify(proc.returncode, stderr, killed_for, limits)
    files = {}
    for name in collect:
        path = workdir / name
        if path.is_file() and not path.is_symlink():
            files[name] = path.read_bytes()[: limits.file_size_mb * 1024 * 1024]
    return SandboxResult(status, proc.returncode, stdout, stderr, reason, round(wall, 4), files)


def _wait(proc: subprocess.Popen, deadline: float, on_timeout) -> float:
    """Reap `proc` (killing it at `deadline`); returns the CPU seconds of its whole reaped tree."""
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, 0 if timed_out else os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline:
            on_timeout()
            timed_out = True
        else:
            time.sleep(0.005)


def _classify(rc: int | None, stderr: str, killed_for: list[str], limits: SandboxLimits) -> tuple[str, str]:
    if killed_for:
        what = killed_for[0]
        if what == "timeout":
            return "timeout", f"wall-clock limit of {limits.wall_s:g}s exceeded"
        if what == "cpu_time":
            return "cpu_time", f"CPU-time limit of {limits.cpu_s}s exceeded"
        return "output_limit", f"output exceeded {limits.output_bytes} bytes"
    if rc == 0:
        return "ok", ""
    if "MemoryError" in stderr:
        return "memory", f"address-space limit of {limits.memory_mb} MiB exceeded"
    if rc is not None and rc < 0:
        sig = -rc
        if sig == signal.SIGXCPU:
            return "cpu_time", f"CPU-time limit of {limits.cpu_s}s exceeded"
        if sig == signal.SIGXFSZ:
            return "file_size", f"file-size limit of {limits.file_size_mb} MiB exceeded"
        return "killed", f"killed by signal {signal.Signals(sig).name}"
    if rc is not None and rc > 128 and rc - 128 in (signal.SIGXCPU, signal.SIGXFSZ, signal.SIGKILL):
        return _classify(-(rc - 128), stderr, killed_for, limits)
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit code {rc}"
    return "error", last[:300]
