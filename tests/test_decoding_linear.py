"""DecodingLinear: the same product as nn.Linear, through the faster BLAS call for few rows on CPU."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformers_xl.modeling import decoding_linear
from transformers_xl.modeling.decoding_linear import MAX_ROWS, DecodingLinear, linear


def refuse_f_linear(monkeypatch):
    """Make the F.linear fallback fail, to prove that a call took the transposed product."""

    def refuse(*args, **kwargs):
        raise AssertionError("F.linear called")

    monkeypatch.setattr(decoding_linear.F, "linear", refuse)


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3,), (2, MAX_ROWS // 2), (MAX_ROWS,)])
@pytest.mark.parametrize("out_features, in_features", [(48, 16), (16, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_f_linear(shape, out_features, in_features, bias, monkeypatch):
    torch.manual_seed(0)
    layer = DecodingLinear(in_features, out_features, bias=bias)
    x = torch.randn(*shape, in_features)
    expected = F.linear(x, layer.weight, layer.bias)
    rows = x.numel() // in_features
    if rows > 1 or out_features > in_features:  # the cases that take the transposed product
        refuse_f_linear(monkeypatch)
    output = layer(x)
    assert output.shape == expected.shape and output.is_contiguous()
    torch.testing.assert_close(output, expected)


def test_gradients_equal_f_linear():
    torch.manual_seed(0)
    layer = DecodingLinear(16, 48)
    x = torch.randn(3, 16, requires_grad=True)
    linear(x, layer.weight, layer.bias).square().sum().backward()
    ours = [t.grad.clone() for t in (x, layer.weight, layer.bias)]
    for t in (x, layer.weight, layer.bias):
        t.grad = None
    F.linear(x, layer.weight, layer.bias).square().sum().backward()
    for mine, reference in zip(ours, (x.grad, layer.weight.grad, layer.bias.grad)):
        torch.testing.assert_close(mine, reference)


@pytest.mark.parametrize(
    "x, weight",
    [
        (torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(48, 16, dtype=torch.bfloat16)),  # half precision
        (torch.randn(MAX_ROWS + 1, 16), torch.randn(48, 16)),  # many rows: a real GEMM already
        (torch.randn(1, 48), torch.randn(16, 48)),  # one row into a narrower output: the GEMV path is faster
    ],
)
def test_other_cases_are_f_linear_exactly(x, weight):
    assert torch.equal(linear(x, weight), F.linear(x, weight))


def test_is_an_nn_linear_with_the_same_state_dict():
    torch.manual_seed(0)
    plain = nn.Linear(16, 48)
    ours = DecodingLinear(16, 48)
    ours.load_state_dict(plain.state_dict())
    assert isinstance(ours, nn.Linear)
    assert list(ours.state_dict()) == list(plain.state_dict())
