"""Compiled models: the graphs do not change with the length (torch.compile's default, dynamic=None)."""

import pytest
import torch

from test_compile import compile_fullgraph, graphs, memory_kwargs, tiny


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
@pytest.mark.parametrize("training", [False, True])
def test_no_recompilation_across_lengths(model_type, training):
    """torch.compile's default (dynamic=None): the first call compiles for its shapes, the first call with other
    segment and memory lengths compiles once more with those lengths symbolic, and later lengths reuse that graph
    (Dynamo's graph counter stays put). (Every segment here overflows the memory, mem_len 8: a segment that does not
    takes the other branch of `mem_len`, one graph more.)"""
    model = tiny(model_type).train(training)
    compiled = compile_fullgraph(model)
    stream = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mems = [mem.clone() for mem in model(stream[:, :12], **memory_kwargs(model_type)).mems]
    with torch.set_grad_enabled(training):
        for i, (length, memory) in enumerate([(7, 8), (9, 6), (5, 5), (12, 7), (4, 6), (10, 8)]):
            ids = stream[:, 12 : 12 + length]
            labels = {"labels": ids} if training else {}
            memory_states = [mem[-memory:].contiguous() for mem in mems]  # (one layout for every length)
            out = compiled(ids, mems=memory_states, **labels, **memory_kwargs(model_type))
            if training:
                out.loss.backward()
            if i == 1:
                settled = graphs()
    assert settled <= 2 and graphs() == settled
