"""The LLM judge client: scores documents with a versioned prompt through a backend, with a store cache,
bounded concurrency, a budget cap and token / cost accounting.

    judge = JudgeClient(backend, load_prompt("edu_math_v1"), store, JudgeClientConfig())
    scores = judge.score_texts(texts)          # list[JudgeScore], same order, never shorter
    judge.metrics()                            # calls, cache hits, parse failures, retries, tokens, cost

Every input gets a `JudgeScore`; `score` is None when the judge could not answer (transport failure after
retries, budget exhausted, unparseable answer) and `status` says which.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from classifiers.judge.backends import JudgeBackend, JudgeCallFailed
from classifiers.judge.cache import CachedAnswer, JudgeCache, document_hash
from classifiers.judge.parser import expected_score, parse_judge_answer
from classifiers.judge.prompt_files import JudgePrompt
from infra.store import ObjectStore

log = logging.getLogger(__name__)

# Inputs with no content: the judge's answer to them is its prior, which calibration divides out.
CONTENT_FREE_INPUTS = ("N/A", "", "[document]")


class JudgeClientConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(
        32, ge=1, description="Documents per batch; the cache is flushed after each batch"
    )
    concurrency: int = Field(1, ge=1, description="Judge calls in flight at once (threads)")
    max_calls: int | None = Field(None, ge=0, description="Budget cap: judge calls per run (None = no cap)")
    max_cost_usd: float | None = Field(None, ge=0, description="Budget cap in USD per run (None = no cap)")
    usd_per_million_prompt_tokens: float = Field(0.0, ge=0, description="Price of prompt tokens")
    usd_per_million_completion_tokens: float = Field(0.0, ge=0, description="Price of completion tokens")
    max_document_chars: int = Field(2000, ge=100, description="Documents are cut to this many characters")
    calibrate: bool = Field(
        False,
        description="Rubric prompts: divide the score distribution by the answer to content-free inputs "
        "(contextual calibration, Zhao et al. 2021)",
    )
    cache_prefix: str = Field("judge/cache", description="Store prefix of the judge cache")
    show_progress: bool = Field(True, description="tqdm progress bar")


@dataclass
class JudgeScore:
    doc_hash: str
    score: float | None
    status: str  # judged | cached | parse_failed | call_failed | over_budget
    raw_score: float | None = None  # before calibration
    answer: str = ""


class BudgetExceeded(Exception):
    pass


class JudgeClient:
    def __init__(
        self,
        backend: JudgeBackend,
        prompt: JudgePrompt,
        store: ObjectStore,
        config: JudgeClientConfig | None = None,
    ):
        self.backend = backend
        self.prompt = prompt
        self.config = config or JudgeClientConfig()
        self.cache = JudgeCache(store, self.config.cache_prefix, backend.model_id, prompt.prompt_id)
        self.counts: Counter = Counter()
        self._lock = threading.Lock()
        self._prior: tuple[float, ...] | None = None

    # --- accounting -------------------------------------------------------------------------------
    @property
    def cost_usd(self) -> float:
        c = self.config
        return (
            self.counts["prompt_tokens"] * c.usd_per_million_prompt_tokens
            + self.counts["completion_tokens"] * c.usd_per_million_completion_tokens
        ) / 1e6

    def _reserve_call(self) -> None:
        with self._lock:
            c = self.config
            if c.max_calls is not None and self.counts["calls"] >= c.max_calls:
                raise BudgetExceeded
            if c.max_cost_usd is not None and self.cost_usd >= c.max_cost_usd:
                raise BudgetExceeded
            self.counts["calls"] += 1

    def metrics(self, prefix: str = "judge/") -> dict[str, float]:
        """Counts (calls, cache hits, parse failures, retries, timeouts, tokens) and cost, for MLflow."""
        out = {f"{prefix}{k}": float(v) for k, v in sorted(self.counts.items())}
        out[f"{prefix}cost_usd"] = self.cost_usd
        out[f"{prefix}cache_size"] = float(len(self.cache))
        return out

    # --- judging ----------------------------------------------------------------------------------
    def _ask(self, text: str, doc_hash: str) -> CachedAnswer:
        self._reserve_call()
        try:
            ans = self.backend.answer(self.prompt, text)
        except JudgeCallFailed as exc:
            with self._lock:
                self.counts["call_failed"] += 1
                self.counts["retries"] += exc.retries
                self.counts["timeouts"] += exc.timeouts
            raise
        parsed = parse_judge_answer(ans.text, ans.top_logprobs, self.prompt.max_score)
        with self._lock:
            self.counts["retries"] += ans.retries
            self.counts["timeouts"] += ans.timeouts
            self.counts["prompt_tokens"] += ans.prompt_tokens
            self.counts["completion_tokens"] += ans.completion_tokens
            self.counts[f"parsed_by/{parsed.method}"] += 1
        return CachedAnswer(
            doc_hash,
            ans.text[:200],
            parsed.score,
            parsed.method,
            list(parsed.digit_probs) if parsed.digit_probs else None,
            ans.prompt_tokens,
            ans.completion_tokens,
        )

    def _to_score(self, entry: CachedAnswer, status: str) -> JudgeScore:
        if entry.score is None:
            return JudgeScore(entry.doc_hash, None, "parse_failed", None, entry.answer)
        score = entry.score
        if self.config.calibrate and entry.digit_probs and self.prior():
            score = expected_score(calibrate(entry.digit_probs, self.prior()))
        return JudgeScore(entry.doc_hash, score, status, entry.score, entry.answer)

    def prior(self) -> tuple[float, ...] | None:
        """The judge's average score distribution on content-free inputs (asked once, cached)."""
        # levels prompts score likelihoods, not answers: a content-free "document" says nothing about bias
        if self._prior is None and self.config.calibrate and self.prompt.kind == "rubric":
            dists = []
            for text in CONTENT_FREE_INPUTS:
                h = document_hash("\x00content-free\x00" + text)
                entry = self.cache.get(h)
                if entry is not None:
                    self.counts["cache_hits"] += 1
                else:
                    try:
                        entry = self._ask(text, h)
                    except (JudgeCallFailed, BudgetExceeded):
                        continue
                    self.cache.put(entry)
                if entry.digit_probs:
                    dists.append(entry.digit_probs)
            self._prior = tuple(sum(col) / len(dists) for col in zip(*dists, strict=True)) if dists else ()
        return self._prior or None

    def score_texts(self, texts: list[str]) -> list[JudgeScore]:
        """Score each text (cut to `max_document_chars`); output is aligned with the input."""
        c = self.config
        cut = [t[: c.max_document_chars] for t in texts]
        hashes = [document_hash(t) for t in cut]
        results: list[JudgeScore | None] = [None] * len(cut)
        self.prior()
        bar = tqdm(total=len(cut), desc=f"judge {self.prompt.name}", disable=not c.show_progress, unit="doc")
        with ThreadPoolExecutor(max_workers=c.concurrency) as pool:
            for start in range(0, len(cut), c.batch_size):
                batch = range(start, min(start + c.batch_size, len(cut)))
                todo: dict[str, list[int]] = {}
                for i in batch:
                    entry = self.cache.get(hashes[i])
                    if entry is not None:
                        self.counts["cache_hits"] += 1
                        results[i] = self._to_score(entry, "cached")
                    else:
                        todo.setdefault(hashes[i], []).append(i)  # duplicates inside a run are asked once
                futures = {h: pool.submit(self._ask, cut[idx[0]], h) for h, idx in todo.items()}
                for h, fut in futures.items():
                    try:
                        entry = fut.result()
                        self.cache.put(entry)
                        score = self._to_score(entry, "judged")
                    except JudgeCallFailed as exc:
                        log.warning("judge call failed, document kept unjudged: %s", exc)
                        score = JudgeScore(h, None, "call_failed", None, str(exc)[:200])
                    except BudgetExceeded:
                        score = JudgeScore(h, None, "over_budget")
                    for i in todo[h]:
                        results[i] = score
                self.cache.flush()
                bar.update(len(batch))
        bar.close()
        self.cache.flush()
        for r in results:
            self.counts[f"status/{r.status}"] += 1
        if self.counts["status/over_budget"]:
            log.warning("judge budget reached: %d documents left unjudged", self.counts["status/over_budget"])
        return results  # type: ignore[return-value]


def calibrate(probs: list[float] | tuple[float, ...], prior: tuple[float, ...]) -> list[float]:
    """Contextual calibration (Zhao et al. 2021): p(k | doc) / p(k | content-free), renormalised."""
    q = [p / max(pr, 1e-6) for p, pr in zip(probs, prior, strict=True)]
    total = sum(q) or 1.0
    return [v / total for v in q]
