"""linear / linear_layer: the same product as nn.Linear, through the faster BLAS call for few rows on CPU; layers that
are not plain nn.Linear (quantized, replaced) are called."""

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from greedy_decoding import assert_greedy_decodings_agree

from transformers_xl.modeling import decoding_linear
from transformers_xl.modeling.decoding_linear import MAX_ROWS, linear, linear_layer


def refuse_f_linear(monkeypatch, measurement="fastest_few_rows_product", answer="transposed"):
    """As on a machine where `measurement` finds another product than F.linear's the faster one (transposed or
    oneDNN's for few fp32 rows, torch's own kernels, packed or fp16 weights for bf16, oneDNN's GEMM for many rows),
    make the F.linear fallback fail, to prove that a call took that product. (F.linear with oneDNN switched off is
    torch's own kernels, `native_linear`, and runs.)"""
    f_linear = F.linear

    def refuse(*args, **kwargs):
        if torch.backends.mkldnn.enabled:
            raise AssertionError("F.linear called")
        return f_linear(*args, **kwargs)

    monkeypatch.setattr(decoding_linear, measurement, lambda *shape_and_threads: answer)
    monkeypatch.setattr(decoding_linear.F, "linear", refuse)


needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


@pytest.mark.parametrize("product", ["transposed", pytest.param("oneDNN", marks=needs_onednn)])
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3,), (2, MAX_ROWS // 2), (MAX_ROWS,)])
@pytest.mark.parametrize("out_features, in_features", [(48, 16), (16, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_few_rows_products_equal_f_linear(product, shape, out_features, in_features, bias, monkeypatch):
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=bias)
    x = torch.randn(*shape, in_features)
    expected = F.linear(x, layer.weight, layer.bias)
    refuse_f_linear(monkeypatch, answer=product)
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
        (torch.randn(3, 16, dtype=torch.float16), torch.randn(48, 16, dtype=torch.float16)),  # fp16
        (torch.randn(MAX_ROWS + 1, 16), torch.randn(48, 16)),  # many rows: a real GEMM already
    ],
)
def test_other_cases_are_f_linear_exactly(x, weight, monkeypatch):
    monkeypatch.setattr(decoding_linear, "onednn_product_pays", lambda threads: False)
    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_threads: "transposed")
    assert torch.equal(linear(x, weight), F.linear(x, weight))


def test_where_f_linear_is_the_fastest_linear_is_f_linear_exactly(monkeypatch):
    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_threads: "F.linear")
    x, weight, bias = torch.randn(3, 16), torch.randn(48, 16), torch.randn(48)
    assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))


@pytest.mark.parametrize("product", ["transposed", pytest.param("oneDNN", marks=needs_onednn)])
def test_a_transposed_view_is_multiplied_by_a_contiguous_copy_made_once(product, monkeypatch):
    """XLNet's q, k, v: [d_model, H*D] read as their transposed view. The measured products take a contiguous copy,
    made once and again after the parameter changes; with gradients to come, or for an inference tensor (no version
    counter to tell), F.linear reads the view itself."""
    torch.manual_seed(0)
    parameter = nn.Parameter(torch.randn(16, 48))
    x = torch.randn(2, 16)
    copies, contiguous = [], torch.Tensor.contiguous
    refuse_f_linear(monkeypatch, answer=product)

    def counted(tensor, *args, **kwargs):
        if tensor.shape == (48, 16) and not tensor.is_contiguous():  # (the weight's view; products copy rows too)
            copies.append(tensor.shape)
        return contiguous(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "contiguous", counted)
    with torch.no_grad():
        first = linear(x, parameter.t())
        torch.testing.assert_close(first, x @ parameter)
        assert torch.equal(linear(x, parameter.t()), first) and len(copies) == 1
        parameter.mul_(2)
        torch.testing.assert_close(linear(x, parameter.t()), 2 * first)
        assert len(copies) == 2
    monkeypatch.undo()
    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_threads: product)
    assert torch.equal(linear(x, parameter.t()), F.linear(x, parameter.t()))  # (gradients to come)
    with torch.inference_mode():
        weight = torch.randn(16, 48)
        assert torch.equal(linear(x, weight.t()), F.linear(x, weight.t()))


