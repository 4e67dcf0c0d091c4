"""SFT rendering: exactly which tokens carry loss on a hand-built trajectory with a wrong step and a failed
tool call, and batches that keep prompts, tool output and errors out of the labels."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from training.sft import (
    IGNORE,
    RenderedChat,
    SftBatches,
    error_correction_trajectory,
    failed_tool_call_trajectory,
    pack_rows,
    render_chat,
)
from training.tasks.tools import ToolSuite
from training.tokenizer import END_OF_TURN, TokenizerConfig, load_tokenizer, train_tokenizer

CORPUS = ["What is 3 + 4? Answer: 7. Wait, that is wrong. The calculator says 42."] * 20 + [
    "def f(x):\n    return x + 1\n",
    "Use the calculator to compute 12 * 34. error: bad tool call",
] * 10


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(
        train_tokenizer(CORPUS, TokenizerConfig(vocab_size=400), tmp_path_factory.mktemp("tok"))
    )


def _trained_text(tok, rendered) -> str:
    return tok.decode([t for t, m in zip(rendered.input_ids, rendered.loss_mask, strict=True) if m])


def test_only_assistant_tokens_outside_errors_carry_loss(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 3 + 4?"},
        {
            "role": "assistant",
            "reasoning_content": "3 + 4 = 8. Wait, that is wrong. 3 + 4 = 7.",
            "content": "Answer: 7",
            "error_spans": ["3 + 4 = 8."],
        },
        {"role": "user", "content": "Now 12 * 34 with the calculator."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "calculator", "arguments": {}}],
            "train": False,
        },
        {"role": "tool", "content": "error: bad tool call"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "calculator", "arguments": {"expression": "12 * 34"}}],
        },
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "Answer: 408"},
    ]
    rendered = render_chat(tok, messages)
    assert (
        rendered.input_ids == tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    )
    trained = _trained_text(tok, rendered)
    assert trained == (
        "<think> Wait, that is wrong. 3 + 4 = 7.</think>Answer: 7" + END_OF_TURN
        + '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>' + END_OF_TURN
        + "Answer: 408" + END_OF_TURN
    )  # fmt: skip
    # nothing of the prompt, the system turn, the failed call or the tool results is a target
    for absent in (
        "Be brief",
        "What is",
        "3 + 4 = 8",
        "error: bad tool call",
        "<tool_response>",
        "<|user|>",
        "<|assistant|>",
    ):
        assert absent not in trained


def test_error_span_must_be_in_the_turn(tok):
    bad = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "error_spans": ["zzz"]}]
    with pytest.raises(ValueError, match="error span 'zzz'"):
        render_chat(tok, bad)


def test_trajectory_builders_mask_the_error_only(tok):
    suite = ToolSuite()
    task = suite.generate("train", 1, 0, 1)[0]
    traj = failed_tool_call_trajectory(task.prompt, suite.solution(task))
    trained = _trained_text(tok, render_chat(tok, traj))
    assert trained.count("<tool_call>") == 1 and '"expression"' in trained
    assert f'Answer: "{task.answer}"' in trained
    fixed = error_correction_trajectory(
        "What is 3 + 4?",
        [{"role": "assistant", "reasoning_content": "3 + 4 = 7", "content": "Answer: 7"}],
        "3 + 4 = 9.",
        random.Random(0),
    )
    trained = _trained_text(tok, render_chat(tok, fixed))
    assert "3 + 4 = 9" not in trained and "3 + 4 = 7" in trained


def test_batches_pad_and_ignore(tok):
    rows = [
        render_chat(tok, [{"role": "user", "content": "hi" * n}, {"role": "assistant", "content": "ok"}])
        for n in (1, 5, 9)
    ]
    batches = SftBatches(rows, batch_size=2, seq_len=64, pad_id=1, seed=0, pack=False)
    first = next(batches)
    assert first["input_ids"].shape[0] == 2
    labels, ids = first["labels"], first["input_ids"]
    assert bool(((labels == IGNORE) | (labels == ids)).all())
    for i in range(2):  # each batch row is one rendered chat, padded, with its own loss mask as labels
        row = next(r for r in rows if ids[i, : len(r.input_ids)].tolist() == r.input_ids)
        assert int((labels[i] != IGNORE).sum()) == sum(row.loss_mask) > 0
        assert ids[i, len(row.input_ids) :].eq(1).all()
    state = batches.state_dict()
    nxt = next(batches)
    batches.load_state_dict(state)
    again = next(batches)
    assert bool((nxt["input_ids"] == again["input_ids"]).all())


def _random_chats(lengths, vocab: int, seed: int = 0) -> list[RenderedChat]:
    g = torch.Generator().manual_seed(seed)
    chats = []
    for n in lengths:
        prompt = int(torch.randint(1, n, (1,), generator=g))
        ids = torch.randint(2, vocab, (n,), generator=g).tolist()
        chats.append(RenderedChat(ids, [0] * prompt + [1] * (n - prompt)))
    return chats


def test_packing_puts_every_chat_in_its_own_block():
    chats = _random_chats([40, 7, 25, 60, 12, 33, 80], vocab=500)
    batch = pack_rows(chats, seq_len=64, pad_id=1)
    ids, labels, pos, mask = (batch[k] for k in ("input_ids", "labels", "position_ids", "attention_mask"))
    assert ids.shape[0] == 4 and ids.shape[1] <= 64  # 64 (cut from 80) | 60 | 40 + 12 + 7 | 33 + 25
    assert int((labels != IGNORE).sum()) == sum(sum(c.loss_mask[:64]) for c in chats)
    starts = (pos == 0) & (ids != 1)
    assert int(starts.sum()) == len(chats)
    for b in range(ids.shape[0]):
        seg = torch.cumsum(starts[b].long(), 0)  # which chat each position belongs to
        real = ids[b] != 1
        same = (seg[:, None] == seg[None, :]) & real[:, None] & real[None, :]
        causal = torch.ones_like(same).tril()
        assert torch.equal(mask[b, 0] & real[:, None], same & causal)


@pytest.mark.parametrize("mode", ["sparse_gather", "dense"])
def test_packed_batch_gives_the_padded_batchs_loss_and_gradients(mode):
    from tie_free import tie_free_glm

    from training.dsa_indexer import set_dsa_mode

    # index_topk 32 and no indexer ties: rows longer than 32 take the sparse top-k path, and the key sets
    # cannot depend on how long the packed row around a chat is
    chats = _random_chats([40, 7, 25, 60, 12, 33], vocab=400, seed=1)
    padded = next(SftBatches(chats, batch_size=6, seq_len=64, pad_id=1, pack=False))
    packed = pack_rows(chats, seq_len=64, pad_id=1)
    assert packed["input_ids"].numel() < 0.75 * padded["input_ids"].numel()
    losses, grads = [], []
    for batch in (padded, packed):
        model = tie_free_glm().train()
        set_dsa_mode(model, mode)
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**inputs).logits
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), reduction="sum"
        )
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        scale = float(g.abs().max())
        assert float((g - grads[1][name]).abs().max()) <= 1e-4 * max(scale, 1e-3), name
