"""generate() with the Transformer-XL memory cache: every decoding strategy, exactness, bounded memory."""

import gc

import pytest
import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers_xl.modeling.memory_cache import MemoryCache
from weights import perturbed

PAD = 0


def scrambled_lm(mem_len=64, seed=0, **overrides):
    """A tiny LM with large random weights (peaked, position-sensitive distributions)."""
    values = dict(
        vocab_size=90, cutoffs=[20, 50], d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=48, div_val=2,
        n_layer=2, mem_len=mem_len, clamp_len=-1, same_length=False, dropout=0.0, pad_token_id=PAD, eos_token_id=None,
    )  # fmt: skip
    values.update(overrides)
    torch.manual_seed(seed)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**values)).eval()
    return perturbed(model)


def prompt(batch=2, length=6, seed=1):
    return torch.randint(2, 90, (batch, length), generator=torch.Generator().manual_seed(seed))


def generate(model, ids, **kwargs):
    kwargs.setdefault("max_new_tokens", 10)
    kwargs.setdefault("do_sample", False)
    return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)


@pytest.mark.parametrize("pre_lnorm, clamp_len", [(False, -1), (True, 3)])
def test_cached_greedy_equals_recomputing_every_step(pre_lnorm, clamp_len):
    model = scrambled_lm(pre_lnorm=pre_lnorm, clamp_len=clamp_len)
    ids = prompt()
    cached = generate(model, ids, max_new_tokens=12)
    recomputed = generate(model, ids, max_new_tokens=12, use_cache=False)
    assert torch.equal(cached, recomputed)
    assert len(set(cached[0, 6:].tolist())) > 1  # not a degenerate repetition


def test_greedy_matches_a_manual_loop_with_bounded_memory():
    """Past mem_len, the memory is the Transformer-XL approximation: the same as feeding tokens one by one."""
    model = scrambled_lm(mem_len=4)
    ids = prompt(length=6)
    out = generate(model, ids, max_new_tokens=8)
    with torch.no_grad():
        step = model(ids)
        tokens = ids
        for _ in range(8):
            next_token = step.logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, next_token], 1)
            step = model(next_token, mems=step.mems)
    assert torch.equal(out, tokens)


def test_memory_stays_bounded_and_keys_are_reused():
    model = scrambled_lm(mem_len=5)
    out = generate(model, prompt(), max_new_tokens=20, return_dict_in_generate=True)
    cache = out.cache
    assert isinstance(cache, MemoryCache) and cache.get_seq_length() == 6 + 19
    for layer in cache.layers:
        assert layer.hidden.shape == (2, 5, 32)
        assert layer.keys.shape == layer.values.shape == (2, 4, 5, 8)
    assert all(mem.shape == (5, 2, 32) for mem in cache.mems)


def test_stored_keys_equal_fresh_projections():
    model = scrambled_lm(mem_len=8, pre_lnorm=True)
    cache = MemoryCache(model.config.n_layer, model.config.mem_len)
    with torch.no_grad():
        model(prompt(length=5), cache=cache)
        model(prompt(length=3, seed=2), cache=cache)
        for i, layer in enumerate(cache.layers):
            keys, values = model.transformer.layers[i].dec_attn.project_keys_values(layer.hidden)
            torch.testing.assert_close(layer.keys, keys)
            torch.testing.assert_close(layer.values, values)


def test_beam_search_with_cache_equals_beam_search_without():
    model = scrambled_lm()
    ids = prompt()
    cached = generate(model, ids, num_beams=3, max_new_tokens=8)
    recomputed = generate(model, ids, num_beams=3, max_new_tokens=8, use_cache=False)
    assert torch.equal(cached, recomputed)
    many = generate(model, ids, num_beams=3, num_return_sequences=2, max_new_tokens=8)
    assert many.shape == (4, 14)


def test_sampling_with_cache_equals_sampling_without():
    model = scrambled_lm()
    ids = prompt()
    settings = dict(do_sample=True, temperature=0.8, top_k=10, top_p=0.9, num_return_sequences=3, max_new_tokens=8)
    torch.manual_seed(7)
    cached = generate(model, ids, **settings)
    torch.manual_seed(7)
    recomputed = generate(model, ids, use_cache=False, **settings)
    assert cached.shape == (6, 14) and torch.equal(cached, recomputed)


def test_num_return_sequences_gives_each_sequence_its_own_memory():
    model = scrambled_lm()
    torch.manual_seed(0)
    out = generate(model, prompt(), do_sample=True, num_return_sequences=3, return_dict_in_generate=True)
    cache = out.cache
    assert cache.batch_size == 6
    for row in range(6):  # each row's memory is exactly the inputs of its own sequence
        with torch.no_grad():
            alone = model(out.sequences[row : row + 1, :-1]).mems
        torch.testing.assert_close(cache.mems[1][:, row], alone[1][:, 0], atol=1e-5, rtol=1e-5)


