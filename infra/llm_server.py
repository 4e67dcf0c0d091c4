"""A small OpenAI-compatible chat server around an in-process model (a GGUF file, a HF model directory, or
any object with a `chat()` method).

It speaks the subset of the API that judges and rollouts use: `POST /v1/chat/completions` (non-streaming,
`max_tokens`, `temperature`, `logprobs` + `top_logprobs`), `GET /v1/models`, `GET /health`, and `GET /stats`
(request counters, so tests can assert how many calls a client made). Tests start it as a subprocess on
127.0.0.1; it also serves as a local endpoint for a judge when no vLLM / llama.cpp server is around.

A model that also implements `TokenCompletionModel` (a policy checkpoint for RL rollouts) gets, in addition:
- `POST /v1/completions` with token ids as the prompt, mirroring vLLM's extensions: `prompt` is a list of
  ids or a list of such lists; `max_tokens`, `temperature` (default 1), `top_p`, `n`, `seed`,
  `stop_token_ids`, `ignore_eos`; `logprobs: 0` returns the sampled tokens' log-probs in
  `choices[i].logprobs.token_logprobs` (no top alternatives); `choices[i].token_ids` always holds the
  generated ids (vLLM >= 0.10.2 with `return_token_ids`, which also adds `prompt_token_ids`), and with
  `return_tokens_as_token_ids` the `logprobs.tokens` strings are `token_id:<n>` (vLLM's spelling).
  Choices are ordered prompt-major (`index = prompt * n + sample`); the stop token is kept in `token_ids`
  and named in `stop_reason`. Extension: `policy_version` on the response and on every choice.
- `POST /reload_weights` `{"path": HF dir, "version": int}` (also SGLang's `POST /update_weights_from_disk`
  `{"model_path", "weight_version"}`): loads new weights into the serving engine; a path that is not a model
  dir is a 400 and the old weights keep serving. `GET /health` and SGLang's `GET /get_weight_version` report
  the version; a model with a `health_info() -> dict` method adds its fields to `GET /health` (e.g. a
  prefix cache's hit counters).

    python -m infra.llm_server --gguf PATH [--port 0]          # prints "listening on http://HOST:PORT"
    python -m infra.llm_server --factory package.module:make   # any ChatModel
    python -m infra.llm_server --factory package.module:make --factory-arg path=DIR   # make(path="DIR")
    python -m infra.llm_server --gguf PATH --answer-choices 0,1,2,3,4,5   # a judge that answers one digit
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import re
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from infra.json_http import JsonHandler

log = logging.getLogger(__name__)


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)  # alternatives at this position, best first


@dataclass
class ChatOutput:
    text: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str = "stop"


class ChatModel(Protocol):
    name: str

    def chat(
        self, messages: list[dict], max_tokens: int, temperature: float, top_logprobs: int
    ) -> ChatOutput:
        """Answer a chat; `top_logprobs` > 0 asks for the top alternatives at each generated position."""


class InvalidRequest(ValueError):
    """A request the model refuses (token ids outside the vocabulary, a path that is not a model dir): a 400."""


@dataclass
class TokenCompletion:
    """One generated sequence: token ids, the engine's log-prob of each, and the weights that produced it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (a stop token, kept in token_ids) or "length"
    policy_version: int
    stop_token: int | None = None
    text: str = ""
    tokens: list[str] | None = None  # each token as text, when the model has a tokenizer


class TokenCompletionModel(Protocol):
    """A model served for rollouts: token ids in, token ids and log-probs out, weights reloadable."""

    name: str
    policy_version: int
    eos_token_id: int | None

    def complete(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop_token_ids: list[int],
        seed: int,
    ) -> list[TokenCompletion]:
        """One completion per prompt, generated in one batch; raises InvalidRequest for bad token ids."""

    def reload_weights(self, path: str, version: int) -> None:
        """Serve the weights in the HF dir `path` as `version`; InvalidRequest (old weights kept) if unusable."""


@dataclass
class _PrefixState:
    prefixes: tuple[str, ...]
    cache: Any  # transformers DynamicCache holding the left-padded prefixes
    mask: Any  # [k, width] 1 on prefix tokens, 0 on the left padding
    lengths: Any  # [k] tokens per prefix
    width: int
    next_logprobs: Any  # [k, vocab] log-probs of the token after each prefix


