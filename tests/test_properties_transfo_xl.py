"""Property tests: invariants of Transformer-XL over random small configurations and inputs (hypothesis).

The number of examples and their reproducibility come from the hypothesis profile loaded in conftest.py.
"""

import tempfile

import torch
from hypothesis import given
from hypothesis import strategies as st

from transformers_xl import TransfoXLConfig, TransfoXLForSequenceClassification, TransfoXLLMHeadModel
from greedy_decoding import assert_greedy_decodings_agree
from weights import perturbed

PAD = 0
ATOL = 1e-5


@st.composite
def configs(draw, min_mem_len=0, **fixed):
    """The fields of a small TransfoXLConfig (a dict, so that a failing example prints them): any architecture the
    original code supports. `fixed` pins fields (strategies restricted where an invariant does not hold by design,
    each test says why); `min_mem_len` bounds the memory."""
    vocab_size = draw(st.integers(12, 40))
    d_model = draw(st.sampled_from([8, 12, 16]))  # even: sinusoid encodings pair sines with cosines
    div_val = draw(st.sampled_from([1, 2]))
    attn_type = draw(st.integers(0, 3))
    n_head = draw(st.sampled_from([1, 2, 4]) if attn_type == 3 else st.integers(1, 3))
    values = dict(
        vocab_size=vocab_size,
        cutoffs=sorted(draw(st.sets(st.integers(2, vocab_size - 1), max_size=2))),
        div_val=div_val,
        d_model=d_model,
        d_embed=draw(st.sampled_from([d_model, 4 * div_val, 16])),
        n_layer=draw(st.integers(1, 2)),
        n_head=n_head,
        # attn_type 3 adds a learned [n_head, d_head] position embedding to the d_model-wide layer input
        d_head=d_model // n_head if attn_type == 3 else draw(st.integers(2, 6)),
        d_inner=draw(st.integers(4, 24)),
        mem_len=draw(st.integers(min_mem_len, min_mem_len + 4)),
        tgt_len=draw(st.integers(1, 6)),
        same_length=draw(st.booleans()),
        clamp_len=draw(st.sampled_from([-1, 1, 2, 4])),
        attn_type=attn_type,
        pre_lnorm=draw(st.booleans()),
        untie_r=draw(st.booleans()),
        proj_share_all_but_first=draw(st.booleans()),
        tie_weight=draw(st.booleans()),
        dropout=0.0,
        pad_token_id=PAD,
        eos_token_id=None,
        num_labels=3,
    )
    values.update(fixed)
    return values


def build(model_class, values, seed):
    """A model of config `values` with large random weights (std about 0.3 on top of the initialisation): peaked,
    position-sensitive distributions, so that a wrong memory or mask shows."""
    torch.manual_seed(seed)
    model = model_class(TransfoXLConfig(**values)).eval()
    return perturbed(model)


def token_ids(draw, values, batch, length):
    return torch.tensor(draw(st.lists(st.lists(st.integers(1, values["vocab_size"] - 1), min_size=length,
                                                   max_size=length), min_size=batch, max_size=batch)))  # fmt: skip


seeds = st.integers(0, 2**16)


# Segments through `mems` see exactly what one pass sees while mem_len covers the sequence (same_length masks
# nothing then). With absolute positions (attn_type 2 and 3) a token's position counts back from the end of its
# segment, so a layer's memory computed in an earlier segment holds other positions than one pass would: there
# only a one-layer model's last segment is defined to agree (its memory is the embeddings, positions re-added).
@given(data=st.data(), seed=seeds)
def test_segments_through_mems_equal_one_pass(data, seed):
    length = data.draw(st.integers(2, 9), label="length")
    config = data.draw(configs(min_mem_len=length), label="config")
    absolute = config["attn_type"] in (2, 3)
    if absolute:
        config["n_layer"] = 1
    model = build(TransfoXLLMHeadModel, config, seed)
    ids = token_ids(data.draw, config, data.draw(st.integers(1, 2), label="batch"), length)
    cuts = sorted(data.draw(st.sets(st.integers(1, length - 1), min_size=1, max_size=3), label="cuts"))
    with torch.no_grad():
        whole = model(ids).logits
        pieces, mems = [], None
        for start, end in zip([0, *cuts], [*cuts, length]):
            out = model(ids[:, start:end], mems=mems)
            pieces.append(out.logits)
            mems = out.mems
    compared = slice(cuts[-1], length) if absolute else slice(0, length)
    torch.testing.assert_close(torch.cat(pieces, 1)[:, compared], whole[:, compared], atol=ATOL, rtol=0)


