"""int8 quantization of both models for CPU inference, every projection and output layer included.

The models call their linear layers as modules (`decoding_linear.linear_layer`), so tools that replace `nn.Linear`
layers reach all of them: for Transformer-XL, torch.ao's `quantize_dynamic(model, {nn.Linear})` alone quantizes
every projection, feed-forward layer and output layer of the adaptive softmax. XLNet's attention projections are
parameters in the original [d_model, heads, d_head] layout (the checkpoints' names), so `use_linear_layers` first
turns them into `nn.Linear` layers of the same products; then any tool that quantizes `nn.Linear` layers (torch.ao's
dynamic quantization below, torchao's `quantize_`) covers them as well.

What stays in float: the input embeddings (a lookup, not a product), the adaptive softmax's cluster logits (one row
per tail cluster) and its projections when d_embed differs from d_model (parameters, shared with the input side).
"""

import copy

import torch
from torch import nn


def use_linear_layers(model: nn.Module) -> nn.Module:
    """`model` (changed in place) with every attention projection an `nn.Linear` layer, for quantization tools."""
    for module in model.modules():
        if hasattr(module, "use_linear_layers"):
            module.use_linear_layers()
    return model


def quantize_dynamic_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` whose linear layers are int8 (torch.ao dynamic quantization, CPU): weights quantized once
    per output channel (one scale per row, which keeps the rare large rows of trained output layers exact enough),
    activations per call. The layers run in fp32 around int8 products; for inference (`eval()`, no gradients)."""
    quantized = use_linear_layers(copy.deepcopy(model))
    qconfig = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
    return torch.ao.quantization.quantize_dynamic(quantized, qconfig, dtype=torch.qint8, inplace=True)