def test_few_rows_products_are_measured_once_per_shape(monkeypatch):
    """One measurement per weight shape and row count, whose answer is one of the products; weights under
    MEASURED_BYTES are F.linear's unmeasured in fp32, torch's own kernels' in bf16."""
    fastest = decoding_linear.fastest_few_rows_product
    fastest.cache_clear()
    measured, cold_seconds = [], decoding_linear._cold_seconds

    def counted(ways, out_features, in_features, dtype, rows):
        measured.append((out_features, in_features, rows))
        return cold_seconds(ways, out_features, in_features, dtype, rows)

    monkeypatch.setattr(decoding_linear, "_cold_seconds", counted)
    side = decoding_linear.MEASURED_BYTES // 4 // 128
    answers = [fastest(side, 128, rows) for rows in (1, 2, 1)] + [fastest(128, side, 1)]
    assert set(answers) <= {"F.linear", "transposed", "oneDNN"}
    assert fastest(side, 128, 1, torch.bfloat16) in {"F.linear", "native", "packed", "fp16 weights"}  # (its own dtype)
    assert measured == [(side, 128, 1), (side, 128, 2), (128, side, 1), (side, 128, 1)]
    info = fastest.cache_info()
    assert (info.misses, info.hits) == (4, 1)
    assert fastest(side - 1, 128, 1) == "F.linear" and len(measured) == 4
    assert fastest(side - 1, 128, 1, torch.bfloat16) == "native" and len(measured) == 4


def test_the_many_rows_choice_is_measured_once_per_thread_count():
    pays = decoding_linear.onednn_product_pays
    pays.cache_clear()
    threads = torch.get_num_threads()
    assert isinstance(pays(threads), bool)
    pays(threads)
    info = pays.cache_info()
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


# ---- bf16: products by torch's own kernels, by oneDNN from a packed copy of the weight, or by FBGEMM from an fp16 copy

needs_bf16_kernels = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this CPU or torch build has no oneDNN bf16 kernels (there linear keeps F.linear for bf16)",
)
needs_fp16_weights = pytest.mark.skipif(
    not decoding_linear._fp16_weights_available(), reason="this CPU or torch build has no FBGEMM fp16-weight products"
)
BF16_COPIED_PRODUCTS = [
    pytest.param("packed", marks=needs_bf16_kernels),
    pytest.param("fp16 weights", marks=needs_fp16_weights),
]
BF16_PRODUCTS = ["native", *BF16_COPIED_PRODUCTS]


