"""The generative reward model (GRM): the LLM judge client (`classifiers/judge`) scoring a (request, answer)
document against a versioned rubric, through its store cache and call budget.

Backends as the judge configures them: the embedded SmolLM2-135M by default, which reads the rubric as levels
(`general_rubric_levels_v1`: it cannot follow a rubric in a chat; measured on hand-built answers, the chat
rubric gave ~2.0 to every answer), or an OpenAI-compatible endpoint asked the chat rubric (`general_rubric_v1`).
"""

from __future__ import annotations

from collections.abc import Sequence

from classifiers.judge.backends import JudgeBackend
from classifiers.judge.client import JudgeClient
from classifiers.judge.judge_config import JudgeConfig, build_backend
from classifiers.judge.prompt_files import load_prompt
from infra.store import ObjectStore
from training.rewards.rules import answer_text

LOCAL_PROMPT, ENDPOINT_PROMPT = "general_rubric_levels_v1", "general_rubric_v1"


def grm_prompt_name(config: JudgeConfig) -> str:
    """The configured prompt, else the levels rubric for a local model and the chat rubric for an endpoint."""
    return config.prompt or (LOCAL_PROMPT if config.backend == "local" else ENDPOINT_PROMPT)


def grm_document(prompt: str, response: str) -> str:
    """What the judge reads: the request, then the answer (special tokens removed)."""
    return f"Request: {prompt}\nAnswer: {answer_text(response)}"


class GenerativeRewardModel:
    """`score(prompts, responses)` -> judge score / max score in [0, 1], or None where the judge gave none
    (budget reached, call failed, unparseable answer); `metrics()` are the judge's calls, cache hits, cost."""

    def __init__(self, judge: JudgeClient):
        self.judge = judge

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float | None]:
        docs = [grm_document(p, r) for p, r in zip(prompts, responses, strict=True)]
        scores = self.judge.score_texts(docs)
        top = self.judge.prompt.max_score
        return [None if s.score is None else s.score / top for s in scores]

    def metrics(self) -> dict[str, float]:
        return self.judge.metrics("grm/")

    def state_dict(self) -> dict[str, int]:
        """The judge's counts (calls against its budget, cache hits, tokens): a resumed run goes on counting
        from them, so `max_calls` bounds the whole run. The answers themselves live in the judge cache."""
        return dict(self.judge.counts)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.judge.counts.clear()
        self.judge.counts.update(state)


def build_grm(
    config: JudgeConfig, store: ObjectStore, backend: JudgeBackend | None = None
) -> GenerativeRewardModel:
    """A GRM from the judge config (its budget is `config.client.max_calls` / `max_cost_usd`; its cache lives
    in `store` under `config.client.cache_prefix`, keyed by judge model and rubric file hash)."""
    prompt = load_prompt(grm_prompt_name(config))
    return GenerativeRewardModel(JudgeClient(backend or build_backend(config), prompt, store, config.client))