@given(data=st.data(), seed=seeds)
def test_loss_is_the_mean_of_losses_over_real_labels(data, seed):
    config = data.draw(configs(), label="config")
    model = build(TransfoXLLMHeadModel, config, seed)
    batch, length = data.draw(st.integers(1, 3), label="batch"), data.draw(st.integers(2, 7), label="length")
    ids = token_ids(data.draw, config, batch, length)
    ignored = torch.tensor(data.draw(st.lists(st.booleans(), min_size=batch * length, max_size=batch * length),
                                     label="ignored")).view(batch, length)  # fmt: skip
    labels = ids.masked_fill(ignored, -100)
    with torch.no_grad():
        out = model(ids, labels=labels)
        log_probs = model(ids).logits
    real = labels[:, 1:] != -100
    assert out.losses.shape == (batch, length - 1) and (out.losses[~real] == 0).all()
    # Position t predicts labels[:, t + 1]: each loss is that label's negative log-probability.
    expected = -log_probs[:, :-1].gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0]
    torch.testing.assert_close(out.losses[real], expected[real], atol=ATOL, rtol=0)
    mean = out.losses[real].mean() if real.any() else torch.tensor(0.0)
    torch.testing.assert_close(out.loss, mean, atol=ATOL, rtol=0)
    with torch.no_grad():
        summed = model(ids, labels=labels, num_items_in_batch=7).loss
    torch.testing.assert_close(summed, out.losses.sum() / 7, atol=ATOL, rtol=0)


def shared_parameters(model):
    """The names of each parameter that more than one name reaches (tied weights), as sorted tuples."""
    names = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return sorted(tuple(sorted(group)) for group in names.values() if len(group) > 1)


# A save / load round trip must restore the state exactly: the config, every tensor of the state dict bit for bit
# (dtype, shape, values) and which parameters are tied. The outputs then agree to rounding, not bit for bit: the
# loaded weights are views into the memory-mapped safetensors file, at 8-byte aligned addresses where fresh tensors
# are 64-byte aligned, and BLAS may take other kernels for other alignments, which sum in another order (on AMD EPYC
# CPUs logits and mems then differ in their last bits). ATOL is 10x the largest fp32 error against fp64 over these
# examples (5e-7, logits up to 21 in size), two summation orders differing by at most two such errors.
@given(data=st.data(), seed=seeds, head=st.sampled_from([TransfoXLLMHeadModel, TransfoXLForSequenceClassification]))
def test_save_and_load_round_trip_restores_the_state_bit_for_bit(data, seed, head):
    config = data.draw(configs(), label="config")
    model = build(head, config, seed)
    ids = token_ids(data.draw, config, 2, data.draw(st.integers(1, 6), label="length"))
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        loaded = head.from_pretrained(folder).eval()
        saved, reloaded = model.config.to_dict(), loaded.config.to_dict()
        assert {**reloaded, "_name_or_path": ""} == {**saved, "_name_or_path": ""}
        state, restored = model.state_dict(), loaded.state_dict()
        assert state.keys() == restored.keys()
        for name, tensor in state.items():
            assert restored[name].dtype == tensor.dtype and torch.equal(restored[name], tensor), name
        assert shared_parameters(loaded) == shared_parameters(model)
        with torch.no_grad():
            expected, actual = model(ids), loaded(ids)
    torch.testing.assert_close(actual.logits, expected.logits, atol=ATOL, rtol=0)
    assert (actual.mems is None) == (expected.mems is None)  # mem_len 0: no memory
    torch.testing.assert_close(actual.mems or (), expected.mems or (), atol=ATOL, rtol=0)


