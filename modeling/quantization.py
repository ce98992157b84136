"""int8 quantization of both models for CPU inference, every projection and output layer included.

The models call their linear layers as modules (`self.qkv_net(x)`), so torchao's `quantize_(model, config)` alone
quantizes every projection; the adaptive softmax's layers (not nn.Linear, for peft) are named by the filter below.
torchao is an optional dependency (the `torchao` extra); transformers imports it whenever it is installed.

What stays in float: the input embeddings (a lookup, not a product), the adaptive softmax's cluster logits (one row
per tail cluster) and its projections when d_embed differs from d_model (parameters, shared with the input side).
"""

import copy

from torch import nn

from .modeling_transfo_xl import SoftmaxLayer

TORCHAO_MISSING = 'int8 quantization needs torchao, which is not installed: pip install "transformers-xl[torchao]"'


def quantize_dynamic_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` whose linear layers are int8 (torchao's dynamic quantization, CPU or GPU): weights quantized
    once per output channel (one scale per row, which keeps the rare large rows of trained output layers exact
    enough), activations per call and per token. The layers run in fp32 around int8 products; for inference
    (`eval()`, no gradients). Raises ImportError, saying what to install, without torchao."""
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    except ImportError:
        raise ImportError(TORCHAO_MISSING) from None
    quantized = copy.deepcopy(model)
    # (set_inductor_config=False: torchao would otherwise change torch.compile's settings for the whole process)
    layers = lambda module, _: isinstance(module, (nn.Linear, SoftmaxLayer))  # noqa: E731
    quantize_(quantized, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False), filter_fn=layers)
    return quantized
