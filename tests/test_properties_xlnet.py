"""Property tests: XLNet over random small configurations and inputs (hypothesis), against transformers' XLNet on the
same weights and against itself (padding).

The number of examples and their reproducibility come from the hypothesis profile loaded in conftest.py.
"""

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

import transformers_xl.modeling.modeling_xlnet as ours
from transformers_xl.modeling.configuration_xlnet import XLNetConfig
from greedy_decoding import assert_greedy_decodings_agree
from weights import peaked

PAD = 5
ATOL = 1e-4  # large weights (std 0.2) make logits of size ~10-100; both sides compute in fp32
HEADS = [name for name in ours.__all__ if name.startswith("XLNet") and name != "XLNetPreTrainedModel"]
transformers.logging.set_verbosity_error()  # transformers' XLNet warns at every generate() (max_length -1)


@st.composite
def configs(draw, **fixed):
    """The fields of a small XLNetConfig (a dict, so that a failing example prints them). `fixed` pins fields where
    an invariant does not hold by design (each test says why)."""
    d_model = draw(st.sampled_from([8, 12, 16]))  # even: sinusoid encodings pair sines with cosines
    values = dict(
        vocab_size=draw(st.integers(12, 40)),
        d_model=d_model,
        n_head=draw(st.sampled_from([n for n in (1, 2, 4) if d_model % n == 0])),
        d_inner=draw(st.integers(4, 24)),
        n_layer=draw(st.integers(1, 2)),
        attn_type=draw(st.sampled_from(["bi", "uni"])),
        bi_data=draw(st.booleans()),
        mem_len=draw(st.sampled_from([None, 0, 1, 3, 6])),
        reuse_len=draw(st.sampled_from([None, 1, 2, 4])),
        clamp_len=draw(st.sampled_from([-1, 1, 3])),
        same_length=draw(st.booleans()),
        ff_activation=draw(st.sampled_from(["gelu", "relu"])),
        summary_type=draw(st.sampled_from(["last", "first", "mean", "cls_index"])),
        dropout=0.0,
        pad_token_id=PAD,
        num_labels=3,
    )
    values.update(fixed)
    return values


def build_pair(name, values, seed):
    """transformers' `name` and ours with the same weights: every parameter from N(0, 0.2), layer-norm weights from
    1 + N(0, 0.1) (peaked distributions: a wrong memory or mask changes the tokens, not only the logits)."""
    torch.manual_seed(seed)
    reference = getattr(transformers, name)(transformers.XLNetConfig(**values)).eval()
    peaked(reference)
    model = getattr(ours, name)(XLNetConfig(**values)).eval()
    model.load_state_dict(reference.state_dict())
    return reference, model


def assert_outputs_close(actual, expected, tied_positions=False):
    """Every field transformers returns, ours returns the same (mems included). With `tied_positions` the span
    beams' indices may order tied positions either way: only their probabilities are compared."""
    for field, value in expected.items():
        mine = actual[field]
        if field.endswith("_top_index"):
            assert tied_positions or torch.equal(mine, value), field
            continue
        if isinstance(value, tuple):
            assert len(mine) == len(value), field
            for a, b in zip(mine, value):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4, msg=field)
        else:
            torch.testing.assert_close(mine, value, atol=ATOL, rtol=1e-4, msg=field)


def integers(draw, low, high, shape, label):
    count = 1
    for size in shape:
        count *= size
    return torch.tensor(draw(st.lists(st.integers(low, high), min_size=count, max_size=count), label=label)).view(shape)


seeds = st.integers(0, 2**16)


