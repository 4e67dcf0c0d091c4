"""DP-aware routing: prefix-cache hit rate of consistent-hash affinity routing vs round-robin on the same
multi-turn workload over prefix-caching replicas (training/rollout/prefix_cache.py behind the TITO gateway).

    .venv/bin/python benchmarks/routing.py                        # 16 rollouts x 3 turns, 2 replicas, micro
    .venv/bin/python benchmarks/routing.py --rollouts 32 --turns 4 --replicas 4
    .venv/bin/python benchmarks/routing.py --checkpoint DIR       # an HF dir with tokenizer.json (e.g. SFT)
    .venv/bin/python benchmarks/routing.py --servers              # real policy servers (infra/llm_server.py)

The workload: `--rollouts` trajectories in groups of `--group` on the same chat prompt; each turn generates to
the end of the turn, then appends a tool observation (the chat template's tokens); within a turn the
rollouts come in a shuffled order (seeded, the same for both routers), as an asynchronous loop interleaves
them. Without `--checkpoint`, a freshly initialised micro model and a tokenizer trained on a few lines.
Prints per router: hit rate (hit tokens / prompt tokens), tokens computed (prompt misses + generated
tokens forwarded), requests per replica and wall time.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch

from training.agentic.gateway import TitoGateway
from training.agentic.routing import ConsistentHashRouter, RoundRobinRouter
from training.model import ModelConfig, build_model, load_model
from training.rollout.engine import SamplingParams
from training.rollout.multiturn import observation_ids
from training.rollout.prefix_cache import PrefixCachingEngine
from training.tokenizer import END_OF_TURN, TokenizerConfig, load_tokenizer, train_tokenizer

QUESTIONS = [
    "list the files in /tmp and count the logs",
    "fix the add function so the tests pass",
    "which document says who sat on the mat?",
    "count the error lines in out.log",
    "rename notes.txt to todo.txt",
    "find the failing test and explain it",
]
CORPUS = [
    "the cat sat on the mat. the dog ate the bone. then they sat together in the sun.",
    "ls -la /tmp && cat notes.txt | grep error; echo done > out.log",
    "def add(a, b):\n    return a + b\n\nassert add(2, 3) == 5",
] * 30


def model_and_tokenizer(checkpoint: str | None, workdir: Path):
    if checkpoint:
        return load_model(checkpoint).eval(), load_tokenizer(checkpoint), Path(checkpoint)
    tokenizer = load_tokenizer(train_tokenizer(CORPUS, TokenizerConfig(vocab_size=320), workdir / "tok"))
    cfg = ModelConfig.for_size(
        "micro", vocab_size=len(tokenizer), bos_token_id=0, eos_token_id=0, pad_token_id=1, index_topk=512
    )
    return build_model(cfg, seed=0).eval(), tokenizer, None


def run_workload(gateway, tokenizer, args) -> None:
    """All rollouts, turn by turn, in a seeded shuffled order per turn."""
    stop = (tokenizer.convert_tokens_to_ids(END_OF_TURN),)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, stop_token_ids=stop, seed=0)
    seqs = {}
    for i in range(args.rollouts):
        q = QUESTIONS[(i // args.group) % len(QUESTIONS)]
        messages = [{"role": "user", "content": q}]
        seqs[f"r{i}"] = list(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
        )
    order = random.Random(args.seed)
    for turn in range(args.turns):
        for rid in order.sample(sorted(seqs), len(seqs)):
            out = gateway.generate(rid, seqs[rid], replace(params, seed=args.seed))
            seqs[rid] += out.token_ids
            if turn + 1 < args.turns:
                seqs[rid] += observation_ids(tokenizer, f"exit 0 after {turn + 1} steps; {rid}: 3 matches")


def measure(name: str, router, model, tokenizer, ckpt_dir, args, stack: ExitStack) -> dict:
    replicas = [f"replica-{i}" for i in range(args.replicas)]
    if args.servers:
        from infra.llm_server import llm_server_process
        from training.rollout.http_engine import HttpRolloutEngine

        engines = {}
        for r in replicas:
            url = stack.enter_context(
                llm_server_process(
                    "--factory",
                    "training.rollout.serving:make_policy_server_model",
                    "--factory-arg",
                    f"path={ckpt_dir}",
                    "--factory-arg",
                    "dtype=float32",
                    "--factory-arg",
                    "threads=1",
                    "--factory-arg",
                    f"prefix_cache_tokens={args.cache_tokens}",
                )
            )
            engines[r] = HttpRolloutEngine(url, timeout_s=120)
    else:
        engines = {
            r: PrefixCachingEngine(model, dtype=torch.float32, max_cached_tokens=args.cache_tokens)
            for r in replicas
        }
    for r in replicas:
        router.add(r)
    gateway = TitoGateway(engines, router)
    started = time.perf_counter()
    run_workload(gateway, tokenizer, args)
    wall = time.perf_counter() - started
    stats = gateway.stats()
    cache = stats["prefix_cache"]
    computed = sum(int(v["prefix_cache"]["computed_tokens"]) for v in stats["replicas"].values())
    served = {r: v["served"] for r, v in stats["replicas"].items()}
    return {"router": name, **cache, "computed_tokens": computed, "served": served, "wall_s": wall}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt (a GRPO group)")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=16, help="max new tokens per turn")
    parser.add_argument("--cache-tokens", type=int, default=8192, help="prefix-cache budget per replica")
    parser.add_argument("--checkpoint", help="HF model dir with tokenizer.json; default: a fresh micro model")
    parser.add_argument("--servers", action="store_true", help="replicas are policy-server subprocesses")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (in-process replicas)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model, tokenizer, ckpt_dir = model_and_tokenizer(args.checkpoint, Path(tmp))
        if args.servers and ckpt_dir is None:
            from training.checkpoint import export_hf

            tok_files = {f.name: f for f in (Path(tmp) / "tok").iterdir() if f.is_file()}
            ckpt_dir = export_hf(model, Path(tmp) / "ckpt", tok_files)
        rows = [
            measure("affinity", ConsistentHashRouter(), model, tokenizer, ckpt_dir, args, stack),
            measure("round-robin", RoundRobinRouter(), model, tokenizer, ckpt_dir, args, stack),
        ]
    print(
        f"workload: {args.rollouts} rollouts x {args.turns} turns (groups of {args.group}), "
        f"{args.replicas} replicas, {'servers' if args.servers else 'in-process'}, "
        f"cache {args.cache_tokens} tokens/replica"
    )
    print(
        f"{'router':<12} {'hit rate':>8} {'prompt tok':>10} {'hit tok':>8} {'computed':>9} {'wall s':>7}  served"
    )
    for r in rows:
        print(
            f"{r['router']:<12} {r['hit_rate']:>8.3f} {r['prompt_tokens']:>10} {r['hit_tokens']:>8} "
            f"{r['computed_tokens']:>9} {r['wall_s']:>7.2f}  {r['served']}"
        )
    a, b = rows
    print(
        f"affinity vs round-robin: hit rate {a['hit_rate']:.3f} vs {b['hit_rate']:.3f}, "
        f"tokens computed {a['computed_tokens'] / b['computed_tokens']:.2f}x"
    )
    if a["prompt_tokens"] != b["prompt_tokens"]:
        print("warning: the two runs saw different prompts (different samples)", file=sys.stderr)


if __name__ == "__main__":
    main()
