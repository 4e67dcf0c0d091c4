"""Chat models served by `infra/llm_server.py` in judge tests (loaded with `--factory`).

`flaky_keyword_scorer` answers like `KeywordScorerModel`, but misbehaves on documents that ask for it:
`STALL` sleeps past the client's timeout on the first attempt, `ERROR500` fails the first attempt,
`ALWAYS500` fails every attempt, `GARBAGE` answers without a score and without log-probs.
"""

from __future__ import annotations

import threading
import time

from infra.llm_server import ChatOutput, KeywordScorerModel


class FlakyKeywordScorer(KeywordScorerModel):
    name = "flaky-keyword-scorer"

    def __init__(self, stall_s: float = 3.0):
        self.stall_s = stall_s
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def chat(self, messages, max_tokens=16, temperature=0.0, top_logprobs=0) -> ChatOutput:
        doc = messages[-1]["content"]
        with self.lock:
            first = doc not in self.seen
            self.seen.add(doc)
        if "STALL" in doc and first:
            time.sleep(self.stall_s)
        if ("ERROR500" in doc and first) or "ALWAYS500" in doc:
            raise RuntimeError("injected failure")
        if "GARBAGE" in doc:
            return ChatOutput("I like turtles.", 10, 4, None)
        return super().chat(messages, max_tokens, temperature, top_logprobs)


def flaky_keyword_scorer() -> FlakyKeywordScorer:
    return FlakyKeywordScorer()
