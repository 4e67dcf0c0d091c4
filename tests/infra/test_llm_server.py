"""infra/llm_server.py's token-completion API without a model: request validation (vLLM's field names and
defaults, refusals naming the field), the response layout (prompt-major choices, token ids, `token_id:<n>`
strings, policy version), and a chat-only model answering the rollout routes with 404 over real HTTP."""

from __future__ import annotations

import threading

import pytest
import requests

from infra.llm_server import (
    CompletionRequest,
    InvalidRequest,
    KeywordScorerModel,
    OpenAICompatibleServer,
    TokenCompletion,
    completion_response,
    parse_completion_request,
)


def test_defaults_follow_the_openai_completions_api():
    req = parse_completion_request({"prompt": [5, 6, 7]})
    assert req.prompts == [[5, 6, 7]] and req.n == 1
    assert (req.max_tokens, req.temperature, req.top_p) == (16, 1.0, 1.0)
    assert not req.logprobs and not req.ignore_eos and req.stop_token_ids == []
    batch = parse_completion_request(
        {"prompt": [[1], [2, 3]], "n": 2, "seed": 4, "logprobs": 0, "stop_token_ids": [0], "temperature": 0}
    )
    assert batch.prompts == [[1], [2, 3]] and batch.logprobs and batch.seed == 4 and batch.temperature == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "some text"}, "not text"),
        ({"prompt": ["a", "b"]}, "not text"),
        ({"prompt": []}, "prompt must be a non-empty list"),
        ({"prompt": [[1], []]}, "prompt[1]"),
        ({"prompt": [1, -2]}, "non-negative"),
        ({"prompt": [1, True]}, "integer"),
        ({"prompt": [1], "stop": ["\n"]}, "stop is not supported"),
        ({"prompt": [1], "stream": True}, "stream"),
        ({"prompt": [1], "logprobs": 5}, "top alternatives"),
        ({"prompt": [1], "top_k": 40}, "top_k"),
        ({"prompt": [1], "top_p": 0}, "top_p"),
        ({"prompt": [1], "max_tokens": "many"}, "bad sampling parameter"),
        ({"prompt": [1], "stop_token_ids": [1.5]}, "stop_token_ids"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(body, field):
    with pytest.raises(InvalidRequest, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_completion_request(body)


def test_response_is_prompt_major_with_token_ids_and_the_policy_version():
    req = CompletionRequest(
        prompts=[[1, 2], [3]],
        n=2,
        max_tokens=2,
        temperature=1.0,
        top_p=1.0,
        stop_token_ids=[0],
        ignore_eos=True,
        seed=0,
        logprobs=True,
        tokens_as_token_ids=True,
        return_token_ids=True,
    )
    outs = [
        TokenCompletion([7 + i, 0], [-0.5, -1.0], "stop", 3, stop_token=0, tokens=["a", "b"])
        for i in range(4)
    ]
    body = completion_response("m", req, outs)
    assert body["object"] == "text_completion" and body["policy_version"] == 3
    assert [c["prompt_token_ids"] for c in body["choices"]] == [[1, 2], [1, 2], [3], [3]]
    first = body["choices"][0]
    assert first["token_ids"] == [7, 0] and first["stop_reason"] == 0 and first["finish_reason"] == "stop"
    assert first["logprobs"]["tokens"] == ["token_id:7", "token_id:0"]
    assert first["logprobs"]["token_logprobs"] == [-0.5, -1.0]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}
    as_text = completion_response(
        "m", CompletionRequest(**{**req.__dict__, "tokens_as_token_ids": False}), outs
    )
    assert as_text["choices"][0]["logprobs"]["tokens"] == ["a", "b"]


def test_a_chat_only_model_has_no_rollout_routes():
    server = OpenAICompatibleServer(KeywordScorerModel())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert requests.get(f"{server.url}/health", timeout=5).json() == {"status": "ok"}
        for route in ("/v1/completions", "/reload_weights", "/update_weights_from_disk"):
            resp = requests.post(f"{server.url}{route}", json={"prompt": [1]}, timeout=5)
            assert resp.status_code == 404 and "chat only" in resp.json()["error"]["message"]
        chat = {"messages": [{"role": "user", "content": "solve the equation x + 1 = 2"}]}
        assert requests.post(f"{server.url}/v1/chat/completions", json=chat, timeout=5).status_code == 200
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_gguf_is_converted_once_to_a_hf_dir_holding_the_same_model(tmp_path, monkeypatch):
    """The packaged SmolLM2 GGUF, copied: the HF directory beside it holds exactly the weights transformers
    de-quantizes from the GGUF and the same tokenizer and chat template; a second load reuses it without
    reading the GGUF again; the model keeps the GGUF's name (judge cache keys carry it)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from infra import llm_server
    from infra.packaged import SMOLLM2_GGUF, packaged_file

    gguf = tmp_path / packaged_file(SMOLLM2_GGUF).name
    shutil.copyfile(packaged_file(SMOLLM2_GGUF), gguf)
    first = llm_server.TransformersChatModel(gguf)
    (hf_dir,) = tmp_path.glob(f"{gguf.name}.hf-*")
    assert first.name == gguf.name and not list(tmp_path.glob(f".{gguf.name}.*"))  # no temp dir left
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32)
    ref_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf.name)
    mine, theirs = first.model.state_dict(), ref.state_dict()
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    chat = [{"role": "user", "content": "Rate: 2 + 2 = 4"}]
    ref_ids = ref_tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert first.prompt_ids(chat) == list(ref_ids)

    def no_gguf(*args, **kwargs):
        raise AssertionError(f"the GGUF was read again: {args} {kwargs}")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", no_gguf)
    assert llm_server.gguf_hf_dir(gguf) == hf_dir
