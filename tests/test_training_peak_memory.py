"""What a training step keeps and copies (its peak memory, issue 38; docs/benchmarks.md): the loss's backward makes no
[N, V] tensor, the position scores keep no per-row copy of the position keys, the mask written into the shifted
scores leaves no in-place copy node in the graph, XLNet's position scores get their gradient without a layout copy and
its feed-forward keeps no activation output, each with the values torch's own operations give."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.activations import ACT2FN

from transformers_xl.modeling.modeling_xlnet import RecomputedActivation
from transformers_xl.modeling.relative_attention import cross_entropy, distance_scores, mask_scores_, relative_shift


class ShapesMade(TorchDispatchMode):
    """The shapes of the new tensors the operations under it make (not views, not in-place results)."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        def tensors(tree):
            return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]

        inputs = {t.untyped_storage().data_ptr() for t in tensors((args, kwargs))}
        out = func(*args, **(kwargs or {}))
        self.shapes += [tuple(t.shape) for t in tensors(out) if t.untyped_storage().data_ptr() not in inputs]
        return out


@pytest.mark.parametrize("overwrite", [False, True])
def test_cross_entropy_equals_torch_and_its_backward_makes_no_full_size_tensor(overwrite):
    torch.manual_seed(0)
    weight = torch.randn(50, 8, requires_grad=True)
    hidden, target = torch.randn(12, 8), torch.randint(0, 50, (12,))
    target[3] = -100
    row_grads = torch.randn(12)
    expected = F.cross_entropy(hidden @ weight.t(), target, reduction="none")
    (expected * row_grads).sum().backward()
    expected_grad, weight.grad = weight.grad, None

    losses = cross_entropy(hidden @ weight.t(), target, overwrite=overwrite)
    with ShapesMade() as made:
        (losses * row_grads).sum().backward()
    assert torch.equal(losses, expected)
    torch.testing.assert_close(weight.grad, expected_grad, rtol=0, atol=1e-6)
    assert (12, 50) not in made.shapes  # torch's backward makes two: nll_loss's one-hot gradient, log_softmax's
    assert cross_entropy(hidden @ weight.t(), target, "sum").item() == pytest.approx(expected.sum().item())


def test_cross_entropy_overwrites_the_logits_only_when_asked_and_refuses_a_second_backward():
    logits = torch.randn(4, 6, requires_grad=True) * 1  # (a non-leaf, as a layer's output is)
    target = torch.tensor([0, 5, 2, 1])
    kept = logits.detach().clone()
    loss = cross_entropy(logits, target).sum()
    assert torch.equal(logits, kept)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    cross_entropy(logits, target, overwrite=True)
    assert torch.equal(logits, torch.log_softmax(kept, -1))


def test_distance_scores_keep_no_per_row_copy_of_the_position_keys():
    torch.manual_seed(0)
    batch, heads, length, dim, distances = 3, 2, 5, 4, 7
    # the query's usual layout: heads of a [B, q, H * D] projection
    query = torch.randn(batch, length, heads * dim, requires_grad=True)
    position_query = query.view(batch, length, heads, dim).transpose(1, 2) + 1
    position_keys = torch.randn(heads, distances, dim, requires_grad=True)
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        scores = distance_scores(position_query, position_keys)
    expected = torch.matmul(position_query, position_keys.transpose(1, 2))
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-6)
    kept = sum(t.untyped_storage().nbytes() for t in saved)
    assert kept <= position_query.untyped_storage().nbytes() + position_keys.untyped_storage().nbytes()
    scores.sum().backward()  # (and the backward runs through the views)


