"""Asynchronous vs synchronous Agentic RL on the same workload, cores and model: the agentic families
(terminal, codefix, search) with a long-tailed extra environment latency, the trainer and the rollout worker
as separate processes in both runs.

- sync: the worker keeps exactly one batch of groups in flight and pauses while the trainer steps (a
  synchronous loop: generation, environment waits and training never overlap across batches);
- async: the worker keeps `--oversample` times as many groups in flight and never pauses.

Prints steady-state trajectories/s of each (steps 2..N), trainer idle fraction, the speedup, and the ceiling
1/u of the sync run, where u = (engine time + training time) / wall time is the share of the sync run in which
the compute was busy (the rest is environment latency nothing overlapped); the target is >= 80% of it.

    .venv/bin/python benchmarks/async_rl.py                         # a fresh micro model, in-process families
    .venv/bin/python benchmarks/async_rl.py --checkpoint HF_DIR     # e.g. the tiny Reasoning RL checkpoint
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from training.agentic.async_loop import AgenticRLConfig, WorkerSpec, train_agentic_rl
from training.agentic.families import AgenticTasksConfig, build_agentic_task_sets
from training.checkpoint import export_hf
from training.model import ModelConfig, build_model, load_model
from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

FACTS = [
    (f"term{i}", f"a word for the {w} kind of thing that is also called term{(i * 7 + 3) % 60}")
    for i, w in enumerate(["red", "blue", "green", "gold", "pink", "gray"] * 10)
]


def _policy(args, work: Path, prompts: list[str]) -> tuple[Path, object, object]:
    if args.checkpoint:
        hf = Path(args.checkpoint)
        return hf, load_model(hf), load_tokenizer(hf)
    tok_dir = train_tokenizer(prompts * 4, TokenizerConfig(vocab_size=512), work / "tok")
    tok = load_tokenizer(tok_dir)
    cfg = ModelConfig.for_size("micro", vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=1)
    extra = {n: tok_dir / n for n in ("tokenizer.json", "tokenizer_config.json")}
    return export_hf(build_model(cfg, seed=0), work / "hf", extra), None, tok


def _run(
    mode: str, args, hf: Path, tasks, tok, facts_json: Path, work: Path, oversample: int
) -> dict[str, float]:
    groups = args.batch // args.group
    in_flight = groups if mode == "sync" else groups * oversample
    cfg = AgenticRLConfig(
        steps=args.steps, group_size=args.group, batch_trajectories=args.batch, in_flight_groups=in_flight,
        push_every=1, max_staleness=oversample, mode=mode, max_new_tokens=args.new_tokens, max_turns=3,
        rollout_replicas=2, env_threads=in_flight * args.group, seed=0,
    )  # fmt: skip
    domains = ["terminal", "codefix", "search"]
    spec = WorkerSpec(
        hf_dir=str(hf), tasks=[t.to_json() for t in tasks], environments="training.agentic.job:local_environments",
        environment_kwargs={
            "facts_json": str(facts_json), "domains": domains, "latency_mean_s": args.latency,
            "latency_sigma": args.sigma,
        },
        config=cfg, pad_id=tok.pad_token_id, threads=1,
    )  # fmt: skip
    model = load_model(hf)
    stamps: list[tuple[float, dict]] = []
    final = train_agentic_rl(
        model, spec, work / mode, lambda m, s: stamps.append((time.perf_counter(), dict(m)))
    )
    (t1, first), (tn, last) = stamps[0], stamps[-1]
    window = tn - t1
    samples = last["trained_samples"] - first["trained_samples"]
    busy = (last.get("worker/generate_s", 0) - first.get("worker/generate_s", 0)) + (
        last["trainer/train_s"] - first["trainer/train_s"]
    )
    return {
        "trajectories_per_s": samples / window,
        "window_s": window,
        "idle_fraction": final["trainer/idle_fraction"],
        "utilisation": busy / window,
        "engine_tokens_per_s": (
            last.get("worker/generated_tokens", 0) - first.get("worker/generated_tokens", 0)
        )
        / max(1e-9, last.get("worker/generate_s", 0) - first.get("worker/generate_s", 0)),
        "train_s_per_step": (last["trainer/train_s"] - first["trainer/train_s"]) / max(1, len(stamps) - 1),
        "generated_tokens_per_trajectory": (
            last.get("worker/generated_tokens", 0) - first.get("worker/generated_tokens", 0)
        )
        / max(1, samples),
        "staleness_mean": sum(m["staleness/mean"] for _, m in stamps) / len(stamps),
        "env_failures": final["buffer/env_failures"],
        "stale_dropped": final["buffer/stale"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="HF dir of a policy (default: a fresh micro model)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16, help="trajectories per optimizer step")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument(
        "--oversample", type=int, default=0,
        help="async: batches in flight (0 = ceil(1/u) of the sync run, at most --max-oversample)",
    )  # fmt: skip
    parser.add_argument("--max-oversample", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--latency", type=float, default=0.3, help="mean extra seconds per tool call / finish"
    )
    parser.add_argument("--sigma", type=float, default=1.5, help="lognormal sigma of the latency (long tail)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="async-rl-bench-"))
    facts_json = work / "facts.json"
    facts_json.write_text(json.dumps([list(f) for f in FACTS]))
    sets = build_agentic_task_sets(
        AgenticTasksConfig(levels={"terminal": [1], "codefix": [1], "search": [1]}, train_per_level=40,
                           heldout_per_level=4, heldout_for={}, max_facts=len(FACTS)),
        FACTS,
    )  # fmt: skip
    hf, _, tok = _policy(args, work, [t.prompt for t in sets["train"]])
    print(f"workload: {len(sets['train'])} tasks, batch {args.batch} (groups of {args.group}), {args.steps} steps, "
          f"latency mean {args.latency} s sigma {args.sigma}, policy {args.checkpoint or 'fresh micro'}", flush=True)  # fmt: skip
    results = {"sync": _run("sync", args, hf, sets["train"], tok, facts_json, work, 1)}
    print("sync", {k: round(v, 3) for k, v in results["sync"].items()}, flush=True)
    # Little's law: to keep the compute busy, about 1/u batches must be in flight
    oversample = args.oversample or min(args.max_oversample, math.ceil(1 / results["sync"]["utilisation"]))
    results["async"] = _run("async", args, hf, sets["train"], tok, facts_json, work, oversample)
    print(
        f"async (oversample {oversample})", {k: round(v, 3) for k, v in results["async"].items()}, flush=True
    )
    sync, asyn = results["sync"], results["async"]
    speedup = asyn["trajectories_per_s"] / sync["trajectories_per_s"]
    ceiling = 1.0 / sync["utilisation"]
    print("\n| run | trajectories/s | trainer idle | compute busy (u) |\n|---|---|---|---|")
    for mode, r in results.items():
        print(
            f"| {mode} | {r['trajectories_per_s']:.2f} | {r['idle_fraction']:.0%} | {r['utilisation']:.0%} |"
        )
    print(f"\nspeedup async/sync {speedup:.2f}x; ceiling 1/u of the sync run {ceiling:.2f}x; "
          f"reached {speedup / ceiling:.0%} of it (target >= 80%)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
