"""The trainer's LM loss: `F.cross_entropy(logits.float(), ...)` vs `training.logits.summed_cross_entropy`.

Baseline ("torch"): `F.cross_entropy(logits.float(), targets, reduction="sum")`, as the trainer computed it
before: an fp32 copy of the [N, V] logits, an fp32 log-softmax kept for backward, a zero-filled gradient.
Ours ("chunked"): the same sum over 64-row chunks upcast one at a time, softmax recomputed in backward.
Measured twice, in one process, interleaved per repeat (median):
  1. the loss alone, forward + backward, on bf16 logits of pre-training's shape (8 x 256 rows, tiny's vocab);
  2. whole pre-training steps of the `tiny` model (`training.trainer.Trainer`, dense, bf16 autocast where the
     CPU has it), the trainer's loss function swapped between the two.

    .venv/bin/python benchmarks/cross_entropy.py [--rows 2048] [--repeats 5] [--steps 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import training.trainer as trainer_module
from training.batch_source import SyntheticBatches
from training.logits import summed_cross_entropy
from training.model import ModelConfig, build_model
from training.trainer import Trainer, TrainerConfig


def torch_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets, reduction="sum")


LOSSES = {"torch (baseline)": torch_loss, "chunked": summed_cross_entropy}


def loss_seconds(fn, logits: torch.Tensor, targets: torch.Tensor, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        x = logits.detach().clone().requires_grad_()
        start = time.perf_counter()
        fn(x, targets).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_seconds(fn, args) -> float:
    trainer_module.summed_cross_entropy = fn
    cfg = TrainerConfig(steps=args.steps + 2, progress=False, eval_every=0, checkpoint_every=0,
                        log_every=1, dsa_mode="dense", optim={"warmup_steps": 0})  # fmt: skip
    model = build_model(ModelConfig(), seed=0)
    batches = SyntheticBatches(model.config.vocab_size, args.batch, args.seq_len, seed=0)
    times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        tokens = args.batch * args.seq_len  # log_every=1: tokens_per_s is one step's
        trainer = Trainer(model, cfg, batches, Path(tmp),
                          callbacks=[lambda _, m: times.append(tokens / m["tokens_per_s"])])  # fmt: skip
        trainer.fit()
    return statistics.median(times[2:])  # the first steps warm the allocator up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="timed trainer steps per repeat")
    args = parser.parse_args()
    vocab = ModelConfig().vocab_size
    rows = args.batch * (args.seq_len - 1)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    print(f"{torch.get_num_threads()} threads; loss on {rows} x {vocab} bf16 logits; trainer steps of "
          f"{args.batch} x {args.seq_len} tokens (tiny)")  # fmt: skip
    alone: dict[str, list[float]] = {name: [] for name in LOSSES}
    steps: dict[str, list[float]] = {name: [] for name in LOSSES}
    for _ in range(args.repeats):
        for name, fn in LOSSES.items():
            alone[name].append(loss_seconds(fn, logits, targets))
            steps[name].append(step_seconds(fn, args))
    base_alone, base_step = (statistics.median(d["torch (baseline)"]) for d in (alone, steps))
    for name in LOSSES:
        a, s = statistics.median(alone[name]), statistics.median(steps[name])
        print(f"{name:18s} loss fwd+bwd {a * 1e3:7.1f} ms ({base_alone / a:.2f}x)   "
              f"trainer step {s * 1e3:7.1f} ms ({base_step / s:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
