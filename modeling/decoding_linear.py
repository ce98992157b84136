"""Linear layers that stay fast for the few rows of a decoding step on CPU, and stay replaceable.

`F.linear(x, W)` asks BLAS for `x W^T` (W stored [out, in]). On CPU in fp32 with a handful of rows (a generation
step feeds 1-3 tokens per sequence) MKL serves that call from a matrix-vector path that streams the weights from
memory at about a third of the speed it reaches for the same product asked as `(W x^T)^T`, the one layout change
here. Decoding steps read every weight once per token, so this is most of their time: on this project's CPUs the
32000-word output layer takes 3.4 ms instead of 7.1 ms for one row, a 512 -> 2048 feed-forward layer 0.25 instead of
0.80 ms for three (`benchmarks/bench_linear.py` measures both ways side by side). The result is the same product,
up to the order of the floating-point sums.

Everything else (GPU, half precision, more than `MAX_ROWS` rows, one row into a narrower output, where the
matrix-vector path is the faster one, or torch.compile) goes to `F.linear` unchanged.

The models keep their layers plain `nn.Linear` modules and call them through `linear_layer`, which takes the fast
product only for a plain layer and otherwise calls the layer: tools that replace `nn.Linear` by type (torch.ao's
`quantize_dynamic`) or its weight by a tensor subclass (torchao's `quantize_`) then reach every layer, and the model
runs whatever they put there.

A decoding step is also too small to split between threads: each of its hundreds of small operations ends at a
barrier where OpenMP's threads wait for each other, so when another process holds a core (a training run, a
tokenizer, a busy loop) every operation waits for a thread the OS has not scheduled, and a step took 10x as long
beside a second torch process. `on_decoding_threads` runs decoding steps on `DECODING_THREADS` threads.
"""

import functools
import inspect

import torch
import torch.nn.functional as F
from torch import nn


MAX_ROWS = 4  # 1.3-4.5x faster up to here (bench_linear.py); from about 6 rows on, either call may win


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for weight [out, in], computed as `(weight x^T)^T` when that is faster."""
    out_features, in_features = weight.shape
    rows = x.numel() // in_features
    if (
        torch.compiler.is_compiling()  # a compiled graph picks its own kernels (and `rows` may be data-dependent)
        or x.device.type != "cpu"
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or not is_plain_tensor(weight)  # (a quantized tensor subclass implements F.linear, not mm)
        or not 0 < rows <= MAX_ROWS
        or (rows == 1 and out_features <= in_features)
    ):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, in_features)
    # The fast call wants x^T as a transposed view of row-major rows; a single row is doubled (a matrix-vector
    # product would take the slow path again).
    flat = torch.cat([flat, flat]) if rows == 1 else flat.contiguous()
    product = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())
    return product.t()[:rows].contiguous().view(*x.shape[:-1], out_features)


def is_plain_tensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is torch's own dense tensor (or parameter), not a subclass such as torchao's quantized ones."""
    return type(tensor) in (torch.Tensor, nn.Parameter)


def is_plain_linear(layer: nn.Module) -> bool:
    """Whether `layer` is an `nn.Linear` itself (not a subclass or a replacement) with plain weights."""
    return type(layer) is nn.Linear and is_plain_tensor(layer.weight)


def linear_layer(layer: nn.Module, x: torch.Tensor, features: slice = slice(None)) -> torch.Tensor:
    """`layer(x)[..., features]`: for a plain `nn.Linear`, `linear` of only those output features' weights; any other
    layer (quantized, or replaced by a tool) is called as it is and its output sliced."""
    if not is_plain_linear(layer):
        output = layer(x)
        return output if features == slice(None) else output[..., features]
    bias = None if layer.bias is None else layer.bias[features]
    return linear(x, layer.weight[features], bias)


# Threads of a decoding step (see the module docstring; None: torch's own setting). One thread decodes about as fast
# as two on a quiet 2-core machine, and a busy core then costs a step little (`benchmarks/run.py --workloads
# contention` measures both).
DECODING_THREADS = 1
# A forward pass that feeds a cache at most this many tokens (all sequences together) is a decoding step.
DECODING_STEP_TOKENS = 16


def on_decoding_threads(forward):
    """Decorator of a language model's `forward(input_ids, ..., cache=...)`: a decoding step (a cache, at most
    `DECODING_STEP_TOKENS` input ids, on CPU, no gradients) runs with torch limited to `DECODING_THREADS` threads,
    and torch's setting is restored afterwards."""
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def wrapper(*args, **kwargs):
        if DECODING_THREADS is None or torch.compiler.is_compiling() or torch.is_grad_enabled():
            return forward(*args, **kwargs)
        arguments = signature.bind_partial(*args, **kwargs).arguments
        input_ids, previous = arguments.get("input_ids"), torch.get_num_threads()
        if (
            DECODING_THREADS >= previous
            or arguments.get("cache") is None
            or input_ids is None
            or input_ids.numel() > DECODING_STEP_TOKENS
            or input_ids.device.type != "cpu"
        ):
            return forward(*args, **kwargs)
        torch.set_num_threads(DECODING_THREADS)
        try:
            return forward(*args, **kwargs)
        finally:
            torch.set_num_threads(previous)

    return wrapper
