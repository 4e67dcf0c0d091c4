"""Which judge a stage uses, as config: the tiny default is SmolLM2-135M-Instruct in-process, the cluster
default an OpenAI-compatible endpoint whose URL comes from the environment (`CRUCIBLE_JUDGE_URL`, ...)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from classifiers.judge.backends import JudgeBackend, LocalModelBackend, OpenAIChatBackend
from classifiers.judge.client import JudgeClient, JudgeClientConfig
from classifiers.judge.prompt_files import load_prompt
from classifiers.judge.quality_gate import GateConfig
from infra.cpu import judge_threads, native_bf16
from infra.store import ObjectStore


class JudgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    backend: Literal["local", "openai"] = Field(
        "local", description="local = a model in this process; openai = an OpenAI-compatible HTTP endpoint"
    )
    local_model: str | None = Field(
        None,
        description="GGUF file or HF model dir for the local backend; None = packaged SmolLM2-135M-Instruct",
    )
    local_threads: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto",
        description="torch threads for the local backend: auto = every CPU under `crucible run` (one job at "
        "a time), else the CPUs shared among the judge runs the Dagster queue allows at once; None = all",
    )
    local_document_tokens: int = Field(
        64, ge=8, description="Levels prompts: document tokens scored per chunk"
    )
    # probe set, SmolLM2-135M, 1 thread: bf16 AUC 0.8645 / Spearman 0.501 in 42 s, fp32 0.8732 / 0.523 in 78 s
    local_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Weights and activations of the local backend: auto = bf16 where the CPU runs it natively "
        "(AVX512-BF16 / AMX; ~1.9x fp32 there, slightly lower probe agreement), else fp32",
    )
    local_level_temperature: float = Field(
        0.1, gt=0, description="Levels prompts: softmax temperature over mean log-likelihoods (nats/token)"
    )
    endpoint_env: str = Field(
        "CRUCIBLE_JUDGE", description="Env prefix of the endpoint: <P>_URL, <P>_MODEL, <P>_API_KEY"
    )
    prompt: str | None = Field(
        None,
        description="Prompt file (classifiers/judge/prompts/); None = the task's default for the backend: "
        "a levels prompt for local models, a rubric prompt for endpoints",
    )
    timeout_s: float = Field(60.0, gt=0, description="HTTP timeout per judge call")
    max_retries: int = Field(4, ge=0, description="Retries per judge call (timeouts, 5xx, malformed bodies)")
    backoff_s: float = Field(1.0, ge=0, description="First retry delay; doubles per retry (with jitter)")
    top_logprobs: int = Field(10, ge=0, le=20, description="Ask the endpoint for first-token alternatives")
    client: JudgeClientConfig = Field(
        default_factory=JudgeClientConfig, description="Batching, budget, cache"
    )
    gate: GateConfig = Field(default_factory=GateConfig, description="Probe-set quality gate")


def local_threads_of(config: JudgeConfig) -> int | None:
    """The local backend's torch threads (`auto` resolved for this process; None = all)."""
    return judge_threads() if config.local_threads == "auto" else config.local_threads


def local_precision_of(config: JudgeConfig) -> str:
    """The local backend's precision (`auto` resolved for this CPU)."""
    if config.local_precision != "auto":
        return config.local_precision
    return "bf16" if native_bf16() else "fp32"


def build_backend(config: JudgeConfig) -> JudgeBackend:
    if config.backend == "local":
        from infra.packaged import SMOLLM2_GGUF, packaged_file

        path = config.local_model or str(packaged_file(SMOLLM2_GGUF))
        return LocalModelBackend(
            path,
            threads=local_threads_of(config),
            max_document_tokens=config.local_document_tokens,
            level_temperature=config.local_level_temperature,
            precision=local_precision_of(config),
        )
    from infra.llm_server import llm_endpoint_from_env

    endpoint = llm_endpoint_from_env(config.endpoint_env)
    if endpoint is None:
        raise ValueError(
            f"judge backend 'openai' needs {config.endpoint_env}_URL (and _MODEL, _API_KEY) in the environment, "
            "e.g. a vLLM / SGLang / llama.cpp server, or `python -m infra.llm_server --gguf FILE`"
        )
    return OpenAIChatBackend(
        endpoint.base_url,
        endpoint.model,
        endpoint.api_key,
        timeout_s=config.timeout_s,
        max_retries=config.max_retries,
        backoff_s=config.backoff_s,
        top_logprobs=config.top_logprobs,
    )


# task -> (prompt for a local model, prompt for an endpoint). Small local models cannot follow a rubric in
# a chat (measured: probe AUC ~0.4-0.5), so they read the rubric's levels by likelihood instead.
DEFAULT_PROMPTS = {
    "edu_math": ("edu_math_levels_v1", "edu_math_v1"),
    "world_knowledge": ("world_knowledge_levels_v1", "world_knowledge_v1"),
}


def prompt_name(config: JudgeConfig, task: str) -> str:
    """The configured prompt, else the task's default for the configured backend."""
    if config.prompt:
        return config.prompt
    local, endpoint = DEFAULT_PROMPTS[task]
    return local if config.backend == "local" else endpoint


def build_judge(
    config: JudgeConfig, store: ObjectStore, task: str, backend: JudgeBackend | None = None
) -> JudgeClient:
    """A JudgeClient for `task` (edu_math, world_knowledge); pass `backend` to share one loaded model."""
    return JudgeClient(
        backend or build_backend(config), load_prompt(prompt_name(config, task)), store, config.client
    )
