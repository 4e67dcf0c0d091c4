"""A task RL alone can learn on a micro model: 'pick a color', rewarded when the answer says 'blue' (it starts
near 1/len(WORDS) or below). Shared by the Reasoning RL and distillation tests."""

from __future__ import annotations

from training.model import ModelConfig
from training.tasks.base import Task, Verdict
from training.tokenizer import TokenizerConfig, load_tokenizer, train_tokenizer

WORDS = ["red", "blue", "green", "gold", "pink", "gray"]


class SayBlue:
    domain, version = "color", "t1"

    def verify(self, task: Task, response: str) -> Verdict:
        return Verdict(1.0, "correct") if "blue" in response else Verdict(0.0, "wrong_answer")


def color_tokenizer_and_config(tok_dir):
    """A tokenizer trained on the color words and a micro model config for it."""
    corpus = [" ".join(WORDS) + " pick a color" for _ in range(50)]
    tok = load_tokenizer(train_tokenizer(corpus, TokenizerConfig(vocab_size=320), tok_dir))
    cfg = ModelConfig.for_size(
        "micro", vocab_size=len(tok), bos_token_id=0, eos_token_id=0, pad_token_id=1, index_topk=512
    )
    return tok, cfg


def color_tasks(split: str, n: int, start: int = 0) -> list[Task]:
    prefix = "c" if split == "train" else "h"
    return [Task(f"{prefix}{i}", "color", f"pick a color {i + start}", "blue", 1, split) for i in range(n)]
