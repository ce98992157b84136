"""XLNet generate() over the memory cache: transformers' tokens, bounded steps, reused projections, beams."""

import pytest
import torch
import transformers

import transformers_xl.modeling.modeling_xlnet as ours
from transformers_xl.modeling.configuration_xlnet import XLNetConfig
from transformers_xl.modeling.memory_cache import MemoryCache
from greedy_decoding import assert_beam_searches_agree
from weights import peaked, perturbed

VOCAB = 40
TINY = dict(vocab_size=VOCAB, d_model=32, n_head=4, d_inner=37, n_layer=2, dropout=0.0, pad_token_id=5)


def weight_pair(draw, **overrides):
    """transformers' XLNetLMHeadModel (TINY + `overrides`, its weights redrawn by `draw`) and ours with its weights."""
    kwargs = {**TINY, **overrides}
    torch.manual_seed(0)
    reference = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**kwargs)).eval()
    draw(reference)
    model = ours.XLNetLMHeadModel(XLNetConfig(**kwargs)).eval()
    model.load_state_dict(reference.state_dict())
    return reference, model


def scrambled_pair(**overrides):
    """transformers' XLNetLMHeadModel and ours with the same large random weights (peaked distributions)."""
    return weight_pair(perturbed, **overrides)


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


@pytest.mark.parametrize("num_beams", [1, 2])
def test_dict_outputs_with_the_cache(num_beams):
    """transformers' test_{greedy,beam_search}_generate_dict_outputs_use_cache (run with `use_cache` given to the
    config: XLNet's has none, its memory is `use_mems_eval`): one score, logit row, attention and hidden-state tuple
    per step, shaped by our scheme (the prompt, then its last two tokens again, and the query stream's next position),
    and a cache of each layer's keys and values for what transformers' memory holds, less its dummy token."""
    _, model = scrambled_pair(mem_len=6)
    out = model.generate(
        ids(2, 5), max_new_tokens=4, do_sample=False, num_beams=num_beams, pad_token_id=5, use_cache=True,
        return_dict_in_generate=True, output_scores=True, output_logits=True, output_attentions=True,
        output_hidden_states=True,
    )  # fmt: skip
    rows, heads, layers = 2 * num_beams, 4, 2
    assert out.sequences.shape == (2, 9)
    assert len(out.scores) == len(out.logits) == len(out.attentions) == len(out.hidden_states) == 4
    first_step = [tuple(tuple(probs.shape) for probs in layer) for layer in out.attentions[0]]
    assert first_step == [((rows, heads, 5, 5), (rows, heads, 1, 5))] * layers  # (content, query stream)
    assert [tuple(s.shape) for s in out.hidden_states[3]] == [(rows, 2, 32), (rows, 1, 32)] * (layers + 1)
    assert isinstance(out.cache, MemoryCache)
    for layer in out.cache.layers:
        assert layer.keys.shape == layer.values.shape == (rows, heads, 5, 8)  # transformers' 6, less the dummy


def test_trainers_use_cache_false_leaves_the_memory_on(tmp_path):
    """transformers' Trainer sets `config.use_cache` (False by default) on every model: XLNet's memory switch is
    `use_mems_eval`, which that neither changes nor, saved and loaded again, turns off."""
    config = XLNetConfig(**TINY)
    config.use_cache = False
    assert config.use_mems_eval is True
    config.save_pretrained(tmp_path)
    assert XLNetConfig.from_pretrained(tmp_path).use_mems_eval is True


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


