"""Relative attention in blocks of queries, with its written-out backward pass, and the fused softmax cross-entropy:
the same numbers and gradients as one explicit block / `F.cross_entropy` (fp64, so that differences are bugs, not
rounding), for every kind of term the models give them, and the same outputs of whole models."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import transformers_xl.modeling.relative_attention as attention
from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers_xl.modeling.configuration_xlnet import XLNetConfig
from transformers_xl.modeling.cross_entropy import reduced_cross_entropy, softmax_cross_entropy
from transformers_xl.modeling.modeling_transfo_xl import FoldedMask
from transformers_xl.modeling.modeling_xlnet import XLNetLMHeadModel

BATCH, HEADS, QUERIES, MEMORY, DIM = 4, 3, 10, 6, 8


@pytest.fixture
def blocks_of(monkeypatch):
    """Make blocks of `rows` query rows for inputs of `keys` keys (the default size gives tests a single block)."""

    def set_rows(rows, keys=MEMORY + QUERIES, batch=BATCH, heads=HEADS):
        for name in ("SCORE_BLOCK_ELEMENTS", "STORED_BLOCK_ELEMENTS"):  # (without, with gradients)
            monkeypatch.setattr(attention, name, batch * heads * keys * rows)

    return set_rows


def attention_inputs(grouped, causal, padding, score_term, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=generator).requires_grad_()

    keys = MEMORY + QUERIES
    distances = keys + 1 if causal else keys + QUERIES  # Transformer-XL's k-1 ... -1, XLNet's k ... -q+1
    inputs = dict(
        query=tensor(BATCH, HEADS, QUERIES, DIM), key=tensor(BATCH, HEADS, keys, DIM),
        value=tensor(BATCH, HEADS, keys, DIM), content_bias=tensor(HEADS, DIM),
    )  # fmt: skip
    position_keys = tensor(2, 1, HEADS, distances, DIM) if grouped else tensor(HEADS, distances, DIM)
    position_bias = tensor(HEADS, DIM)
    offset = QUERIES - 1 if causal else QUERIES
    inputs["positions"] = attention.RelativePositions(position_keys, position_bias, offset)
    inputs["score_bias"] = tensor(BATCH, HEADS, QUERIES, keys) if score_term else None
    mask = attention.causal_memory_mask(QUERIES, MEMORY)[None, None] if causal else None
    if padding:
        padded = torch.rand(BATCH, 1, QUERIES, keys, generator=generator) < 0.2
        mask = padded if mask is None else mask | padded
    inputs["mask"], inputs["causal"] = mask, causal
    leaves = [inputs[name] for name in ("query", "key", "value", "content_bias")] + [position_keys, position_bias]
    return inputs, leaves + ([inputs["score_bias"]] if score_term else [])


CASES = list(itertools.product([False, True], repeat=4))  # grouped keys, causal, padding, score term


@pytest.mark.parametrize("grouped,causal,padding,score_term", CASES)
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_blocks_with_gradients_equal_one_explicit_block(blocks_of, grouped, causal, padding, score_term, rows):
    inputs, leaves = attention_inputs(grouped, causal, padding, score_term)
    expected, _ = attention.relative_attention(**inputs, output_attentions=True)
    upstream = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, leaves, upstream)
    blocks_of(rows)
    output, probs = attention.relative_attention(**inputs)
    assert probs is None and output.grad_fn.name().startswith("_TrainingAttention")
    torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)
    for got, want in zip(torch.autograd.grad(output, leaves, upstream), expected_grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("grouped,causal,padding,score_term", CASES)
@pytest.mark.parametrize("rows", [1, 3])  # (blocks of one row: a decoding step's position scores)
def test_blocks_without_gradients_equal_one_explicit_block(blocks_of, grouped, causal, padding, score_term, rows):
    inputs, _ = attention_inputs(grouped, causal, padding, score_term)
    with torch.no_grad():
        expected, _ = attention.relative_attention(**inputs, output_attentions=True)
        blocks_of(rows)
        output, _ = attention.relative_attention(**inputs)
    torch.testing.assert_close(output, expected, atol=1e-12, rtol=0)


def test_blocks_run_last_rows_first_and_share_one_workspace(blocks_of):
    """The widest block comes first, so the position scores of a call are one allocation that later (narrower)
    blocks reuse; a dtype change gets a buffer of its own. A block of one row (here the last row, first) multiplies
    into a fresh tensor of its own keys' distances only, as a decoding step does."""
    assert [start for start, *_ in attention._blocks(10, 16, 3, causal=True)] == [9, 6, 3, 0]
    workspace = attention.Workspace()
    first = workspace.take((4, 5), torch.ones(()))
    assert workspace.take((2, 3), torch.ones(())).data_ptr() == first.data_ptr()
    assert workspace.take((3, 7), torch.ones(())).numel() == 21 and workspace.buffer.numel() == 21
    assert workspace.take((2, 2), torch.ones((), dtype=torch.float64)).dtype == torch.float64
    inputs, _ = attention_inputs(grouped=False, causal=True, padding=False, score_term=True)
    blocks_of(3)
    taken = []
    original_take = attention.Workspace.take

    def recording_take(self, shape, like):
        taken.append((id(self), self.buffer is None))
        return original_take(self, shape, like)

    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention.Workspace, "take", recording_take)
        attention.relative_attention(**inputs)
    assert len(taken) == 3 and len({owner for owner, _ in taken}) == 1  # 3 blocks of 3 rows, one workspace
    assert [fresh for _, fresh in taken] == [True, False, False]  # allocated by the first of them only