@pytest.mark.parametrize("product", BF16_PRODUCTS)
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (3,), (2, MAX_ROWS // 2), (MAX_ROWS,)])
@pytest.mark.parametrize("out_features, in_features", [(48, 16), (16, 48)])
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_few_rows_products_equal_f_linear(product, shape, out_features, in_features, bias, monkeypatch):
    torch.manual_seed(0)
    layer = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    x = torch.randn(*shape, in_features, dtype=torch.bfloat16)
    expected = F.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
    refuse_f_linear(monkeypatch, answer=product)
    with torch.inference_mode():
        output = linear_layer(layer, x)
    assert output.dtype == torch.bfloat16 and output.shape == expected.shape and output.is_contiguous()
    torch.testing.assert_close(output.float(), expected, rtol=2e-2, atol=2e-2)  # (bf16 outputs: 8 bits of mantissa)


@pytest.mark.parametrize("onednn_before", [True, False])
def test_native_linear_rounds_once_and_leaves_onednn_as_it_was(onednn_before, monkeypatch):
    """torch's own bf16 kernels for a few rows: the product of the bf16 numbers summed in fp32 (with the bias) and
    rounded once, within one bf16 rounding of the exact one; the oneDNN switch is back as it was, also after an
    error."""
    torch.manual_seed(0)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", onednn_before)
    for rows in range(1, MAX_ROWS + 1):
        x, weight, bias = (torch.randn(*shape, dtype=torch.bfloat16) for shape in ((rows, 512), (96, 512), (96,)))
        exact = F.linear(x.double(), weight.double(), bias.double())
        output = decoding_linear.native_linear(x, weight, bias)
        assert output.dtype == torch.bfloat16 and torch.backends.mkldnn.enabled == onednn_before
        torch.testing.assert_close(output.double(), exact, rtol=2**-8, atol=1e-6)
    with pytest.raises(RuntimeError):
        decoding_linear.native_linear(torch.ones(1, 3, dtype=torch.bfloat16), weight)
    assert torch.backends.mkldnn.enabled == onednn_before


def test_overlapping_native_products_in_two_threads_leave_onednn_as_it_was(monkeypatch):
    """Two threads' products overlapping, the first to start finishing first: oneDNN stays off until both are done,
    and is on again afterwards."""
    import threading

    started, first_done = threading.Event(), threading.Event()
    seen, f_linear = {}, F.linear

    def first(*args):  # (the first thread's product, held until the second is inside)
        started.set()
        first_done.wait(5)
        return f_linear(*args)

    monkeypatch.setattr(decoding_linear.F, "linear", first)
    x, weight = torch.randn(1, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    thread = threading.Thread(target=decoding_linear.native_linear, args=(x, weight))
    thread.start()
    assert started.wait(5)
    with decoding_linear.onednn_switched_off:  # (the second thread: inside while the first finishes)
        first_done.set()
        thread.join(5)
        seen["while the second is inside"] = torch.backends.mkldnn.enabled
    assert seen == {"while the second is inside": False} and torch.backends.mkldnn.enabled


@needs_fp16_weights
def test_fp16_weights_are_the_bf16_weights_where_fp16_holds_them(monkeypatch):
    """bf16 weights from 2^-17 to 65504 are fp16 numbers: the product is the fp32 one of the same numbers, rounded
    once; a weight beyond fp16's range keeps the packed product."""
    torch.manual_seed(0)
    magnitudes = (1 + torch.rand(48, 16)) * torch.logspace(-5, 4, 16)  # (columns from 1e-5 to 2e4)
    weight = (magnitudes * torch.randn(48, 16).sign()).to(torch.bfloat16)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    exact = F.linear(x.double(), weight.double()).to(torch.bfloat16)
    assert torch.equal(weight.half().to(torch.bfloat16), weight)
    beyond = weight.clone()
    beyond[0, 0] = 1e5
    with torch.no_grad():  # (not inference mode: a weight made there has no version counter, so it is not copied)
        output = decoding_linear.fp16_weight_linear(x, decoding_linear.pack_fp16(weight))
        torch.testing.assert_close(output.float(), exact.float(), rtol=1e-2, atol=0)  # (one bf16 rounding apart)
        assert decoding_linear.pack_fp16(beyond) is None
        expected = F.linear(x.float(), beyond.float())
        refuse_f_linear(monkeypatch, answer="fp16 weights")
        calls, onednn_linear = [], decoding_linear.onednn_linear
        monkeypatch.setattr(decoding_linear, "onednn_linear", lambda *args: calls.append(1) or onednn_linear(*args))
        if decoding_linear._onednn_available(torch.bfloat16):
            torch.testing.assert_close(linear(x, beyond).float(), expected, rtol=2e-2, atol=1e3 * 2e-2)
            assert calls == [1]


@needs_fp16_weights
def test_beyond_fp16_without_onednn_bf16_kernels_is_f_linear_exactly(monkeypatch):
    """Where fp16 weights are chosen but a weight lies beyond fp16's range and the CPU has no oneDNN bf16 kernels for
    the packed product (an AVX2 CPU: FBGEMM runs there, oneDNN's bf16 kernels do not), F.linear."""
    x, weight = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(48, 16, dtype=torch.bfloat16)
    weight[0, 0] = 1e5
    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_dtype: "fp16 weights")
    monkeypatch.setattr(decoding_linear, "_onednn_available", lambda dtype: False)

    def no_kernels(weight):
        raise RuntimeError("no oneDNN bf16 kernels on this CPU")

    monkeypatch.setattr(decoding_linear, "pack", no_kernels)
    with torch.no_grad():
        assert torch.equal(linear(x, weight), F.linear(x, weight))


@pytest.mark.parametrize("product", BF16_COPIED_PRODUCTS)
def test_a_weight_is_copied_once_and_again_after_it_changes(product, monkeypatch):
    torch.manual_seed(0)
    layer = nn.Linear(16, 48, bias=False).to(torch.bfloat16)
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    name = {"packed": "pack", "fp16 weights": "pack_fp16"}[product]
    copies, prepare = [], getattr(decoding_linear, name)
    monkeypatch.setattr(decoding_linear, name, lambda weight: copies.append(tuple(weight.shape)) or prepare(weight))
    refuse_f_linear(monkeypatch, answer=product)
    with torch.no_grad():
        first = linear_layer(layer, x)
        assert torch.equal(linear_layer(layer, x), first)
        linear_layer(layer, x, slice(8, None))  # a slice of the same parameter: a copy of its own
        assert copies == [(48, 16), (40, 16)]
        layer.weight.mul_(2)  # an in-place change (an optimizer step, load_state_dict): copied anew
        torch.testing.assert_close(linear_layer(layer, x).float(), 2 * first.float(), rtol=2e-2, atol=2e-2)
    assert copies == [(48, 16), (40, 16), (48, 16)]
    assert layer.weight in decoding_linear._PREPARED
    gc.collect()
    entries = len(decoding_linear._PREPARED)
    del layer  # the copies live as long as their parameter
    gc.collect()
    assert len(decoding_linear._PREPARED) == entries - 1


@pytest.mark.parametrize("product", BF16_COPIED_PRODUCTS)
def test_a_weight_written_through_data_is_copied_anew(product, monkeypatch):
    """Writes through `.data` (PEFT merging an adapter, a hand-written SGD step) move no version counter: new
    storage is seen at once, new values in the same storage once a forward starts a memory (`compare_copies_again`)."""
    torch.manual_seed(0)
    layer = nn.Linear(16, 48, bias=False).to(torch.bfloat16)
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    name = {"packed": "pack", "fp16 weights": "pack_fp16"}[product]
    copies, prepare = [], getattr(decoding_linear, name)
    monkeypatch.setattr(decoding_linear, name, lambda weight: copies.append(1) or prepare(weight))
    refuse_f_linear(monkeypatch, answer=product)
    with torch.no_grad():
        first = linear_layer(layer, x).float()
        layer.weight.data.mul_(2)
        assert torch.equal(linear_layer(layer, x).float(), first) and len(copies) == 1  # (the step's copy, kept)
        decoding_linear.compare_copies_again()
        torch.testing.assert_close(linear_layer(layer, x).float(), 2 * first, rtol=2e-2, atol=2e-2)
        assert len(copies) == 2
        assert linear_layer(layer, x).float().equal(linear_layer(layer, x).float()) and len(copies) == 2
        layer.weight.data = 3 * layer.weight.data  # new storage: copied at once
        torch.testing.assert_close(linear_layer(layer, x).float(), 6 * first, rtol=2e-2, atol=2e-2)
        assert len(copies) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
@pytest.mark.parametrize("write", ["data.copy_", "data ="])
def test_generate_after_a_write_through_data_decodes_with_the_new_weights(model_type, dtype, write, monkeypatch):
    """generate() after weights were written through `.data` decodes as a model built with those weights does: the
    decoding steps' kept copies (XLNet's contiguous q, k, v in fp32; every bf16 weight) are not stale."""
    if dtype == torch.bfloat16:
        monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_dtype: "packed")
    else:
        monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_dtype: "transposed")
    model = tiny_lm(model_type).eval().to(dtype)
    prompt = torch.randint(1, 90, (1, 8), generator=torch.Generator().manual_seed(0))

    def decode(model):
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)  # fmt: skip
        return torch.stack(out.logits).float()

    before = decode(model)
    torch.manual_seed(1)
    for parameter in model.parameters():  # (values far from the initial ones, whose logits are nearly uniform)
        values = (torch.randn_like(parameter, dtype=torch.float32) * 0.5).to(dtype)
        if write == "data.copy_":
            parameter.data.copy_(values)
        else:
            parameter.data = values
    expected = tiny_lm(model_type).eval().to(dtype)
    expected.load_state_dict(model.state_dict())
    after, tolerance = decode(model), {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(after, decode(expected), rtol=tolerance, atol=tolerance)
    assert not torch.allclose(after, before, rtol=tolerance, atol=tolerance)


def test_bf16_with_gradients_or_where_f_linear_is_fastest_is_f_linear_exactly(monkeypatch):
    x, weight = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(48, 16, dtype=torch.bfloat16)
    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_dtype: "F.linear")
    assert torch.equal(linear(x, weight), F.linear(x, weight))
    for product in ("native", "packed", "fp16 weights"):
        monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_dtype: product)
        weight.requires_grad_()
        output = linear(x, weight)
        assert torch.equal(output, F.linear(x, weight)) and output.requires_grad


