"""The linear cross-entropy (output layer and loss in chunks of rows, gradients made in the forward pass) equals the
plain composition `F.linear` + `F.cross_entropy` in values and gradients (fp64, exact to rounding), whatever the
chunking, the incoming gradient (uniform, as for a mean, or per row), ignored targets, a second backward pass,
logits given by the caller, or autocast; and both language-model heads train with it as with the composition."""

import pytest
import torch
import torch.nn.functional as F

import transformers_xl.modeling.cross_entropy as cross_entropy
from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers_xl.modeling.configuration_xlnet import XLNetConfig
from transformers_xl.modeling.cross_entropy import Softmax, SoftmaxPart, linear_cross_entropy
from transformers_xl.modeling.modeling_xlnet import XLNetLMHeadModel

ROWS, DIM, WORDS, CLUSTERS = 23, 6, 17, 2
TAIL_ROWS = torch.tensor([1, 4, 5, 11, 22])


def problem(dtype=torch.float64, seed=0):
    """An adaptive-softmax-shaped problem: a head over the first 7 words and 2 cluster rows, a tail over words
    9-16 for 5 of the rows, through a projection; one ignored target."""
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape):
        return torch.randn(*shape, dtype=dtype, generator=generator).requires_grad_()

    tensors = dict(hidden=tensor(ROWS, DIM), weight=tensor(WORDS, DIM), bias=tensor(WORDS), proj=tensor(DIM, DIM),
                   cluster_weight=tensor(CLUSTERS, DIM), cluster_bias=tensor(CLUSTERS))  # fmt: skip
    head_target = torch.randint(0, 7 + CLUSTERS, (ROWS,), generator=generator)
    head_target[7] = -100
    tail_target = torch.randint(0, 8, (len(TAIL_ROWS),), generator=generator)
    return tensors, head_target, tail_target


def ours(tensors, head_target, tail_target, logits=False):
    t = tensors
    head_parts = (SoftmaxPart(t["weight"], t["bias"], 0, 7), SoftmaxPart(t["cluster_weight"], t["cluster_bias"], 0, 2))
    tail_hidden = t["hidden"][TAIL_ROWS] @ t["proj"]
    tail_parts = (SoftmaxPart(t["weight"], t["bias"], 9, 17),)
    head_logits = reference_logits(t)[0] if logits else None
    return linear_cross_entropy([Softmax(t["hidden"], head_target, head_parts, logits=head_logits),
                                 Softmax(tail_hidden, tail_target, tail_parts, TAIL_ROWS)], ROWS)  # fmt: skip


def reference_logits(t):
    head = torch.cat([F.linear(t["hidden"], t["weight"][:7], t["bias"][:7]),
                      F.linear(t["hidden"], t["cluster_weight"], t["cluster_bias"])], -1)  # fmt: skip
    tail = F.linear(t["hidden"][TAIL_ROWS] @ t["proj"], t["weight"][9:], t["bias"][9:])
    return head, tail


def reference(tensors, head_target, tail_target):
    head, tail = reference_logits(tensors)
    nll = F.cross_entropy(head.double(), head_target, reduction="none")
    return nll.index_add(0, TAIL_ROWS, F.cross_entropy(tail.double(), tail_target, reduction="none"))


def values_and_gradients(fn, tensors, targets, row_weights):
    nll = fn(tensors, *targets)
    return [nll, *torch.autograd.grad((nll * row_weights).sum(), list(tensors.values()))]


