"""XLNet generate() over the memory cache: transformers' tokens, bounded steps, reused projections, beams."""

import pytest
import torch
import transformers

import transformers_xl.modeling.modeling_xlnet as ours
from transformers_xl.modeling.configuration_xlnet import XLNetConfig
from transformers_xl.modeling.memory_cache import MemoryCache

VOCAB = 40
TINY = dict(vocab_size=VOCAB, d_model=32, n_head=4, d_inner=37, n_layer=2, dropout=0.0, pad_token_id=5)


def scrambled_pair(**overrides):
    """transformers' XLNetLMHeadModel and ours with the same large random weights (peaked distributions)."""
    kwargs = {**TINY, **overrides}
    torch.manual_seed(0)
    reference = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**kwargs)).eval()
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(torch.randn_like(param) * 0.3)
    model = ours.XLNetLMHeadModel(XLNetConfig(**kwargs)).eval()
    model.load_state_dict(reference.state_dict())
    return reference, model


def ids(batch, length, seed=1):
    return torch.randint(6, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mem_len", [6, None])
def test_greedy_and_beams_match_transformers_and_steps_stay_small(mem_len):
    reference, model = scrambled_pair(mem_len=mem_len)
    prompt = ids(2, 5)
    lengths = []
    forward = model.forward
    model.forward = lambda *a, **k: lengths.append(k["input_ids"].shape[1]) or forward(*a, **k)
    settings = dict(max_new_tokens=10, do_sample=False, pad_token_id=5)
    actual = model.generate(prompt, **settings)
    assert torch.equal(actual, reference.generate(prompt, **settings))
    assert len(set(actual[0, 5:].tolist())) > 1
    assert lengths == [5] + [2] * 9  # the prompt, then the 2 recomputed tokens per step (no dummy token)
    beams = dict(settings, num_beams=3, num_return_sequences=2)
    assert torch.equal(model.generate(prompt, **beams), reference.generate(prompt, **beams))


def test_sampling_several_sequences_matches_transformers():
    reference, model = scrambled_pair(mem_len=8)
    settings = dict(max_new_tokens=6, do_sample=True, top_p=0.9, num_return_sequences=3, pad_token_id=5)
    torch.manual_seed(5)
    expected = reference.generate(ids(2, 4), **settings)
    torch.manual_seed(5)
    assert torch.equal(model.generate(ids(2, 4), **settings), expected)


def test_cache_keeps_keys_aligned_with_the_memory():
    _, model = scrambled_pair(mem_len=7)
    out = model.generate(ids(2, 5), max_new_tokens=9, do_sample=False, pad_token_id=5, return_dict_in_generate=True)
    cache = out.cache
    assert isinstance(cache, MemoryCache)
    for i, layer in enumerate(cache.layers):
        assert layer.hidden.shape == (2, 6, 32)  # mem_len - 1: transformers' memory holds its dummy token too
        keys, values = model.transformer.layer[i].rel_attn.project_keys_values(layer.hidden)
        torch.testing.assert_close(layer.keys, keys)
        torch.testing.assert_close(layer.values, values)


def test_user_mems_start_the_cache_and_are_expanded_for_beams():
    reference, model = scrambled_pair(mem_len=16)
    with torch.no_grad():
        mems = model(ids(2, 6, seed=2), use_mems=True).mems
    prompt = ids(2, 4)
    settings = dict(max_new_tokens=5, do_sample=False, pad_token_id=5)
    greedy = model.generate(prompt, mems=mems, **settings)
    assert torch.equal(greedy, reference.generate(prompt, mems=mems, **settings))
    # transformers does not expand a mems tuple for beams; give it the expanded one to compare.
    expanded = tuple(mem.repeat_interleave(2, dim=1) for mem in mems)
    beams = dict(settings, num_beams=2)
    assert torch.equal(model.generate(prompt, mems=mems, **beams), reference.generate(prompt, mems=expanded, **beams))


# transformers' "uni" attention crashes with a perm_mask on batches larger than 1: compare on one row there.
@pytest.mark.parametrize("attn_type, batch", [("bi", 2), ("uni", 1)])
def test_predict_next_token_equals_transformers_dummy_token_scheme(attn_type, batch):
    reference, model = scrambled_pair(mem_len=16, attn_type=attn_type)
    prompt = ids(batch, 5)
    with torch.no_grad():
        mems = model(ids(batch, 6, seed=2), use_mems=True).mems
        dummy = torch.cat([prompt, torch.zeros(batch, 1, dtype=torch.long)], 1)
        perm_mask = torch.zeros(batch, 6, 6)
        perm_mask[:, :, -1] = 1
        target_mapping = torch.zeros(batch, 1, 6)
        target_mapping[:, 0, -1] = 1
        expected = reference(dummy, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping).logits
        actual = model(prompt, mems=mems, predict_next_token=True).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="expected no `perm_mask`, `target_mapping` or `token_type_ids`"):
        model(dummy, perm_mask=perm_mask, target_mapping=target_mapping, predict_next_token=True)
