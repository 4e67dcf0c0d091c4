"""A policy checkpoint served over HTTP for rollouts, by `infra/llm_server.py`:

    python -m infra.llm_server --factory training.rollout.serving:make_policy_server_model \\
        --factory-arg path=HF_DIR [--factory-arg dtype=float32] [--factory-arg threads=2] \\
        [--factory-arg prefix_cache_tokens=N]

The server runs the same `LocalRolloutEngine` as in-process rollouts, so on the same checkpoint and dtype its
greedy outputs and log-probs are the local engine's. `reload_weights` reads an HF dir (what
`HttpRolloutEngine.sync_weights` writes) and copies it into the serving engine; a dir that is not a model
of this architecture is refused before any weight changes. infra/ only sees the `TokenCompletionModel`
protocol; the model code stays in training/.

With `prefix_cache_tokens=N` (> 0) the server runs `PrefixCachingEngine` (training/rollout/prefix_cache.py):
up to N tokens of KV cache reused across requests that share a prefix; `GET /health` then reports its hit
counters under `prefix_cache`.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import torch

from infra.llm_server import ChatOutput, InvalidRequest, TokenCompletion, TokenLogprob
from training.model import load_model
from training.rollout.engine import LocalRolloutEngine, SamplingParams
from training.rollout.prefix_cache import PrefixCachingEngine
from training.tokenizer import END_OF_TURN, load_tokenizer

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def model_dir_problem(path: Path) -> str | None:
    """Why `path` is not an HF model dir we can load weights from (None when it is one)."""
    if not path.exists():
        return "no such directory"
    if not path.is_dir():
        return "not a directory"
    if not (path / "config.json").is_file():
        return "no config.json"
    if not any(path.glob("*.safetensors")):
        return "no *.safetensors weights"
    return None


def matched_state(own: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`new` checked against the serving model's state dict `own`: the same names and shapes (copy_ would
    broadcast a wrong shape silently). Raises InvalidRequest naming the first differences."""
    missing = sorted(set(own) - set(new))
    unexpected = sorted(set(new) - set(own))
    wrong = sorted(n for n in set(own) & set(new) if own[n].shape != new[n].shape)
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensors missing, e.g. {missing[:3]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensors, e.g. {unexpected[:3]}")
    if wrong:
        n = wrong[0]
        problems.append(
            f"{len(wrong)} shape mismatches, e.g. {n}: {tuple(new[n].shape)} vs {tuple(own[n].shape)}"
        )
    if problems:
        raise InvalidRequest("weights do not fit the served model: " + "; ".join(problems))
    return new


class PolicyServerModel:
    """A checkpoint behind the OpenAI-compatible server: token completions (and chat, when the dir has a
    tokenizer) from a `LocalRolloutEngine` in `dtype`, with weight reloads that bump the policy version."""

    def __init__(
        self,
        path: str | Path,
        dtype: str = "bfloat16",
        threads: int | None = None,
        prefix_cache_tokens: int = 0,
    ):
        path = Path(path)
        problem = model_dir_problem(path)
        if problem:
            raise ValueError(f"{path} is not an HF model dir: {problem}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {sorted(DTYPES)}")
        if threads:
            torch.set_num_threads(int(threads))
        started = time.time()
        model = load_model(path)
        self.tokenizer = load_tokenizer(path) if (path / "tokenizer.json").is_file() else None
        config = model.config
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else config.pad_token_id
        pad_id = 1 if pad is None else int(pad)
        if prefix_cache_tokens:
            self.engine: LocalRolloutEngine = PrefixCachingEngine(
                model, dtype=DTYPES[dtype], pad_id=pad_id, max_cached_tokens=prefix_cache_tokens
            )
        else:
            self.engine = LocalRolloutEngine(model, dtype=DTYPES[dtype], pad_id=pad_id)
        del model
        eos = self.tokenizer.eos_token_id if self.tokenizer is not None else config.eos_token_id
        self.eos_token_id: int | None = eos
        self.vocab_size = int(config.vocab_size)
        self.name = path.name
        self._lock = threading.Lock()  # one generation or weight swap at a time
        log.info("serving %s (%s) in %.1f s", path, dtype, time.time() - started)

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def health_info(self) -> dict:
        """Extra `GET /health` fields: the prefix cache's counters when the engine has one."""
        if isinstance(self.engine, PrefixCachingEngine):  # no lock: /health must answer during a generation
            return {"prefix_cache": self.engine.cache_stats()}
        return {}

    def complete(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop_token_ids: list[int],
        seed: int,
    ) -> list[TokenCompletion]:
        """One batch through the local engine; token ids outside the vocabulary are the client's error."""
        for i, prompt in enumerate(prompts):
            if not prompt or max(prompt) >= self.vocab_size:
                raise InvalidRequest(f"prompt {i}: token ids must be in [0, {self.vocab_size})")
        params = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop_token_ids=tuple(stop_token_ids),
            seed=seed,
        )
        with self._lock:
            generations = self.engine.generate(prompts, params)
        tok = self.tokenizer
        return [
            TokenCompletion(
                token_ids=g.token_ids,
                logprobs=g.logprobs,
                finish_reason=g.finish_reason,
                policy_version=g.policy_version,
                stop_token=g.stop_token,
                text=tok.decode(g.token_ids, skip_special_tokens=True) if tok is not None else "",
                tokens=[tok.decode([t]) for t in g.token_ids] if tok is not None else None,
            )
            for g in generations
        ]

    def reload_weights(self, path: str, version: int) -> None:
        """Copy the weights of the HF dir `path` into the serving engine as `version`. Everything is read and
        checked before the swap, so a refused dir leaves the old weights serving."""
        directory = Path(path)
        problem = model_dir_problem(directory)
        if problem:
            raise InvalidRequest(f"{path} is not an HF model dir: {problem}")
        try:  # from_pretrained: the HF checkpoint layout (per-expert tensors) becomes the runtime one
            loaded, info = type(self.engine.model).from_pretrained(
                str(directory), dtype=torch.float32, output_loading_info=True
            )
        except Exception as exc:  # a foreign config, a truncated file, another architecture's shapes
            raise InvalidRequest(f"cannot load {path}: {type(exc).__name__}: {str(exc)[:300]}") from exc
        incomplete = {k: sorted(v)[:3] for k, v in info.items() if k != "error_msgs" and v}
        if incomplete or info.get("error_msgs"):
            raise InvalidRequest(
                f"{path} does not hold this model's weights: {incomplete or info['error_msgs']}"
            )
        state = matched_state(self.engine.model.state_dict(), loaded.state_dict())
        with self._lock:
            self.engine.sync_weights(state, version)

    def chat(
        self, messages: list[dict], max_tokens: int = 16, temperature: float = 0.0, top_logprobs: int = 0
    ) -> ChatOutput:
        """The chat API over the same engine (the tokenizer's chat template; stops at end-of-turn or EOS)."""
        if self.tokenizer is None:
            raise ValueError(f"{self.name} has no tokenizer: chat needs one, use /v1/completions")
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        ends = (self.eos_token_id, self.tokenizer.convert_tokens_to_ids(END_OF_TURN))
        stops = [int(t) for t in ends if t is not None]  # EOS is id 0: test for None, not truthiness
        out = self.complete([list(ids)], max_tokens, temperature, 1.0, stops, seed=0)[0]
        logprobs = None
        if top_logprobs:  # the engine gives the sampled token's log-prob only, no alternatives
            logprobs = [TokenLogprob(t, lp) for t, lp in zip(out.tokens or [], out.logprobs, strict=True)]
        return ChatOutput(out.text, len(ids), len(out.token_ids), logprobs, out.finish_reason)


def make_policy_server_model(
    path: str, dtype: str = "bfloat16", threads: str | None = None, prefix_cache_tokens: str = "0"
) -> PolicyServerModel:
    """The `--factory` entry point: `--factory-arg path=DIR [--factory-arg dtype=float32]
    [--factory-arg prefix_cache_tokens=N]`."""
    return PolicyServerModel(
        path,
        dtype=dtype,
        threads=int(threads) if threads else None,
        prefix_cache_tokens=int(prefix_cache_tokens),
    )