def tiny_lm(model_type):
    """A two-layer language model of 90 words, fp32, in train mode (as constructed)."""
    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    if model_type == "transfo-xl":
        config = TransfoXLConfig(vocab_size=90, cutoffs=[20, 50], d_model=32, d_embed=32, n_head=4, d_head=8,
                                 d_inner=48, n_layer=2, mem_len=16, dropout=0.0, eos_token_id=None)  # fmt: skip
        return TransfoXLLMHeadModel(config)
    return XLNetLMHeadModel(XLNetConfig(vocab_size=90, d_model=32, n_layer=2, n_head=4, d_inner=48, dropout=0.0))


@pytest.mark.parametrize("product", BF16_PRODUCTS)
@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_bf16_models_decode_alike_with_each_few_rows_product(model_type, product, monkeypatch):
    """Greedy decoding of a bf16 model with every few-row product from packed or fp16 weights (XLNet's q, k and v
    included) against the same model through F.linear: the same tokens, up to near ties, and close logits."""
    model = tiny_lm(model_type).eval().to(torch.bfloat16)
    prompt = torch.randint(1, 90, (1, 8), generator=torch.Generator().manual_seed(0))

    def decode():
        with torch.inference_mode():
            out = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)  # fmt: skip
        return out.sequences, [step.float() for step in out.logits]

    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_dtype: "F.linear")
    expected = decode()
    name = {"native": "native_linear", "packed": "onednn_linear", "fp16 weights": "fp16_weight_linear"}[product]
    calls, multiply = [], getattr(decoding_linear, name)
    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_dtype: product)
    monkeypatch.setattr(decoding_linear, name, lambda *args: calls.append(1) or multiply(*args))
    assert_greedy_decodings_agree(*decode(), *expected, atol=0.1, rtol=0.05)
    # Each decoding step after the prompt's (5 of them), in each of the 2 layers: Transformer-XL's qkv, o and the
    # feed-forward's 2; XLNet's q, k, v, o and 2.
    per_layer = {"transfo-xl": 4, "xlnet": 6}[model_type]
    assert len(calls) >= 5 * 2 * per_layer