# Cached generation feeds one token per step against the memory; recomputation reruns the whole text. They agree
# while mem_len covers prompt and continuation, except that with absolute positions (attn_type 2 and 3) a memory
# layer above the first holds positions of an earlier step (see test_segments_through_mems_equal_one_pass).
@given(data=st.data(), seed=seeds)
def test_cached_greedy_generation_equals_recomputation(data, seed):
    length, new_tokens = data.draw(st.integers(1, 5), label="length"), data.draw(st.integers(1, 5), label="new")
    config = data.draw(configs(min_mem_len=length + new_tokens), label="config")
    if config["attn_type"] in (2, 3):
        config["n_layer"] = 1
    model = build(TransfoXLLMHeadModel, config, seed)
    ids = token_ids(data.draw, config, data.draw(st.integers(1, 2), label="batch"), length)
    settings = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                    return_dict_in_generate=True, output_logits=True)  # fmt: skip
    cached, recomputed = model.generate(ids, **settings), model.generate(ids, use_cache=False, **settings)
    assert_greedy_decodings_agree(cached.sequences, cached.logits, recomputed.sequences, recomputed.logits, ATOL)


# Padding is masked out as keys, and every position scheme measures from the end of the segment or between tokens,
# so left padding changes nothing for the real tokens, except under same_length, whose window of keys counts the
# padding positions too.
@given(data=st.data(), seed=seeds, head=st.sampled_from([TransfoXLLMHeadModel, TransfoXLForSequenceClassification]))
def test_each_row_of_a_left_padded_batch_gives_what_it_gives_alone(data, seed, head):
    config = data.draw(configs(same_length=False), label="config")
    model = build(head, config, seed)
    lengths = data.draw(st.lists(st.integers(1, 6), min_size=2, max_size=3), label="lengths")
    rows = [token_ids(data.draw, config, 1, n) for n in lengths]
    longest = max(lengths)
    batch = torch.cat([torch.cat([torch.full((1, longest - n), PAD), row], 1) for n, row in zip(lengths, rows)])
    mask = torch.cat([torch.cat([torch.zeros(1, longest - n), torch.ones(1, n)], 1) for n in lengths]).long()
    with torch.no_grad():
        together = model(batch, attention_mask=mask).logits
        for i, (n, row) in enumerate(zip(lengths, rows)):
            alone = model(row).logits[0]
            actual = together[i, longest - n :] if head is TransfoXLLMHeadModel else together[i]
            torch.testing.assert_close(actual, alone, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Regressions: failing examples the properties found, kept as plain tests
# ---------------------------------------------------------------------------------------------------------------

MINIMAL = dict(
    vocab_size=12, cutoffs=[], div_val=1, d_model=8, d_embed=8, n_layer=1, n_head=1, d_head=2, d_inner=4,
    tgt_len=1, same_length=False, clamp_len=-1, pre_lnorm=False, untie_r=False, proj_share_all_but_first=False,
    tie_weight=False, dropout=0.0, pad_token_id=PAD, eos_token_id=None,
)  # fmt: skip


def test_absolute_positions_are_not_remembered_with_the_memory():
    """attn_type 2 stored layer 0's input with its segment's positions in the memory and then added the next
    segment's on top: the second token of [1, 1] fed in two segments differed from one pass by 0.1."""
    model = build(TransfoXLLMHeadModel, dict(MINIMAL, attn_type=2, mem_len=2), seed=0)
    ids = torch.tensor([[1, 1]])
    with torch.no_grad():
        whole = model(ids).logits
        first = model(ids[:, :1])
        second = model(ids[:, 1:], mems=first.mems).logits
    torch.testing.assert_close(second[:, 0], whole[:, 1], atol=ATOL, rtol=0)


def test_al_rfou_positions_older_than_the_table_share_its_first_row():
    """attn_type 3 crashed on a segment longer than its position table (tgt_len + ext_len + mem_len rows). Older
    positions now share the first row, as the memory's already did: the same as a table extended with that row."""
    values = dict(MINIMAL, attn_type=3, n_head=2, d_head=4, mem_len=0, tgt_len=2)
    short = build(TransfoXLLMHeadModel, values, seed=0)
    extended = TransfoXLLMHeadModel(TransfoXLConfig(**dict(values, tgt_len=3))).eval()
    state = short.state_dict()
    table = state["transformer.layers.0.r_emb"]
    state["transformer.layers.0.r_emb"] = torch.cat([table[:1], table])
    extended.load_state_dict(state)
    ids = torch.tensor([[1, 5, 3]])
    with torch.no_grad():
        torch.testing.assert_close(short(ids).logits, extended(ids).logits, atol=ATOL, rtol=0)
