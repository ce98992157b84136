"""Linear layers that stay fast for the few rows of a decoding step on CPU, and stay replaceable.

`F.linear(x, W)` asks BLAS for `x W^T` (W stored [out, in]). On CPU in fp32 with a handful of rows (a generation
step feeds 1-3 tokens per sequence) BLAS serves that call from a matrix-vector path, and how fast that path streams
the weights depends on the CPU: MKL on this project's AMD EPYC machines streams them at about a third of the speed
it reaches for the same product asked as `(W x^T)^T` (the 32000-word output layer: 3.4 instead of 7.1 ms for one
row), while on an Intel Xeon with AVX-512 the plain call is the faster one by 2x. Decoding steps read every weight
once per token, so the choice is most of their time, and `transposed_product_pays` measures it once per process
(`benchmarks/bench_linear.py` measures both ways side by side). The result is the same product, up to the order of
the floating-point sums.

Everything else (GPU, half precision, more than `MAX_ROWS` rows, one row into a narrower output, where the
matrix-vector path is the faster one, or torch.compile) goes to `F.linear` unchanged.

The models keep their layers plain `nn.Linear` modules and call them through `linear_layer`, which takes the fast
product only for a plain layer and otherwise calls the layer: tools that replace `nn.Linear` by type (torch.ao's
`quantize_dynamic`) or its weight by a tensor subclass (torchao's `quantize_`) then reach every layer, and the model
runs whatever they put there.
"""

import functools
import time

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
        or not transposed_product_pays(torch.get_num_threads())
    ):
        return F.linear(x, weight, bias)
    return transposed_linear(x, weight, bias)


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` asked of BLAS as `(weight x^T)^T`."""
    out_features, in_features = weight.shape
    rows = x.numel() // in_features
    flat = x.reshape(rows, in_features)
    # The call wants x^T as a transposed view of row-major rows; a single row is doubled (a matrix-vector product
    # would take the matrix-vector path again).
    flat = torch.cat([flat, flat]) if rows == 1 else flat.contiguous()
    product = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())
    return product.t()[:rows].contiguous().view(*x.shape[:-1], out_features)


@functools.cache
def transposed_product_pays(threads: int) -> bool:
    """Whether this machine's BLAS, on `threads` threads, serves a one-row fp32 product with weights out of the caches
    clearly faster asked as `(W x^T)^T` than as `F.linear`: timed once per thread count, both ways alternating, on
    copies of a [4096, 512] matrix (32 MiB in all, so that each call reads its weights from memory as a decoding step
    does); under a tenth of a second."""
    weights = [torch.ones(4096, 512, dtype=torch.float32, device="cpu") for _ in range(4)]
    x = torch.ones(1, 512, dtype=torch.float32, device="cpu")
    ways = {"plain": lambda w: F.linear(x, w), "transposed": lambda w: transposed_linear(x, w)}
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(4):
        for name, product in ways.items():
            start = time.perf_counter()
            for weight in weights:
                product(weight)
            best[name] = min(best[name], time.perf_counter() - start)
    return best["transposed"] < 0.8 * best["plain"]  # (a near tie keeps the plain call)


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
