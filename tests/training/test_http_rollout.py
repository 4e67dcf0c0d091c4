"""The HTTP rollout backend against a real server subprocess (infra/llm_server.py serving a micro checkpoint
through training/rollout/serving.py): greedy outputs and log-probs equal the local engine's on the same
checkpoint and dtype, seeded sampling reproduces, weight reloads change outputs and the policy version, a
bad reload is a 400 that keeps the old weights, and the client rides out a server that is not up yet."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import requests
import torch

from infra.settings import REPO_ROOT
from training.checkpoint import export_hf
from training.model import ModelConfig, build_model, load_model
from training.rollout.engine import Generation, LocalRolloutEngine, SamplingParams
from training.rollout.http_engine import HttpRolloutEngine, RolloutServerError, generation_from_choice
from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

EOS, PAD = 0, 1
CORPUS = ["the cat sat on the mat. the dog ate the bone. 1 + 2 = 3, 4 * 5 = 20."] * 30
PROMPTS = [[20 + i, 30, 40, 50, 60][: 2 + i % 4] for i in range(5)]
GREEDY = SamplingParams(max_new_tokens=10, temperature=0, stop_token_ids=(EOS,))
SAMPLED = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.9, stop_token_ids=(EOS,), seed=7)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two micro checkpoints (different seeds) with the same in-test tokenizer, as HF dirs."""
    root = tmp_path_factory.mktemp("ckpt")
    tok_dir = train_tokenizer(CORPUS, TokenizerConfig(vocab_size=300), root / "tok")
    vocab = len(load_tokenizer(tok_dir))
    cfg = ModelConfig.for_size("micro", vocab_size=vocab, eos_token_id=EOS, pad_token_id=PAD, index_topk=512)
    extra = {f.name: f for f in tok_dir.iterdir() if f.is_file()}
    dirs = [export_hf(build_model(cfg, seed=s).eval(), root / f"seed{s}", extra) for s in (0, 1)]
    return dirs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def local(checkpoints) -> list[LocalRolloutEngine]:
    """The in-process engine on each checkpoint, same dtype (fp32) as the server."""
    return [LocalRolloutEngine(load_model(p).eval(), dtype=torch.float32, pad_id=PAD) for p in checkpoints]


@dataclass
class Served:
    url: str
    proc: subprocess.Popen
    first: list[Generation]  # the answer to the request sent before the server listened
    retries_before_up: int

    def health(self) -> dict:
        return requests.get(f"{self.url}/health", timeout=10).json()


