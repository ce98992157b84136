"""Few-row linear layers on CPU: `F.linear` against the other products `decoding_linear.linear` may take, side by
side, with the weights cold as in a decoding step.

    python benchmarks/bench_linear.py [--rows 1 2 3 4 6 8 16] [--rounds 10] [--dtype bfloat16]

A decoding step reads every weight matrix once, and the model's weights do not fit in the CPU caches, so each
product streams its matrix from memory. To measure that, each measurement cycles through enough copies of the
matrix (about 64 MB in all) that every call finds its weights evicted. Shapes: the XLNet / Transformer-XL
measurement config (d_model 512, d_inner 2048, vocabulary 32000), 2 threads. In fp32 the other products are the
same product asked of BLAS as `(W x^T)^T` (`transposed_linear`) and oneDNN's GEMM on the plain weight
(`onednn_linear`); the table gives ms per call (median of rounds), each one's speed-up over F.linear (> 1: faster),
and which one `fastest_few_rows_product` (its own, shorter measurement) chose on this machine for that shape and
row count (up to 4 rows). With `--dtype bfloat16` the other sides are the products bf16 decoding steps may take
instead, torch's own kernels with oneDNN off for the call (`native_linear`), oneDNN's from a packed copy of the weight
and FBGEMM's from an fp16 copy (`fp16_weight_linear`), and the choice is made among those (a bf16 step should take
half an fp32 step's time, its weights being half the bytes: compare with the fp32 table).
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from transformers_xl.modeling.decoding_linear import (
    MAX_ROWS,
    fastest_few_rows_product,
    fp16_weight_linear,
    native_linear,
    onednn_linear,
    pack,
    pack_fp16,
    transposed_linear,
)

SHAPES = {  # name: (out_features, in_features)
    "attention output 512 -> 512": (512, 512),
    "feed-forward in 512 -> 2048": (2048, 512),
    "feed-forward out 2048 -> 512": (512, 2048),
    "output layer 512 -> 32000": (32000, 512),
}
COLD_BYTES = 64 * 2**20


def cold_ms(function, weights, biases, x, rounds):
    """Median over rounds of the mean ms per call, cycling through the weights so that each call reads cold ones."""
    for weight, bias in zip(weights, biases):  # warm-up: allocations, thread pool
        function(x, weight, bias)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for weight, bias in zip(weights, biases):
            function(x, weight, bias)
        times.append((time.perf_counter() - start) / len(weights) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 16])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(2)
    if dtype == torch.float32:
        products = {"transposed": (transposed_linear, lambda weight: weight),
                    "oneDNN": (onednn_linear, lambda weight: weight)}  # fmt: skip
    else:
        products = {"native": (native_linear, lambda weight: weight), "packed": (onednn_linear, pack),
                    "fp16 weights": (fp16_weight_linear, pack_fp16)}  # fmt: skip
    print(f"{args.dtype}, ms per call with cold weights, speed-up over F.linear; the product decoding_linear.linear "
          "takes for up to 4 rows on this machine")
    sides = "".join(f"{name:>18}" for name in products)
    print(f"{'shape':<30} {'rows':>5} {'F.linear':>10}{sides}  chosen")
    for name, (out_features, in_features) in SHAPES.items():
        copies = max(2, COLD_BYTES // (out_features * in_features * dtype.itemsize))
        weights = [torch.randn(out_features, in_features, dtype=dtype) for _ in range(copies)]
        biases = [torch.randn(out_features, dtype=dtype) for _ in range(copies)]
        for rows in args.rows:
            x = torch.randn(rows, in_features, dtype=dtype)
            expected = F.linear(x, weights[0], biases[0])  # entries ~sqrt(in_features): sums differ a bit
            tolerance = 1e-4 if dtype == torch.float32 else 0.5
            reference = cold_ms(F.linear, weights, biases, x, args.rounds)
            cells = ""
            for product, prepare in products.values():
                prepared = [prepare(weight) for weight in weights]
                torch.testing.assert_close(product(x, prepared[0], biases[0]), expected, rtol=tolerance, atol=tolerance)
                own = cold_ms(product, prepared, biases, x, args.rounds)
                cells += f"{own:>9.3f} ({reference / own:4.2f}x)"
            chosen = fastest_few_rows_product(out_features, in_features, rows, dtype) if rows <= MAX_ROWS else "-"
            print(f"{name:<30} {rows:>5} {reference:>10.3f}{cells}  {chosen}")

if __name__ == "__main__":
    main()
