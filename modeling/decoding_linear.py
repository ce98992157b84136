"""Linear layers that stay fast for the few rows of a decoding step on CPU, and stay replaceable.

`F.linear(x, W)` asks BLAS for `x W^T` (W stored [out, in]). On CPU in fp32 with a handful of rows (a generation
step feeds 1-3 tokens per sequence) BLAS serves that call from a matrix-vector path, and how fast that path streams
the weights depends on the CPU and on the matrix: MKL on this project's AMD EPYC machines streams the 32000-word
output layer at about a third of the speed it reaches for the same product asked as `(W x^T)^T` (3.4 instead of 7.1
ms for one row), while oneDNN's GEMM is the fastest of the three for the feed-forward's [512, 2048] (0.19 ms against
0.27), and on an Intel Xeon with AVX-512 the plain call is the faster one by 2x. Decoding steps read every weight
once per token, so the choice is most of their time, and `fastest_few_rows_product` measures it once per process
for each weight shape and row count (`benchmarks/bench_linear.py` measures the three side by side). The result is
the same product, up to the order of the floating-point sums. A weight that is a transposed view (XLNet's q, k, v,
stored [d_model, H, D] and applied as x W) would be read across its rows by the faster products, and BLAS serves it
no faster than the plain call (0.15 ms for [512, 512], against 0.08 for the transposed product of a contiguous copy):
those products multiply by a contiguous copy, made on a weight's first decoding step and kept as a packed bf16 copy
is (below), which cost an fp32 XLNet 6 d_model^2 floats more per layer while it decodes (the copies and the
snapshot that tells when they are stale, see `prepared_weight`).

In bf16 the same few-row products are slow as `F.linear` asks for them (about 11 GB/s of weights on the AMD EPYC, less
than fp32's transposed product reads twice the bytes at): on a CPU with bf16 instructions torch hands them to oneDNN,
which builds a primitive for every call. They are faster three ways. torch's own kernels, with oneDNN switched off for
the call (`native_linear`), stream the weights as they are at 18-22 GB/s for one row and sum in fp32, rounding once. The
other two multiply by a copy of the weight made on first use and kept as long as the weight lives and is not modified
(see `prepared_weight`): oneDNN given the weight once in its own blocked layout (`pack`, about 20 GB/s), and FBGEMM's
fp16-weight products (`pack_fp16`: the weight as fp16, multiplied by fp32 rows and summed in fp32; 1.3-2.9x faster than
the packed product for the models' shapes there). bf16 weights are fp16 numbers when they lie between 2^-17 and 65504 in
magnitude (fp16 has more mantissa bits and fewer exponent bits), so that product is the bf16 one up to the order of the
sums, and up to at most 2^-25 per weight below 2^-17 (fp16's subnormals), far under the bf16 output's rounding; a weight
beyond fp16's range keeps the packed product (`F.linear` without oneDNN's bf16 kernels). `fastest_few_rows_product`
measures the four per weight shape and row count as it does fp32's (on the AMD EPYC torch's own kernels win the
attention's and the feed-forward's single rows, the fp16 weights the output layer's and the rows in twos to fours). A
kept copy is what a bf16 model pays for them: its weights' memory up to three times (the weights, the copies, and the
snapshot that tells when a copy is stale).

More rows make a real GEMM, and there the BLAS matters again: on the AMD EPYC MKL (torch's BLAS on CPU) runs fp32
products of 8-2048 rows at 40-150 GFLOP/s where oneDNN, on the same plain weights, reaches 80-190 (the output layer
of a 128-token segment: 80 against 167). Where `onednn_product_pays` measures that, fp32 products of more than
`MAX_ROWS` rows go to oneDNN (an evaluation, a prompt, the loss's logits: `cross_entropy.linear_into`); with
gradients, or in a compiled graph (whatever its rows), through the operator `onednn_linear_op`, whose backward
products are oneDNN's too.

Everything else (GPU, fp16, bf16 products with gradients, products in a graph torch.export traces, or
torch.compile's where oneDNN does not pay) goes to `F.linear` unchanged.

The models keep their layers plain `nn.Linear` modules and call them through `linear_layer`, which takes the fast
product only for a plain layer and otherwise calls the layer: tools that replace `nn.Linear` by type (torch.ao's
`quantize_dynamic`) or its weight by a tensor subclass (torchao's `quantize_`) then reach every layer, and the model
runs whatever they put there.
"""

