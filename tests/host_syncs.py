"""Counting host syncs: operations that make the host wait for the device (`.item()`, `bool(tensor)`, `nonzero`,
boolean-mask indexing, `torch.equal`, ...). On a GPU each stalls the stream, so the hot paths of the models must make
none (or as few as their design needs). Counted on CPU with a `TorchDispatchMode`, the same ops a GPU would sync on."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

SYNCING_OPS = {
    aten._local_scalar_dense.default,  # .item(), bool(tensor), int(tensor), float(tensor)
    aten.nonzero.default,  # nonzero, boolean-mask indexing, where(cond) with one argument
    aten.masked_select.default,
    aten.equal.default,  # torch.equal
    aten.allclose.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
    aten.repeat_interleave.Tensor,  # without output_size
}


class HostSyncCounter(TorchDispatchMode):
    """`with HostSyncCounter() as syncs: ...` then `syncs.count` and `syncs.ops` (the op names, in order)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    @property
    def count(self) -> int:
        return len(self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in SYNCING_OPS or (func is aten.index.Tensor and _has_boolean_index(args)):
            self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def _has_boolean_index(args) -> bool:
    """x[mask] with a boolean mask: the output's size depends on the data (a nonzero inside the kernel)."""
    return any(i is not None and i.dtype == torch.bool for i in args[1])
