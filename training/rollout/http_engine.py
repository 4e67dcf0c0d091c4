"""Rollouts from an OpenAI-compatible inference server: vLLM at scale, here `infra/llm_server.py` serving a
checkpoint (training/rollout/serving.py). Implements the `RolloutEngine` protocol of engine.py.

`generate` sends the whole batch as one `POST /v1/completions` with token-id prompts (vLLM's extensions:
`return_token_ids`, `return_tokens_as_token_ids`, `logprobs: 0`, `stop_token_ids`, `ignore_eos`), so the
token ids and log-probs are the server's own and nothing is re-tokenized; a server that only returns
`token_id:<n>` strings in `logprobs.tokens` is read too. `sync_weights` writes the trainer's state dict as
an HF dir under `weights_dir` (temp dir + rename; the server must see the same file system) and asks the
server to load it (`POST /reload_weights`, SGLang's `/update_weights_from_disk` takes the same dir).

Log-probs are those of the sampling distribution at the request's temperature without top-p truncation
(the local engine's and our server's convention). vLLM reports the raw model's log-probs by default
(temperature 1); against vLLM, sample at temperature 1 or account for the difference.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import requests
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from training.checkpoint import save_pretrained
from training.rollout.engine import Generation, SamplingParams

log = logging.getLogger(__name__)

TOKEN_ID_PREFIX = "token_id:"  # vLLM's `return_tokens_as_token_ids` spelling
SYNCED_PREFIX = "policy-v"
RELOAD_BODIES = {  # route -> body: ours (infra/llm_server.py) and SGLang's field names
    "/reload_weights": lambda path, version: {"path": str(path), "version": version},
    "/update_weights_from_disk": lambda path, version: {
        "model_path": str(path),
        "weight_version": str(version),
    },
}


class RolloutServerError(RuntimeError):
    """The rollout server could not be reached, or refused or garbled a request; the message names the URL."""


def choice_token_ids(choice: dict) -> list[int]:
    """The generated token ids of one completion choice: `token_ids`, else `logprobs.tokens` as
    `token_id:<n>` strings (vLLM with `return_tokens_as_token_ids`)."""
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if tokens is not None and all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
    raise ValueError("choice has neither token_ids nor token_id:<n> tokens (ask return_token_ids)")


def generation_from_choice(choice: dict, default_version: int, stop_token_ids: tuple[int, ...]) -> Generation:
    """A `Generation` from one `/v1/completions` choice (ours or vLLM's)."""
    token_ids = choice_token_ids(choice)
    logprobs = [float(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
    if len(logprobs) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} log-probs (ask logprobs=0)")
    stopped = choice.get("finish_reason") == "stop" and bool(token_ids) and token_ids[-1] in stop_token_ids
    return Generation(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason="stop" if stopped else "length",
        policy_version=int(choice.get("policy_version", default_version)),
        stop_token=token_ids[-1] if stopped else None,
    )


def write_hf_weights(state_dict: dict[str, torch.Tensor], model_config: Any, out_dir: Path) -> Path:
    """`state_dict` as an HF model dir (config.json + model.safetensors) at `out_dir`, written to a temp dir
    and renamed into place. `model_config` is a transformers config or an HF dir holding config.json.
    A state dict that does not fit the config raises before anything is published."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".tmp-{out_dir.name}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        config = model_config
        if not hasattr(config, "save_pretrained"):
            config = AutoConfig.from_pretrained(str(model_config))
        # save_pretrained on an empty shell holding the tensors: the standard HF checkpoint layout (per-expert
        # weights, tied weights once) that vLLM / SGLang and from_pretrained read
        with torch.device("meta"):
            shell = AutoModelForCausalLM.from_config(config)
        shell.load_state_dict({k: v.detach().cpu() for k, v in state_dict.items()}, strict=True, assign=True)
        save_pretrained(shell, tmp)
        for file in tmp.iterdir():
            with open(file, "rb") as f:
                os.fsync(f.fileno())
        if out_dir.exists():  # the same version synced again: move the old one out of the name first
            trash = out_dir.with_name(f".trash-{out_dir.name}-{uuid.uuid4().hex[:8]}")
            os.replace(out_dir, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fd = os.open(out_dir.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return out_dir


class HttpRolloutEngine:
    """A `RolloutEngine` over an OpenAI-compatible server's `/v1/completions` with token ids.

    Connection errors, timeouts and 5xx answers are retried `retries` times with exponential backoff
    (`backoff_s`, doubling, at most `max_backoff_s`); a 4xx is raised at once. Every error names the URL.
    `weights_dir` and `model_config` are needed only for `sync_weights`; the newest `keep_synced` synced
    dirs are kept, older ones deleted; `reload_route="/update_weights_from_disk"` speaks SGLang's reload. A server that reports no policy version (vLLM) is stamped with the
    client's own: `policy_version` at start (else /health's, else 0), then each synced version.
    """

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 300.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        weights_dir: str | Path | None = None,
        model_config: Any = None,
        model: str = "policy",
        keep_synced: int = 2,
        policy_version: int | None = None,
        reload_route: str = "/reload_weights",
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.retries = timeout_s, retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.model_config, self.model, self.keep_synced = model_config, model, keep_synced
        self.stats = {"requests": 0, "retries": 0}
        self._version = policy_version  # None: ask GET /health on first use
        if reload_route not in RELOAD_BODIES:
            raise ValueError(f"reload_route {reload_route!r}: choose one of {sorted(RELOAD_BODIES)}")
        self.reload_route = reload_route
        self._session = requests.Session()

    @property
    def policy_version(self) -> int:
        """The version of the last response or sync; asks `GET /health` before the first one."""
        if self._version is None:
            self._version = int(self._request("GET", "/health").get("policy_version", 0))
        return self._version

    def _request(self, method: str, route: str, body: dict | None = None) -> dict:
        url = f"{self.base_url}{route}"
        self.stats["requests"] += 1
        started, last = time.monotonic(), ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats["retries"] += 1
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s))
            try:
                resp = self._session.request(method, url, json=body, timeout=self.timeout_s)
            except (requests.ConnectionError, requests.Timeout) as exc:
                last = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "rollout server %s: %s (attempt %d of %d)", url, last, attempt + 1, self.retries + 1
                )
                continue
            if resp.status_code >= 500:
                last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                log.warning(
                    "rollout server %s: %s (attempt %d of %d)", url, last, attempt + 1, self.retries + 1
                )
                continue
            if resp.status_code >= 400:
                raise RolloutServerError(
                    f"rollout server {url} refused the request: HTTP {resp.status_code}: {resp.text[:500]}"
                )
            if not resp.content:  # e.g. vLLM's /health: 200 with an empty body
                return {}
            try:
                return resp.json()
            except ValueError as exc:
                raise RolloutServerError(
                    f"rollout server {url} answered with non-JSON: {resp.text[:200]!r}"
                ) from exc
        raise RolloutServerError(
            f"rollout server {url} failed after {self.retries + 1} attempts over "
            f"{time.monotonic() - started:.1f} s; last error: {last}"
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One request for the whole batch (so a seeded batch samples what the local engine samples)."""
        if not prompts or any(not p for p in prompts):
            raise ValueError("every prompt needs at least one token")
        body = {
            "model": self.model,
            "prompt": [list(map(int, p)) for p in prompts],
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": True,  # stop only on the caller's stop tokens, as the local engine does
            "seed": params.seed,
            "n": 1,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        started = time.monotonic()
        answer = self._request("POST", "/v1/completions", body)
        elapsed = time.monotonic() - started
        url = f"{self.base_url}/v1/completions"
        choices = sorted(answer.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise RolloutServerError(
                f"rollout server {url} returned {len(choices)} choices for {len(prompts)} prompts"
            )
        default_version = int(answer["policy_version"]) if "policy_version" in answer else self.policy_version
        try:
            generations = [generation_from_choice(c, default_version, params.stop_token_ids) for c in choices]
        except (ValueError, TypeError) as exc:
            raise RolloutServerError(f"rollout server {url}: unusable answer: {exc}") from exc
        for g in generations:
            g.timings["generate"] = elapsed
        self._version = generations[-1].policy_version
        return generations

    def sync_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Write `state_dict` as `<weights_dir>/policy-v<version>/` and have the server load it as `version`."""
        if self.weights_dir is None or self.model_config is None:
            raise ValueError("HttpRolloutEngine.sync_weights needs weights_dir and model_config")
        path = write_hf_weights(
            state_dict, self.model_config, self.weights_dir / f"{SYNCED_PREFIX}{version:08d}"
        )
        try:
            answer = self._request(
                "POST", self.reload_route, RELOAD_BODIES[self.reload_route](path.resolve(), version)
            )
        except RolloutServerError:
            shutil.rmtree(path, ignore_errors=True)  # never served: do not leave it among the synced dirs
            raise
        self._version = int(answer.get("policy_version", version))
        synced = sorted(p for p in self.weights_dir.glob(f"{SYNCED_PREFIX}*") if p.is_dir() and p != path)
        for old in synced[: max(0, len(synced) - (self.keep_synced - 1))]:
            shutil.rmtree(old, ignore_errors=True)