def test_left_padded_batch_matches_unpadded_prompts():
    model = scrambled_lm()
    short, long = prompt(1, 4, seed=3), prompt(1, 7, seed=4)
    batch = torch.cat([torch.cat([torch.full((1, 3), PAD), short], 1), long])
    mask = (batch != PAD).long()
    mask[1] = 1
    out = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False)
    alone_short = generate(model, short, max_new_tokens=6)
    alone_long = generate(model, long, max_new_tokens=6)
    assert torch.equal(out[0, 3:], alone_short[0]) and torch.equal(out[1], alone_long[0])


def test_generation_continues_from_user_mems_and_expands_them_for_beams():
    model = scrambled_lm()
    ids = prompt(length=9)
    with torch.no_grad():
        mems = model(ids[:, :5]).mems
    continued = model.generate(ids[:, 5:], mems=mems, max_new_tokens=6, do_sample=False)
    whole = generate(model, ids, max_new_tokens=6)
    assert torch.equal(continued[:, 4:], whole[:, 9:])
    beams = model.generate(ids[:, 5:], mems=mems, num_beams=2, max_new_tokens=6, do_sample=False)
    assert torch.equal(beams[:, 4:], generate(model, ids, num_beams=2, max_new_tokens=6)[:, 9:])


def test_repetition_penalty_and_stopping_criteria():
    model = scrambled_lm()
    ids = prompt()
    plain = generate(model, ids, max_new_tokens=12)
    penalised = generate(model, ids, max_new_tokens=12, repetition_penalty=5.0)
    assert not torch.equal(plain, penalised)
    penalised_recomputed = generate(model, ids, max_new_tokens=12, repetition_penalty=5.0, use_cache=False)
    assert torch.equal(penalised, penalised_recomputed)

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 9, dtype=torch.bool)

    stopped = generate(model, ids, max_new_tokens=12, stopping_criteria=StoppingCriteriaList([StopAfter()]))
    assert stopped.shape[1] == 9


def test_eos_ends_sequences_and_pads_them():
    model = scrambled_lm()
    ids = prompt()
    free = generate(model, ids, max_new_tokens=10)
    eos = int(free[0, 6])  # make the first generated token of row 0 the end of sequence
    out = generate(model, ids, max_new_tokens=10, generation_config=GenerationConfig(eos_token_id=eos, pad_token_id=PAD))
    assert out[0, 6] == eos and (out[0, 7:] == PAD).all()


def test_crop_rolls_back_exactly_until_tokens_are_evicted():
    model = scrambled_lm(mem_len=8)
    ids = prompt(length=6)
    cache = MemoryCache(model.config.n_layer, model.config.mem_len)
    with torch.no_grad():
        model(ids[:, :4], cache=cache)
        before = [layer.hidden.clone() for layer in cache.layers]
        model(ids[:, 4:], cache=cache)
        assert cache.is_croppable and cache.get_seq_length() == 6
        cache.crop(-2)
        assert cache.get_seq_length() == 4
        for layer, hidden in zip(cache.layers, before):
            torch.testing.assert_close(layer.hidden, hidden)
            assert layer.keys.shape[2] == 4
        model(prompt(length=7, seed=5), cache=cache)
    assert not cache.is_croppable  # 11 tokens seen, 8 kept
    with pytest.raises(ValueError, match="cannot remove 9 positions; the memory holds 8"):
        cache.crop(-9)


# ---------------------------------------------------------------------------------------------------------------
# What transformers' generation tests check once a config has `use_cache` (docs/models.md, "transformers' common
# tests"; they skip every cached test without it)
# ---------------------------------------------------------------------------------------------------------------


def test_config_use_cache_is_generates_default_and_is_saved(tmp_path):
    """True by default (the memory is a cache); False is kept through save/load (transformers v5 drops undeclared
    `use_cache` keys) and makes generate() recompute every step and return no cache, as `use_cache=False` does."""
    assert TransfoXLConfig().use_cache is True
    model = scrambled_lm(use_cache=False)
    model.config.save_pretrained(tmp_path)
    assert TransfoXLConfig.from_pretrained(tmp_path).use_cache is False
    ids = prompt()
    recomputed = generate(model, ids, max_new_tokens=4, return_dict_in_generate=True)
    assert recomputed.cache is None
    cached = generate(model, ids, max_new_tokens=4, return_dict_in_generate=True, use_cache=True)
    assert isinstance(cached.cache, MemoryCache) and torch.equal(recomputed.sequences, cached.sequences)


