"""SFT step time: the LM head at every position on padded rows vs at target positions only, padded and packed.

Baseline ("full head, padded"): the trainer as it was before `training/logits.py`: logits at every position
of rows right-padded to the batch's longest. Then the head only where a target follows (`logits_at`), and
then also the rows packed (`training.sft.pack_rows`). The `tiny` model in SFT's DSA mode (`sparse_gather`),
fp32, AdamW; synthetic chats shaped like tiny's SFT rows (random lengths up to `seq_len`, the loss on the last
~45% of each chat). All three run in one process on the same chats, interleaved per repeat; median seconds
per step.

    .venv/bin/python benchmarks/sft_step.py [--steps 10] [--repeats 3] [--batch 16] [--seq-len 256]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import training.trainer as trainer_module
from training.logits import predicting_positions
from training.model import ModelConfig, build_model
from training.optim import OptimConfig
from training.sft import RenderedChat, SftBatches
from training.trainer import Trainer, TrainerConfig


def every_position(labels: torch.Tensor) -> torch.Tensor:
    keep = torch.ones_like(labels, dtype=torch.bool)
    keep[:, -1] = False  # the last position predicts nothing, as `logits[:, :-1]` did
    return keep


def chats(n: int, seq_len: int, vocab: int, seed: int = 0) -> list[RenderedChat]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(24, seq_len + 1, (1,), generator=g))
        prompt = int(length * 0.55)
        ids = torch.randint(2, vocab, (length,), generator=g).tolist()
        out.append(RenderedChat(ids, [0] * prompt + [1] * (length - prompt)))
    return out


def seconds_per_step(rows, args, pack: bool, head_at_targets: bool) -> float:
    trainer_module.predicting_positions = predicting_positions if head_at_targets else every_position
    cfg = TrainerConfig(
        steps=args.steps, progress=False, eval_every=0, checkpoint_every=0, dsa_mode="sparse_gather",
        precision="fp32", moe_aux_loss_coef=0.0, optim=OptimConfig(optimizer="adamw", warmup_steps=0),
    )  # fmt: skip
    model = build_model(ModelConfig(), seed=0)
    batches = SftBatches(rows, args.batch, args.seq_len, pad_id=1, seed=0, pack=pack)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model, cfg, batches, Path(tmp))
        start = time.perf_counter()
        trainer.fit()
        return (time.perf_counter() - start) / args.steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    rows = chats(args.batch * args.steps, args.seq_len, ModelConfig().vocab_size)
    variants = {
        "full head, padded (baseline)": (False, False),
        "head at targets, padded": (False, True),
        "head at targets, packed": (True, True),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, (pack, at_targets) in variants.items():
            times[name].append(seconds_per_step(rows, args, pack, at_targets))
    base = statistics.median(times["full head, padded (baseline)"])
    print(
        f"SFT step, tiny model, batch {args.batch}, seq_len {args.seq_len}, {torch.get_num_threads()} threads"
    )
    for name, ts in times.items():
        median = statistics.median(ts)
        print(f"  {name:32s} {median:6.3f} s/step   {base / median:4.2f}x the baseline")


if __name__ == "__main__":
    main()
