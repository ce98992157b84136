"""The relative shift re-indexes per-distance scores to (query, key) pairs: `out[i, j] = scores[i, j + offset - i]`
for every pair that reads a listed distance, with autograd's gradient, and under dynamic torch.export."""

import pytest
import torch

from transformers_xl.modeling.relative_attention import relative_shift

SHAPES = [  # (leading dims, queries, distances, keys, offset)
    ((2, 3), 5, 9, 8, 4),  # Transformer-XL: distances k-1 ... -1, offset q - 1
    ((2, 3), 5, 13, 8, 5),  # XLNet bi: k ... -q+1, offset q (keys < distances - 1: unread columns per row)
    ((3,), 4, 9, 5, 4),  # XLNet uni: k ... 0
    ((), 1, 4, 3, 0),  # one query
    ((2,), 4, 9, 5, 1),  # an offset below q - 1
]


def reference(scores, keys, offset):
    """The definition, pair by pair; NaN where j + offset - i lies outside the listed distances."""
    *batch, queries, distances = scores.shape
    out = torch.full((*batch, queries, keys), float("nan"), dtype=scores.dtype)
    for i in range(queries):
        for j in range(keys):
            if 0 <= j + offset - i < distances:
                out[..., i, j] = scores[..., i, j + offset - i]
    return out


@pytest.mark.parametrize("batch, queries, distances, keys, offset", SHAPES)
def test_shift_reads_each_pairs_distance(batch, queries, distances, keys, offset):
    scores = torch.randn(*batch, queries, distances)
    expected = reference(scores, keys, offset)
    listed = ~expected.isnan()
    assert torch.equal(relative_shift(scores, keys, offset)[listed], expected[listed])
    # (Transformer-XL and XLNet read only listed distances for the keys they attend to: query i's keys j <= k - q + i)
    attended = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    assert listed[..., attended].all() or offset < queries - 1


@pytest.mark.parametrize("batch, queries, distances, keys, offset", SHAPES[:2])
def test_shift_gradcheck(batch, queries, distances, keys, offset):
    scores = torch.randn(*batch, queries, distances, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: relative_shift(s, keys, offset), (scores,))


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="expected key_length < distances"):
        relative_shift(torch.randn(4, 9), 9, 3)


def test_shift_exports_with_a_dynamic_length():
    """Transformer-XL's shift (offset q - 1, keys = distances - 1) traced by torch.export with the number of
    queries and distances symbolic, then run at other sizes."""

    class Shift(torch.nn.Module):
        def forward(self, scores):
            return relative_shift(scores, scores.shape[-1] - 1, scores.shape[-2] - 1)

    queries, distances = torch.export.Dim("queries", min=2), torch.export.Dim("distances", min=3)
    example = torch.randn(2, 4, 9)
    program = torch.export.export(Shift(), (example,), dynamic_shapes=({1: queries, 2: distances},))
    for shape in ((2, 3, 7), (2, 6, 12)):
        scores = torch.randn(shape)
        assert torch.equal(program.module()(scores), relative_shift(scores, shape[-1] - 1, shape[-2] - 1))
