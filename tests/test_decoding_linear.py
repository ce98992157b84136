"""linear / linear_layer: the same product as nn.Linear, through the faster BLAS call for few rows on CPU; layers that
are not plain nn.Linear (quantized, replaced) are called."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformers_xl.modeling import decoding_linear
from transformers_xl.modeling.decoding_linear import MAX_ROWS, linear, linear_layer


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


# ----------------------------------------------------------------------------------------------------------------
# Decoding steps on DECODING_THREADS threads


def tiny_language_models():
    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    txl = TransfoXLLMHeadModel(TransfoXLConfig(vocab_size=60, cutoffs=[20, 40], d_model=16, d_embed=16, n_head=2,
                                               d_head=8, d_inner=32, n_layer=2, mem_len=32, eos_token_id=None))
    xlnet = XLNetLMHeadModel(XLNetConfig(vocab_size=60, d_model=16, n_layer=2, n_head=2, d_inner=32))
    return {"transfo-xl": txl.eval(), "xlnet": xlnet.eval()}


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_decoding_steps_run_on_decoding_threads_and_restore_the_setting(model_type, monkeypatch):
    """generate(): the prompt's forward pass keeps torch's thread count, every decoding step runs on
    DECODING_THREADS, and the count is torch's again afterwards (also after a step that raised)."""
    model = tiny_language_models()[model_type]
    seen = []
    model.transformer.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        prompt = torch.randint(1, 60, (1, 20), generator=torch.Generator().manual_seed(0))
        model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert seen[0] == 3 and seen[1:] == [decoding_linear.DECODING_THREADS] * (len(seen) - 1) and len(seen) >= 3
        assert torch.get_num_threads() == 3
        monkeypatch.setattr(decoding_linear, "DECODING_THREADS", None)  # (torch's setting throughout)
        seen.clear()
        model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert set(seen) == {3}
        monkeypatch.setattr(decoding_linear, "DECODING_THREADS", 1)
        model.transformer.register_forward_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("failed step")))
        with pytest.raises(RuntimeError, match="failed step"):
            model.generate(prompt[:, :4], max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(previous)
