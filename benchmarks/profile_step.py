"""Where a call's time goes: torch.profiler's op table and the GEMM FLOPs (`FlopCounterMode`'s formulas; by op and
by input shapes) of one evaluation or training forward + backward, at the configurations of `run.py`, for ours or a
reference.

    python benchmarks/profile_step.py [--config issue] [--model transfo-xl] [--workload train]
                                      [--implementation ours|transformers|legacy] [--legacy-python PYTHON] [--rows 30]

The FLOP counts hold on a busy machine (they count work, not time); the op times do not, compare them within one
table. FLOPs are reported against `run.ideal_forward_flops` (x3 for forward + backward: the backward pass of a GEMM
costs two GEMMs), so redundant work shows. The legacy Transformer-XL (transformers 4.37.2) is profiled in a process
of its own under the legacy python (`--legacy-python` or $TRANSFORMERS_XL_LEGACY_PYTHON).
"""

import argparse
import sys
from pathlib import Path

import torch
from run import CASES, Session, ideal_forward_flops, measure_case
from timing import LEGACY_PYTHON_ENV
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class FlopCounter(TorchDispatchMode):
    """GEMM FLOPs by op and input shapes (`FlopCounterMode`'s formulas). Not `FlopCounterMode` itself: its module
    tracking's backward hooks fail where a backward calls `autograd.grad` (XLNet's recomputed activation)."""

    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in flop_registry:
            flops = flop_registry[func.overloadpacket](*args, **(kwargs or {}), out_val=out)
            shapes = tuple(tuple(x.shape) for x in args if isinstance(x, torch.Tensor))
            key = (str(func.overloadpacket), shapes)
            self.counts[key] = self.counts.get(key, 0) + flops
        return out


def profile_call(folder: Path, implementation: str, workload: str, rows: int, ideal: float):
    session = Session(folder, implementation)
    call = {"eval": session.evaluate, "train": session.forward_backward}[workload]
    call(session.model)  # warm-up
    with FlopCounter() as counter:
        call(session.model)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        call(session.model)
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40))
    print(profiler.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=rows // 2,
                                                                 max_name_column_width=30, max_shapes_column_width=70))  # fmt: skip
    ideal *= 3 if workload == "train" else 1
    total = sum(counter.counts.values())
    print(f"GEMM FLOPs counted: {total / 1e9:.1f} G, ideal {ideal / 1e9:.1f} G ({total / ideal:.2f}x the ideal)")
    by_op = {}
    for (op, _), flops in counter.counts.items():
        by_op[op] = by_op.get(op, 0) + flops
    for op, flops in sorted(by_op.items(), key=lambda item: -item[1]):
        print(f"  {op:40s} {flops / 1e9:8.1f} G")
    print("By input shapes:")
    for (op, shapes), flops in sorted(counter.counts.items(), key=lambda item: -item[1])[:rows]:
        print(f"  {op:20s} {str(shapes):70s} {flops / 1e9:8.1f} G")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=list(CASES), default="issue")
    parser.add_argument("--model", choices=["transfo-xl", "xlnet"], default="transfo-xl")
    parser.add_argument("--workload", choices=["eval", "train"], default="train")
    parser.add_argument("--implementation", choices=["ours", "transformers", "legacy"], default="ours")
    parser.add_argument("--legacy-python", help=f"python of a transformers==4.37.2 venv (default: ${LEGACY_PYTHON_ENV})")
    parser.add_argument("--rows", type=int, default=30)
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's own count)")
    parser.add_argument("--folder", help=argparse.SUPPRESS)  # (set when this script re-runs itself for legacy)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    case = next(case for case in CASES[args.config] if case.model == args.model)
    ideal = ideal_forward_flops(case)
    return measure_case(parser, args, case,
                        lambda folder: profile_call(folder, args.implementation, args.workload, args.rows, ideal),
                        "profile_")

if __name__ == "__main__":
    sys.exit(main())
