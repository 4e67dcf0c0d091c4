"""Byte-level BPE tokenizer trained on the curated corpus, with the special tokens and chat template that
SFT and RL need later. Saved as a HF tokenizer directory (tokenizer.json + tokenizer_config.json)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
PAD = "<|pad|>"
END_OF_TURN = "<|end_of_turn|>"
# Order fixes the ids: EOS is 0, PAD 1, ... so every tokenizer we train agrees on them.
SPECIAL_TOKENS = [
    EOS,
    PAD,
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    END_OF_TURN,
]

# GLM-style roles. Assistant turns are wrapped in {% generation %} so `return_assistant_tokens_mask=True`
# gives SFT its loss mask; tool results come back as the <|observation|> role. The loader sets trim_blocks,
# so a newline right after a block tag is written as an expression.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "<|system|>\n{{ message['content'] }}<|end_of_turn|>\n"
    "{% elif message['role'] == 'user' %}"
    "<|user|>\n{{ message['content'] }}<|end_of_turn|>\n"
    "{% elif message['role'] == 'assistant' %}"
    "<|assistant|>\n"
    "{% generation %}"
    "{% if message.get('reasoning_content') %}<think>{{ message['reasoning_content'] }}</think>{% endif %}"
    "{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "<tool_call>{{ (call['function'] if 'function' in call else call) | tojson }}</tool_call>"
    "{% endfor %}"
    "<|end_of_turn|>"
    "{% endgeneration %}{{ '\\n' }}"
    "{% elif message['role'] in ['tool', 'observation'] %}"
    "<|observation|>\n<tool_response>{{ message['content'] }}</tool_response><|end_of_turn|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class TokenizerConfig(BaseModel):
    """Tokenizer training settings (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    vocab_size: int = Field(
        8192, ge=300, le=1_000_000, description="Vocabulary size incl. bytes and specials"
    )
    min_frequency: int = Field(2, ge=1, description="Minimum pair count for a BPE merge")
    max_docs: int = Field(200_000, ge=1, description="Train on at most this many documents")
    max_chars_per_doc: int = Field(20_000, ge=100, description="Truncate each training document to this")
    individual_digits: bool = Field(
        True, description="Split numbers into single digits, a leading space kept with the first one"
    )
    model_max_length: int = Field(2048, ge=16, description="Longest context recorded in tokenizer_config")


def build_untrained_tokenizer(config: TokenizerConfig) -> tuple[Tokenizer, trainers.BpeTrainer]:
    """The byte-level BPE pipeline and its trainer, before training."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    # One token per digit, but a leading space stays with the first digit (" 71432" -> "Ġ7" "1" "4" "3" "2"),
    # so the token before a number's second digit identifies the number (copying it needs one-token lookback).
    steps = [pre_tokenizers.Split(Regex(r" ?\p{N}"), behavior="isolated")] if config.individual_digits else []
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        steps + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def _bounded(texts: Iterable[str], config: TokenizerConfig) -> Iterator[str]:
    for i, text in enumerate(texts):
        if i >= config.max_docs:
            return
        if text:
            yield text[: config.max_chars_per_doc]


def train_tokenizer(texts: Iterable[str], config: TokenizerConfig, out_dir: str | Path) -> Path:
    """Train byte-level BPE on `texts` and save a HF tokenizer dir (loads with AutoTokenizer); returns it."""
    from transformers import PreTrainedTokenizerFast

    tok, trainer = build_untrained_tokenizer(config)
    tok.train_from_iterator(_bounded(texts, config), trainer=trainer)
    for i, special in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(special) == i, f"special token {special} got id {tok.token_to_id(special)}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[2:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=config.model_max_length,
        clean_up_tokenization_spaces=False,
    )
    # Legacy format keeps the chat template inside tokenizer_config.json, which every loader reads.
    hf.save_pretrained(str(out_dir), save_jinja_files=False)
    log.info("tokenizer: %d tokens saved to %s", tok.get_vocab_size(), out_dir)
    return out_dir


def load_tokenizer(path: str | Path):
    """Load a tokenizer dir saved by `train_tokenizer` as a transformers fast tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def round_robin_texts(store, sources: dict[str, list[str]]) -> Iterator[str]:
    """Doc texts from every source in turn (web, code, math, ...), so a `max_docs` cap still sees all of them."""
    from training.data import document_keys, iter_documents

    def texts(prefixes: list[str]) -> Iterator[str]:
        for prefix in prefixes:
            for key in document_keys(store, prefix):
                for doc in iter_documents(store, key):
                    yield doc.get("text") or ""

    streams = [texts(p) for _, p in sorted(sources.items()) if p]
    while streams:
        for stream in list(streams):
            text = next(stream, None)
            if text is None:
                streams.remove(stream)
            else:
                yield text


def tokenizer_stage(
    config: TokenizerConfig, store, sources: dict[str, list[str]], out_dir: str | Path, out_prefix: str
):
    """Train the tokenizer on the curated corpus (source -> store prefixes), publish it under `out_prefix` and
    report chars/token per source on a sample. Returns a StageResult (outputs: local dir and store prefix)."""
    import xxhash

    from infra.committed import commit
    from infra.stage import StageResult, markdown_table
    from training.data import document_keys, iter_documents

    path = train_tokenizer(round_robin_texts(store, sources), config, out_dir)
    tok = load_tokenizer(path)
    metrics: dict[str, float] = {"vocab_size": float(len(tok))}
    rows = []
    for source, prefixes in sorted(sources.items()):
        sample = []
        for key in (k for p in prefixes for k in document_keys(store, p)):
            sample += [d.get("text") or "" for d in iter_documents(store, key)]
            if len(sample) >= 200:
                break
        chars = sum(len(t) for t in sample[:200])
        tokens = (
            sum(len(ids) for ids in tok(sample[:200], add_special_tokens=False)["input_ids"]) if sample else 0
        )
        metrics[f"chars_per_token/{source}"] = chars / tokens if tokens else 0.0
        rows.append(
            {
                "source": source,
                "sample docs": len(sample[:200]),
                "chars/token": round(chars / max(tokens, 1), 3),
            }
        )
    out = commit(store, out_prefix, path)  # the whole HF tokenizer dir as one version, pointer last
    return StageResult(
        metrics=metrics,
        outputs={"tokenizer_dir": str(path), "prefix": out.prefix, "version": out.version},
        report_md=f"## Tokenizer ({len(tok)} tokens)\n\n{markdown_table(rows)}",
        sample=rows,
        artifacts={f"tokenizer/{n}": path / n for n in ("tokenizer.json", "tokenizer_config.json")},
        data_version=xxhash.xxh64_hexdigest((path / "tokenizer.json").read_bytes()),
    )
