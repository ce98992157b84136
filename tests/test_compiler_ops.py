"""The custom operators torch.compile sees (`library_ops`): the blocked relative attention with its written-out
backward pass, the linear cross-entropy, evaluation's adaptive log-probabilities, and oneDNN's GEMM
(`decoding_linear`). `torch.library.opcheck` checks each one's schema, fake kernel, autograd
registration and traced behaviour; compiled models call them (one operator per attention, none of the blocks'
operations) and give eager's numbers and gradients; the graphs do not change with the length."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import transformers_xl.modeling.adaptive_softmax as adaptive_softmax
import transformers_xl.modeling.cross_entropy as cross_entropy
import transformers_xl.modeling.decoding_linear as decoding_linear
import transformers_xl.modeling.relative_attention as attention
from test_blocked_attention import attention_inputs, blocks_of  # noqa: F401 (a fixture)
from test_compile import compile_fullgraph, graphs, memory_kwargs, tiny
from test_linear_cross_entropy import TAIL_ROWS, problem

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def attention_op_arguments(grouped, causal, padding, score_term, stored=True):
    inputs, _ = attention_inputs(grouped, causal, padding, score_term)
    positions = inputs["positions"]
    return (inputs["query"], inputs["key"], inputs["value"], inputs["content_bias"], positions.keys, positions.bias,
            inputs["score_bias"], inputs["mask"], positions.offset, None, causal, 0.0, stored)  # fmt: skip


@pytest.mark.parametrize("grouped,causal,padding,score_term", [(False, True, False, True), (True, False, True, False)])
@pytest.mark.parametrize("stored", [True, False])
def test_attention_operator_passes_opcheck(blocks_of, grouped, causal, padding, score_term, stored):
    blocks_of(3)  # (several blocks: their probabilities share one flat output)
    arguments = attention_op_arguments(grouped, causal, padding, score_term, stored)
    if not stored:  # (inputs without gradients: a call that keeps nothing for a backward pass)
        arguments = [a.detach() if torch.is_tensor(a) else a for a in arguments]
    torch.library.opcheck(attention.attention_op, arguments, test_utils=OPCHECK_TESTS)


def test_attention_backward_operator_passes_opcheck(blocks_of):
    blocks_of(3)
    arguments = attention_op_arguments(grouped=False, causal=True, padding=True, score_term=True)
    query, key, value, content_bias, position_keys, position_bias, score_bias, mask, offset, *_ = arguments
    with torch.no_grad():
        output, probs, kept = attention.attention_op(*arguments)
    backward = (torch.randn_like(output).transpose(1, 2), query, key, value, content_bias, position_keys,
                position_bias, probs, kept, list(score_bias.shape), offset, None, True, 0.0)  # fmt: skip
    torch.library.opcheck(attention.attention_backward_op, [t.detach() if torch.is_tensor(t) else t for t in backward],
                          test_utils=OPCHECK_TESTS[:3])  # fmt: skip


def test_attention_operator_equals_the_eager_passes(blocks_of):
    """The operator (what a compiled graph calls) against eager `relative_attention`, outputs and gradients, with a
    folded mask as Transformer-XL gives it."""
    blocks_of(3)
    inputs, leaves = attention_inputs(grouped=False, causal=True, padding=False, score_term=True)
    inputs["positions"] = inputs["positions"]._replace(masked_far=2)
    inputs["mask"] = None
    expected, _ = attention.relative_attention(**inputs)
    upstream = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.compiler, "is_compiling", lambda: True)
        output, _ = attention.relative_attention(**inputs)
    assert output.grad_fn.name() != "_TrainingAttentionBackward"
    torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)
    for got, want in zip(torch.autograd.grad(output, leaves, upstream), expected_grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("transposed_weight", [False, True])  # (XLNet's q, k, v: a transposed view)
def test_onednn_linear_operator_passes_opcheck(bias, transposed_weight):
    torch.manual_seed(0)
    weight = torch.randn(16, 48).t() if transposed_weight else torch.randn(48, 16)
    arguments = (torch.randn(2, 7, 16), weight, torch.randn(48) if bias else None)
    for needs_gradients in (True, False):
        inputs = [t if t is None else t.clone().requires_grad_(needs_gradients) for t in arguments]
        torch.library.opcheck(decoding_linear.onednn_linear_op, inputs, test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("needs_x, needs_weight", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("zero", [False, True])
def test_onednn_linear_gradients_operator(needs_x, needs_weight, zero, monkeypatch):
    """The backward products' operator passes opcheck and gives F.linear's gradients (an empty tensor for the one not
    asked for); for an all-zero output gradient (what AOTAutograd hands an output nothing reads) it gives zeros
    without computing either product."""
    torch.manual_seed(0)
    x, weight = torch.randn(2, 7, 16), torch.randn(16, 48).t()  # (XLNet's q, k, v: a transposed view)
    grad = torch.zeros(2, 7, 48) if zero else torch.randn(2, 7, 48)
    arguments = (grad, x, weight, needs_x, needs_weight)
    torch.library.opcheck(decoding_linear.onednn_linear_gradients_op, arguments, test_utils=OPCHECK_TESTS)
    x_leaf, weight_leaf = x.clone().requires_grad_(), weight.clone().requires_grad_()
    expected = torch.autograd.grad(F.linear(x_leaf, weight_leaf), (x_leaf, weight_leaf), grad)
    if zero:
        monkeypatch.setattr(decoding_linear, "onednn_linear", lambda *args: pytest.fail("a product was computed"))
    for got, want, needed in zip(decoding_linear.onednn_linear_gradients_op(*arguments), expected,
                                 (needs_x, needs_weight)):  # fmt: skip
        if needed:
            torch.testing.assert_close(got, want)
        else:
            assert got.numel() == 0


def test_onednn_linear_operator_has_second_derivatives():
    """With `create_graph` the backward products stay differentiable (the zero-skipping operator has no gradients):
    a gradient of a gradient equals F.linear's."""
    torch.manual_seed(0)
    x, weight = torch.randn(5, 16, requires_grad=True), torch.randn(48, 16, requires_grad=True)
    results = []
    for product in (decoding_linear.onednn_linear_op, F.linear):
        (grad_x,) = torch.autograd.grad(product(x, weight, None).square().sum(), x, create_graph=True)
        results.append(torch.autograd.grad(grad_x.square().sum(), (x, weight)))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("div_val, cutoffs, d_proj", [(1, [10, 18], 16), (2, [10, 18], 12), (1, [], 16)])