def test_mask_written_into_the_shifted_scores_adds_no_copy_node_and_keeps_the_gradient():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 4, 9, requires_grad=True)
    mask = torch.ones(4, 8, dtype=torch.bool).triu(5)  # (every row keeps keys: masked probabilities are exactly 0)
    bias = mask_scores_(relative_shift(scores * 1, 8, 3), mask)
    node, names = bias.grad_fn, []
    while node is not None:
        names.append(node.name())
        node = node.next_functions[0][0] if node.next_functions else None
    assert not any("CopySlices" in name for name in names)

    content = torch.randn(2, 3, 4, 8)
    torch.softmax(content + bias, -1).pow(2).sum().backward()
    expected_grad, scores.grad = scores.grad, None
    recorded = relative_shift(scores * 1, 8, 3).masked_fill(mask, torch.finfo(scores.dtype).min)
    torch.softmax(content + recorded, -1).pow(2).sum().backward()
    torch.testing.assert_close(expected_grad, scores.grad, rtol=0, atol=0)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_xlnet_feed_forward_keeps_only_its_input_and_the_dropout_mask_and_equals_autograd(dropout):
    # (the activation is recomputed in the backward; selective checkpointing did the same at ~0.5 ms per call)
    torch.manual_seed(0)
    inner, weight, bias = (torch.randn(*shape, requires_grad=True) for shape in [(2, 5, 12), (4, 12), (4,)])
    activation, row_grads = ACT2FN["gelu_new"], torch.randn(2, 5, 4)
    saved = []
    torch.manual_seed(1)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        output = RecomputedActivation.apply(inner, weight, bias, activation, dropout)
    grads = torch.autograd.grad(output, (inner, weight, bias), row_grads)
    torch.manual_seed(1)
    activated = activation(inner)
    dropped = torch.native_dropout(activated, dropout, True)[0] if dropout else activated
    expected = F.linear(dropped, weight, bias)
    expected_grads = torch.autograd.grad(expected, (inner, weight, bias), row_grads)
    assert torch.equal(output, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-6)
    assert [(tuple(t.shape), t.dtype) for t in saved] == [((2, 5, 12), torch.float32), ((4, 12), torch.float32)] + (
        [((2, 5, 12), torch.bool)] if dropout else []
    )


def test_xlnet_feed_forward_under_autocast_gives_autograds_gradients_in_the_parameters_dtype():
    torch.manual_seed(0)
    inner, weight, bias = (torch.randn(*shape, requires_grad=True) for shape in [(2, 5, 12), (4, 12), (4,)])
    row_grads = torch.randn(2, 5, 4)
    results = []
    for function in (RecomputedActivation.apply, lambda x, w, b, act, p: F.linear(act(x), w, b)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = function(inner.to(torch.bfloat16), weight, bias, ACT2FN["gelu_new"], 0.0)
        results.append((output, torch.autograd.grad(output, (inner, weight, bias), row_grads.to(output.dtype))))
    (output, grads), (expected, expected_grads) = results
    assert output.dtype == expected.dtype == torch.bfloat16 and torch.equal(output, expected)
    for grad, expected_grad, parameter in zip(grads, expected_grads, (inner, weight, bias), strict=True):
        assert grad.dtype == parameter.dtype
        torch.testing.assert_close(grad, expected_grad, rtol=2e-2, atol=2e-2)


def test_xlnet_position_scores_get_their_gradient_without_a_layout_copy():
    """The position product's [B, H, q, R] scores are a view of its [H, B, q, R] output; shifted in that order, the
    backward hands the product its gradient without copying it into that layout (2% of a training step)."""
    from transformers_xl import XLNetConfig, XLNetLMHeadModel

    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=30, d_model=16, n_layer=1, n_head=2, d_inner=32, mem_len=4, dropout=0.0)
    model, ids = XLNetLMHeadModel(config).train(), torch.randint(0, 30, (3, 5))
    loss = model(ids, mems=[torch.randn(4, 3, 16)], labels=ids, use_mems=True).loss
    made = ShapesMade()
    with made:
        loss.backward()
    heads, batch, queries, distances = 2, 3, 5, 4 + 5 + 5  # (bi attention: R = k + q)
    assert (heads, batch, queries, distances) not in made.shapes
    assert (heads, batch * queries, 8) in made.shapes  # (the product's query gradient, so the backward was seen)
