"""The memory grows in place: decoding steps write only their new positions, and nothing the caller owns is
ever written."""

import pytest
import torch

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers_xl.modeling.configuration_xlnet import XLNetConfig
from transformers_xl.modeling.memory_cache import GrowingTensor, MemoryCache
from transformers_xl.modeling.modeling_xlnet import XLNetLMHeadModel


def appended_one_by_one(sequence, steps, keep=None):
    """Append `steps` random positions to `sequence`; -> (reference built with torch.cat, buffers used)."""
    reference, buffers = sequence.tensor.clone(), {sequence.buffer.data_ptr()}
    for step in range(steps):
        new = torch.randn(2, 1, 3, generator=torch.Generator().manual_seed(step))
        sequence.append(new)
        reference = torch.cat([reference, new], dim=1)
        if keep is not None:
            sequence.keep_last(keep)
            reference = reference[:, -keep:]
        buffers.add(sequence.buffer.data_ptr())
        assert torch.equal(sequence.tensor, reference)
    return buffers


def test_growing_memory_is_copied_a_logarithmic_number_of_times():
    sequence = GrowingTensor(torch.randn(2, 10, 3), axis=1)
    buffers = appended_one_by_one(sequence, 300)
    assert len(buffers) <= 7  # the caller's tensor, then room doubling: 11 -> 22 -> ... -> 352


def test_sliding_memory_stays_within_twice_its_length():
    sequence = GrowingTensor(torch.randn(2, 8, 3), axis=1)
    buffers = appended_one_by_one(sequence, 300, keep=8)
    assert sequence.buffer.shape[1] <= 2 * (8 + 1)
    assert len(buffers) <= 300 // 8 + 2  # one move per 8 or so steps, not one per step


def test_a_callers_tensor_is_never_written_and_earlier_views_stay_intact():
    owned = torch.randn(2, 4, 3)
    original = owned.clone()
    sequence = GrowingTensor(owned, axis=1)
    sequence.append(torch.ones(2, 1, 3))
    assert torch.equal(owned, original) and sequence.buffer.data_ptr() != owned.data_ptr()
    view, copy = sequence.tensor, sequence.tensor.clone()
    sequence.extended(torch.zeros(2, 2, 3))  # room after the view: written in place, the view is untouched
    assert torch.equal(view, copy)


def tiny_transfo_xl(mem_len=5):
    torch.manual_seed(0)
    config = TransfoXLConfig(
        vocab_size=50, cutoffs=[20], d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=24, n_layer=2,
        mem_len=mem_len, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return TransfoXLLMHeadModel(config).eval()


def tiny_xlnet(mem_len=None):
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=50, d_model=16, n_head=2, d_inner=24, n_layer=2, mem_len=mem_len, pad_token_id=0)
    return XLNetLMHeadModel(config).eval()


def test_user_mems_are_not_modified_by_forward_or_generate():
    ids = torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    for model, mem_kwargs in ((tiny_transfo_xl(), {}), (tiny_xlnet(mem_len=8), {"use_mems": True})):
        with torch.no_grad():
            mems = model(ids, **mem_kwargs).mems
            originals = [mem.clone() for mem in mems]
            model(ids[:, :3], mems=mems, **mem_kwargs)
            model.generate(ids[:, :2], mems=mems, max_new_tokens=4, do_sample=False, pad_token_id=0)
            model.generate(ids[:, :2], mems=mems, max_new_tokens=4, num_beams=2, do_sample=False, pad_token_id=0)
        for mem, original in zip(mems, originals):
            assert torch.equal(mem, original)


def test_mems_of_a_plain_forward_hold_no_spare_room():
    model = tiny_transfo_xl(mem_len=5)
    ids = torch.randint(1, 50, (2, 4))
    with torch.no_grad():
        mems = model(ids).mems
        mems = model(ids, mems=mems).mems
    positions = 4 + 4  # the memory and the segment, of which the last mem_len are kept
    assert all(mem.untyped_storage().nbytes() == positions * 2 * 16 * 4 for mem in mems)


def test_decoding_steps_write_into_the_same_buffers():
    model = tiny_transfo_xl(mem_len=1000)
    cache = MemoryCache(model.config.n_layer, model.config.mem_len)
    token = torch.randint(1, 50, (1, 1))
    with torch.no_grad():
        model(torch.randint(1, 50, (1, 40)), cache=cache)
        buffers = set()
        for _ in range(30):
            model(token, cache=cache)
            buffers.add(cache.layers[0].sequences["keys"].buffer.data_ptr())
    assert len(buffers) <= 2  # the copy of the prompt's keys, then in place (room for 80 positions)


