"""The relative shift's own backward (one pass) gives autograd's gradient of the plain view, exactly; the copy that
torch.export traces reads the same cells."""

import pytest
import torch

from transformers_xl.modeling.relative_attention import _shifted_copy, _shifted_view, relative_shift

SHAPES = [  # (leading dims, queries, distances, keys, offset)
    ((2, 3), 5, 9, 8, 4),  # Transformer-XL: distances k-1 ... -1, offset q - 1
    ((2, 3), 5, 13, 8, 5),  # XLNet bi: k ... -q+1, offset q (keys < distances - 1: unread columns per row)
    ((3,), 4, 9, 5, 4),  # XLNet uni: k ... 0
    ((), 1, 4, 3, 0),  # one query
]


@pytest.mark.parametrize("batch, queries, distances, keys, offset", SHAPES)
def test_shift_gradient_equals_the_views(batch, queries, distances, keys, offset):
    scores = torch.randn(*batch, queries, distances, requires_grad=True)
    upstream = torch.randn(*batch, queries, keys)
    (ours,) = torch.autograd.grad(relative_shift(scores, keys, offset), scores, upstream)
    (views,) = torch.autograd.grad(_shifted_view(scores, keys, offset), scores, upstream)
    assert torch.equal(ours, views)
    assert torch.equal(relative_shift(scores, keys, offset), _shifted_view(scores, keys, offset))


@pytest.mark.parametrize("batch, queries, distances, keys, offset", SHAPES[:2])
def test_shift_gradcheck(batch, queries, distances, keys, offset):
    scores = torch.randn(*batch, queries, distances, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: relative_shift(s, keys, offset), (scores,))


def test_shift_without_gradients_is_a_view():
    scores = torch.randn(2, 4, 9)
    assert relative_shift(scores, 8, 3)._base is scores


@pytest.mark.parametrize("batch, queries, distances, keys, offset", SHAPES)
def test_the_copy_torch_export_traces_reads_the_same_cells(batch, queries, distances, keys, offset):
    """`out[..., i, j] = scores[..., i, j + offset - i]` wherever that distance exists (the other cells are future
    keys, masked)."""
    scores = torch.randn(*batch, queries, distances)
    rows, columns = torch.arange(queries)[:, None], torch.arange(keys)[None, :]
    read = columns + offset - rows
    exists = (read >= 0) & (read < distances)
    expected = scores.gather(-1, read.clamp(0, distances - 1).expand(*batch, queries, keys))
    for shift in (_shifted_view, _shifted_copy):
        assert torch.equal(shift(scores, keys, offset)[..., exists], expected[..., exists])