import functools
import threading
import time
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from .library_ops import define


MAX_ROWS = 4  # 1.3-4.5x faster up to here (bench_linear.py); from about 6 rows on, either call may win
# Weights smaller than this are not measured: they are read from the caches, where the call with the fewest
# operations is the fastest (and a tiny model's dozens of shapes would each cost a measurement): F.linear in fp32,
# torch's own kernels in bf16.
MEASURED_BYTES = 256 * 2**10


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for weight [out, in], through the faster product on CPU. (The few rows of a
    decoding step are told apart first: a step makes dozens of these calls, and its checks cost more than a tiny
    model's products.)"""
    if not torch.compiler.is_compiling():  # (a traced graph picks its own kernels and must not branch on `rows`)
        rows = x.numel() // weight.shape[-1]
        if 0 < rows <= MAX_ROWS:
            return _few_rows(x, weight, bias, rows)
    if uses_onednn(x, weight, bias):
        return onednn_linear_op(x, weight, bias) if _traced(x, weight, bias) else onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _few_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """`linear` of at most `MAX_ROWS` rows."""
    # (a quantized tensor subclass implements F.linear, not the products below)
    if x.device.type != "cpu" or x.dtype != weight.dtype or not is_plain_tensor(weight):
        return F.linear(x, weight, bias)
    if x.dtype == torch.bfloat16:
        return _few_bf16_rows(x, weight, bias, rows)
    if x.dtype == torch.float32:
        return _few_fp32_rows(x, weight, bias, rows)
    return F.linear(x, weight, bias)


def _few_bf16_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """`linear` of a few bf16 rows: the product measured fastest for this shape, from the weight or a kept copy."""
    product = fastest_few_rows_product(*weight.shape, rows, torch.bfloat16)
    if product == "F.linear" or is_differentiable(x, weight, bias):
        return F.linear(x, weight, bias)
    if product == "native":
        by_rows = _by_rows(x, weight, bias)
        return F.linear(x, weight, bias) if by_rows is None else native_linear(x, by_rows, bias)
    if not _copyable(x, weight, bias):
        return F.linear(x, weight, bias)
    if product == "fp16 weights":
        packed = prepared_weight(weight, pack_fp16)
        if packed is not None:
            return fp16_weight_linear(x, packed, bias)
        if not _onednn_available(torch.bfloat16):  # (a weight beyond fp16's range, and no packed product to take)
            return F.linear(x, weight, bias)
    return onednn_linear(x, prepared_weight(weight, pack), bias)


def _few_fp32_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """`linear` of a few fp32 rows: the product measured fastest for this shape."""
    product = fastest_few_rows_product(*weight.shape, rows)
    by_rows = None if product == "F.linear" else _by_rows(x, weight, bias)
    if by_rows is None:
        return F.linear(x, weight, bias)
    if product == "transposed":
        return transposed_linear(x, by_rows, bias)
    return onednn_linear(x, by_rows, bias)


def _by_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """`weight` as the measured products read it, [out, in] rows in memory: itself, or for a transposed view
    (XLNet's q, k, v, stored [d_model, H, D]) a contiguous copy, kept as a packed one is; None where no copy may be
    kept."""
    if weight.is_contiguous():
        return weight
    if not (_copyable(x, weight, bias) and weight.t().is_contiguous()):
        return None
    return prepared_weight(weight, torch.Tensor.contiguous)


def _copyable(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether a product may use a kept copy of `weight` (`prepared_weight`): no gradients to come, and a weight with
    a version counter to say when the copy is stale (one made under inference_mode has none)."""
    return not (is_differentiable(x, weight, bias) or weight.is_inference())


def uses_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether `linear(x, weight, bias)` is oneDNN's GEMM on the plain weight: fp32 on CPU, more than `MAX_ROWS`
    rows (any number in a compiled graph, which must not branch on it), where `onednn_product_pays`; never under
    torch.export, whose graphs (ONNX export's too) keep torch's own operations, nor under autocast, whose products
    run in its lower precision."""
    return (
        not torch.compiler.is_exporting()
        and x.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
        and x.dtype == weight.dtype == torch.float32
        and is_plain_tensor(weight)
        and (torch.compiler.is_compiling() or x.numel() // weight.shape[1] > MAX_ROWS)
        and _onednn_pays_here()
    )


def is_tracing() -> bool:
    """Whether torch.compile or torch.export is tracing a graph (in which nothing may be kept across calls)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def _traced(*tensors) -> bool:
    """Whether a product must be one operator that autograd or torch.compile can follow: it has gradients to
    come, or a graph is being traced."""
    return torch.compiler.is_compiling() or is_differentiable(*tensors)


def is_differentiable(*tensors) -> bool:
    """Whether autograd records an operation on `tensors` (None entries allowed)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


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


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` by oneDNN, for a plain weight [out, in] or one `pack` made (no autograd: see
    `onednn_linear_op`)."""
    flat = x.reshape(-1, x.shape[-1])
    return torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "").view(*x.shape[:-1], -1)


# `onednn_linear` as an operator with gradients, each one oneDNN's GEMM too, on views of what it saved:
# dx = dy W, dW = dy^T x, db = sum of dy. torch.compile calls it as one opaque operation (its own GEMM lowering would
# be MKL's) and knows its output's shape from the fake kernel.
def _onednn_linear_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return onednn_linear(x, weight, bias)


def _onednn_linear_fake(x, weight, bias):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _setup_onednn_linear(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _gradient_products(product, grad, x, weight, needs_x: bool, needs_weight: bool):
    """(dx = dy W, dW = dy^T x) by `product(x, weight, bias)`, None for one not asked for."""
    flat_grad, flat_x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
    grad_x = product(grad, weight.t(), None) if needs_x else None
    grad_weight = product(flat_grad.t(), flat_x.t(), None) if needs_weight else None
    return grad_x, grad_weight


def _onednn_linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    needs_x, needs_weight = ctx.needs_input_grad[:2]
    grad_x = grad_weight = grad_bias = None
    if torch.is_grad_enabled():  # (create_graph: a second derivative to come, through products it can differentiate)
        grad_x, grad_weight = _gradient_products(onednn_linear_op, grad, x, weight, needs_x, needs_weight)
    elif torch.compiler.is_compiling():  # (a compiled backward: one operator, which skips a zero gradient's products)
        grad_x, grad_weight = onednn_linear_gradients_op(grad, x, weight, needs_x, needs_weight)
        grad_x, grad_weight = grad_x if needs_x else None, grad_weight if needs_weight else None
    else:  # (eager autograd gives no unread output a zero gradient: the products without the check's pass over it)
        grad_x, grad_weight = _gradient_products(onednn_linear, grad, x, weight, needs_x, needs_weight)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad.reshape(-1, grad.shape[-1]).sum(0)
    return grad_x, grad_weight, grad_bias


# dx = dy W and dW = dy^T x (the ones asked for; an empty tensor for the other) as one opaque operation, which skips
# both products where dy is all zeros. A compiled graph's backward is one function of every output's gradient, and
# AOTAutograd hands an output that nothing reads a zero one: XLNet's logits beside its loss, whose two [tokens, 32000]
# products took 0.85 s of a 5.5 s compiled training step. Zeros are the products' exact value (for finite weights).
def _onednn_linear_gradients(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, needs_x: bool,
                             needs_weight: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if not grad.any():
        return _onednn_linear_gradients_fake(grad, x, weight, needs_x, needs_weight, torch.zeros)
    grad_x, grad_weight = _gradient_products(onednn_linear, grad, x, weight, needs_x, needs_weight)
    return (x.new_empty(0) if grad_x is None else grad_x), (weight.new_empty(0) if grad_weight is None else grad_weight)


def _onednn_linear_gradients_fake(grad, x, weight, needs_x, needs_weight, make=torch.empty):
    return (make(x.shape if needs_x else (0,), dtype=x.dtype, device=x.device),
            make(weight.shape if needs_weight else (0,), dtype=weight.dtype, device=weight.device))  # fmt: skip


onednn_linear_gradients_op = define(__package__ or __name__, "onednn_linear_gradients", _onednn_linear_gradients,
                                    _onednn_linear_gradients_fake)  # fmt: skip
onednn_linear_op = define(__package__ or __name__, "onednn_linear", _onednn_linear_op, _onednn_linear_fake,
                          _onednn_linear_backward, _setup_onednn_linear)  # fmt: skip


class _OneDNNSwitchedOff:
    """A context in which oneDNN is switched off. The switch, `torch.backends.mkldnn.enabled`, is the process's: the
    first thread to enter saves it and the last to leave restores it, so threads decoding at once leave it as they
    found it (each restoring its own saved value would leave it off whenever two calls overlap). An operation another
    thread runs meanwhile may skip oneDNN too, which changes its speed, and at most the order of its sums."""

    def __init__(self):
        self.lock, self.inside, self.saved = threading.Lock(), 0, True

    def __enter__(self):
        with self.lock:
            if self.inside == 0:
                self.saved = torch.backends.mkldnn.enabled
                torch.backends.mkldnn.enabled = False
            self.inside += 1

    def __exit__(self, *exception):
        with self.lock:
            self.inside -= 1
            if self.inside == 0:
                torch.backends.mkldnn.enabled = self.saved


onednn_switched_off = _OneDNNSwitchedOff()


def native_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` by torch's own CPU kernels, oneDNN switched off for the call: for a few bf16 rows
    they sum in fp32 and round once."""
    with onednn_switched_off:
        return F.linear(x, weight, bias)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` [out, in] in oneDNN's blocked layout for products of a row or a few (an opaque tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)


FP16_MAX = torch.finfo(torch.float16).max


def pack_fp16(weight: torch.Tensor):
    """`weight` [out, in] as FBGEMM's packed fp16 weights for `fp16_weight_linear`, or None where a weight lies beyond
    fp16's range."""
    weight = weight.float().contiguous()
    if weight.abs().max() > FP16_MAX:
        return None
    return torch.ops.quantized.linear_prepack_fp16(weight, None)


def fp16_weight_linear(x: torch.Tensor, packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` in x's dtype, from `pack_fp16(weight)`: fp32 rows times the fp16 weights, summed and
    biased in fp32, rounded once."""
    product = torch.ops.quantized.linear_dynamic_fp16(x.reshape(-1, x.shape[-1]).float(), packed)
    if bias is not None:
        product += bias
    return product.to(x.dtype).view(*x.shape[:-1], -1)


class _KeptCopies:
    """The copies made of one parameter (or of views of it), with what says whether they still match it: its version
    counter, its storage, and a snapshot of its values for the writes neither sees (through `.data`, as PEFT merges
    an adapter or a hand-written SGD step updates a weight)."""

    def __init__(self, base: torch.Tensor):
        self.version, self.storage, self.checked = base._version, base.data_ptr(), _epoch
        self.snapshot = base.detach().clone()
        self.copies = {}  # (prepare, the view's layout) -> copy

    def still_match(self, base: torch.Tensor, compare: bool = False) -> bool:
        """Whether `base` is unchanged since the copies were made: its version and storage always, its values
        compared with the snapshot once per `compare_copies_again`, or now with `compare` (as 64-bit words where
        its bytes allow)."""
        if base._version != self.version or base.data_ptr() != self.storage:
            return False
        if compare or self.checked != _epoch:
            if not _equal_bits(base.detach(), self.snapshot):
                return False
            self.checked = _epoch
        return True


def _equal_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal, 4x faster on CPU over 64-bit words (1.9 against 9 ms for a [32000, 512] bf16 tensor)."""
    if a.is_contiguous() and b.is_contiguous() and (a.numel() * a.element_size()) % 8 == 0:
        a, b = a.reshape(-1).view(torch.int64), b.reshape(-1).view(torch.int64)
    return torch.equal(a, b)


# weight's base tensor (the parameter a slice or reshape of it views) -> its _KeptCopies
_PREPARED: WeakIdKeyDictionary = WeakIdKeyDictionary()
_epoch = 0  # moved on by compare_copies_again


def compare_copies_again():
    """Have each kept copy's parameter compared with its snapshot at the copy's next use. The models call this when
    a forward pass starts a memory (a prompt, a first segment): a parameter written through `.data` since then is
    copied anew before it is read, while a decoding step reads its copies with two integer checks."""
    global _epoch
    _epoch += 1


def prepared_weight(weight: torch.Tensor, prepare) -> torch.Tensor:
    """`prepare(weight)` (`pack`, or a contiguous copy), made once per weight: kept while the parameter it views
    lives, and made anew once that parameter is modified: in place through autograd's view of it (an optimizer step,
    `load_state_dict`), which moves its version counter, or given new storage, at once; through `.data`, at the first
    use after the next `compare_copies_again`. The price is a snapshot of each copied parameter."""
    key = (prepare, weight.storage_offset(), tuple(weight.shape), weight.stride())
    return kept_result(weight, key, lambda: prepare(weight))


def kept_result(weight: torch.Tensor, key, make, compare: bool = False):
    """`make()`, made from `weight` (a copy, or a holder of what is made from it; `key`, hashable, names it among the
    weight's), kept with `weight`'s copies (see `prepared_weight`) and made again once the weight changes; with
    `compare`, its values are compared with the snapshot at this call (for a result used once per forward pass,
    where that costs little beside it). Made and not kept for a weight without a version counter (made under
    inference_mode) and in a traced graph."""
    if weight.is_inference() or is_tracing():
        return make()
    base = weight if weight._base is None else weight._base
    kept = _PREPARED.get(base)
    if kept is None or not kept.still_match(base, compare):
        with torch.no_grad():
            kept = _PREPARED[base] = _KeptCopies(base)
    if key not in kept.copies:
        with torch.no_grad():
            kept.copies[key] = make()
    return kept.copies[key]


def _cold_seconds(ways: dict, out_features: int, in_features: int, dtype: torch.dtype, rows: int) -> dict:
    """The best time of each way, `name: (prepare(weight), product(x, prepared))`, to multiply `rows` rows by each
    of several [out_features, in_features] weights: 2 to 256 copies, 64 MiB in all where that many fit (more than
    the 32 MiB L3 cache of this project's machines, which would keep part of 32 MiB), so that each call reads its
    weight from memory as a decoding step does (15-25 ms a way)."""
    copies = min(256, max(2, 64 * 2**20 // (out_features * in_features * dtype.itemsize)))
    weights = [torch.ones(out_features, in_features, dtype=dtype, device="cpu") for _ in range(copies)]
    x = torch.ones(rows, in_features, dtype=dtype, device="cpu")
    prepared = {name: [prepare(weight) for weight in weights] for name, (prepare, _) in ways.items()}
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(2):  # (the best of two: four chose the same, for twice the time)
        for name, (_, product) in ways.items():
            start = time.perf_counter()
            for weight in prepared[name]:
                product(x, weight)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _fastest(seconds: dict, plain: str = "F.linear") -> str:
    """The fastest way, where it is clearly faster than the plain call: by more than a tenth, which neighbours' noise
    on these machines' measurements stays under (a near tie keeps the plain call)."""
    fastest = min(seconds, key=seconds.get)
    return fastest if seconds[fastest] < 0.9 * seconds[plain] else plain


def _as_is(weight: torch.Tensor) -> torch.Tensor:
    return weight


def _onednn_available(dtype: torch.dtype) -> bool:
    return torch.backends.mkldnn.is_available() and (
        dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


@functools.cache
def fastest_few_rows_product(out_features: int, in_features: int, rows: int, dtype=torch.float32) -> str:
    """Which call multiplies `rows` rows by an [out_features, in_features] weight clearly fastest on this machine (the
    plain call unless another is clearly faster): in fp32 "F.linear", "transposed" (`transposed_linear`) or "oneDNN"
    (`onednn_linear`); in bf16 "F.linear", "native" (`native_linear`), "packed" (`onednn_linear` from `pack`) or
    "fp16 weights" (`fp16_weight_linear`). Measured once per shape, row count and dtype, for weights of
    `MEASURED_BYTES` or more (in fp32), on the threads of the decoding step that first asks (1 and 2 threads measured
    the same choices, up to near ties): 40-100 ms each, which a first `generate()` pays. The row count matters: MKL's
    matrix-vector path serves one row of the feed-forward's [512, 2048] about as fast as oneDNN on the AMD EPYC, and
    two to four rows 1.6-1.9x slower; torch's own bf16 kernels are the fastest for one row and among the slowest for
    two."""
    if out_features * in_features * torch.float32.itemsize < MEASURED_BYTES:
        # (in bf16 torch's own kernels: oneDNN's primitive for each call costs more than such a weight's product,
        # 21-26 us against 7-12 for [128-512, 128-512] on the AMD EPYC)
        return "F.linear" if dtype == torch.float32 else "native"
    ways = {"F.linear": (_as_is, F.linear)}
    if dtype == torch.float32:
        ways["transposed"] = (_as_is, transposed_linear)
        if _onednn_available(dtype):
            ways["oneDNN"] = (_as_is, onednn_linear)
    else:
        ways["native"] = (_as_is, native_linear)
        if _onednn_available(dtype):
            ways["packed"] = (pack, onednn_linear)
        if _fp16_weights_available():
            ways["fp16 weights"] = (pack_fp16, fp16_weight_linear)
    return _fastest(_cold_seconds(ways, out_features, in_features, dtype, rows))


@functools.cache
def _fp16_weights_available() -> bool:
    """Whether this torch build runs FBGEMM's fp16-weight products (x86 CPUs with AVX2; not a build without torch's
    quantized operators)."""
    try:
        fp16_weight_linear(torch.ones(1, 8), pack_fp16(torch.ones(8, 8)))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


@torch.compiler.assume_constant_result  # (a traced graph takes the answer as a constant, instead of timing inside)
def _onednn_pays_here() -> bool:
    return onednn_product_pays(torch.get_num_threads())


@functools.cache
def onednn_product_pays(threads: int) -> bool:
    """Whether oneDNN, on `threads` threads, computes an fp32 product of 64 rows clearly faster than `F.linear`
    (MKL) on the same plain weights (measured once per thread count)."""
    if not _onednn_available(torch.float32):
        return False
    ways = {"F.linear": (_as_is, F.linear), "oneDNN": (_as_is, onednn_linear)}
    return _fastest(_cold_seconds(ways, 4096, 512, torch.float32, rows=64)) == "oneDNN"


def is_plain_tensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is torch's own dense tensor (or parameter), not a subclass such as torchao's quantized ones."""
    return type(tensor) in (torch.Tensor, nn.Parameter)


def is_plain_linear(layer: nn.Module) -> bool:
    """Whether `layer` is an `nn.Linear` itself (not a subclass or a replacement) with plain weights."""
    return type(layer) is nn.Linear and is_plain_tensor(layer.weight)


def linear_layer(layer: nn.Module, x: torch.Tensor, features: slice = slice(None)) -> torch.Tensor:
    """`layer(x)[..., features]`: for a plain `nn.Linear`, `linear` of only those output features' weights; any other
    layer (quantized, or replaced by a tool) is called as it is and its output sliced."""
    whole = features == slice(None)
    if not is_plain_linear(layer):
        output = layer(x)
        return output if whole else output[..., features]
    weight, bias = layer.weight, layer.bias
    if not whole:  # (sliced only when asked: a decoding step calls this dozens of times)
        weight, bias = weight[features], None if bias is None else bias[features]
    return linear(x, weight, bias)
