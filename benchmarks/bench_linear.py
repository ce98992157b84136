"""Few-row linear layers on CPU: `F.linear` against `decoding_linear.linear` (the same product asked of BLAS as
`(W x^T)^T`), side by side, with the weights cold as in a decoding step.

    python benchmarks/bench_linear.py [--rows 1 2 3 4 6 8 16] [--rounds 10]

A decoding step reads every weight matrix once, and the model's weights do not fit in the CPU caches, so each
product streams its matrix from memory. To measure that, each measurement cycles through enough copies of the
matrix (about 64 MB in all) that every call finds its weights evicted. Shapes: the XLNet / Transformer-XL
measurement config (d_model 512, d_inner 2048, vocabulary 32000), fp32, 2 threads. Reports ms per call (median of
rounds) and the ratio F.linear / ours (> 1: ours is faster).
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from transformers_xl.modeling.decoding_linear import linear

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
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"{'shape':<30} {'rows':>5} {'F.linear':>10} {'ours':>10} {'F.linear / ours':>16}")
    for name, (out_features, in_features) in SHAPES.items():
        copies = max(2, COLD_BYTES // (out_features * in_features * 4))
        weights = [torch.randn(out_features, in_features) for _ in range(copies)]
        biases = [torch.randn(out_features) for _ in range(copies)]
        for rows in args.rows:
            x = torch.randn(rows, in_features)
            expected = F.linear(x, weights[0], biases[0])  # entries ~sqrt(in_features): fp32 sums differ a bit
            torch.testing.assert_close(linear(x, weights[0], biases[0]), expected, rtol=1e-4, atol=1e-4)
            reference = cold_ms(F.linear, weights, biases, x, args.rounds)
            ours = cold_ms(linear, weights, biases, x, args.rounds)
            print(f"{name:<30} {rows:>5} {reference:>10.3f} {ours:>10.3f} {reference / ours:>15.2f}x")


if __name__ == "__main__":
    main()