@pytest.mark.parametrize("product", ["transposed", pytest.param("oneDNN", marks=needs_onednn)])
@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_fp32_models_decode_alike_with_each_few_rows_product(model_type, product, monkeypatch):
    """Greedy decoding with every few-row fp32 product the transposed one or oneDNN's (XLNet's q, k, v from
    contiguous copies of their transposed views) against the same model through F.linear: the same tokens, up to
    near ties, and close logits."""
    model = tiny_lm(model_type).eval()
    prompt = torch.randint(1, 90, (1, 8), generator=torch.Generator().manual_seed(0))

    def decode():
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
                                 return_dict_in_generate=True)  # fmt: skip
        return out.sequences, list(out.logits)

    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_threads: "F.linear")
    expected = decode()
    monkeypatch.setattr(decoding_linear, "fastest_few_rows_product", lambda *shape_and_threads: product)
    calls = {"products": [], "copies": []}
    counted = {"transposed_linear": "products", "onednn_linear": "products", "prepared_weight": "copies"}
    for name, counter in counted.items():
        function = getattr(decoding_linear, name)
        monkeypatch.setattr(decoding_linear, name, lambda *args, f=function, c=calls[counter]: c.append(1) or f(*args))
    assert_greedy_decodings_agree(*decode(), *expected, atol=1e-4, rtol=1e-4)
    # Each of the 5 steps after the prompt's, in each of the 2 layers: Transformer-XL's qkv, o and the feed-forward's
    # 2; XLNet's q, k, v (from copies), o and 2.
    per_layer = {"transfo-xl": 4, "xlnet": 6}[model_type]
    assert len(calls["products"]) >= 5 * 2 * per_layer
    if model_type == "xlnet":
        assert len(calls["copies"]) >= 5 * 2 * 3
    else:  # (no transposed weights)
        assert not calls["copies"]


# ---- fp32 products of many rows: oneDNN's GEMM where MKL's is slower