@st.composite
def head_inputs(draw, values, name, rows_alone=False):
    """Inputs of head `name` for config `values`: ids, and optionally attention_mask, token_type_ids, perm_mask,
    target_mapping, mems, use_mems. transformers' "uni" attention crashes on a data mask (attention_mask, perm_mask)
    with more than one row (it adds the [q, k, 1, 1] causal mask to the [q, k, batch, 1] data mask in place): unless
    `rows_alone`, uni inputs with a mask have one row (see test_uni_masks_on_a_batch_equal_transformers_row_by_row);
    with `rows_alone` a multiple-choice row has one choice (transformers runs each choice as a row)."""
    two_choices = name == "XLNetForMultipleChoice" and not rows_alone
    choices = draw(st.integers(1, 2), label="choices") if two_choices else 1
    batch = draw(st.sampled_from([2] if values["bi_data"] else [1, 2, 3]), label="batch")  # bi_data: two halves
    rows, length = batch * choices, draw(st.integers(1, 6), label="length")
    shape = (batch, choices, length) if name == "XLNetForMultipleChoice" else (batch, length)
    masks_allowed = values["attn_type"] == "bi" or rows == 1 or rows_alone
    inputs = {"input_ids": integers(draw, 0, values["vocab_size"] - 1, shape, "input_ids")}
    if draw(st.booleans(), label="with attention_mask") and masks_allowed:
        mask = integers(draw, 0, 1, shape, "attention_mask")
        mask[..., -1] = 1  # at least one token per row
        inputs["attention_mask"] = mask.float()
    if draw(st.booleans(), label="with token_type_ids"):
        inputs["token_type_ids"] = integers(draw, 0, 2, shape, "token_type_ids")
    if draw(st.booleans(), label="with perm_mask") and masks_allowed:
        inputs["perm_mask"] = integers(draw, 0, 1, (rows, length, length), "perm_mask").float()
    if draw(st.booleans(), label="with target_mapping"):
        predictions = draw(st.integers(1, length), label="predictions")
        targets = integers(draw, 0, length - 1, (rows, predictions), "targets")
        inputs["target_mapping"] = torch.nn.functional.one_hot(targets, length).float()
    if draw(st.booleans(), label="with mems"):
        memory_length = draw(st.integers(1, 4), label="memory length")
        generator = torch.Generator().manual_seed(draw(seeds, label="mems seed"))
        inputs["mems"] = tuple(
            torch.randn(memory_length, rows, values["d_model"], generator=generator) for _ in range(values["n_layer"])
        )
    inputs["use_mems"] = draw(st.booleans(), label="use_mems")
    return inputs


def tied_positions(reference, inputs):
    """Whether two positions of a row end with the same hidden state (identical tokens can): their span scores tie
    exactly, and top-k may order them either way."""
    hidden = reference.transformer(**inputs).last_hidden_state
    gaps = torch.cdist(hidden, hidden) + torch.eye(hidden.shape[1]) * 1e9
    return bool((gaps < 1e-4).any())


def fitted(values, name, inputs):
    """`values` made to fit the head: XLNetForQuestionAnswering's inference beams (start_n_top, end_n_top) within
    its outputs, XLNetForQuestionAnsweringSimple's two logits (start, end) per position."""
    target_mapping = inputs.get("target_mapping")
    outputs = inputs["input_ids"].shape[-1] if target_mapping is None else target_mapping.shape[1]
    values = dict(values, start_n_top=min(2, outputs), end_n_top=min(2, outputs))
    return dict(values, num_labels=2) if name == "XLNetForQuestionAnsweringSimple" else values


@settings(max_examples=settings().max_examples * 4)  # seven heads, each with or without each optional input
@given(data=st.data(), seed=seeds, name=st.sampled_from(HEADS))
def test_every_head_equals_transformers(data, seed, name):
    values = data.draw(configs(), label="config")
    inputs = data.draw(head_inputs(values, name), label="inputs")
    reference, model = build_pair(name, fitted(values, name, inputs), seed)
    with torch.no_grad():
        ties = name == "XLNetForQuestionAnswering" and tied_positions(reference, inputs)
        assert_outputs_close(model(**inputs), reference(**inputs), ties)


@given(data=st.data(), seed=seeds, name=st.sampled_from(HEADS))
def test_uni_masks_on_a_batch_equal_transformers_row_by_row(data, seed, name):
    """Where transformers crashes (uni attention, a data mask, several rows), ours gives each row what
    transformers gives it alone. (bi_data pairs rows, so a row cannot run alone.)"""
    values = data.draw(configs(attn_type="uni", bi_data=False), label="config")
    inputs = data.draw(head_inputs(values, name, rows_alone=True), label="inputs")
    reference, model = build_pair(name, fitted(values, name, inputs), seed)
    rows = inputs["input_ids"].shape[0]
    with torch.no_grad():
        together = model(**inputs)
        for row in range(rows):
            row_inputs = {key: row_of(value, row, rows) for key, value in inputs.items()}
            alone = reference(**row_inputs)
            ties = name == "XLNetForQuestionAnswering" and tied_positions(reference, row_inputs)
            assert_outputs_close({key: row_of(together[key], row, rows) for key in alone}, alone, ties)


def row_of(value, row, rows):
    """Row `row` of a batch-first tensor, of time-major mems (a tuple), or a flag as it is."""
    if isinstance(value, tuple):
        return tuple(mem[:, row : row + 1] for mem in value)
    if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == rows:
        return value[row : row + 1]
    return value