def test_trainers_use_cache_false_leaves_generation_cached(tmp_path):
    """transformers' Trainer sets `config.use_cache` (False by default) on every model it trains: as for
    transformers' own models, the saved generation config keeps generate() on the cache."""
    model = scrambled_lm()
    model.config.use_cache = False
    model.save_pretrained(tmp_path)
    loaded = TransfoXLLMHeadModel.from_pretrained(tmp_path)
    assert loaded.config.use_cache is False and loaded.generation_config.use_cache is True
    assert isinstance(generate(loaded, prompt(), max_new_tokens=2, return_dict_in_generate=True).cache, MemoryCache)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_dict_outputs_with_the_cache(num_beams):
    """transformers' test_{greedy,beam_search}_generate_dict_outputs_use_cache: one score, logit row, attention and
    hidden-state tuple per step; the cache holds each layer's keys and values of the newest mem_len positions."""
    model = scrambled_lm(mem_len=8)
    out = generate(
        model, prompt(), max_new_tokens=4, num_beams=num_beams, use_cache=True, return_dict_in_generate=True,
        output_scores=True, output_logits=True, output_attentions=True, output_hidden_states=True,
    )  # fmt: skip
    rows, heads, layers = 2 * num_beams, 4, 2
    assert out.sequences.shape == (2, 10)
    assert len(out.scores) == len(out.logits) == len(out.attentions) == len(out.hidden_states) == 4
    assert [a.shape for a in out.attentions[0]] == [(rows, heads, 6, 6)] * layers
    assert [a.shape for a in out.attentions[3]] == [(rows, heads, 1, 9)] * layers  # 8 remembered + the token
    assert [h.shape for h in out.hidden_states[3]] == [(rows, 1, 32)] * (layers + 1)
    assert out.cache.get_seq_length() == 9  # prompt + 3 tokens fed; the last one generated is not fed
    for layer in out.cache.layers:
        assert layer.keys.shape == layer.values.shape == (rows, heads, 8, 8)


def test_generation_continues_from_the_returned_cache():
    """transformers' test_generate_continue_from_past_key_values: 3 tokens, then 1 more from the returned cache,
    equal 4 tokens at once (left padding included)."""
    model = scrambled_lm()
    ids = prompt()
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    settings = dict(do_sample=False, use_cache=True, return_dict_in_generate=True, output_scores=True)
    whole = model.generate(ids, attention_mask=mask, max_new_tokens=4, **settings)
    first = model.generate(ids, attention_mask=mask, max_new_tokens=3, **settings)
    mask = torch.nn.functional.pad(mask, (0, 3), value=1)
    rest = model.generate(first.sequences, attention_mask=mask, cache=first.cache, max_new_tokens=1, **settings)
    assert torch.equal(rest.sequences, whole.sequences)
    torch.testing.assert_close(rest.scores[0], whole.scores[-1])
    for continued, at_once in zip(rest.cache.layers, whole.cache.layers):
        for name in ("hidden", "keys", "values"):
            torch.testing.assert_close(getattr(continued, name), getattr(at_once, name))


def test_assisted_decoding_dict_outputs_equal_greedys():
    """transformers' test_assisted_decoding_matches_greedy_search (an assistant accepting every draft, one accepting
    none) and test_prompt_lookup_decoding_matches_greedy_search: greedy's tokens, scores and per-step output shapes."""
    model = scrambled_lm()
    ids = prompt(batch=1)
    settings = dict(
        max_new_tokens=4, use_cache=True, return_dict_in_generate=True, output_scores=True, output_logits=True,
        output_attentions=True, output_hidden_states=True,
    )  # fmt: skip
    greedy = generate(model, ids, **settings)
    for assistant in (model, scrambled_lm(seed=7), None):
        if assistant is None:
            assisted = generate(model, ids, prompt_lookup_num_tokens=2, **settings)
        else:
            assistant.generation_config.num_assistant_tokens = 2
            assistant.generation_config.num_assistant_tokens_schedule = "constant"
            assisted = generate(model, ids, assistant_model=assistant, **settings)
        assert torch.equal(assisted.sequences, greedy.sequences)
        torch.testing.assert_close(torch.stack(assisted.scores), torch.stack(greedy.scores))
        for name in ("attentions", "hidden_states"):
            shapes = [[[t.shape for t in step] for step in getattr(out, name)] for out in (assisted, greedy)]
            assert shapes[0] == shapes[1]


