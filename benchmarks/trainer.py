"""Trainer throughput vs a plain forward/backward/step loop on the same model and batch.

Baseline ("plain loop"): `transformers`' own forward with `labels=` (its loss), torch AdamW, zero_grad, in the
trainer's precision: what one writes first. Ours: `training.trainer.Trainer` as pre-training runs it (dense DSA
mode, Muon + AdamW by default, MoE balance loss and bias update, clipping, metrics). Same weights, same batch,
measured in the same process; median tokens/s over the timed steps (the box is shared, medians are stabler).
The plain loop also runs under the other precision (bf16 autocast vs fp32), which shows what `precision:
auto` saves on a CPU without bf16 arithmetic (emulated bf16).

    .venv/bin/python benchmarks/trainer.py [--size tiny] [--steps 12] [--optimizer muon] [--precision auto]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from training.batch_source import SyntheticBatches
from training.model import ModelConfig, build_model, parameter_counts
from training.trainer import Trainer, TrainerConfig, resolve_precision


class SameBatch:
    """Yields one fixed batch forever (both loops see identical inputs)."""

    def __init__(self, batch):
        self.batch = batch

    def __iter__(self):
        return self

    def __next__(self):
        return self.batch

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def plain_loop(model, batch, steps: int, warmup: int, precision: str) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return [batch["input_ids"].numel() / t for t in times]


def our_trainer(
    model, batch, steps: int, warmup: int, optimizer: str, dsa_mode: str, precision: str, run_dir: Path
) -> list[float]:
    reports: list[float] = []
    cfg = TrainerConfig(
        steps=warmup + steps,
        log_every=1,
        eval_every=0,
        checkpoint_every=0,
        progress=False,
        dsa_mode=dsa_mode,
        precision=precision,
        optim={"optimizer": optimizer, "warmup_steps": 0},
    )
    trainer = Trainer(
        model, cfg, SameBatch(batch), run_dir, callbacks=[lambda s, m: reports.append(m["tokens_per_s"])]
    )
    trainer.fit()
    return reports[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny", choices=["micro", "tiny"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per loop")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--optimizer", default="muon", choices=["muon", "adamw"])
    parser.add_argument(
        "--dsa-mode", default="dense", choices=["dense", "native", "sparse"], help="dense = pre-training"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    precision = resolve_precision(args.precision, torch.device("cpu"))
    other = "fp32" if precision == "bf16" else "bf16"

    cfg = ModelConfig.for_size(args.size)
    batch = SyntheticBatches(cfg.vocab_size, args.batch_size, args.seq_len, seed=0).batch_at(0)
    counts = parameter_counts(build_model(cfg))
    print(
        f"model {args.size}: {counts['total'] / 1e6:.2f}M params ({counts['active'] / 1e6:.2f}M active), "
        f"batch {args.batch_size}x{args.seq_len}, {precision} ({args.precision}), {torch.get_num_threads()} threads"
    )
    with tempfile.TemporaryDirectory() as tmp:
        # Interleave the two measurements so drifting load on the shared box hits both.
        plain, plain_other, ours = [], [], []
        for rnd in range(2):
            plain += plain_loop(build_model(cfg), batch, args.steps // 2, args.warmup, precision)
            plain_other += plain_loop(build_model(cfg), batch, args.steps // 2, args.warmup, other)
            ours += our_trainer(
                build_model(cfg),
                batch,
                args.steps // 2,
                args.warmup,
                args.optimizer,
                args.dsa_mode,
                precision,
                Path(tmp) / str(rnd),
            )
    base, mine, base_other = statistics.median(plain), statistics.median(ours), statistics.median(plain_other)
    print(f"{'loop':<40}{'tokens/s (median)':>18}")
    print(f"{f'plain loop (HF loss, AdamW, {precision})':<40}{base:>18.0f}")
    print(f"{f'plain loop (HF loss, AdamW, {other})':<40}{base_other:>18.0f}")
    print(f"{f'Trainer ({args.optimizer}, {args.dsa_mode} DSA, {precision})':<40}{mine:>18.0f}")
    print(f"ratio Trainer / plain loop: {mine / base:.2f}x")
    print(f"ratio plain loop {precision} / {other}: {base / base_other:.2f}x")


if __name__ == "__main__":
    main()