def test_blocks_with_dropout_have_exact_gradients(blocks_of):
    """gradcheck with the dropout masks drawn again from the same seed on every call: the backward pass applies the
    masks the forward pass drew."""
    inputs, leaves = attention_inputs(grouped=False, causal=True, padding=True, score_term=True)
    blocks_of(4)

    def attend(query, key, value, content_bias, position_keys, position_bias, score_bias):
        torch.manual_seed(0)
        positions = attention.RelativePositions(position_keys, position_bias, inputs["positions"].offset)
        return attention.relative_attention(
            query, key, value, content_bias, positions, score_bias, inputs["mask"], causal=True, dropout=0.3
        )[0]

    output = attend(*leaves)
    assert output.grad_fn.name().startswith("_TrainingAttention")
    assert not torch.equal(output, attention.relative_attention(**inputs)[0])  # something was dropped
    assert torch.autograd.gradcheck(attend, [leaf.detach().requires_grad_() for leaf in leaves])


def test_training_attention_under_autocast_runs_in_bf16():
    inputs, leaves = attention_inputs(grouped=False, causal=True, padding=False, score_term=False)
    inputs = {name: value.float() if torch.is_tensor(value) and value.is_floating_point() else value
              for name, value in inputs.items()}  # fmt: skip
    inputs["positions"] = attention.RelativePositions(*(t.float() for t in inputs["positions"][:2]), QUERIES - 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, _ = attention.relative_attention(**inputs)
    assert output.dtype == torch.bfloat16
    output.float().sum().backward()


# ----------------------------------------------------------------------------------------------------------------
# Whole models: blocks change nothing


def transfo_xl(**overrides):
    torch.manual_seed(0)
    config = TransfoXLConfig(
        vocab_size=120, cutoffs=[30, 70], d_model=24, d_embed=24, n_head=3, d_head=8, d_inner=32, n_layer=2,
        mem_len=MEMORY, dropout=0.0, dropatt=0.0, **overrides,
    )  # fmt: skip
    return TransfoXLLMHeadModel(config).double()


def xlnet(**overrides):
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=120, d_model=24, n_layer=2, n_head=3, d_inner=32, mem_len=MEMORY, dropout=0.0,
                         **overrides)  # fmt: skip
    return XLNetLMHeadModel(config).double()