def gguf_hf_dir(gguf: Path) -> Path:
    """A HF directory beside `gguf` holding its de-quantized fp32 weights and its tokenizer (chat template
    included), made on first use. transformers parses and de-quantizes a GGUF on every load, 29 s for
    SmolLM2-135M, and a run loads the judge in 4-5 processes; the directory loads in a second or two. It is
    named by the file's sha256 and written to a temporary directory renamed last, so a killed conversion
    leaves no directory that looks whole, and two processes converting at once both end with the same one."""
    import shutil
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infra.packaged import file_sha256

    target = gguf.with_name(f"{gguf.name}.hf-{file_sha256(gguf)[:16]}")
    if target.is_dir():
        return target
    log.info("converting %s to a HF directory (once): %s", gguf.name, target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{gguf.name}.", dir=gguf.parent))
    # stdout is the server's "listening on" channel: save_pretrained imports deepspeed, which prints there
    try:
        with contextlib.redirect_stdout(sys.stderr):
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
            loaded = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
            config = loaded.config
            if hasattr(config, "quantization_config"):  # GGUF-loaded models refuse save_pretrained
                del config.quantization_config
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            model.load_state_dict(loaded.state_dict())
            model.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():  # not another process's finished conversion: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class TransformersChatModel:
    """A causal LM loaded in-process with transformers: a HF model directory, or a GGUF file (`gguf_file=`).

    Greedy decoding when temperature is 0. `dtype` is the weights' and activations' type; log-probs are taken
    in float32 either way. `next_token_logprobs` gives the distribution over chosen candidate
    tokens right after the prompt, which is how a judge reads a score without sampling.
    """

    def __init__(
        self,
        path: str | Path,
        threads: int | None = None,
        max_input_tokens: int = 2048,
        seed: int = 0,
        dtype: str = "float32",
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        self.threads = threads
        self.name = path.name  # the GGUF file's name for a GGUF: judge cache keys carry it
        started = time.time()
        if path.is_file():  # a GGUF file: de-quantized into a HF directory once, then loaded from there
            path = gguf_hf_dir(path)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype {dtype!r}: use float32 or bfloat16")
        self.dtype = dtype
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
        self.max_input_tokens = max_input_tokens
        self.seed = seed
        self._lock = threading.Lock()  # one forward pass at a time: torch already uses every core we allow
        self._prefix: _PrefixState | None = None  # continuation_logprobs' last prefixes, computed once
        log.info("loaded %s in %.1f s", self.name, time.time() - started)

    @contextmanager
    def _busy(self) -> Iterator[None]:
        """One forward pass at a time, on `threads` torch threads and without grad. torch's thread count is
        the process's: set it for this model's passes only and put it back, or a judge built inside a training
        process (General RL, the report) would leave the whole process on its one thread."""
        import torch

        with self._lock, torch.no_grad():
            before = torch.get_num_threads()
            if self.threads and self.threads != before:
                torch.set_num_threads(self.threads)
            try:
                yield
            finally:
                if torch.get_num_threads() != before:
                    torch.set_num_threads(before)

    def prompt_ids(self, messages: list[dict]):
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)[-self.max_input_tokens :]

    def token_id(self, text: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is not a single token for {self.name}: {ids}")
        return ids[0]

    def next_token_logprobs(
        self, messages: list[dict], candidates: list[str], assistant_prefix: str = ""
    ) -> tuple[dict[str, float], int]:
        """Log-probabilities of each candidate as the first answer token, and the prompt's token count."""
        import torch

        ids = self.prompt_ids(messages)
        if assistant_prefix:
            ids = ids + self.tokenizer.encode(assistant_prefix, add_special_tokens=False)
        with self._busy():
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        return {c: float(logprobs[self.token_id(c)]) for c in candidates}, len(ids)

    def continuation_logprobs(
        self, prefixes: list[str], text: str, max_text_tokens: int = 256
    ) -> tuple[list[float], int]:
        """Mean per-token log-likelihood of `text` (first `max_text_tokens` tokens) after each prefix, in one
        batch; and the number of text tokens scored. A plain-text (not chat) reading of the model.

        The prefixes' keys and values are computed once per prefix list and reused (a judge reads every
        document after the same level descriptions): only the text's tokens go through the model per call."""
        import torch

        text_ids = self.tokenizer.encode(text, add_special_tokens=False)[:max_text_tokens] or [
            self.tokenizer.eos_token_id
        ]
        n, target = len(text_ids), torch.tensor(text_ids)
        with self._busy():
            prefix = self._prefix_state(tuple(prefixes))
            k = len(prefixes)
            first = prefix.next_logprobs[:, text_ids[0]]  # each prefix's last position predicts token 0
            rest = torch.zeros(k, 0)
            if n > 1:
                mask = torch.cat([prefix.mask, torch.ones(k, n - 1, dtype=torch.long)], 1)
                positions = prefix.lengths[:, None] + torch.arange(n - 1)[None]
                try:
                    logits = self.model(
                        target[None, :-1].expand(k, -1), attention_mask=mask, position_ids=positions,
                        past_key_values=prefix.cache, use_cache=True,
                    ).logits.float()  # fmt: skip
                finally:
                    # back to the prefixes alone for the next call (crop takes the tokens to remove, negated)
                    prefix.cache.crop(-(prefix.cache.get_seq_length() - prefix.width))
                picked = torch.log_softmax(logits, dim=-1).gather(2, target[None, 1:, None].expand(k, -1, 1))
                rest = picked[..., 0]
            means = torch.cat([first[:, None], rest], 1).mean(1)
        return [float(m) for m in means], n

    def _prefix_state(self, prefixes: tuple[str, ...]) -> _PrefixState:
        """Keys and values of `prefixes`, left-padded to one width, and each one's next-token log-probs."""
        import torch
        from transformers import DynamicCache

        if self._prefix is not None and self._prefix.prefixes == prefixes:
            return self._prefix
        eos = self.tokenizer.eos_token_id
        rows = [self.tokenizer.encode(p, add_special_tokens=False) or [eos] for p in prefixes]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), eos or 0, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r), 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self.model(
            ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        lengths = torch.tensor([len(r) for r in rows])
        self._prefix = _PrefixState(
            prefixes, cache, mask, lengths, width, torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        )
        return self._prefix

    def chat(
        self, messages: list[dict], max_tokens: int = 16, temperature: float = 0.0, top_logprobs: int = 0
    ) -> ChatOutput:
        import torch

        ids = self.prompt_ids(messages)
        with self._busy():
            torch.manual_seed(self.seed)
            out = self.model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_tokens,
                do_sample=temperature > 0,
                temperature=temperature or None,
                top_p=None,
                top_k=None,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        new_ids = out.sequences[0, len(ids) :].tolist()
        eos = self.tokenizer.eos_token_id
        finish = "stop" if new_ids and new_ids[-1] == eos else "length"
        new_ids = [t for t in new_ids if t != eos]
        logprobs = None
        if top_logprobs:
            logprobs = []
            for tok_id, step_logits in zip(new_ids, out.logits, strict=False):
                lp = torch.log_softmax(step_logits[0].float(), dim=-1)
                top = torch.topk(lp, top_logprobs)
                logprobs.append(
                    TokenLogprob(
                        self.tokenizer.decode([tok_id]),
                        float(lp[tok_id]),
                        [
                            (self.tokenizer.decode([int(i)]), float(v))
                            for v, i in zip(top.values, top.indices, strict=True)
                        ],
                    )
                )
        return ChatOutput(
            self.tokenizer.decode(new_ids, skip_special_tokens=True), len(ids), len(new_ids), logprobs, finish
        )


class ChoiceAnswerModel:
    """Every chat answered with one of `choices` (single tokens): the most likely one as the first answer token,
    like a server-wide grammar (llama.cpp's `--grammar`) or vLLM's `guided_choice`. For a small judge that
    answers a rubric in prose ("The document ...") where a client looks for a digit. The reported log-probs
    are the model's own (log-softmax over the whole vocabulary) for the choices only, best first, so a client
    reads the same distribution as `TransformersChatModel.next_token_logprobs`. Greedy: temperature ignored.
    """

    def __init__(self, model: TransformersChatModel, choices: list[str]):
        for choice in choices:
            model.token_id(choice)  # raises unless each choice is one token
        self.model = model
        self.name = model.name
        self.choices = list(choices)

    def chat(
        self, messages: list[dict], max_tokens: int = 16, temperature: float = 0.0, top_logprobs: int = 0
    ) -> ChatOutput:
        logprobs, n_prompt = self.model.next_token_logprobs(messages, self.choices)
        ranked = sorted(logprobs.items(), key=lambda kv: -kv[1])
        best, best_logprob = ranked[0]
        steps = [TokenLogprob(best, best_logprob, ranked[:top_logprobs])] if top_logprobs else None
        return ChatOutput(best, n_prompt, 1, steps)


_MATH_WORDS = re.compile(
    r"\b(theorem|proof|lemma|equation|integral|derivative|polynomial|matrix|prime|probability|function|"
    r"solve|solution|sum|limit|vector|triangle|angle|algebra|calculus|geometry|integer|fraction)s?\b",
    re.IGNORECASE,
)
_MATH_SYMBOLS = re.compile(r"[=+\-*/^<>]|\d")


class KeywordScorerModel:
    """A tiny deterministic 'judge': scores 0-5 by the density of math words and symbols in the last user
    message. For tests and dry runs of judge clients without a real LLM; answers like `Score: 3`."""

    name = "keyword-scorer"

    def score(self, text: str) -> int:
        words = max(1, len(text.split()))
        density = (3 * len(_MATH_WORDS.findall(text)) + 0.5 * len(_MATH_SYMBOLS.findall(text))) / words
        return max(0, min(5, int(density * 10)))

    def chat(
        self, messages: list[dict], max_tokens: int = 16, temperature: float = 0.0, top_logprobs: int = 0
    ) -> ChatOutput:
        user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        doc = user.split("<document>")[-1].split("</document>")[0]  # score the document, not the rubric
        score = self.score(doc)
        logprobs = None
        if top_logprobs:
            # a peaked distribution around the score, so log-prob weighted parsing has something to read
            top = sorted(((str(s), -1.5 * abs(s - score) - 0.05) for s in range(6)), key=lambda t: -t[1])
            logprobs = [TokenLogprob(str(score), top[0][1], top[:top_logprobs])]
        return ChatOutput(f"{score}", len(user.split()), 1, logprobs)


class OpenAICompatibleServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, model: ChatModel, host: str = "127.0.0.1", port: int = 0):
        super().__init__((host, port), _Handler)
        self.model = model
        self.stats: dict[str, int] = {}
        self.stats_lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def count(self, key: str) -> None:
        with self.stats_lock:
            self.stats[key] = self.stats.get(key, 0) + 1