def start_server(path, port, log_path) -> subprocess.Popen:
    args = [sys.executable, "-m", "infra.llm_server", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--factory", "training.rollout.serving:make_policy_server_model"]
    args += ["--factory-arg", f"path={path}", "--factory-arg", "dtype=float32", "--factory-arg", "threads=1"]
    with open(log_path, "w") as log:
        return subprocess.Popen(
            args, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
        )


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def served(checkpoints, tmp_path_factory):
    """The server on checkpoint 0, whose first request is sent the moment the process starts (before it
    listens), so it only succeeds through the client's retries."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    proc = start_server(checkpoints[0], port, log_path)
    try:
        client = HttpRolloutEngine(
            f"http://127.0.0.1:{port}", timeout_s=60, retries=60, backoff_s=0.25, max_backoff_s=1
        )
        first = client.generate(PROMPTS, GREEDY)
        yield Served(client.base_url, proc, first, client.stats["retries"])
    finally:
        stop_server(proc)


def client(served, **kwargs) -> HttpRolloutEngine:
    return HttpRolloutEngine(served.url, timeout_s=60, retries=2, backoff_s=0.05, **kwargs)


def test_client_retries_until_the_server_listens(served, local):
    assert served.retries_before_up >= 1  # the first attempts met a closed port
    assert [g.token_ids for g in served.first] == [g.token_ids for g in local[0].generate(PROMPTS, GREEDY)]


def test_greedy_samples_and_logprobs_equal_the_local_engine(served, local):
    version = served.health()["policy_version"]
    greedy = local[0].generate(PROMPTS, GREEDY)
    stop_early = replace(GREEDY, stop_token_ids=(EOS, greedy[0].token_ids[2]))  # so some rows stop
    worst, reasons = 0.0, set()
    for params in (GREEDY, stop_early, SAMPLED):
        remote = client(served).generate(PROMPTS, params)
        reasons |= {g.finish_reason for g in remote}
        mine = local[0].generate(PROMPTS, params)
        for r, m in zip(remote, mine, strict=True):
            assert r.token_ids == m.token_ids  # same engine, batch and seed: same tokens, sampled ones too
            worst = max(worst, (torch.tensor(r.logprobs) - torch.tensor(m.logprobs)).abs().max().item())
            assert (r.finish_reason, r.stop_token) == (m.finish_reason, m.stop_token)
            assert r.policy_version == version and "generate" in r.timings
        assert len({tuple(g.token_ids) for g in mine}) > 1
    assert worst < 1e-4, worst
    assert reasons == {"stop", "length"}


def test_seeded_sampling_reproduces_and_n_samples_per_prompt(served):
    engine = client(served)
    a, b = engine.generate(PROMPTS, SAMPLED), engine.generate(PROMPTS, SAMPLED)
    c = engine.generate(PROMPTS, replace(SAMPLED, seed=8))
    assert [g.token_ids for g in a] == [g.token_ids for g in b] != [g.token_ids for g in c]
    body = {"prompt": PROMPTS[:2], "n": 3, "max_tokens": 6, "seed": 3, "logprobs": 0, "ignore_eos": True}
    answer = requests.post(
        f"{served.url}/v1/completions", json={**body, "return_tokens_as_token_ids": True}, timeout=60
    ).json()
    assert [c["index"] for c in answer["choices"]] == list(range(6))
    assert len({tuple(c["token_ids"]) for c in answer["choices"][:3]}) > 1  # n samples differ
    for choice in answer["choices"]:
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
        assert len(choice["token_ids"]) == 6 and choice["finish_reason"] == "length"
        # the vLLM convention read back: ids from `token_id:<n>` strings when token_ids is absent
        vllm_style = {k: v for k, v in choice.items() if k != "token_ids"}
        assert generation_from_choice(vllm_style, 0, ()).token_ids == choice["token_ids"]
    text = requests.post(
        f"{served.url}/v1/completions", json={**body, "return_token_ids": True}, timeout=60
    ).json()
    assert text["choices"][0]["prompt_token_ids"] == PROMPTS[0]
    assert all(isinstance(t, str) for t in text["choices"][0]["logprobs"]["tokens"])  # token texts
    for bad in (
        {"prompt": "text"},
        {"prompt": [[]]},
        {"prompt": [10**6]},
        {**body, "logprobs": 5},
        {**body, "stream": True},
    ):
        resp = requests.post(f"{served.url}/v1/completions", json=bad, timeout=60)
        assert resp.status_code == 400, bad
    chat = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 4, "logprobs": True}
    answer = requests.post(f"{served.url}/v1/chat/completions", json=chat, timeout=60).json()
    assert isinstance(answer["choices"][0]["message"]["content"], str)
    assert 1 <= answer["usage"]["completion_tokens"] == len(answer["choices"][0]["logprobs"]["content"]) <= 4


def test_reload_changes_outputs_and_version_and_bad_paths_are_refused(served, checkpoints, local, tmp_path):
    base_version = served.health()["policy_version"]
    before = client(served).generate(PROMPTS, GREEDY)
    trained = load_model(checkpoints[1])
    engine = client(served, weights_dir=tmp_path / "sync", model_config=trained.config)
    engine.sync_weights(trained.state_dict(), version=base_version + 1)
    assert served.health()["policy_version"] == engine.policy_version == base_version + 1
    after = engine.generate(PROMPTS, GREEDY)
    expected = local[1].generate(PROMPTS, GREEDY)
    assert [g.token_ids for g in after] == [g.token_ids for g in expected] != [g.token_ids for g in before]
    assert {g.policy_version for g in after} == {base_version + 1}
    synced = [p.name for p in (tmp_path / "sync").iterdir()]
    assert synced == [f"policy-v{base_version + 1:08d}"]  # renamed into place, no temp dir left

    # refused: not a dir, no weights, weights of another shape; the version and outputs stay
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    other = build_model(ModelConfig.for_size("micro", vocab_size=64), seed=0)
    for path in (tmp_path / "missing", no_weights):
        resp = requests.post(
            f"{served.url}/reload_weights", json={"path": str(path), "version": 99}, timeout=60
        )
        assert resp.status_code == 400 and str(path) in resp.json()["error"]["message"]
        assert resp.json()["success"] is False
    with pytest.raises(RuntimeError, match="size mismatch"):  # caught by the client before writing
        engine.sync_weights(other.state_dict(), version=99)
    assert not list((tmp_path / "sync").glob(".tmp-*"))
    foreign = client(served, weights_dir=tmp_path / "sync", model_config=other.config)
    retries = foreign.stats["retries"]
    refused = rf"{served.url}/reload_weights refused .*HTTP 400.*mismatch"
    with pytest.raises(RolloutServerError, match=refused):  # a valid dir of another model: the server says no
        foreign.sync_weights(other.state_dict(), version=99)
    assert foreign.stats["retries"] == retries  # a 400 is not retried
    assert served.health()["policy_version"] == base_version + 1
    assert [g.token_ids for g in client(served).generate(PROMPTS, GREEDY)] == [g.token_ids for g in after]

    # SGLang's endpoint and field names load checkpoint 0 back (raw, then through the client)
    resp = requests.post(
        f"{served.url}/update_weights_from_disk",
        json={"model_path": str(checkpoints[0]), "weight_version": str(base_version + 2)},
        timeout=60,
    ).json()
    assert resp["success"] is True and resp["policy_version"] == base_version + 2
    sglang = client(
        served,
        weights_dir=tmp_path / "sync",
        model_config=trained.config,
        reload_route="/update_weights_from_disk",
    )
    sglang.sync_weights(local[0].model.state_dict(), version=base_version + 3)
    weight_version = requests.get(f"{served.url}/get_weight_version", timeout=10).json()["weight_version"]
    assert weight_version == str(base_version + 3) and sglang.policy_version == base_version + 3
    synced = sorted(p.name for p in (tmp_path / "sync").iterdir())  # the refused v99 dir was removed
    assert synced == [f"policy-v{base_version + 1:08d}", f"policy-v{base_version + 3:08d}"]
    assert [g.token_ids for g in client(served).generate(PROMPTS, GREEDY)] == [g.token_ids for g in before]


def test_nothing_listening_is_a_clear_error_after_the_retry_budget():
    url = f"http://127.0.0.1:{free_port()}"
    engine = HttpRolloutEngine(url, timeout_s=5, retries=2, backoff_s=0.05)
    with pytest.raises(
        RolloutServerError, match=rf"rollout server {url}/v1/completions failed after 3 attempts"
    ):
        engine.generate(PROMPTS, GREEDY)
    assert engine.stats["retries"] == 2


def test_concurrent_requests_and_a_reload_interleave_safely(served, checkpoints, local):
    """Requests racing a reload each see one whole version: their tokens are the old weights' or the new's."""
    outputs, errors = [], []

    def work():
        try:
            outputs.append(client(served).generate(PROMPTS, GREEDY))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    version = served.health()["policy_version"]
    requests.post(
        f"{served.url}/reload_weights", json={"path": str(checkpoints[1]), "version": version + 1}, timeout=60
    )
    for t in threads:
        t.join()
    assert not errors
    by_version = {
        version: [g.token_ids for g in local[0].generate(PROMPTS, GREEDY)],
        version + 1: [g.token_ids for g in local[1].generate(PROMPTS, GREEDY)],
    }
    for gens in outputs:
        assert len({g.policy_version for g in gens}) == 1
        assert [g.token_ids for g in gens] == by_version[gens[0].policy_version]


def test_5xx_is_retried_and_a_vllm_shaped_answer_is_read():
    """A server answering 503 twice, then the way vLLM does (ids only as `token_id:<n>` strings, no policy
    version): the client retries, reads the ids back, and stamps its own last known version."""
    calls = []

    class VllmLike(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(body)
            if len(calls) <= 2:
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            choices = [
                {
                    "index": i,
                    "text": "",
                    "logprobs": {"tokens": ["token_id:7", "token_id:0"], "token_logprobs": [-0.25, -0.5]},
                    "finish_reason": "stop",
                    "stop_reason": 0,
                }
                for i in range(len(body["prompt"]))
            ]
            data = json.dumps({"object": "text_completion", "choices": choices}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = HTTPServer(("127.0.0.1", 0), VllmLike)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        engine = HttpRolloutEngine(url, retries=3, backoff_s=0.01, policy_version=5)
        gens = engine.generate(PROMPTS[:2], GREEDY)
    finally:
        server.shutdown()
        server.server_close()
    assert engine.stats["retries"] == 2 and len(calls) == 3
    assert calls[-1]["prompt"] == PROMPTS[:2] and calls[-1]["return_token_ids"] and calls[-1]["ignore_eos"]
    assert [(g.token_ids, g.logprobs, g.finish_reason, g.stop_token, g.policy_version) for g in gens] == [
        ([7, 0], [-0.25, -0.5], "stop", 0, 5)
    ] * 2
