"""Custom operators (`torch.library`) for the parts torch.compile should see as one operation each: the blocked
relative attention with its written-out backward pass, the linear cross-entropy, evaluation's adaptive
log-probabilities, and oneDNN's GEMM with its backward products (where it beats the BLAS a graph would call). The
compiler then calls the same eager code a training step runs instead of tracing it (into one unblocked graph, into
log-softmax kernels over the vocabulary's columns, or into MKL's GEMMs), and knows the outputs' shapes from the fake
kernels without running them.

Operators are global to the process, and this code may be loaded twice: as the installed package and as a copy
in a Hub repository (remote code, another module name), possibly of another version. Each copy registers its
operators in a namespace named after its own package, and a package imported again reuses what it registered.
"""

import re

import torch


def define(package: str, name: str, function, fake, backward=None, setup_context=None):
    """`torch.ops.<package's namespace>.<name>`, defined from `function` (annotated: the schema is inferred from
    it) with the fake kernel `fake` and, if given, autograd's `backward` / `setup_context`; the existing operator
    when this package defined it already."""
    namespace = re.sub(r"\W", "_", package)
    existing = getattr(getattr(torch.ops, namespace), name, None)
    if existing is not None:
        return existing
    op = torch.library.custom_op(f"{namespace}::{name}", function, mutates_args=())
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return getattr(getattr(torch.ops, namespace), name)