def chat_completion_response(model_name: str, out: ChatOutput, want_logprobs: bool) -> dict:
    """An OpenAI `chat.completion` object for one choice."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": out.text},
        "finish_reason": out.finish_reason,
        "logprobs": None,
    }
    if want_logprobs and out.logprobs is not None:
        choice["logprobs"] = {
            "content": [
                {
                    "token": t.token,
                    "logprob": t.logprob,
                    "bytes": list(t.token.encode()),
                    "top_logprobs": [
                        {"token": a, "logprob": lp, "bytes": list(a.encode())} for a, lp in t.top
                    ],
                }
                for t in out.logprobs
            ]
        }
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens,
        },
    }


TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token under `return_tokens_as_token_ids`


@dataclass(frozen=True)
class CompletionRequest:
    """A validated `POST /v1/completions` body (token-id prompts only)."""

    prompts: list[list[int]]
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    stop_token_ids: list[int]
    ignore_eos: bool
    seed: int
    logprobs: bool
    tokens_as_token_ids: bool
    return_token_ids: bool


def _token_ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"{what} must be a non-empty list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise InvalidRequest(f"{what} must hold non-negative integer token ids")
    return value


def parse_completion_request(body: dict) -> CompletionRequest:
    """Validate a completions body; raises InvalidRequest naming the field. Text prompts are refused: the
    trainer never re-tokenizes, so the server takes token ids only."""
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
        raise InvalidRequest(
            "prompt: this server takes token ids (a list of ints or a list of lists), not text"
        )
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompts = [_token_ids(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    else:
        prompts = [_token_ids(prompt, "prompt")]
    for unsupported in ("stream", "echo", "suffix", "stop"):  # stop strings: use stop_token_ids
        if body.get(unsupported):
            raise InvalidRequest(f"{unsupported} is not supported by this server")
    if body.get("best_of") not in (None, body.get("n") or 1):
        raise InvalidRequest("best_of is not supported (only best_of == n)")
    if body.get("top_k") not in (None, 0, -1):
        raise InvalidRequest("top_k is not supported (only -1 / 0, no truncation)")
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, True, 0):  # 1 == True: the sampled token only, like 0
        raise InvalidRequest(
            "logprobs: only 0 (the sampled tokens' log-probs); top alternatives are not served"
        )
    try:
        n = int(body.get("n") or 1)
        max_tokens = int(body["max_tokens"]) if body.get("max_tokens") is not None else 16
        temperature = float(body["temperature"]) if body.get("temperature") is not None else 1.0
        top_p = float(body["top_p"]) if body.get("top_p") is not None else 1.0
        seed = int(body["seed"]) if body.get("seed") is not None else secrets.randbelow(2**31)
        stops = body.get("stop_token_ids") or []
        stops = _token_ids(stops, "stop_token_ids") if stops else []
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"bad sampling parameter: {exc}") from exc
    if n < 1 or max_tokens < 1 or temperature < 0 or not 0 < top_p <= 1:
        raise InvalidRequest("need n >= 1, max_tokens >= 1, temperature >= 0 and 0 < top_p <= 1")
    return CompletionRequest(
        prompts=prompts,
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        stop_token_ids=stops,
        ignore_eos=bool(body.get("ignore_eos")),
        seed=seed,
        logprobs=logprobs is not None and logprobs is not False,
        tokens_as_token_ids=bool(body.get("return_tokens_as_token_ids")),
        return_token_ids=bool(body.get("return_token_ids")),
    )


def completion_response(model_name: str, req: CompletionRequest, outs: list[TokenCompletion]) -> dict:
    """An OpenAI `text_completion` object with vLLM's token-id extensions and the policy version."""
    choices = []
    for i, out in enumerate(outs):
        choice: dict[str, Any] = {
            "index": i,
            "text": out.text,
            "token_ids": out.token_ids,
            "logprobs": None,
            "finish_reason": out.finish_reason,
            "stop_reason": out.stop_token,
            "policy_version": out.policy_version,
        }
        if req.return_token_ids:
            choice["prompt_token_ids"] = req.prompts[i // req.n]
        if req.logprobs:
            as_ids = req.tokens_as_token_ids or out.tokens is None
            choice["logprobs"] = {
                "tokens": [f"{TOKEN_ID_PREFIX}{t}" for t in out.token_ids] if as_ids else out.tokens,
                "token_logprobs": out.logprobs,
                "top_logprobs": None,
                "text_offset": None,
            }
        choices.append(choice)
    prompt_tokens = sum(len(p) for p in req.prompts)
    completion_tokens = sum(len(o.token_ids) for o in outs)
    return {
        "id": f"cmpl-{uuid.uuid4().hex[:12]}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "policy_version": outs[0].policy_version,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


_CHAT = "/v1/chat/completions"
_POST_ROUTES = (_CHAT, "/v1/completions", "/reload_weights", "/update_weights_from_disk")


class _Handler(JsonHandler):
    server: OpenAICompatibleServer

    def _error(self, status: int, message: str, extra: dict | None = None) -> None:
        self.server.count(f"errors/{status}")
        error = {"message": message, "type": "invalid_request_error", "code": status}
        self.send_json(status, {"error": error, **(extra or {})})

    def _token_model(self) -> TokenCompletionModel | None:
        model = self.server.model
        return model if hasattr(model, "complete") and hasattr(model, "reload_weights") else None  # type: ignore[return-value]

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        token_model = self._token_model()
        if self.path == "/health":
            health: dict[str, Any] = {"status": "ok"}
            if token_model is not None:
                health["policy_version"] = token_model.policy_version
            extra = getattr(self.server.model, "health_info", None)  # optional: e.g. prefix-cache counters
            if callable(extra):
                health.update(extra())
            self.send_json(200, health)
        elif self.path == "/get_weight_version" and token_model is not None:  # SGLang's name
            self.send_json(200, {"weight_version": str(token_model.policy_version)})
        elif self.path == "/v1/models":
            self.send_json(
                200,
                {
                    "object": "list",
                    "data": [{"id": self.server.model.name, "object": "model", "owned_by": "crucible"}],
                },
            )
        elif self.path == "/stats":
            with self.server.stats_lock:
                self.send_json(200, dict(self.server.stats))
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:  # noqa: N802
        if self.path not in _POST_ROUTES or (self.path != _CHAT and self._token_model() is None):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))  # drain: the connection stays usable
        if self.path == _CHAT:
            self._chat()
        elif self.path in ("/v1/completions", "/reload_weights", "/update_weights_from_disk"):
            if self._token_model() is None:
                self._error(
                    404, f"{self.path}: model {self.server.model.name} serves chat only (no token ids)"
                )
            elif self.path == "/v1/completions":
                self._completions()
            else:
                self._reload_weights()
        else:
            self._error(404, f"no route {self.path}")

    def _completions(self) -> None:
        model = self._token_model()
        assert model is not None
        self.server.count("requests/completions")
        try:
            req = parse_completion_request(self.read_body())
        except (ValueError, TypeError) as exc:  # InvalidRequest is a ValueError
            self._error(400, f"bad request: {exc}")
            return
        stops = list(req.stop_token_ids)
        if not req.ignore_eos and model.eos_token_id is not None and model.eos_token_id not in stops:
            stops.append(model.eos_token_id)  # like vLLM: EOS ends a sequence unless ignore_eos
        prompts = [p for p in req.prompts for _ in range(req.n)]  # prompt-major, as OpenAI orders choices
        try:
            outs = model.complete(prompts, req.max_tokens, req.temperature, req.top_p, stops, req.seed)
        except InvalidRequest as exc:
            self._error(400, f"bad request: {exc}")
            return
        except Exception as exc:
            log.exception("model failed")
            self._error(500, f"model failed: {exc}")
            return
        self.server.count("responses/completions")
        self.send_json(200, completion_response(model.name, req, outs))

    def _reload_weights(self) -> None:
        """Ours: {"path", "version": int}; SGLang's: {"model_path", "weight_version": str} (version optional
        there: the current one + 1). Answers SGLang-style {"success", "message"} plus the policy version."""
        model = self._token_model()
        assert model is not None
        self.server.count("requests/reload_weights")
        try:
            body = self.read_body()
            path = body.get("path") or body.get("model_path")
            if not isinstance(path, str) or not path:
                raise ValueError("path (or model_path) must name an HF model directory")
            version = body.get("version", body.get("weight_version"))
            if version is None and self.path == "/update_weights_from_disk":
                version = model.policy_version + 1
            if version is None or isinstance(version, bool):
                raise ValueError("version must be an integer")
            version = int(version)
        except (ValueError, TypeError) as exc:
            self._error(400, f"bad request: {exc}", {"success": False, "message": str(exc)})
            return
        try:
            model.reload_weights(path, version)
        except InvalidRequest as exc:
            message = f"weights not reloaded, still serving version {model.policy_version}: {exc}"
            self._error(400, message, {"success": False, "message": message})
            return
        except Exception as exc:
            log.exception("reload failed")
            message = f"reload of {path} failed, serving version {model.policy_version}: {exc}"
            self._error(500, message, {"success": False, "message": message})
            return
        self.server.count("reloads")
        log.info("serving %s as policy version %d", path, version)
        self.send_json(
            200,
            {
                "success": True,
                "message": f"loaded {path} as policy version {version}",
                "policy_version": model.policy_version,
                "weight_version": str(model.policy_version),
            },
        )

    def _chat(self) -> None:
        self.server.count("requests/chat")
        try:
            body = self.read_body()
            messages = body["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages must be a non-empty list")
        except (ValueError, KeyError, TypeError) as exc:
            self._error(400, f"bad request: {exc}")
            return
        if body.get("stream"):
            self._error(400, "stream=true is not supported by this server")
            return
        if int(body.get("n", 1)) != 1:
            self._error(400, "only n=1 is supported")
            return
        want_logprobs = bool(body.get("logprobs"))
        top = int(body.get("top_logprobs") or 0) if want_logprobs else 0
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        try:
            out = self.server.model.chat(
                messages,
                max_tokens=max_tokens,
                temperature=float(body.get("temperature") or 0.0),
                top_logprobs=max(top, 1) if want_logprobs else 0,
            )
        except Exception as exc:  # a model failure is the client's 500, not a dead server
            log.exception("model failed")
            self._error(500, f"model failed: {exc}")
            return
        self.server.count("responses/chat")
        self.send_json(200, chat_completion_response(self.server.model.name, out, want_logprobs))


