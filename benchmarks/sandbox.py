"""Per-call overhead of the code sandbox: `infra.sandbox.run_python` vs a plain `python -I -c` subprocess
running the same trivial program, in one run (medians over N calls); then the sandbox again from a caller
holding `--resident-gb` of memory, as a training process does (spawning must not copy its page tables)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from infra.sandbox import SandboxLimits, run_python, sandbox_available


def _median_s(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--resident-gb", type=float, default=2.0)
    args = parser.parse_args()
    missing = sandbox_available()
    if missing:
        print(f"sandbox unavailable: {missing}")
        return 1
    code = "print(sum(range(1000)))"
    limits = SandboxLimits()
    sandboxed = _median_s(lambda: run_python(code, limits), args.calls)
    plain = _median_s(
        lambda: subprocess.run([sys.executable, "-I", "-B", "-c", code], capture_output=True, check=True),
        args.calls,
    )
    print(f"calls: {args.calls}")
    print(f"plain subprocess (baseline): {plain * 1000:.1f} ms/call")
    print(f"sandbox:                     {sandboxed * 1000:.1f} ms/call")
    print(f"overhead: +{(sandboxed - plain) * 1000:.1f} ms/call, ratio {sandboxed / plain:.2f}x the baseline")
    resident = bytearray(int(args.resident_gb * 1024**3))
    for i in range(0, len(resident), 4096):  # touch every page: resident, not just reserved
        resident[i] = 1
    big = _median_s(lambda: run_python(code, limits), args.calls)
    print(
        f"sandbox, caller holding {args.resident_gb:g} GB: {big * 1000:.1f} ms/call, ratio {big / plain:.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