def two_segments(model, **extra):
    """Loss, log-probabilities / logits and gradients over a second segment that attends to the first's memory."""
    ids = torch.randint(0, 120, (2, 2, QUERIES), generator=torch.Generator().manual_seed(1))
    model.zero_grad()
    with torch.no_grad():
        mems = model(ids[0], **extra).mems
        evaluated = model(ids[1], mems=mems, **extra).logits
    loss = model(ids[1], mems=mems, labels=ids[1], **extra).loss
    loss.backward()
    return [evaluated, loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("attn_type", [0, 1])
def test_transfo_xl_in_blocks_equals_one_block(blocks_of, attn_type):
    model = transfo_xl(attn_type=attn_type, same_length=True)
    expected = two_segments(model)
    blocks_of(3, keys=MEMORY + QUERIES, batch=2)
    for got, want in zip(two_segments(model), expected):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("same_length,span", [(False, None), (True, None), (True, 4)])
@pytest.mark.parametrize("rows", [1, 3, QUERIES])
def test_transfo_xl_folded_causal_mask_equals_the_boolean_mask(blocks_of, same_length, span, rows):
    """Without padding, attn_type 0 folds the causal (and same_length) mask into its position scores; an all-ones
    attention_mask takes the boolean mask instead: the same log-probabilities, loss and gradients."""
    model = transfo_xl(same_length=same_length, same_length_span=span)
    blocks_of(rows, keys=MEMORY + QUERIES, batch=2)
    folded = two_segments(model)
    assert isinstance(model.transformer._attention_mask(QUERIES, MEMORY, None, "cpu"), FoldedMask)
    for got, want in zip(folded, two_segments(model, attention_mask=torch.ones(2, QUERIES, dtype=torch.long))):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


@pytest.mark.parametrize("bi_data", [False, True])
def test_xlnet_in_blocks_equals_one_block(blocks_of, bi_data):
    model = xlnet(bi_data=bi_data)
    types = torch.tensor([[0] * 4 + [1] * 6, [0] * 7 + [1] * 3])
    extra = dict(use_mems=True, token_type_ids=types)
    expected = two_segments(model, **extra)
    blocks_of(3, keys=MEMORY + QUERIES, batch=2)
    for got, want in zip(two_segments(model, **extra), expected):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


# ----------------------------------------------------------------------------------------------------------------
# Softmax cross-entropy


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows_shape, keys_shape, masked_far", [
    ((3, 1, 8), (3, 37, 8), None),  # keys shared by the batch
    ((3, 1, 8), (3, 37, 8), 5),  # with a folded mask
    ((2, 1, 3, 2, 8), (2, 1, 3, 37, 8), None),  # grouped keys (XLNet's bi_data)
])  # fmt: skip
def test_few_reduced_precision_position_rows_are_multiplied_in_fp32(dtype, rows_shape, keys_shape, masked_far,
                                                                   monkeypatch):  # fmt: skip
    """A decoding step's few bf16 / fp16 query rows: position scores without torch's reduced-precision GEMM (which
    builds a oneDNN primitive for every new key length), equal to the exact products rounded to the dtype (up to one
    rounding step: the fp32 sums may round the other way than fp64's, and their order differs between CPUs)."""
    torch.manual_seed(0)
    query = torch.randn(rows_shape).to(dtype)
    if len(rows_shape) == 5:  # [G, B/G, H, q, d] -> the [B, H, q, d] query
        query = query.flatten(0, 1)
    else:  # [H, q, d] -> [1, H, q, d]
        query = query[None]
    keys = torch.randn(keys_shape).to(dtype)
    with torch.no_grad():
        expected = attention._unshifted_position_scores(query.double(), keys.double(), masked_far)
        fp32_product = attention._keys_product

        def only_fp32(rows, keys, out=None):
            if dtype in (rows.dtype, keys.dtype):
                pytest.fail(f"the {dtype} GEMM was called")
            return fp32_product(rows, keys, out)

        monkeypatch.setattr(attention, "_keys_product", only_fp32)
        actual = attention._unshifted_position_scores(query, keys, masked_far)
    assert actual.dtype == dtype
    expected = expected.masked_fill(expected == torch.finfo(torch.float64).min, torch.finfo(dtype).min)  # (masked)
    torch.testing.assert_close(actual, expected.to(dtype), rtol=torch.finfo(dtype).eps, atol=1e-6)