def test_a_memory_made_under_inference_mode_continues_under_no_grad():
    model = tiny_transfo_xl(mem_len=100)
    cache = MemoryCache(model.config.n_layer, model.config.mem_len)
    with torch.inference_mode():
        for length in (10, 1, 1):
            model(torch.randint(1, 50, (1, length)), cache=cache)
    with torch.no_grad():
        model(torch.randint(1, 50, (1, 1)), cache=cache)
    assert cache.get_seq_length() == 13 and cache.layers[0].keys.shape[2] == 13


def test_a_memory_made_under_inference_mode_trains_like_one_made_under_no_grad():
    # Inference tensors cannot be saved for backward: the memory must be copied where it enters a training forward.
    ids = torch.randint(1, 50, (1, 3), generator=torch.Generator().manual_seed(0))
    for model, mem_kwargs in ((tiny_transfo_xl(), {}), (tiny_xlnet(mem_len=8), {"use_mems": True})):
        memories = {}
        for name, mode in (("inference", torch.inference_mode), ("no_grad", torch.no_grad)):
            with mode():
                mems = model(ids, **mem_kwargs).mems
                memories[name] = (mems, MemoryCache.from_mems(mems, 5))
        assert memories["inference"][0][0].is_inference()
        gradients = {}
        for name, (mems, cache) in memories.items():
            for memory in ({"mems": mems}, {"cache": cache}):
                model.zero_grad()
                model(ids, labels=ids, **memory, **mem_kwargs).loss.backward()
                gradients[name, *memory] = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        for memory in ("mems", "cache"):
            for a, b in zip(gradients["inference", memory], gradients["no_grad", memory], strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)


def stream_model(model_type):
    """An eval-mode language model and how a stream calls it through legacy `mems` (one memory per call)."""
    model = (tiny_transfo_xl(mem_len=6) if model_type == "transfo-xl" else tiny_xlnet(mem_len=6)).eval()
    with torch.no_grad():  # (weights far from the initial ones, which leave the logits nearly uniform)
        for parameter in model.parameters():
            parameter.normal_(0, 0.5)
    extra = {"use_mems": True} if model_type == "xlnet" else {}
    ids = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mems = model(ids, **extra).mems

    def segment(model=model):
        with torch.no_grad():
            return model(ids, mems=mems, **extra).logits

    return model, segment


def position_weight(model):
    """The first layer's projection of the relative encodings."""
    if isinstance(model, TransfoXLLMHeadModel):
        return model.transformer.layers[0].dec_attn.r_net.weight
    return model.transformer.layer[0].rel_attn.r.weight


def count_position_projections(model, monkeypatch):
    attentions = [m for m in model.modules() if hasattr(m, "project_positions")]
    calls = []
    for attention in attentions:
        project = attention.project_positions
        monkeypatch.setattr(attention, "project_positions", lambda *args, f=project: calls.append(1) or f(*args))
    return calls, len(attentions)


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
def test_a_model_keeps_no_position_keys_between_calls(model_type, monkeypatch):
    """Each call wraps its `mems` in a memory of its own, which holds its projected position keys: the model itself
    keeps no derived tensors, so every call projects them again (once per layer) and gives the same numbers."""
    model, segment = stream_model(model_type)
    calls, layers = count_position_projections(model, monkeypatch)
    first = segment()
    assert len(calls) == layers
    assert torch.equal(segment(), first) and len(calls) == 2 * layers


@pytest.mark.parametrize("model_type", ["transfo-xl", "xlnet"])
@pytest.mark.parametrize("change", ["data.copy_", "clamp_len"])
def test_kept_position_keys_follow_a_weight_written_through_data_and_the_config(model_type, change):
    """A weight written through `.data` (no version counter moves) or a changed clamp_len: the next call projects
    the positions again, and gives what a model built that way gives."""
    model, segment = stream_model(model_type)
    before = segment()
    if change == "data.copy_":
        weight = position_weight(model)
        weight.data.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)))
    else:
        model.config.clamp_len = 2
    expected = type(model)(model.config).eval()
    expected.load_state_dict(model.state_dict())
    after = segment()
    torch.testing.assert_close(after, segment(expected))
    assert not torch.allclose(after, before)


def test_a_training_segment_that_fills_the_memory_is_remembered_as_a_view_of_the_layer_inputs():
    # (a training step's peak held a copy of [memory; segment] per layer, of which the next step reads mem_len; with
    # gradients off the memory's keys are kept too, and the memory grows in place for decoding)
    ids = torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    for model, mem_kwargs in ((tiny_transfo_xl(mem_len=4), {}), (tiny_xlnet(mem_len=4), {"use_mems": True})):
        first = model(ids[:, :3], **mem_kwargs).mems
        out = model(ids, mems=first, output_hidden_states=True, **mem_kwargs)
        for mem, layer_input in zip(out.mems, out.hidden_states):  # (time-major mems)
            assert mem.untyped_storage().data_ptr() == layer_input.untyped_storage().data_ptr()
            assert torch.equal(mem.transpose(0, 1), layer_input[:, -4:]) and not mem.requires_grad