def test_adaptive_log_prob_operator_passes_opcheck(div_val, cutoffs, d_proj):
    """The operator of evaluation's log-probabilities (no gradients) passes opcheck and gives the differentiable
    path's values, with tail clusters or without, with projections (div_val 2) or without."""
    torch.manual_seed(0)
    softmax = adaptive_softmax.ProjectedAdaptiveLogSoftmax(30, 16, d_proj, cutoffs, div_val)
    for parameter in softmax.parameters():
        torch.nn.init.normal_(parameter)
    hidden = torch.randn(7, d_proj)
    weights, biases, projections = (list(field) for field in zip(*softmax._clusters()))
    tails = [softmax.cluster_weight, softmax.cluster_bias] if cutoffs else [None, None]
    arguments = [hidden, *[[t if t is None else t.detach() for t in field] for field in (weights, biases, projections)],
                 *[t if t is None else t.detach() for t in tails]]  # fmt: skip
    torch.library.opcheck(adaptive_softmax.log_prob_op, arguments, test_utils=OPCHECK_TESTS)
    differentiable = softmax.log_prob(hidden.requires_grad_())  # (the other path: log_softmax per cluster)
    torch.testing.assert_close(adaptive_softmax.log_prob_op(*arguments), differentiable.detach())


def linear_cross_entropy_op_arguments(needs_gradients=True):
    t, head_target, tail_target = problem()
    tensors = [t["hidden"], t["weight"], t["bias"], t["cluster_weight"], t["cluster_bias"], t["hidden"][TAIL_ROWS]]
    codes = [0, 2, 1, 2, 0, 7, 3, 4, 0, 2] + [5, 1, 1, 2, 9, 17]  # the head (words 0-6, 2 clusters), a tail
    targets, rows, logits = [head_target, tail_target], [None, TAIL_ROWS], [None, None]
    needs = [needs_gradients] * 5 + [False]
    return [tensor.detach().requires_grad_(need) for tensor, need in zip(tensors, needs)], targets, rows, logits, \
        codes, len(head_target), needs