def test_softmax_cross_entropy_equals_torch_in_values_and_gradients():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 37, dtype=torch.float64, generator=generator, requires_grad=True)
    target = torch.randint(0, 37, (50,), generator=generator)
    target[[3, 9]] = -100
    weights = torch.rand(50, dtype=torch.float64, generator=generator)
    nll = softmax_cross_entropy(logits, target)
    expected = F.cross_entropy(logits, target, reduction="none")
    torch.testing.assert_close(nll, expected, atol=1e-12, rtol=0)
    grad, = torch.autograd.grad((nll * weights).sum(), logits)
    want, = torch.autograd.grad((expected * weights).sum(), logits)
    torch.testing.assert_close(grad, want, atol=1e-12, rtol=0)
    for reduction in ("sum", "mean"):
        torch.testing.assert_close(reduced_cross_entropy(logits, target, reduction),
                                   F.cross_entropy(logits, target, reduction=reduction), atol=1e-12, rtol=0)  # fmt: skip
    assert reduced_cross_entropy(logits, torch.full((50,), -100), "mean").isnan()  # as F.cross_entropy


def test_softmax_cross_entropy_keeps_half_precision_logits_intact_and_refuses_a_second_backward():
    logits = torch.randn(6, 5, dtype=torch.bfloat16, requires_grad=True)
    before = logits.detach().clone()
    nll = softmax_cross_entropy(logits, torch.tensor([0, 1, 2, 3, 4, 0]))
    assert nll.dtype == torch.float32
    nll.sum().backward(retain_graph=True)
    assert torch.equal(logits.detach(), before)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        nll.sum().backward()  # the gradient was scaled in place: autograd says so rather than reuse it
    with pytest.raises(ValueError, match=r"expected \[N, C\] and \[N\]"):
        softmax_cross_entropy(logits, torch.tensor([0, 1]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("batch, offset, biases", [(1, 0, True), (4, 1, True), (4, 0, False)])
def test_one_query_row_equals_one_explicit_block(monkeypatch, batch, offset, biases, dtype):
    """A decoding step's attention (one query row after or at the last key, nothing masked) takes its own path,
    with the numbers of one explicit block (bf16 inputs: those of the block in fp64 on the same numbers, rounded)."""
    generator = torch.Generator().manual_seed(3)

    def tensor(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=generator).to(dtype).double()

    keys = MEMORY + 1
    query, key, value = (tensor(batch, HEADS, rows, DIM) for rows in (1, keys, keys))
    content_bias, position_bias = (tensor(HEADS, DIM) if biases else None for _ in range(2))
    position_keys = tensor(HEADS, keys + 2, DIM)
    positions = attention.RelativePositions(position_keys, position_bias, offset, masked_far=0)
    calls = []
    one_query = attention._one_query_attention
    monkeypatch.setattr(attention, "_one_query_attention", lambda *args: calls.append(1) or one_query(*args))
    inputs = [query, key, value, content_bias, positions]
    lowered = [t if t is None else t.to(dtype) for t in inputs[:4]] + [positions._replace(
        keys=position_keys.to(dtype), bias=None if position_bias is None else position_bias.to(dtype))]  # fmt: skip
    with torch.no_grad():
        output, _ = attention.relative_attention(*lowered, causal=True)
        expected, _ = attention._attention_in_blocks(*inputs, None, None, True, 0.0, True)
    assert calls == [1] and output.dtype == dtype
    tolerance = 1e-12 if dtype == torch.float64 else 1e-2  # (bf16: the output rounded once)
    torch.testing.assert_close(output.double(), expected, atol=tolerance, rtol=tolerance)