# ---------------------------------------------------------------------------------------------------------------
# Text that outgrows mem_len (issue 12): generate() equals feeding the text token by token through `mems`
# ---------------------------------------------------------------------------------------------------------------

PROMPT_LENGTH, NEW_TOKENS = 6, 8
# shorter than the prompt, between the prompt and prompt + new tokens, longer than both
MEM_LENS = [3, 9, 20]


def left_padded_prompt():
    ids = prompt(2, PROMPT_LENGTH, seed=8)
    ids[1, :2] = PAD
    return ids, (ids != PAD).long()


@torch.no_grad()
def feed_token_by_token(model, ids, mask, choose):
    """What a user does with the legacy API: the prompt in one piece, then each chosen token alone, carrying the
    memory in `mems` and the whole history's padding in `attention_mask`. `choose(step, log_probs)` gives the next
    tokens [batch]. Returns the tokens and each step's log-probabilities."""
    out = model(ids, attention_mask=mask)
    steps = []
    for step in range(NEW_TOKENS):
        log_probs = out.logits[:, -1].float()
        steps.append(log_probs)
        next_tokens = choose(step, log_probs)[:, None]
        ids, mask = torch.cat([ids, next_tokens], 1), torch.cat([mask, torch.ones_like(next_tokens)], 1)
        out = model(next_tokens, mems=out.mems, attention_mask=mask)
    return ids, steps


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
@pytest.mark.parametrize("mem_len", MEM_LENS)
def test_greedy_equals_feeding_tokens_one_by_one(mem_len, attn_type):
    model = scrambled_lm(mem_len=mem_len, attn_type=attn_type)
    ids, mask = left_padded_prompt()
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
        output_logits=True,
    )  # fmt: skip
    expected, steps = feed_token_by_token(model, ids, mask, lambda step, log_probs: log_probs.argmax(-1))
    assert torch.equal(out.sequences, expected)
    for actual, reference in zip(out.logits, steps):
        torch.testing.assert_close(actual, reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("mem_len", MEM_LENS)
def test_sampling_equals_feeding_tokens_one_by_one(mem_len):
    model = scrambled_lm(mem_len=mem_len)
    ids, mask = left_padded_prompt()
    torch.manual_seed(11)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=0)
    torch.manual_seed(11)
    expected, _ = feed_token_by_token(
        model, ids, mask, lambda step, log_probs: torch.multinomial(log_probs.softmax(-1), 1)[:, 0]
    )
    assert torch.equal(out, expected)


@pytest.mark.parametrize("mem_len", MEM_LENS)
def test_beam_scores_equal_feeding_each_beam_one_by_one(mem_len):
    """Beam reordering under eviction: each returned beam's score (length_penalty 0: the sum of its tokens'
    log-probabilities) is what feeding that sequence token by token through `mems` gives."""
    model = scrambled_lm(mem_len=mem_len)
    ids, mask = left_padded_prompt()
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, num_beams=3, num_return_sequences=2, do_sample=False,
        length_penalty=0.0, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    beams = out.sequences
    rows = torch.arange(beams.shape[0]) // 2  # the prompt each returned sequence continues
    generated = beams[:, PROMPT_LENGTH:]
    fed, steps = feed_token_by_token(model, ids[rows], mask[rows], lambda step, log_probs: generated[:, step])
    assert torch.equal(fed, beams)
    scores = sum(log_probs.gather(1, generated[:, step : step + 1])[:, 0] for step, log_probs in enumerate(steps))
    torch.testing.assert_close(out.sequences_scores, scores, atol=1e-4, rtol=0)


def live_tensors() -> set[int]:
    gc.collect()
    return {id(o) for o in gc.get_objects() if isinstance(o, torch.Tensor)}


def test_a_bf16_model_holds_its_weights_once_while_decoding():
    """No hidden copies: once generate()'s output is gone, no tensor it made is alive (no fp16 or packed weight
    copies, no snapshots, no tables kept beside the weights), no module holds a tensor besides its parameters and
    buffers, and the cache held bf16 tensors only."""
    model = scrambled_lm(mem_len=8).to(torch.bfloat16)
    before = live_tensors()
    out = generate(model, prompt(), max_new_tokens=12, return_dict_in_generate=True)
    cached = [tensor for layer in out.cache.layers for tensor in (layer.hidden, layer.keys, layer.values)]
    assert all(tensor.dtype == torch.bfloat16 for tensor in cached)
    del out, cached
    assert not live_tensors() - before
    for name, module in model.named_modules():
        registered = set(module._parameters) | set(module._buffers)
        held = [key for key, value in vars(module).items() if torch.is_tensor(value) and key not in registered]
        assert not held, (name, held)
