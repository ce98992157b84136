"""linear / linear_layer: the same product as nn.Linear, through the faster BLAS call for few rows on CPU; layers that
are not plain nn.Linear (quantized, replaced) are called."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformers_xl.modeling import decoding_linear
from transformers_xl.modeling.decoding_linear import MAX_ROWS, linear, linear_layer


def refuse_f_linear(monkeypatch):
    """On a machine where the transposed product pays, make the F.linear fallback fail, to prove that a call took the
    transposed product."""

    def refuse(*args, **kwargs):
        raise AssertionError("F.linear called")

    monkeypatch.setattr(decoding_linear, "transposed_product_pays", lambda threads: True)
    monkeypatch.setattr(decoding_linear.F, "linear", refuse)


@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3,), (2, MAX_ROWS // 2), (MAX_ROWS,)])
@pytest.mark.parametrize("out_features, in_features", [(48, 16), (16, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_f_linear(shape, out_features, in_features, bias, monkeypatch):
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=bias)
    x = torch.randn(*shape, in_features)
    expected = F.linear(x, layer.weight, layer.bias)
    rows = x.numel() // in_features
    if rows > 1 or out_features > in_features:  # the cases that take the transposed product
        refuse_f_linear(monkeypatch)
    output = linear_layer(layer, x)
    assert output.shape == expected.shape and output.is_contiguous()
    torch.testing.assert_close(output, expected)


def test_gradients_equal_f_linear():
    torch.manual_seed(0)
    layer = nn.Linear(16, 48)
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


def test_where_the_transposed_product_does_not_pay_linear_is_f_linear_exactly(monkeypatch):
    monkeypatch.setattr(decoding_linear, "transposed_product_pays", lambda threads: False)
    x, weight, bias = torch.randn(3, 16), torch.randn(48, 16), torch.randn(48)
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))


def test_the_layout_is_measured_once_per_thread_count():
    decoding_linear.transposed_product_pays.cache_clear()
    threads = torch.get_num_threads()
    assert isinstance(decoding_linear.transposed_product_pays(threads), bool)
    decoding_linear.transposed_product_pays(threads)
    info = decoding_linear.transposed_product_pays.cache_info()
    assert (info.misses, info.hits) == (1, 1)


def test_output_features_of_a_plain_layer_read_only_their_weights(monkeypatch):
    torch.manual_seed(0)
    layer = nn.Linear(16, 48)
    x = torch.randn(3, 16)
    refuse_f_linear(monkeypatch)
    torch.testing.assert_close(linear_layer(layer, x, slice(16, None)), (x @ layer.weight.t() + layer.bias)[:, 16:])


class Doubled(nn.Linear):
    """A replacement layer (as a quantization tool would put there): not a plain nn.Linear, so it must be called."""

    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("features", [slice(None), slice(16, None)])
def test_other_layers_are_called(features):
    torch.manual_seed(0)
    layer = Doubled(16, 48)
    x = torch.randn(3, 16)
    torch.testing.assert_close(linear_layer(layer, x, features), 2 * F.linear(x, layer.weight, layer.bias)[:, features])


def test_a_quantized_layer_is_called():
    torch.manual_seed(0)
    layer = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(16, 48)), {nn.Linear})[0]
    x = torch.randn(3, 16)
    torch.testing.assert_close(linear_layer(layer, x, slice(0, 8)), layer(x)[:, :8])


def test_a_tensor_subclass_weight_is_not_read_by_mm():
    """torchao's quantized weights are tensor subclasses that implement F.linear but not mm: `linear` leaves them to
    F.linear."""

    class Subclass(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.mm or func is torch.addmm:
                raise AssertionError("mm called on the subclass weight")
            return super().__torch_function__(func, types, args, kwargs or {})

    weight = torch.randn(48, 16).as_subclass(Subclass)
    x = torch.randn(3, 16)
    torch.testing.assert_close(linear(x, weight).as_subclass(torch.Tensor), x @ weight.as_subclass(torch.Tensor).t())