# transformers' generation passes a perm_mask, on which its "uni" attention crashes with several rows (see
# head_inputs): there each row is compared with transformers' generation for it alone, beams (rows of one prompt)
# and bi_data (which pairs rows) are left out. Under uni with same_length and an empty memory, transformers' next-token
# query sees no position at all and averages every value uniformly, its dummy token's included, which ours does not
# compute: same_length is tested with a memory in test_uni_same_length_generation_with_a_memory_equals_transformers.
@given(data=st.data(), seed=seeds)
def test_generated_tokens_equal_transformers(data, seed):
    values = data.draw(configs(), label="config")
    if values["attn_type"] == "uni":
        values.update(bi_data=False, same_length=False)
    batch = data.draw(st.sampled_from([2] if values["bi_data"] else [1, 2]), label="batch")
    length = data.draw(st.integers(1, 5), label="prompt length")
    prompt = integers(data.draw, 0, values["vocab_size"] - 1, (batch, length), "prompt")
    beams = [{}, {"num_beams": 2}] if values["attn_type"] == "bi" else [{}]
    strategy = data.draw(st.sampled_from(beams), label="beams")
    settings = dict(
        strategy, max_new_tokens=data.draw(st.integers(1, 4), label="new tokens"), do_sample=False,
        use_mems=data.draw(st.booleans(), label="use_mems"), return_dict_in_generate=True, output_logits=True,
    )  # fmt: skip
    reference, model = build_pair("XLNetLMHeadModel", values, seed)
    actual = model.generate(prompt, **settings)
    parts = [prompt] if values["attn_type"] == "bi" else prompt.split(1)
    expected = [reference.generate(part, **settings) for part in parts]
    their_sequences = torch.cat([out.sequences for out in expected])
    their_logits = [torch.cat(step) for step in zip(*(out.logits for out in expected))]
    if strategy:  # beams: rows of the logits are beams, whose order the tokens decide; compared exactly
        assert torch.equal(actual.sequences, their_sequences)
        for ours_logits, theirs in zip(actual.logits, their_logits, strict=True):
            torch.testing.assert_close(ours_logits, theirs, atol=ATOL, rtol=1e-4)
    else:
        assert_greedy_decodings_agree(actual.sequences, actual.logits, their_sequences, their_logits, ATOL, 1e-4)


# Padding is masked out as keys and positions are relative, so left padding changes nothing for the real tokens,
# except: bi_data encodes the two halves of a batch in opposite directions (a row alone is in another half); uni
# attention with same_length gives every query a window of keys that counts the padding; the "first" and "mean"
# sequence summaries read the padding (XLNet's CLS token is last).
@given(data=st.data(), seed=seeds, name=st.sampled_from(["XLNetLMHeadModel", "XLNetForSequenceClassification"]))
def test_each_row_of_a_left_padded_batch_gives_what_it_gives_alone(data, seed, name):
    values = data.draw(configs(bi_data=False, summary_type="last"), label="config")
    if values["attn_type"] == "uni":
        values["same_length"] = False
    _, model = build_pair(name, values, seed)
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=2, max_size=3), label="lengths")
    rows = [integers(data.draw, 6, values["vocab_size"] - 1, (1, n), f"row {i}") for i, n in enumerate(lengths)]
    longest = max(lengths)
    batch = torch.cat([torch.cat([torch.full((1, longest - n), PAD), row], 1) for n, row in zip(lengths, rows)])
    mask = (torch.arange(longest)[None] >= longest - torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        together = model(batch, attention_mask=mask).logits
        for i, (n, row) in enumerate(zip(lengths, rows)):
            alone = model(row).logits[0]
            actual = together[i, longest - n :] if name == "XLNetLMHeadModel" else together[i]
            torch.testing.assert_close(actual, alone, atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("mem_len, reuse_len, prompt_length", [(None, None, 1), (4, None, 3), (None, 2, 1), (4, 2, 3)])
def test_uni_same_length_generation_with_a_memory_equals_transformers(mem_len, reuse_len, prompt_length):
    """Regression (found by test_generated_tokens_equal_transformers): under uni attention with same_length every
    query sees only the newest memory_length + 1 positions, transformers' next-token query too; ours saw them all.
    Given mems of 5 positions (3 after transformers drops its newest two), no step's memory is empty."""
    values = dict(
        vocab_size=12, d_model=8, n_head=1, d_inner=4, n_layer=2, attn_type="uni", bi_data=False, mem_len=mem_len,
        reuse_len=reuse_len, clamp_len=-1, same_length=True, dropout=0.0, pad_token_id=PAD,
    )  # fmt: skip
    reference, model = build_pair("XLNetLMHeadModel", values, seed=0)
    generator = torch.Generator().manual_seed(1)
    mems = tuple(torch.randn(5, 1, 8, generator=generator) for _ in range(2))
    prompt = torch.randint(0, 12, (1, prompt_length), generator=generator)
    settings = dict(
        max_new_tokens=4, do_sample=False, mems=mems, use_mems=True, return_dict_in_generate=True, output_logits=True
    )
    actual, expected = model.generate(prompt, **settings), reference.generate(prompt, **settings)
    assert_greedy_decodings_agree(actual.sequences, actual.logits, expected.sequences, expected.logits, ATOL, 1e-4)