def test_next_token_streams_attended_together_equal_apart():
    """Without masks, next-token prediction attends the content rows and the query row in one call (a padding mask,
    even one that masks nothing, keeps them apart): same logits, memory and per-stream probabilities."""
    _, model = scrambled_pair(mem_len=16)
    prompt = ids(2, 3)
    with torch.no_grad():
        mems = model(ids(2, 6, seed=2), use_mems=True).mems
        together, apart = (
            model(prompt, mems=mems, predict_next_token=True, use_mems=True, output_attentions=True, **mask)
            for mask in ({}, {"attention_mask": torch.ones(2, 3)})
        )
    torch.testing.assert_close(together.logits, apart.logits, atol=1e-5, rtol=0)
    for new, old in zip(together.mems, apart.mems):
        torch.testing.assert_close(new, old, atol=1e-5, rtol=0)
    for layer, (new, old) in enumerate(zip(together.attentions, apart.attentions)):
        assert len(new) == len(old) == 2
        for stream in range(2):  # (the content stream of the last layer, which nothing reads, in both or neither)
            if old[stream] is None:
                assert new[stream] is None
            else:
                torch.testing.assert_close(new[stream], old[stream], atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------------------
# Every memory configuration (issue 12): mem_len x reuse_len x use_mems, against transformers on the same weights
# ---------------------------------------------------------------------------------------------------------------


def large_weight_pair(**overrides):
    """transformers' XLNetLMHeadModel and ours with every parameter drawn from N(0, 0.2) (layer-norm weights from
    1 + N(0, 0.1)): peaked distributions, so that a wrong memory changes the tokens, not only the logits."""
    return weight_pair(peaked, **{"d_model": 16, "n_head": 2, "d_inner": 32, **overrides})


def assert_same_generation(model, reference, prompt, **settings):
    """Same tokens, and the same logits at every step (tokens alone can agree by chance)."""
    settings = dict(settings, return_dict_in_generate=True, output_logits=True)
    torch.manual_seed(3)
    actual = model.generate(prompt, **settings)
    torch.manual_seed(3)
    expected = reference.generate(prompt, **settings)
    assert torch.equal(actual.sequences, expected.sequences)
    for step, (ours_logits, their_logits) in enumerate(zip(actual.logits, expected.logits)):
        torch.testing.assert_close(ours_logits, their_logits, atol=1e-4, rtol=0, msg=f"step {step}")


STRATEGIES = {
    "greedy": dict(do_sample=False),
    "sampling": dict(do_sample=True, top_k=0, num_return_sequences=2),
    "beams": dict(do_sample=False, num_beams=3, num_return_sequences=2),
}
PROMPT_LENGTH, NEW_TOKENS = 5, 6


# mem_len: none, shorter than the prompt, between the prompt and prompt + new tokens, longer than both;
# reuse_len: none, shorter and longer than the prompt.
@pytest.mark.parametrize("use_mems", [True, False])
@pytest.mark.parametrize("reuse_len", [None, 3, 7])
@pytest.mark.parametrize("mem_len", [None, 3, 8, 20])
def test_every_memory_configuration_matches_transformers(mem_len, reuse_len, use_mems):
    reference, model = large_weight_pair(mem_len=mem_len, reuse_len=reuse_len)
    prompt = ids(2, PROMPT_LENGTH, seed=4)
    prompt[1, :2] = TINY["pad_token_id"]  # left padding (transformers' XLNet generation ignores the mask: so do we)
    mask = (prompt != TINY["pad_token_id"]).long()
    for settings in STRATEGIES.values():
        assert_same_generation(
            model, reference, prompt, attention_mask=mask, max_new_tokens=NEW_TOKENS, use_mems=use_mems, **settings
        )


# Boundaries: one- and two-token prompts, a memory of one or two positions, reuse_len 1, 2 and equal to the prompt.
@pytest.mark.parametrize(
    "prompt_length, mem_len, reuse_len",
    [(1, None, 2), (1, 2, 1), (2, 1, None), (2, 2, 2), (2, None, 1), (4, 2, 4), (4, None, 4), (4, 5, 5)],
)
def test_memory_boundaries_match_transformers(prompt_length, mem_len, reuse_len):
    reference, model = large_weight_pair(mem_len=mem_len, reuse_len=reuse_len)
    assert_same_generation(model, reference, ids(2, prompt_length, seed=6), max_new_tokens=5, do_sample=False)


def test_issue_12_example_reuse_len_shorter_than_the_prompt():
    """The reported case: with reuse_len 5 < a 6-token prompt the second step's logits were off by about 0.9."""
    kwargs = dict(vocab_size=120, d_model=32, n_layer=3, n_head=4, d_inner=64, mem_len=6, reuse_len=5, dropout=0.0)
    reference, model = large_weight_pair(**kwargs)
    prompt = torch.randint(0, 120, (1, 6), generator=torch.Generator().manual_seed(1))
    assert_same_generation(model, reference, prompt, max_new_tokens=8, do_sample=False, pad_token_id=5)


@pytest.mark.parametrize("reuse_len", [None, 2, 3])
def test_user_mems_without_use_mems_match_transformers(reuse_len):
    """With `use_mems=False` transformers attends to the same given memory (less its newest two positions) at
    every step, before the last two tokens."""
    reference, model = large_weight_pair(mem_len=6, reuse_len=reuse_len)
    with torch.no_grad():
        mems = model(ids(2, 7, seed=2), use_mems=True).mems
    assert_same_generation(model, reference, ids(2, 4), mems=mems, use_mems=False, max_new_tokens=5, do_sample=False)


# ---------------------------------------------------------------------------------------------------------------
# Beam-search hardening (issue 48): mem_len x reuse_len x bi_data x use_mems x beams x batch, up to exact ties
# ---------------------------------------------------------------------------------------------------------------

HARDENING = dict(vocab_size=50, d_model=32, n_head=4, d_inner=64, n_layer=3, dropout=0.0, pad_token_id=5)


def hardening_pair(**overrides):
    """transformers' XLNetLMHeadModel and ours, HARDENING + `overrides`, with the same perturbed weights."""
    torch.manual_seed(0)
    reference = perturbed(transformers.XLNetLMHeadModel(transformers.XLNetConfig(**HARDENING, **overrides)).eval())
    model = ours.XLNetLMHeadModel(XLNetConfig(**HARDENING, **overrides)).eval()
    model.load_state_dict(reference.state_dict())
    return reference, model


def test_issue_48_beams_tied_in_exact_arithmetic():
    """The reported case: from the 14th token ours kept `30 30 30 26 30 ...`, transformers `30 30 26 30 30 ...`.
    With mem_len 2 a step sees its last two tokens only, so both are the same transitions in another order: one
    score (-0.76269 each). Three beams in the same state got bitwise equal scores in transformers, and scores 1 ulp
    apart in ours (this CPU's GEMM rounds the last rows of a product differently), so a different one was kept."""
    reference, model = hardening_pair(mem_len=2, reuse_len=9, bi_data=False)
    prompt = torch.randint(6, 50, (1, 6), generator=torch.Generator().manual_seed(3))
    settings = dict(num_beams=3, use_mems=True, pad_token_id=5)
    assert_beam_searches_agree(model, reference, prompt, 12, atol=1e-4, **settings)


@pytest.mark.parametrize(
    "mem_len, reuse_len, bi_data, use_mems, num_beams, batch",
    [
        (2, 9, False, True, 3, 1),
        (2, 9, False, False, 3, 2),
        (None, None, False, True, 2, 2),
        (1, None, False, True, 4, 1),
        (2, 3, True, True, 2, 1),
        (6, 9, True, False, 3, 2),
        (6, 2, False, True, 3, 2),
        (16, None, True, True, 2, 2),
    ],
)
def test_beam_hardening_matches_transformers_up_to_ties(mem_len, reuse_len, bi_data, use_mems, num_beams, batch):
    reference, model = hardening_pair(mem_len=mem_len, reuse_len=reuse_len, bi_data=bi_data)
    prompt = torch.randint(6, 50, (batch, 6), generator=torch.Generator().manual_seed(3))
    settings = dict(num_beams=num_beams, num_return_sequences=2, use_mems=use_mems, pad_token_id=5)
    assert_beam_searches_agree(model, reference, prompt, 10, atol=1e-4, **settings)


def test_beam_comparison_fails_on_a_numerical_difference():
    """The tie check is no blanket: a model off by a little (one layer norm's bias) fails it."""
    reference, model = hardening_pair(mem_len=2, reuse_len=9, bi_data=False)
    with torch.no_grad():
        model.transformer.layer[1].ff.layer_norm.bias.add_(0.05)
    prompt = torch.randint(6, 50, (1, 6), generator=torch.Generator().manual_seed(3))
    with pytest.raises(AssertionError):
        assert_beam_searches_agree(model, reference, prompt, 12, atol=1e-4, num_beams=3, use_mems=True, pad_token_id=5)
