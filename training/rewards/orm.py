"""The outcome reward model (ORM): a small GLM-5 transformer with a scalar head on its last token, trained with
the Bradley-Terry loss  -log σ(r(x, y_chosen) - r(x, y_rejected))  on preference pairs built from the General
RL prompts and the task suites (chosen = verified-correct / constraint-satisfying, rejected = a wrong or
constraint-violating answer to the same prompt). Pairs of held-out prompts measure its pair accuracy.

    pairs = preference_pairs(prompts)                  # {"train": [...], "heldout": [...]}
    orm, metrics = train_orm(pairs, tokenizer, ORMConfig())
    orm.save(dir); ORM.load(dir).score(prompts, responses)   # sigmoid(r) in (0, 1)
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from training.model import ModelConfig, build_model, load_model
from training.rewards.rules import without_end_markers
from training.tasks.base import Split, Task

log = logging.getLogger(__name__)
WEIGHTS, CONFIG = "orm.safetensors", "orm_config.json"


class ORMConfig(BaseModel):
    """Outcome reward model training (defaults are the `tiny` profile's)."""

    model_config = ConfigDict(extra="forbid")
    model_size: str = Field(
        "micro", description="training/model.py size preset of the backbone (micro / tiny)"
    )
    init_from: str | None = Field(
        None, description="HF dir of a policy checkpoint to start the backbone from (None = random init)"
    )
    steps: int = Field(300, ge=1, description="Optimizer steps")
    batch_size: int = Field(16, ge=1, description="Preference pairs per step")
    learning_rate: float = Field(1e-3, gt=0, description="AdamW learning rate")
    max_len: int = Field(128, ge=16, description="Tokens per (prompt, answer); longer ones keep their end")
    eval_every: int = Field(100, ge=1, description="Held-out pair accuracy every N steps (and at the end)")
    seed: int = Field(0, description="Seed of the init and the pair order")


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    kind: str  # which perturbation made `rejected` (the accuracy is reported per kind)


def _shuffled(text: str, rng: random.Random) -> str:
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


def _sentence(definition: str) -> str:
    return definition[:1].upper() + definition[1:].rstrip(".") + "."


def _pairs_for(task: Task, others: Sequence[Task], rng: random.Random) -> list[PreferencePair]:
    """The preference pairs of one prompt; `others` give the wrong answers (another prompt's reference)."""
    meta, p = task.meta, task.prompt
    other = rng.choice(others)
    if task.domain == "math":
        steps, right = meta.get("steps", ""), task.answer.replace("*x", "x")
        wrong = (
            str(int(right) + rng.choice([-3, -2, -1, 1, 2, 3]))
            if re.fullmatch(r"-?\d+", right)
            else right + "0"
        )
        return [
            PreferencePair(
                p,
                f"<think>{steps}</think>Answer: {right}",
                f"<think>{steps}</think>Answer: {wrong}",
                "math_wrong_answer",
            )
        ]
    if task.domain == "knowledge":
        return [
            PreferencePair(p, f"Answer: {task.answer}", f"Answer: {other.answer}", "knowledge_wrong_term")
        ]
    definition, term = meta.get("reference", task.answer), meta.get("term", "it")
    sentence, wrong_def = _sentence(definition), _sentence(other.meta.get("reference", other.answer))
    pairs = [PreferencePair(p, sentence, _shuffled(sentence, rng), "garbled")]
    c = meta.get("constraints", {})
    words = sentence.split()
    if c.get("max_words"):
        n = c["max_words"]
        short = " ".join(words[: max(1, n - 1)]).rstrip(",;") + "."
        long = sentence + " " + " ".join(["It is a word people use often."] * (1 + n // 6))
        pairs.append(PreferencePair(p, short, long, "too_many_words"))
    elif c.get("min_words"):
        n = c["min_words"]
        long = sentence
        while len(long.split()) < n:
            long += f" In other words, {term} is {definition.rstrip('.')}."
        pairs.append(PreferencePair(p, long, " ".join(words[:3]) + ".", "too_few_words"))
    elif c.get("keywords"):
        kw = c["keywords"][0]
        dropped = re.sub(rf"\b{re.escape(kw)}\b", "thing", sentence, flags=re.IGNORECASE)
        if dropped != sentence:
            pairs.append(PreferencePair(p, sentence, dropped, "missing_keyword"))
    elif c.get("json_keys"):
        good = json.dumps({"term": term, "definition": definition})
        pairs.append(PreferencePair(p, good, f"term: {term}, definition: {definition}", "invalid_json"))
    elif task.domain == "chat":
        pairs.append(PreferencePair(p, sentence, wrong_def, "wrong_definition"))
    elif task.domain == "writing":
        pairs.append(
            PreferencePair(p, sentence, f"Shut up, {term} is stupid. " + sentence, "forbidden_words")
        )
    return pairs


def preference_pairs(prompts: dict[Split, list[Task]], seed: int = 0) -> dict[Split, list[PreferencePair]]:
    """Pairs per split from `general_prompts` (fact prompts and suite tasks); held-out pairs come only from
    held-out prompts, so the held-out accuracy is on prompts the ORM never saw."""
    rng = random.Random(seed)
    out: dict[Split, list[PreferencePair]] = {}
    for split, tasks in prompts.items():
        by_domain: dict[str, list[Task]] = defaultdict(list)
        for t in tasks:
            by_domain[t.domain].append(t)
        out[split] = [
            pair
            for t in tasks
            for pair in _pairs_for(t, [o for o in by_domain[t.domain] if o.id != t.id] or [t], rng)
        ]
    return out


class RewardModel(nn.Module):
    """A GLM-5 decoder (the causal LM's `model`) with a linear scalar head on the last real token."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids).last_hidden_state  # [B, S, H], right-padded
        last = hidden[torch.arange(len(lengths)), lengths - 1]
        return self.head(last).squeeze(-1)


class ORM:
    """A trained reward model with its tokenizer: `score` is sigmoid(r) in (0, 1) per (prompt, answer)."""

    def __init__(self, model: RewardModel, tokenizer: Any, model_cfg: ModelConfig, cfg: ORMConfig):
        self.model, self.tokenizer, self.model_cfg, self.cfg = model, tokenizer, model_cfg, cfg

    def encode(self, prompts: Sequence[str], answers: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for prompt, answer in zip(prompts, answers, strict=True):
            # the whole output, reasoning block included: a worked solution is judged with its steps
            messages = [
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": without_end_markers(answer)},
            ]
            ids = self.tokenizer.apply_chat_template(messages, return_dict=True)["input_ids"]
            rows.append(list(ids)[-self.cfg.max_len :])  # keep the end: the answer is what is judged
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), max(map(len, rows))), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        return ids, torch.tensor([len(r) for r in rows])

    def rewards(self, prompts: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        return self.model(*self.encode(prompts, answers))

    @torch.no_grad()
    def score(self, prompts: Sequence[str], answers: Sequence[str], batch_size: int = 32) -> list[float]:
        self.model.eval()
        out: list[float] = []
        for i in range(0, len(prompts), batch_size):
            out += torch.sigmoid(
                self.rewards(prompts[i : i + batch_size], answers[i : i + batch_size])
            ).tolist()
        return out

    def save(self, directory: Path) -> Path:
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, directory / WEIGHTS)
        meta = {"model": self.model_cfg.model_dump(), "orm": self.cfg.model_dump()}
        (directory / CONFIG).write_text(json.dumps(meta, indent=1))
        self.tokenizer.save_pretrained(
            directory, save_jinja_files=False
        )  # the template in tokenizer_config.json
        return directory

    @staticmethod
    def load(directory: Path) -> ORM:
        from safetensors.torch import load_file

        from training.tokenizer import load_tokenizer

        directory = Path(directory)
        if not (directory / WEIGHTS).exists():
            raise FileNotFoundError(
                f"no outcome reward model in {directory} (expected {WEIGHTS}); train one first"
            )
        meta = json.loads((directory / CONFIG).read_text())
        model_cfg, cfg = ModelConfig.model_validate(meta["model"]), ORMConfig.model_validate(meta["orm"])
        model = RewardModel(build_model(model_cfg).model, model_cfg.hidden_size)
        model.load_state_dict(load_file(directory / WEIGHTS))
        model.eval()
        return ORM(model, load_tokenizer(directory), model_cfg, cfg)


def pair_accuracy(orm: ORM, pairs: Sequence[PreferencePair]) -> dict[str, float]:
    """Share of pairs where r(chosen) > r(rejected), overall and per kind, with standard errors."""
    if not pairs:
        return {}
    prompts = [p.prompt for p in pairs]
    good = orm.score(prompts, [p.chosen for p in pairs])
    bad = orm.score(prompts, [p.rejected for p in pairs])
    by_kind: dict[str, list[float]] = defaultdict(list)
    for p, g, b in zip(pairs, good, bad, strict=True):
        by_kind[p.kind].append(float(g > b))
        by_kind["all"].append(float(g > b))
    out = {}
    for kind, hits in sorted(by_kind.items()):
        acc = sum(hits) / len(hits)
        suffix = "" if kind == "all" else f"/{kind}"
        out[f"pair_accuracy{suffix}"] = acc
        out[f"pair_accuracy_se{suffix}"] = math.sqrt(acc * (1 - acc) / len(hits))
        out[f"pairs{suffix}"] = float(len(hits))
    return out


def train_orm(
    pairs: dict[Split, list[PreferencePair]],
    tokenizer: Any,
    cfg: ORMConfig,
    log_metrics: Callable[[dict[str, float], int], None] = lambda m, s: None,
) -> tuple[ORM, dict[str, float]]:
    """Bradley-Terry training on `pairs["train"]`; returns the model and its final held-out pair accuracy
    (`heldout/pair_accuracy`, per kind, with standard errors) and last train loss."""
    if not pairs.get("train"):
        raise ValueError("train_orm: no train pairs (build them with preference_pairs from general_prompts)")
    # the backbone sees every token of its short inputs: DSA's top-k never drops one
    overrides = {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "index_topk": cfg.max_len,
    }
    if cfg.init_from:
        policy = load_model(cfg.init_from)
        model_cfg = ModelConfig.model_validate({**_config_of(policy), **overrides})
        backbone = policy.model
    else:
        model_cfg = ModelConfig.for_size(cfg.model_size, **overrides)
        backbone = build_model(model_cfg, seed=cfg.seed).model
    torch.manual_seed(cfg.seed)
    orm = ORM(RewardModel(backbone, model_cfg.hidden_size), tokenizer, model_cfg, cfg)
    optimizer = torch.optim.AdamW(orm.model.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
    rng = random.Random(cfg.seed)
    train, order = pairs["train"], []
    metrics: dict[str, float] = {}
    for step in range(1, cfg.steps + 1):
        orm.model.train()
        if len(order) < cfg.batch_size:
            order += rng.sample(range(len(train)), len(train))
        batch = [train[order.pop()] for _ in range(cfg.batch_size)]
        prompts = [p.prompt for p in batch]
        r = orm.rewards(prompts + prompts, [p.chosen for p in batch] + [p.rejected for p in batch])
        margin = r[: len(batch)] - r[len(batch) :]
        loss = -F.logsigmoid(margin).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(orm.model.parameters(), 1.0)
        optimizer.step()
        metrics = {"loss": float(loss.detach()), "train/batch_accuracy": float((margin > 0).float().mean())}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            metrics.update(
                {f"heldout/{k}": v for k, v in pair_accuracy(orm, pairs.get("heldout", [])).items()}
            )
            log.info("ORM step %d: loss %.3f, held-out pair accuracy %s", step, metrics["loss"],
                     metrics.get("heldout/pair_accuracy"))  # fmt: skip
        log_metrics(metrics, step)
    orm.model.eval()
    return orm, metrics


def _config_of(policy: nn.Module) -> dict[str, Any]:
    """The ModelConfig fields of a loaded policy (its HF config carries them under the same names)."""
    hf = policy.config.to_dict()
    return {k: hf[k] for k in ModelConfig.model_fields if k in hf}
