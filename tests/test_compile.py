"""torch.compile(fullgraph=True) for both models: evaluation over segments carrying the memory and training steps give
eager's numbers, with a bounded number of graphs (no recompilation per step); value checks still fire.

The tests use the "aot_eager" backend: it traces exactly what inductor would be given (Dynamo's graph and AOT
autograd's joint forward / backward graph, where graph breaks, data-dependent guards and view aliasing fail) without
generating C++ kernels, which takes minutes per model on two shared cores."""

import copy

import pytest
import torch
from torch._dynamo.utils import counters

import transformers_xl.modeling.modeling_xlnet as xlnet
from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers_xl.modeling.configuration_xlnet import XLNetConfig

VOCAB, SEGMENT, MEM_LEN = 200, 8, 8


def tiny(model_type, n_layer=2, **overrides):
    torch.manual_seed(0)
    if model_type == "transfo-xl":
        config = TransfoXLConfig(
            vocab_size=VOCAB, cutoffs=[50, 100], d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=64, div_val=2,
            n_layer=n_layer, mem_len=MEM_LEN, tgt_len=SEGMENT, dropout=0.0, dropatt=0.0, **overrides,
        )  # fmt: skip
        return TransfoXLLMHeadModel(config)
    config = XLNetConfig(
        vocab_size=VOCAB, d_model=32, n_layer=n_layer, n_head=4, d_inner=64, mem_len=MEM_LEN, dropout=0.0, **overrides
    )
    return xlnet.XLNetLMHeadModel(config)


def compile_fullgraph(model, backend="aot_eager"):
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(model, fullgraph=True, backend=backend)


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


def segments(count, batch=2, seed=1):
    stream = torch.randint(0, VOCAB, (batch, count * SEGMENT), generator=torch.Generator().manual_seed(seed))
    return stream.split(SEGMENT, dim=1)


def memory_kwargs(model_type):
    return {"use_mems": True} if model_type == "xlnet" else {}


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_compiled_evaluation_over_segments_equals_eager(model_type):
    """Four segments carrying the memory: the same log-probabilities as eager, and at most three graphs (no memory;
    the first memory, a view of the first segment's states; the steady state): the last segments add none. Then
    segments of other lengths: one more graph, whose length is dynamic (no recompilation per length)."""
    model = tiny(model_type).eval()
    compiled = compile_fullgraph(model)
    eager_mems = compiled_mems = None
    other_lengths = [segment[:, :length] for segment, length in zip(segments(3, seed=2), (5, 6, 3))]
    with torch.no_grad():
        for i, segment in enumerate(list(segments(4)) + other_lengths):
            expected = model(segment, mems=eager_mems, **memory_kwargs(model_type))
            actual = compiled(segment, mems=compiled_mems, **memory_kwargs(model_type))
            torch.testing.assert_close(actual.logits, expected.logits, atol=1e-5, rtol=0)
            for got, want in zip(actual.mems, expected.mems):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
            eager_mems, compiled_mems = expected.mems, actual.mems
            if i == 2:
                settled = graphs()
            if i == 3:
                assert settled <= 3 and graphs() == settled
    assert graphs() == settled + 1


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_compiled_training_equals_eager(model_type):
    """SGD steps over consecutive segments with the memory carried (stop-gradient): same losses and weights as eager,
    and no new graph once the memory has its steady shape."""
    eager = tiny(model_type).train()
    model = copy.deepcopy(eager)
    compiled = compile_fullgraph(model)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, model)]
    mems = [None, None]
    for i, segment in enumerate(segments(4)):
        losses = []
        for k, (net, optimizer) in enumerate(zip((eager, compiled), optimizers)):
            out = net(segment, labels=segment, mems=mems[k], **memory_kwargs(model_type))
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(out.loss.detach())
            mems[k] = out.mems
        torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=0)
        if i == 2:
            settled = graphs()
    assert settled <= 3 and graphs() == settled
    for (name, expected), actual in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0, msg=name)


def test_compiled_training_with_graph_breaks_allowed_does_not_recompile_per_step():
    """torch.compile's default (graph breaks allowed): Transformer-XL's loss, which selects each tail cluster's rows
    outside a graph, scores every row inside one instead, so nothing breaks the graph; its graphs are reused, not
    compiled again per step."""
    model = tiny("transfo-xl").train()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="aot_eager")
    for i, segment in enumerate(segments(5)):
        compiled(segment, labels=segment).loss.backward()
        if i == 1:
            settled = graphs()
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert graphs() == settled


def test_compiled_xlnet_training_under_bf16_autocast():
    """The reported failure: XLNet's LM head training compiled, batch (8, 16) with labels, here under CPU autocast
    (without dropout, so that eager and compiled draw nothing at random)."""
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=VOCAB, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0)
    eager = xlnet.XLNetLMHeadModel(config).train()
    model = copy.deepcopy(eager)
    compiled = compile_fullgraph(model)
    ids = torch.randint(0, VOCAB, (8, 16), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, actual = eager(ids, labels=ids).loss, compiled(ids, labels=ids).loss
    expected.backward()
    actual.backward()
    torch.testing.assert_close(actual, expected, atol=1e-2, rtol=0)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), model.parameters()):
        if p_eager.grad is not None:
            torch.testing.assert_close(p_compiled.grad, p_eager.grad, atol=1e-2, rtol=0, msg=name)


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_checks_when_compiled(model_type):
    """Values are checked by in-graph assertions (a RuntimeError with the expectation); shapes and dtypes raise at
    trace time (inside Dynamo's error under fullgraph, as the ValueError itself without)."""
    model = tiny(model_type, n_layer=1).eval()
    name = type(model).__name__.replace("LMHead", "")
    segment = segments(1)[0]
    compiled = compile_fullgraph(model)
    with pytest.raises(RuntimeError, match=rf"{name}: `input_ids` has values out of range; expected token ids in"):
        compiled(segment + VOCAB)
    with pytest.raises(RuntimeError, match=r"`labels` has values out of range; expected token ids in .* or -100"):
        compiled(segment, labels=segment - VOCAB)
    # the shape may print as a symbol (e.g. s17): labels of length 8 were traced before, so that size is dynamic now
    with pytest.raises(Exception, match=r"`labels` has shape \(2, \w+\); expected \[batch_size, seq_len\] = \(2, 8\)"):
        compiled(segment, labels=segment[:, 1:])
    with pytest.raises(ValueError, match=r"`labels` has shape \(2, 7\)"):
        torch.compile(model, backend="aot_eager")(segment, labels=segment[:, 1:])
