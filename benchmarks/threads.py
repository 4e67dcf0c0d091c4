"""Training throughput by torch thread count and libgomp wait settings, idle and beside a busy core.

Why: a training child with 2 intra-op threads on a 2-core machine spins in OpenMP barriers while another
process holds a core (libgomp's default wait policy busy-waits), so one background job can cut its speed
several-fold. Baseline: 1 thread, libgomp's defaults, measured in the same run under the same load. Each cell
is a fresh process (libgomp reads its settings when torch loads) running the model's pre-training step
through `training.trainer.Trainer` (benchmarks/trainer.py's loop).

    .venv/bin/python benchmarks/threads.py [--size tiny] [--steps 12] [--load 0 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# (threads, libgomp settings); the first is the baseline. PASSIVE: idle threads sleep at once; GOMP_SPINCOUNT:
# they spin that many iterations first (libgomp's default is 300,000).
VARIANTS = [
    (1, {}),
    (2, {}),
    (2, {"OMP_WAIT_POLICY": "PASSIVE"}),
    (2, {"GOMP_SPINCOUNT": "10000"}),
]


def measure(size: str, steps: int, warmup: int) -> float:
    """Median tokens/s of the Trainer's pre-training step in this process (torch threads already set)."""
    import statistics

    import torch

    from benchmarks.trainer import our_trainer
    from training.batch_source import SyntheticBatches
    from training.model import ModelConfig, build_model
    from training.trainer import resolve_precision

    cfg = ModelConfig.for_size(size)
    batch = SyntheticBatches(cfg.vocab_size, 8, 256, seed=0).batch_at(0)
    precision = resolve_precision("auto", torch.device("cpu"))
    with tempfile.TemporaryDirectory() as tmp:
        rates = our_trainer(build_model(cfg), batch, steps, warmup, "muon", "dense", precision, Path(tmp))
    return statistics.median(rates)


def cell(threads: int, settings: dict[str, str], args: argparse.Namespace) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update({"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO), **settings})
    cmd = [sys.executable, __file__, "--child", "--size", args.size, "--steps", str(args.steps),
           "--warmup", str(args.warmup)]  # fmt: skip
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])["tokens_per_s"]


def busy_cores(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=["micro", "tiny"])
    parser.add_argument("--steps", type=int, default=12, help="timed steps per cell")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--load", type=int, nargs="+", default=[0, 1], help="busy-loop processes beside it")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        print(json.dumps({"tokens_per_s": measure(args.size, args.steps, args.warmup)}))
        return
    print(f"model {args.size}, batch 8x256, {os.cpu_count()} cores; baseline: 1 thread, libgomp defaults")
    print("| busy processes beside it | threads | libgomp settings | tokens/s | vs baseline |")
    print("|---|---|---|---|---|")
    for load in args.load:
        procs = busy_cores(load)
        try:
            rates = [cell(t, p, args) for t, p in VARIANTS]
        finally:
            for p in procs:
                p.kill()
        for (threads, settings), rate in zip(VARIANTS, rates, strict=True):
            named = " ".join(f"{k}={v}" for k, v in settings.items()) or "default"
            print(f"| {load} | {threads} | {named} | {rate:.0f} | {rate / rates[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