@pytest.mark.parametrize("needs_gradients", [True, False])
def test_linear_cross_entropy_operator_passes_opcheck(needs_gradients):
    arguments = linear_cross_entropy_op_arguments(needs_gradients)
    torch.library.opcheck(cross_entropy.linear_cross_entropy_op, arguments, test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("uniform", [True, False])
def test_linear_cross_entropy_backward_operator_passes_opcheck(uniform):
    tensors, targets, rows, logits, codes, num_rows, needs = linear_cross_entropy_op_arguments()
    with torch.no_grad():
        _, gradients = cross_entropy.linear_cross_entropy_op(tensors, targets, rows, logits, codes, num_rows, needs)
    grad_nll = torch.full((num_rows,), 0.5, dtype=torch.float64) if uniform else torch.rand(num_rows).double()
    arguments = (grad_nll, gradients, [t.detach() for t in tensors], targets, rows, codes, needs)
    torch.library.opcheck(cross_entropy.linear_cross_entropy_backward_op, arguments, test_utils=OPCHECK_TESTS[:3])


# ----------------------------------------------------------------------------------------------------------------
# Compiled models


def recording_backend(operators):
    """A torch.compile backend that records the operators of every graph (forward and backward) it is given, then
    runs them as aot_eager would."""
    from torch._dynamo.backends.common import aot_autograd

    def record(graph, _):
        operators.update(node.target for node in graph.graph.nodes if node.op == "call_function")
        return graph

    return aot_autograd(fw_compiler=record, bw_compiler=record)


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
@pytest.mark.parametrize("onednn_pays", [True, False])
def test_compiled_training_calls_the_operators(model_type, onednn_pays, monkeypatch):
    """The graphs hold the attention and linear cross-entropy operators (forward and backward) and no softmax of
    their own (the attention's and the loss's run inside the operators), and the loss and gradients are eager's.
    Where oneDNN's GEMM pays (`decoding_linear.onednn_product_pays`), the linear layers' products are its operator
    in both passes, as in eager; elsewhere there is none."""
    monkeypatch.setattr(decoding_linear, "onednn_product_pays", lambda threads: onednn_pays)
    eager = tiny(model_type).train()
    model = copy.deepcopy(eager)
    operators = set()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=recording_backend(operators))
    ids = torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(0))
    mems = eager(ids, **memory_kwargs(model_type)).mems
    expected = eager(ids, labels=ids, mems=mems, **memory_kwargs(model_type)).loss
    actual = compiled(ids, labels=ids, mems=mems, **memory_kwargs(model_type)).loss
    expected.backward()
    actual.backward()
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), model.parameters()):
        if p_eager.grad is not None:
            torch.testing.assert_close(p_compiled.grad, p_eager.grad, atol=1e-5, rtol=0, msg=name)
    names = {str(op) for op in operators}
    for op in (attention.attention_op, attention.attention_backward_op, cross_entropy.linear_cross_entropy_op,
               cross_entropy.linear_cross_entropy_backward_op):  # fmt: skip
        assert any(name.startswith(str(op)) for name in names), (op, sorted(names))
    assert not any("softmax" in name and "transformers_xl" not in name for name in names), sorted(names)
    products = [name for name in names if name.startswith(str(decoding_linear.onednn_linear_op))]
    assert bool(products) == onednn_pays, sorted(names)
    backward_products = [name for name in names if name.startswith(str(decoding_linear.onednn_linear_gradients_op))]
    assert bool(backward_products) == onednn_pays, sorted(names)  # (the zero-skipping one: see decoding_linear)


def test_compiled_evaluation_calls_the_log_prob_operator():
    """Transformer-XL's log-probabilities in a compiled graph: one operator (no log-softmax of the graph's own over
    the vocabulary's columns), eager's values."""
    model = tiny("transfo-xl").eval()
    operators = set()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=recording_backend(operators))
    ids = torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    names = {str(op) for op in operators}
    assert any(name.startswith(str(adaptive_softmax.log_prob_op)) for name in names), sorted(names)
    assert not any("softmax" in name and "transformers_xl" not in name for name in names), sorted(names)


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
