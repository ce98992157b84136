"""int8 quantization of both models: every linear layer reached (the models call their layers rather than read their
weights), forward with the memory and generate running, and outputs close to fp32 on small trained models.

Tolerances: the models are trained for a few steps on a periodic text, so that their distributions are peaked like a
real model's (random weights give flat ones, which hide errors). int8 per-channel weights and per-call activations
carry about 8 significant bits, as bf16 does: the quantized log-probabilities are held to the error that rounding
the same model to bf16 makes, with a factor of 3 for the activations' rounding (per tensor, not per row), and the
greedy tokens must agree where fp32's choice is clear (a margin over the runner-up well above that error).

The quantization is torchao's (the `torchao` extra, not in the default or `test` installs): without it these tests
skip, but the one that checks the error saying what to install.
"""

import copy
import sys
from importlib.util import find_spec

import pytest
import torch
from torch import nn

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel
from transformers_xl.modeling.modeling_transfo_xl import SoftmaxLayer
from transformers_xl.modeling.quantization import TORCHAO_MISSING, quantize_dynamic_int8

needs_torchao = pytest.mark.skipif(
    find_spec("torchao") is None, reason='needs torchao: pip install "transformers-xl[torchao]"'
)

VOCAB = 48
PERIOD = 11


def periodic_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Rows of a periodic sequence (period PERIOD) at random phases: learnable in a few steps."""
    phases = torch.randint(0, PERIOD, (batch, 1), generator=torch.Generator().manual_seed(seed))
    return (phases + torch.arange(length)) % PERIOD * 3 + 2


def transfo_xl():
    config = TransfoXLConfig(
        vocab_size=VOCAB, cutoffs=[12, 30], div_val=1, d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=64,
        n_layer=2, mem_len=8, dropout=0.0, dropatt=0.0, eos_token_id=None,
    )  # fmt: skip
    return TransfoXLLMHeadModel(config), {}


def xlnet():
    config = XLNetConfig(vocab_size=VOCAB, d_model=32, n_head=4, d_inner=64, n_layer=2, mem_len=8, dropout=0.0)
    return XLNetLMHeadModel(config), {"use_mems": True}


FAMILIES = {"transfo-xl": transfo_xl, "xlnet": xlnet}


@pytest.fixture(scope="module", params=list(FAMILIES))
def trained(request):
    """(family, fp32 model trained for a few steps, extra forward arguments)."""
    torch.manual_seed(0)
    model, extra = FAMILIES[request.param]()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(40):
        batch = periodic_ids(8, 16, seed=step)
        model(batch, labels=batch, **extra, **training_arguments(request.param, batch)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return request.param, model.eval(), extra


def training_arguments(family, batch):
    """XLNet learns next-token prediction through its query stream: every position a target that sees only the
    tokens before it (labels are not shifted). Transformer-XL's labels are shifted inside."""
    if family != "xlnet":
        return {}
    length = batch.shape[1]
    perm_mask = torch.ones(length, length).triu().expand(batch.shape[0], -1, -1)
    return {"perm_mask": perm_mask, "target_mapping": torch.eye(length).expand(batch.shape[0], -1, -1)}


def two_segments(model, ids, extra):
    """Log-probabilities of two segments, the second attending to the first's memory."""
    with torch.inference_mode():
        first = model(ids[:, :8], **extra)
        second = model(ids[:, 8:], mems=first.mems, **extra)
    return torch.cat([first.logits, second.logits], dim=1).log_softmax(-1)


LINEAR = (nn.Linear, SoftmaxLayer)  # (the adaptive softmax's output layers are not nn.Linear: see quantization.py)


def linear_layer_names(model):
    return {name for name, module in model.named_modules() if isinstance(module, LINEAR)}


def quantized_layer_names(model):
    """The linear layers whose weight torchao replaced by a quantized tensor (a subclass of torch.Tensor)."""
    return {name for name, module in model.named_modules() if isinstance(module, LINEAR) and is_quantized(module)}


def is_quantized(layer: nn.Linear) -> bool:
    return type(layer.weight) not in (torch.Tensor, nn.Parameter)


def test_without_torchao_quantization_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # (import torchao then raises ImportError, as when missing)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(ImportError) as raised:
        quantize_dynamic_int8(transfo_xl()[0])
    assert str(raised.value) == TORCHAO_MISSING and "transformers-xl[torchao]" in TORCHAO_MISSING


@needs_torchao
def test_every_linear_layer_is_quantized(trained):
    family, model, _ = trained
    layers = linear_layer_names(model)
    per_layer = {"transfo-xl": 5, "xlnet": 7}[family]  # (qkv, r, o, 2 feed-forward) / (q, k, v, r, o, 2 ff)
    assert len(layers) == per_layer * model.config.n_layer + 1  # and the output layer
    quantized = quantize_dynamic_int8(model)
    assert quantized_layer_names(quantized) == layers == linear_layer_names(quantized)
    assert not quantized_layer_names(model)  # (a copy was quantized)


