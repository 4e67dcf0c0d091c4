"""The script every rank runs: `python -m training.launch_entry --spec <run_dir>/spec.json`.

Under `torchrun` / `deepspeed` each rank joins the process group, builds (or loads) the model, reads its
shard of batches and runs the same `Trainer`. Rank 0 reports metrics (JSON lines + spec callbacks), writes
the HF export and `result.json`; every rank writes `result_rank<r>.json` with a digest of its final weights.
Any exception exits non-zero, so the launcher fails the run.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

import torch

from training.checkpoint import STEP_DIR, export_hf, latest_checkpoint
from training.distributed import DeepSpeedEngine, init_process_group
from training.job import TrainJobSpec, import_object
from training.model import build_model, load_model, parameter_counts
from training.trainer import JsonlMetricsWriter, Trainer

log = logging.getLogger("training.launch_entry")


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the state dict (names and bytes): equal digests = bit-identical weights."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(path)


def run(spec: TrainJobSpec) -> dict:
    """Run the phase in this process (one rank); returns the result dict (rank 0's is also written)."""
    run_dir = Path(spec.run_dir)
    if spec.distributed.threads_per_process:
        torch.set_num_threads(spec.distributed.threads_per_process)
    rank, world_size = init_process_group(spec.distributed)
    if spec.init_from:
        model = load_model(spec.init_from, spec.model)
    else:
        model = build_model(spec.model, seed=spec.trainer.seed)
    if spec.distributed.engine == "torch" and torch.cuda.is_available():  # DeepSpeed places the model itself
        model.to(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    counts = parameter_counts(model)
    log.info(
        "model: %.2fM parameters (%.2fM active per token)", counts["total"] / 1e6, counts["active"] / 1e6
    )
    batches = import_object(spec.data.factory)(rank=rank, world_size=world_size, **spec.data.kwargs)
    eval_batches = None
    if spec.eval_data is not None:
        eval_batches = import_object(spec.eval_data.factory)(
            rank=rank, world_size=world_size, **spec.eval_data.kwargs
        )

    callbacks = []
    if rank == 0:
        writer = JsonlMetricsWriter(run_dir / "metrics.jsonl")
        resume = latest_checkpoint(run_dir / "checkpoints")
        writer.drop_after(int(STEP_DIR.match(resume.name).group(1)) if resume else 0)
        callbacks = [writer] + [import_object(path)(spec) for path in spec.callbacks]
    engine = None
    if spec.distributed.engine == "deepspeed":
        engine = functools.partial(
            DeepSpeedEngine,
            dist_cfg=spec.distributed,
            grad_accum_steps=spec.trainer.grad_accum_steps,
            grad_clip=spec.trainer.grad_clip,
        )
    trainer = Trainer(model, spec.trainer, batches, run_dir, eval_batches, callbacks, engine)
    metrics = trainer.fit()

    digest = weights_digest(model)
    _write_json(run_dir / f"result_rank{rank}.json", {"weights_digest": digest, "step": trainer.step})
    result = {
        "step": trainer.step,
        "tokens": trainer.tokens_seen,
        "world_size": world_size,
        "metrics": metrics,
        "parameters": counts,
        "weights_digest": digest,
        "checkpoint": str(latest_checkpoint(run_dir / "checkpoints")),
        "hf_dir": None,
    }
    if rank == 0:
        if spec.export_hf:
            extra = {name: Path(src) for name, src in spec.extra_files.items()}
            result["hf_dir"] = str(export_hf(model, run_dir / "hf", extra))
        _write_json(run_dir / "result.json", result)
    trainer.engine.barrier()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="TrainJobSpec JSON file")
    parser.add_argument(
        "--local_rank", "--local-rank", type=int, default=None, help="set by the deepspeed CLI"
    )
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s [rank {rank}] %(name)s: %(message)s"
    )
    spec = TrainJobSpec.model_validate_json(args.spec.read_text())
    run(spec)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