@dataclass(frozen=True)
class LlmEndpoint:
    base_url: str
    model: str
    api_key: str | None = None


def llm_endpoint_from_env(prefix: str = "CRUCIBLE_JUDGE") -> LlmEndpoint | None:
    """`<PREFIX>_URL`, `<PREFIX>_MODEL`, `<PREFIX>_API_KEY` from the environment (None when no URL is set)."""
    import os

    url = os.environ.get(f"{prefix}_URL")
    if not url:
        return None
    return LlmEndpoint(url, os.environ.get(f"{prefix}_MODEL", "default"), os.environ.get(f"{prefix}_API_KEY"))


@contextmanager
def llm_server_process(*args: str, cwd: Path | None = None, startup_timeout_s: float = 120) -> Iterator[str]:
    """Run `python -m infra.llm_server ARGS` in its own process group on a free port; yields its URL and
    stops it (by pid) on exit. For tests and for a local judge endpoint next to a pipeline run."""
    import os
    import signal
    import subprocess

    from infra.settings import REPO_ROOT

    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.llm_server", "--host", "127.0.0.1", "--port", "0", *args],
        cwd=cwd or REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        ready = threading.Timer(startup_timeout_s, proc.kill)  # a server that never prints is killed
        ready.start()
        line = proc.stdout.readline() if proc.stdout else ""
        ready.cancel()
        if not line.startswith("listening on "):
            raise RuntimeError(
                f"infra.llm_server {' '.join(args)} did not start (exit {proc.poll()}): {line!r}"
            )
        yield line.split("listening on ", 1)[1].strip()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def load_factory(spec: str, **kwargs: str) -> ChatModel:
    """`module:callable` -> the ChatModel the callable returns when called with `kwargs`."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)(**kwargs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--gguf", help="a GGUF model file")
    which.add_argument("--hf-dir", help="a Hugging Face model directory")
    which.add_argument("--keyword-scorer", action="store_true", help="the deterministic keyword scorer")
    which.add_argument("--factory", help="module:callable returning a ChatModel")
    parser.add_argument(
        "--factory-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument (a string) for the --factory callable; repeatable",
    )
    parser.add_argument(
        "--answer-choices",
        default=None,
        metavar="A,B,...",
        help="with --gguf / --hf-dir: answer every chat with one of these single tokens (ChoiceAnswerModel)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="with --gguf / --hf-dir: weights' type",
    )
    args = parser.parse_args(argv)
    if args.answer_choices and not (args.gguf or args.hf_dir):
        parser.error("--answer-choices needs --gguf or --hf-dir")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    if args.gguf or args.hf_dir:
        model: ChatModel = TransformersChatModel(
            args.gguf or args.hf_dir, threads=args.threads, dtype=args.dtype
        )
        if args.answer_choices:
            model = ChoiceAnswerModel(model, args.answer_choices.split(","))
    elif args.keyword_scorer:
        model = KeywordScorerModel()
    else:
        kwargs = dict(arg.split("=", 1) for arg in args.factory_arg if "=" in arg)
        if len(kwargs) != len(args.factory_arg):
            parser.error(f"--factory-arg takes KEY=VALUE, got {args.factory_arg}")
        model = load_factory(args.factory, **kwargs)
    server = OpenAICompatibleServer(model, args.host, args.port)
    print(f"listening on {server.url}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()


if __name__ == "__main__":
    # Run the importable module, not __main__: a factory's model raises infra.llm_server.InvalidRequest,
    # which must be the class the handler catches.
    from infra import llm_server

    llm_server.main()
