"""Where a training step's peak memory goes: every tensor alive at the step's peak, by the operation that made it.

    python benchmarks/memory_breakdown.py [--config issue] [--model transfo-xl]
                                          [--implementation ours|transformers|legacy] [--legacy-python PYTHON]

One training step (forward, backward, AdamW), the second of the session like `run.py`'s memory workload, under a
`TorchDispatchMode` that records each new storage's bytes, the operation that made it (in the forward, with the module
that ran it; in the backward, the autograd node), and whether autograd saved it for the backward; a storage counts
until torch frees it. The peak is over what the step allocates (the trained model and AdamW's state excluded), so it
counts tensors, not the allocator's pages: on CPU `run.py` measures the resident set, a little more. Every side runs
on the same device; the legacy Transformer-XL (transformers 4.37.2) in a process of its own under the legacy python.
"""

import argparse
import collections
import sys
import weakref

import torch
from run import CASES, Session, measure_case
from timing import LEGACY_PYTHON_ENV
from torch.utils._python_dispatch import TorchDispatchMode


class StorageTracker(TorchDispatchMode):
    """Live bytes of the storages made under it, their peak, and what was alive at the peak."""

    def __init__(self):
        super().__init__()
        self.live = {}  # storage key -> [bytes, made by, saved for backward]
        self.bytes = self.peak = 0
        self.at_peak = {}
        self.modules = []  # names of the modules whose forward runs now (innermost last)

    def _made_by(self, func) -> str:
        node = torch._C._current_autograd_node()
        if node is not None:
            return f"backward {node.name()}"
        where = self.modules[-1] if self.modules else "-"
        return f"{where}: {func.overloadpacket.__name__}"

    def _track(self, tensor: torch.Tensor, made_by: str, inputs: set):
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live or key in inputs or storage.nbytes() == 0:  # (a view or an in-place result)
            return
        self.live[key] = [storage.nbytes(), f"{made_by} {list(tensor.shape)}", False]
        self.bytes += storage.nbytes()
        weakref.finalize(storage, self._free, key)
        if self.bytes > self.peak:
            self.peak, self.at_peak = self.bytes, {k: list(v) for k, v in self.live.items()}

    def _free(self, key):
        entry = self.live.pop(key, None)
        if entry is not None:
            self.bytes -= entry[0]

    def mark_saved(self, tensor: torch.Tensor):
        entry = self.live.get(tensor.untyped_storage()._cdata)
        if entry is not None:
            entry[2] = True
        return tensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        inputs = {t.untyped_storage()._cdata for t in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}  # fmt: skip
        out = func(*args, **(kwargs or {}))
        made_by = self._made_by(func)
        for tensor in torch.utils._pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor, made_by, inputs)
        return out


def breakdown(session: Session, rows: int):
    session.train_step(session.model)  # the first step makes AdamW's state
    tracker = StorageTracker()
    names = {module: name or "model" for name, module in session.model.named_modules()}

    def enter(module, args):
        tracker.modules.append(names.get(module, type(module).__name__))

    def leave(module, args, output):
        tracker.modules.pop()

    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
             torch.nn.modules.module.register_module_forward_hook(leave)]  # fmt: skip
    try:
        with tracker, torch.autograd.graph.saved_tensors_hooks(tracker.mark_saved, lambda tensor: tensor):
            session.train_step(session.model)
    finally:
        for hook in hooks:
            hook.remove()
    mib = 2**20
    print(f"peak of the tensors a training step allocates: {tracker.peak / mib:,.0f} MiB")
    groups = collections.defaultdict(lambda: [0, 0])
    for size, made_by, saved in tracker.at_peak.values():
        kind = "saved for backward" if saved else ("gradient/temporary" if made_by.startswith("backward") else "other")
        groups[(kind, made_by)][0] += size
        groups[(kind, made_by)][1] += 1
    totals = collections.Counter()
    for (kind, _), (size, _) in groups.items():
        totals[kind] += size
    for kind, size in totals.most_common():
        print(f"  {kind:20s} {size / mib:8,.0f} MiB")
    print(f"\nthe {rows} largest groups at the peak (kind, made by, count):")
    for (kind, made_by), (size, count) in sorted(groups.items(), key=lambda item: -item[1][0])[:rows]:
        print(f"  {size / mib:8,.1f} MiB  {kind:20s} {made_by} (x{count})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=list(CASES), default="issue")
    parser.add_argument("--model", choices=["transfo-xl", "xlnet"], default="transfo-xl")
    parser.add_argument("--implementation", choices=["ours", "transformers", "legacy"], default="ours")
    parser.add_argument("--legacy-python", help=f"python of a transformers==4.37.2 venv (default: ${LEGACY_PYTHON_ENV})")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--folder", help=argparse.SUPPRESS)  # (set when this script re-runs itself for legacy)
    args = parser.parse_args()
    case = next(case for case in CASES[args.config] if case.model == args.model)
    return measure_case(parser, args, case, lambda folder: breakdown(Session(folder, args.implementation), args.rows),
                        "memory_")

if __name__ == "__main__":
    sys.exit(main())