@pytest.mark.parametrize("shape", [(MAX_ROWS + 1,), (2, 37)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("transposed_weight", [False, True])  # (XLNet's q, k, v: a transposed view)
def test_many_rows_without_gradients_go_to_onednn_and_equal_f_linear(shape, bias, transposed_weight, monkeypatch):
    torch.manual_seed(0)
    weight = torch.randn(16, 48).t() if transposed_weight else torch.randn(48, 16)
    b = torch.randn(48) if bias else None
    x = torch.randn(*shape, 16)
    expected = F.linear(x, weight, b)
    refuse_f_linear(monkeypatch, "onednn_product_pays", True)
    with torch.no_grad():
        output = linear(x, weight, b)
    assert output.shape == expected.shape
    torch.testing.assert_close(output, expected)


@pytest.mark.parametrize("bias", [True, False])
def test_many_rows_with_gradients_go_to_onednn_both_ways(bias, monkeypatch):
    """The forward product and the gradients' (dx = dy W, dW = dy^T x) are oneDNN's, equal to F.linear's."""
    torch.manual_seed(0)
    x = torch.randn(3, MAX_ROWS + 2, 16, requires_grad=True)
    weight, b = torch.randn(48, 16, requires_grad=True), (torch.randn(48, requires_grad=True) if bias else None)
    leaves = [t for t in (x, weight, b) if t is not None]
    grad = torch.randn(3, MAX_ROWS + 2, 48)
    expected = F.linear(x, weight, b)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    refuse_f_linear(monkeypatch, "onednn_product_pays", True)
    calls, onednn_linear = [], decoding_linear.onednn_linear
    monkeypatch.setattr(decoding_linear, "onednn_linear", lambda *args: calls.append(1) or onednn_linear(*args))
    output = linear(x, weight, b)
    torch.testing.assert_close(output, expected)
    for ours, reference in zip(torch.autograd.grad(output, leaves, grad), expected_grads):
        torch.testing.assert_close(ours, reference)
    assert len(calls) == 3  # y = x W^T + b, dx = dy W, dW = dy^T x


@pytest.mark.parametrize("requires_grad", [False, True])
def test_many_rows_under_autocast_are_f_linear_in_its_dtype(requires_grad, monkeypatch):
    """Under CPU autocast the product runs in autocast's dtype, as F.linear's does, not in fp32 through oneDNN."""
    x, weight = torch.randn(MAX_ROWS + 3, 16), torch.randn(48, 16, requires_grad=requires_grad)
    monkeypatch.setattr(decoding_linear, "onednn_product_pays", lambda threads: True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, expected = linear(x, weight), F.linear(x, weight)
    assert output.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(output, expected)


def test_many_rows_where_onednn_does_not_pay_are_f_linear_exactly(monkeypatch):
    x, weight = torch.randn(MAX_ROWS + 3, 16), torch.randn(48, 16, requires_grad=True)
    monkeypatch.setattr(decoding_linear, "onednn_product_pays", lambda threads: False)
    assert torch.equal(linear(x, weight), F.linear(x, weight))


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_training_gradients_are_the_same_through_onednn(model_type, monkeypatch):
    """A training step's loss and gradients with every product of many rows through oneDNN (XLNet's feed-forward
    under its selective checkpointing included) equal those through MKL."""
    model = tiny_lm(model_type)
    ids = torch.randint(0, 90, (2, 12), generator=torch.Generator().manual_seed(1))

    def loss_and_gradients():
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    monkeypatch.setattr(decoding_linear, "onednn_product_pays", lambda threads: False)
    expected_loss, expected = loss_and_gradients()
    calls, onednn_linear = [], decoding_linear.onednn_linear
    monkeypatch.setattr(decoding_linear, "onednn_product_pays", lambda threads: True)
    monkeypatch.setattr(decoding_linear, "onednn_linear", lambda *args: calls.append(1) or onednn_linear(*args))
    loss, gradients = loss_and_gradients()
    assert calls
    torch.testing.assert_close(loss, expected_loss)
    assert gradients.keys() == expected.keys()
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradient, expected[name], msg=name)


def test_the_loss_logits_go_to_onednn_into_their_columns(monkeypatch):
    from transformers_xl.modeling.cross_entropy import linear_into

    torch.manual_seed(0)
    hidden, weight, bias = torch.randn(9, 16), torch.randn(20, 16), torch.randn(20)
    out = torch.zeros(9, 30)
    monkeypatch.setattr(decoding_linear, "onednn_product_pays", lambda threads: True)
    calls, onednn_linear = [], decoding_linear.onednn_linear
    monkeypatch.setattr("transformers_xl.modeling.cross_entropy.onednn_linear",
                        lambda *args: calls.append(1) or onednn_linear(*args))  # fmt: skip
    with torch.no_grad():
        linear_into(out[:, 5:25], hidden, weight, bias)
    assert calls
    torch.testing.assert_close(out[:, 5:25], F.linear(hidden, weight, bias))
    assert not out[:, :5].any() and not out[:, 25:].any()