@pytest.mark.parametrize("chunk_rows", [1, 4, ROWS])
@pytest.mark.parametrize("weighting", ["uniform", "per row"])
@pytest.mark.parametrize("logits", [False, True])
def test_equals_the_composition_in_values_and_gradients(monkeypatch, chunk_rows, weighting, logits):
    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", chunk_rows * (7 + CLUSTERS))
    monkeypatch.setattr(cross_entropy, "MIN_CHUNK_ROWS", 1)
    tensors, *targets = problem()
    row_weights = torch.full((ROWS,), 0.25).double() if weighting == "uniform" else torch.rand(ROWS).double()
    got = values_and_gradients(lambda *a: ours(*a, logits=logits), tensors, targets, row_weights)
    for got_tensor, want in zip(got, values_and_gradients(reference, tensors, targets, row_weights)):
        torch.testing.assert_close(got_tensor, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_normaliser_of_given_logits_is_logsumexp_chunk_by_chunk(monkeypatch, dtype):
    monkeypatch.setattr(cross_entropy, "CHUNK_ELEMENTS", 3 * 50)  # (chunks of 3 rows, the last one shorter)
    logits = (torch.randn(11, 50) * 30).to(dtype)
    logits[2] = float("-inf")  # (a row that allows nothing: -inf, as torch.logsumexp gives, not NaN)
    logits[4, 7] = float("inf")
    got = cross_entropy._logsumexp_rows(logits, torch.float32)
    torch.testing.assert_close(got, torch.logsumexp(logits.float(), -1))


def test_scores_without_gradients_and_ignored_targets_score_zero():
    tensors, head_target, tail_target = problem()
    with torch.no_grad():
        nll = ours(tensors, head_target, tail_target)
        torch.testing.assert_close(nll, reference(tensors, head_target, tail_target), atol=1e-12, rtol=0)
    assert nll[7] == 0 and nll.requires_grad is False


def test_a_second_backward_pass_recomputes_the_same_gradients():
    tensors, *targets = problem()
    nll = ours(tensors, *targets)
    first = torch.autograd.grad(nll.mean(), list(tensors.values()), retain_graph=True)
    second = torch.autograd.grad(nll.mean(), list(tensors.values()))
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("weighting", ["uniform", "per row"])
def test_the_operator_that_torch_compile_calls_is_the_same(monkeypatch, weighting):
    """Under torch.compile `linear_cross_entropy` calls its custom operator: same values and gradients, both when the
    backward pass scales the gradients made in the forward pass and when it recomputes them per row."""
    tensors, *targets = problem()
    row_weights = torch.ones(ROWS, dtype=torch.float64) if weighting == "uniform" else torch.rand(ROWS).double()
    expected = values_and_gradients(ours, tensors, targets, row_weights)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    for got, want in zip(values_and_gradients(ours, tensors, targets, row_weights), expected):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_under_autocast_the_products_run_in_bf16_and_the_parameters_get_fp32_gradients():
    tensors, *targets = problem(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nll = ours(tensors, *targets)
    gradients = torch.autograd.grad(nll.mean(), list(tensors.values()))
    want = values_and_gradients(reference, tensors, targets, torch.full((ROWS,), 1 / ROWS))
    assert nll.dtype == torch.float32
    torch.testing.assert_close(nll, want[0].float(), atol=0.1, rtol=0.05)
    for got, expected in zip(gradients, want[1:]):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, expected, atol=0.05, rtol=0.05)


def test_a_softmax_over_no_rows_adds_nothing():
    tensors, head_target, _ = problem()
    t = tensors
    head = Softmax(t["hidden"], head_target, (SoftmaxPart(t["weight"], t["bias"], 0, 7),
                                              SoftmaxPart(t["cluster_weight"], t["cluster_bias"], 0, 2)))  # fmt: skip
    empty = Softmax(t["hidden"][:0], head_target[:0], (SoftmaxPart(t["weight"], t["bias"], 9, 17),), TAIL_ROWS[:0])
    used = [t[name] for name in ("hidden", "weight", "bias", "cluster_weight", "cluster_bias")]
    results = []
    for softmaxes in ([head], [head, empty]):
        nll = linear_cross_entropy(softmaxes, ROWS)
        results.append([nll, *torch.autograd.grad(nll.sum(), used)])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# The language-model heads


def loss_and_gradients(model, input_ids, **kwargs):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids, labels=input_ids, **kwargs).loss
    loss.backward()
    return [loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("div_val", [1, 2])
def test_transfo_xl_adaptive_loss_equals_the_full_log_probabilities(div_val):
    """The adaptive NLL (linear cross-entropy per cluster) against -log_prob of the whole vocabulary, in fp64."""
    config = TransfoXLConfig(vocab_size=40, d_model=8, d_embed=8, n_head=2, d_head=4, d_inner=16, n_layer=2,
                             mem_len=4, cutoffs=[10, 25], div_val=div_val, dropout=0.0, dropatt=0.0)  # fmt: skip
    model = TransfoXLLMHeadModel(config).double().train()
    input_ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    input_ids[1, 3] = 39  # (the last cluster's last word)
    got = loss_and_gradients(model, input_ids)

    def full_softmax_loss(hidden, labels):
        log_p = model.crit.log_prob(hidden[:, :-1].reshape(-1, hidden.shape[-1]))
        return -log_p.gather(1, labels[:, 1:].reshape(-1, 1)).mean()

    model.zero_grad(set_to_none=True)
    hidden = model.transformer(input_ids).last_hidden_state
    loss = full_softmax_loss(hidden, input_ids)
    loss.backward()
    want = [loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_xlnet_language_model_loss_equals_cross_entropy_of_its_logits():
    config = XLNetConfig(vocab_size=30, d_model=8, n_layer=2, n_head=2, d_inner=16, dropout=0.0)
    model = XLNetLMHeadModel(config).double().train()
    input_ids = torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(2))
    labels = input_ids.clone()
    labels[0, 2] = -100
    model.zero_grad(set_to_none=True)
    out = model(input_ids, labels=labels)
    out.loss.backward()
    got = [out.loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    logits = model(input_ids).logits
    loss = F.cross_entropy(logits.reshape(-1, 30), labels.reshape(-1))
    loss.backward()
    want = [loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
