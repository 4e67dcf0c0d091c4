"""The trainer's side of RL: per-token log-probs and entropy of trajectories under the policy being trained,
and the DSA settings RL needs (deterministic top-k, frozen indexer: docs/recipe.md "Reasoning RL")."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from training.logits import logits_at
from training.rollout.trajectory import Trajectory


def freeze_indexer(model: nn.Module) -> int:
    """Stop gradient updates of every DSA indexer parameter; returns how many tensors were frozen. The
    native forward selects keys with `torch.topk`, which is deterministic."""
    frozen = 0
    for name, param in model.named_parameters():
        if ".indexer." in name:
            param.requires_grad_(False)
            frozen += 1
    return frozen


def response_batch(trajs: Sequence[Trajectory], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded [B, S] ids of prompt + response, and for the response part [B, T]: engine log-probs,
    loss mask and the column where each response starts."""
    seq = max(len(t.token_ids) for t in trajs)
    width = max(len(t.response_ids) for t in trajs)
    ids = torch.full((len(trajs), seq), pad_id, dtype=torch.long)
    logp_infer = torch.zeros((len(trajs), width))
    mask = torch.zeros((len(trajs), width))
    starts = torch.zeros(len(trajs), dtype=torch.long)
    for i, t in enumerate(trajs):
        ids[i, : len(t.token_ids)] = torch.tensor(t.token_ids)
        n = len(t.response_ids)
        logp_infer[i, :n] = torch.tensor(t.logprobs)
        mask[i, :n] = torch.tensor(t.loss_mask, dtype=torch.float)
        starts[i] = len(t.prompt_ids)
    return {"input_ids": ids, "logp_infer": logp_infer, "mask": mask, "starts": starts}


def response_logprobs_all(
    model: nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0
) -> torch.Tensor:
    """[B, T, V] log-softmax at every response position under `model`; gradient flows if enabled."""
    ids, starts = batch["input_ids"], batch["starts"]
    width = batch["mask"].shape[1]
    # position p predicts token p + 1: response token t sits at starts + t and is predicted at starts + t - 1
    cols = (starts.unsqueeze(1) + torch.arange(width).unsqueeze(0) - 1).clamp(max=ids.shape[1] - 2)
    rows = torch.arange(ids.shape[0]).unsqueeze(1).expand_as(cols)
    with logits_at(model, (rows, cols)):  # the LM head on the response positions only
        picked = model(input_ids=ids).logits.float() / max(temperature, 1e-6)
    return F.log_softmax(picked, dim=-1)


def response_targets(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B, T] the sampled response tokens (aligned with `response_logprobs_all`'s positions)."""
    ids, starts = batch["input_ids"], batch["starts"]
    cols = (starts.unsqueeze(1) + torch.arange(batch["mask"].shape[1]).unsqueeze(0)).clamp(
        max=ids.shape[1] - 1
    )
    return ids.gather(1, cols)


def token_logprobs(
    model: nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(response_t), entropy_t), each [B, T], under `model`; gradient flows if enabled."""
    logp_all = response_logprobs_all(model, batch, temperature)
    logp = logp_all.gather(-1, response_targets(batch).unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy.detach()
