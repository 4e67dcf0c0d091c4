"""Tokenizer: byte-level roundtrip, special tokens as single ids, chat template and assistant mask."""

import json
import random

import pytest

from training.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, TokenizerConfig, load_tokenizer, train_tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n",
    "Let x = 3 and y = 42; then x + y = 45.",
    "Die Straße ist naß, 東京 is a city, emoji 🙂 and tabs\t\there.",
] * 10
rng = random.Random(0)
SYLLABLES = ["ka", "lo", "mi", "tre", "sun", "dor", "vel", "ix", "qua", "ber", "sto", "ne"]
CORPUS += [
    " ".join("".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(60)) for _ in range(60)
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return train_tokenizer(CORPUS, TokenizerConfig(vocab_size=600), tmp_path_factory.mktemp("tok"))


def test_files_and_vocab(tokenizer_dir):
    assert (tokenizer_dir / "tokenizer.json").exists()
    cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert cfg["chat_template"] == CHAT_TEMPLATE
    assert cfg["eos_token"] == "<|endoftext|>" and cfg["pad_token"] == "<|pad|>"
    tok = load_tokenizer(tokenizer_dir)
    assert len(tok) == 600  # 256 bytes + 13 specials + 331 merges
    assert tok.eos_token_id == 0 and tok.pad_token_id == 1


@pytest.mark.parametrize(
    "text",
    [
        "Hello wörld 12345 🙂\n\tdef f(x): return x",
        "never seen: ЖЩЪ ñ ☃ \x00 \u200b",
        "",
        "   lots   of  space ",
    ],
)
def test_roundtrip_any_text(tokenizer_dir, text):
    tok = load_tokenizer(tokenizer_dir)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_digits_are_single_tokens(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    assert tok.convert_ids_to_tokens(tok.encode("71432", add_special_tokens=False)) == list("71432")
    # A leading space merges with the first digit only (the corpus has " 3", " 4" ...).
    assert tok.convert_ids_to_tokens(tok.encode(" 42", add_special_tokens=False)) == ["Ġ4", "2"]


def test_special_tokens_are_single_ids(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    for i, special in enumerate(SPECIAL_TOKENS):
        assert tok.encode(special, add_special_tokens=False) == [i]
        assert tok.decode([i]) == special


def test_chat_template_renders_roles_tools_and_thinking(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "use the tool",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
        },
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|system|>\nBe brief.<|end_of_turn|>\n"
        "<|user|>\nAdd 2 and 3.<|end_of_turn|>\n"
        '<|assistant|>\n<think>use the tool</think><tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}'
        "</tool_call><|end_of_turn|>\n"
        "<|observation|>\n<tool_response>5</tool_response><|end_of_turn|>\n"
        "<|assistant|>\n5<|end_of_turn|>\n"
        "<|assistant|>\n"
    )
    out = tok.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    assistant_text = tok.decode(
        [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    )
    assert assistant_text == (
        '<think>use the tool</think><tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        "<|end_of_turn|>5<|end_of_turn|>"
    )


def test_tokenizer_stage_reads_all_sources_and_publishes(tmp_path):
    import gzip

    from infra.committed import commit, fetch_committed, read_committed
    from infra.store import LocalStore, StoreError
    from training.tokenizer import round_robin_texts, tokenizer_stage

    store = LocalStore(tmp_path / "store")
    for prefix, (name, docs) in {
        "web/filtered/s1": (
            "kept/00000.jsonl.gz",
            [f"web page {i} about rivers and stones" for i in range(30)],
        ),
        "code/files/c1": ("00000.jsonl.gz", [f"def f{i}(x):\n    return x + {i}\n" for i in range(30)]),
    }.items():  # committed as the producing stages do
        (tmp_path / prefix / name).parent.mkdir(parents=True)
        with gzip.open(tmp_path / prefix / name, "wt") as fh:
            fh.writelines(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(docs))
        commit(store, prefix, tmp_path / prefix)
    sources = {"web": ["web/filtered/s1/kept/"], "code": ["code/files/c1/"]}
    first = list(round_robin_texts(store, sources))[:4]
    assert first == ["def f0(x):\n    return x + 0\n", "web page 0 about rivers and stones",
                     "def f1(x):\n    return x + 1\n", "web page 1 about rivers and stones"]  # fmt: skip
    result = tokenizer_stage(
        TokenizerConfig(vocab_size=320), store, sources, tmp_path / "tok", "tokenizer/v1"
    )
    # one committed version holds the whole tokenizer dir; a reader fetches it hash-checked
    out = read_committed(store, "tokenizer/v1")
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(out.names())
    assert result.outputs["version"] == out.version
    _, fetched = fetch_committed(store, "tokenizer/v1", tmp_path / "fetched")
    # 256 bytes + 13 specials + the merges this small corpus supports (capped at 320)
    assert result.metrics["vocab_size"] == len(load_tokenizer(fetched)) == 318

    # a retrain whose publish dies after its first file leaves the previous tokenizer whole and readable
    # (on 98a639e the files were put in place one by one: a new tokenizer.json beside the old config)
    class DiesAfterOneFile(LocalStore):
        puts = 0

        def put_file(self, key, path):
            DiesAfterOneFile.puts += 1
            if DiesAfterOneFile.puts == 2:
                raise StoreError(f"S3 upload {key} failed: connection reset")
            return super().put_file(key, path)

    with pytest.raises(StoreError, match="connection reset"):
        tokenizer_stage(
            TokenizerConfig(vocab_size=300),
            DiesAfterOneFile(store.root),
            sources,
            tmp_path / "t2",
            "tokenizer/v1",
        )
    assert read_committed(store, "tokenizer/v1").version == out.version
    _, again = fetch_committed(store, "tokenizer/v1", tmp_path / "again")
    assert len(load_tokenizer(again)) == 318
    assert result.metrics["chars_per_token/web"] > 2 and result.metrics["chars_per_token/code"] > 1.5
    assert len(result.data_version) == 16
