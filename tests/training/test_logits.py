"""The LM head at selected positions only: same values and gradients as the full head, ragged rows included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.logits import logits_at, predicting_positions, summed_cross_entropy
from training.model import ModelConfig, build_model

MICRO = ModelConfig.for_size("micro")


def _ragged_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, MICRO.vocab_size, (3, 24), generator=g)
    labels = ids.clone()
    for row, start in enumerate((5, 17, 22)):  # a different prompt length per row
        labels[row, :start] = -100
    labels[1, 20] = -100  # and a hole inside one response
    return ids, labels


def test_predicting_positions_shift_labels_by_one():
    labels = torch.tensor([[-100, -100, 7, 8], [-100, 5, -100, -100]])
    assert predicting_positions(labels).tolist() == [[False, True, True, False], [True, False, False, False]]


def test_selected_head_gives_the_full_heads_loss_and_gradients():
    ids, labels = _ragged_batch()
    full, sel = build_model(MICRO, seed=3), build_model(MICRO, seed=3)
    logits = full(input_ids=ids).logits
    ref = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="sum")
    ref.backward()
    keep = predicting_positions(labels)
    with logits_at(sel, keep):
        picked = sel(input_ids=ids).logits
    assert picked.shape == (int(keep.sum()), MICRO.vocab_size)
    loss = F.cross_entropy(picked, labels[:, 1:][keep[:, :-1]], reduction="sum")
    loss.backward()
    assert float(loss) == pytest.approx(float(ref), rel=1e-5)
    for (name, a), b in zip(full.named_parameters(), sel.parameters(), strict=True):
        if a.grad is None:
            assert b.grad is None, name
            continue
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name
    assert sel.lm_head.weight.grad.abs().sum() > 0
    # the hook is gone after the block: the next forward is the full head again
    assert sel(input_ids=ids).logits.shape == (3, 24, MICRO.vocab_size)


def test_row_column_index_selects_per_row_columns():
    model = build_model(MICRO, seed=1).eval()
    ids, _ = _ragged_batch(1)
    rows = torch.arange(3).unsqueeze(1).expand(3, 4)
    cols = torch.tensor([[0, 1, 2, 3], [10, 11, 12, 12], [20, 21, 22, 23]])  # a repeated column is allowed
    with torch.no_grad():
        full = model(input_ids=ids).logits
        with logits_at(model, (rows, cols)):
            picked = model(input_ids=ids).logits
    assert picked.shape == (3, 4, MICRO.vocab_size)
    assert torch.allclose(picked, full[rows, cols], atol=1e-5)


def test_a_mask_of_the_wrong_shape_is_refused():
    model = build_model(MICRO, seed=1)
    ids, labels = _ragged_batch()
    with (
        pytest.raises(ValueError, match="do not match index"),
        logits_at(model, predicting_positions(labels[:2])),
    ):
        model(input_ids=ids)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 63, 64, 200])  # one chunk is 64 rows at V=8192: below, at, across
def test_summed_cross_entropy_matches_torch_in_loss_and_gradient(dtype, rows):
    g = torch.Generator().manual_seed(rows)
    base = torch.randn(rows, 8192, generator=g) * 3
    targets = torch.randint(0, 8192, (rows,), generator=g)
    ref_in, ours_in = base.to(dtype).requires_grad_(), base.to(dtype).requires_grad_()
    ref = F.cross_entropy(ref_in.float(), targets, reduction="sum")
    (ref * 0.5).backward()
    ours = summed_cross_entropy(ours_in, targets)
    (ours * 0.5).backward()
    assert ours.dtype == torch.float32 and ours_in.grad.dtype == dtype
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6)
    # bf16 gradients: one rounding of the same fp32 value, so at most one bf16 ulp apart
    tol = 2e-3 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(ours_in.grad.float(), ref_in.grad.float(), rtol=tol, atol=1e-6)


def test_summed_cross_entropy_refuses_ignored_or_out_of_range_targets():
    logits = torch.zeros(3, 10)
    with pytest.raises(ValueError, match="outside"):
        summed_cross_entropy(logits, torch.tensor([1, -100, 2]))
    with pytest.raises(ValueError, match="outside"):
        summed_cross_entropy(logits, torch.tensor([1, 10, 2]))
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        summed_cross_entropy(logits[None], torch.tensor([1, 2, 3]))