@needs_torchao
def test_transfo_xl_quantizes_with_quantize_alone():
    """torchao's quantize_ alone: every projection is an nn.Linear module (the softmax's layers stay float)."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(0)
    model = transfo_xl()[0].eval()
    quantized = copy.deepcopy(model)
    quantize_(quantized, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False))
    assert len(quantized_layer_names(quantized)) == 5 * 2 == len(linear_layer_names(quantized)) - 1
    ids = periodic_ids(2, 16)
    torch.testing.assert_close(two_segments(quantized, ids, {}), two_segments(model, ids, {}), atol=0.05, rtol=0)


def quantization_error_bound(model, ids, extra, expected):
    """3x the largest log-probability error of the same model rounded to bf16 (see the module docstring), with its
    attention written out ("eager": every score rounded to bf16; the fused kernels keep them in fp32, more exact)."""
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    bf16.set_attn_implementation("eager")
    return 3 * (two_segments(bf16, ids, extra).float() - expected).abs().max().item()


@needs_torchao
def test_quantized_forward_with_memory_matches_fp32(trained):
    family, model, extra = trained
    ids = periodic_ids(3, 16, seed=100)
    expected = two_segments(model, ids, extra)
    assert expected.max(-1).values.mean() > -1.5  # (peaked distributions: uniform would be log(1/48) = -3.9)
    actual = two_segments(quantize_dynamic_int8(model), ids, extra)
    bound = quantization_error_bound(model, ids, extra, expected)
    assert 0 < (actual - expected).abs().max() <= bound


@needs_torchao
def test_quantized_loss_matches_fp32(trained):
    family, model, extra = trained
    ids = periodic_ids(3, 16, seed=101)
    with torch.inference_mode():
        expected = model(ids, labels=ids, **extra).loss
        actual = quantize_dynamic_int8(model)(ids, labels=ids, **extra).loss
    torch.testing.assert_close(actual, expected, atol=0.02, rtol=0.05)


@needs_torchao
def test_quantized_generation_with_memory_agrees_with_fp32(trained):
    family, model, extra = trained
    prompt = periodic_ids(2, 12, seed=102)
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, **extra)
    expected = model.generate(prompt, **settings)
    actual = quantize_dynamic_int8(model).generate(prompt, **settings)
    assert torch.equal(actual, expected)
    # (fp32's choices are clear: it continues the learned text, at least for a few tokens)
    assert torch.equal(expected[:, :16], periodic_continuation(prompt, 4))


def periodic_continuation(prompt, new_tokens):
    """The prompt followed by `new_tokens` more tokens of its periodic sequence."""
    phase = (prompt[:, :1] - 2) // 3
    return (phase + torch.arange(prompt.shape[1] + new_tokens)) % PERIOD * 3 + 2


@needs_torchao
def test_torchao_int8_weight_only_reaches_every_layer(trained):
    import torchao.quantization as torchao_quantization
    family, model, extra = trained
    quantized = copy.deepcopy(model)
    torchao_quantization.quantize_(quantized, torchao_quantization.Int8WeightOnlyConfig())
    layers = [module for module in quantized.modules() if isinstance(module, nn.Linear)]
    assert layers and all(type(layer.weight) not in (torch.Tensor, nn.Parameter) for layer in layers)
    ids = periodic_ids(3, 16, seed=100)
    expected = two_segments(model, ids, extra)
    actual = two_segments(quantized, ids, extra)
    assert 0 < (actual - expected).abs().max() <= quantization_error_bound(model, ids, extra, expected)


@needs_torchao
def test_torchao_config_through_from_pretrained_then_the_rest(trained, tmp_path):
    """transformers' TorchAoConfig quantizes the nn.Linear layers it selects while loading (not the output layers,
    nor XLNet's attention projections, loaded as parameters in the checkpoints' layout); torchao's quantize_ then covers the rest."""
    import torchao.quantization as torchao_quantization
    from transformers import TorchAoConfig

    def is_plain_linear(layer):  # (an nn.Linear with a float weight, not a quantized one)
        return type(layer) in LINEAR and type(layer.weight) is nn.Parameter

    family, model, extra = trained
    model.save_pretrained(tmp_path)
    config = torchao_quantization.Int8WeightOnlyConfig()
    loaded = type(model).from_pretrained(tmp_path, quantization_config=TorchAoConfig(config)).eval()
    layers = [module for module in loaded.modules() if isinstance(module, LINEAR)]
    assert any(not is_plain_linear(layer) for layer in layers)  # (transformers quantized some while loading)
    still_float = lambda module, _: is_plain_linear(module)  # noqa: E731
    torchao_quantization.quantize_(loaded, config, filter_fn=still_float)
    layers = [module for module in loaded.modules() if isinstance(module, LINEAR)]
    assert len(layers) == len(linear_layer_names(model))
    assert not any(is_plain_linear(layer) for layer in layers)
    ids = periodic_ids(3, 16, seed=100)
    expected = two_segments(model, ids, extra)
    actual = two_segments(loaded, ids, extra)
    assert 0 < (actual - expected).abs().max() <= quantization_error_bound(model, ids, extra, expected)
