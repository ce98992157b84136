"""The static memory cache (`generate(..., cache_implementation="static")`): the default cache's tokens and scores
with decoding steps of fixed shapes, compiled by generate() without graph breaks, recompilations or host syncs."""

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import CompileConfig, DynamicCache, StaticCache

from greedy_decoding import assert_greedy_decodings_agree
from host_syncs import HostSyncCounter
from test_generation_transfo_xl import PAD, prompt, scrambled_lm
from transformers_xl.modeling.memory_cache import MemoryCache
from transformers_xl.modeling.modeling_transfo_xl import StaticMemoryCache

MEM_LEN = 8
# The keys are summed in slot order, not in time order: rounding differs, and these scrambled weights (peaked,
# log-probabilities down to -150) amplify it to a few 1e-5, as they do between the default cache and recomputing
# every step (tests/test_generation_transfo_xl.py, 1e-4). Tokens must be equal.
TOLERANCE = 1e-4


def generate_both(model, ids, mask=None, seed=None, **settings):
    """generate() with the default and with the static cache (same seed for sampling) -> the two outputs."""
    outputs = []
    for cache_implementation in (None, "static"):
        if seed is not None:
            torch.manual_seed(seed)
        outputs.append(
            model.generate(
                ids, attention_mask=torch.ones_like(ids) if mask is None else mask,
                cache_implementation=cache_implementation, return_dict_in_generate=True, output_scores=True,
                **{"do_sample": False, **settings},
            )  # fmt: skip
        )
    assert isinstance(outputs[0].cache, MemoryCache) and isinstance(outputs[1].cache, StaticMemoryCache)
    return outputs


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("prompt_length", [3, 2 * MEM_LEN + 3])  # shorter than mem_len, longer
def test_greedy_equals_the_default_cache_while_the_memory_fills_and_wraps_around(batch, prompt_length):
    model = scrambled_lm(mem_len=MEM_LEN)
    ids = prompt(batch, prompt_length)
    default, static = generate_both(model, ids, max_new_tokens=40)  # (the ring of 9 slots wraps 4 times)
    assert_greedy_decodings_agree(static.sequences, static.scores, default.sequences, default.scores, atol=TOLERANCE)
    for ours, expected in zip(static.cache.mems, default.cache.mems):  # the memory itself, oldest first
        torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)
    assert static.cache.get_seq_length() == default.cache.get_seq_length() == prompt_length + 39


def test_256_greedy_tokens_equal_the_default_caches():
    model = scrambled_lm(mem_len=MEM_LEN)
    default, static = generate_both(model, prompt(1, 16), max_new_tokens=256)
    assert_greedy_decodings_agree(static.sequences, static.scores, default.sequences, default.scores, atol=TOLERANCE)


@pytest.mark.parametrize(
    "overrides",
    [dict(same_length=True), dict(same_length=True, same_length_span=3), dict(clamp_len=5, pre_lnorm=True),
     dict(zero_initial_mems=True), dict(untie_r=False)],
)  # fmt: skip
def test_every_position_scheme_option_equals_the_default_cache(overrides):
    model = scrambled_lm(mem_len=MEM_LEN, **overrides)
    for length in (4, 12):
        default, static = generate_both(model, prompt(2, length), max_new_tokens=20)
        assert_greedy_decodings_agree(static.sequences, static.scores, default.sequences, default.scores, atol=TOLERANCE)


def test_sampling_with_the_same_seed_equals_the_default_cache():
    model = scrambled_lm(mem_len=MEM_LEN)
    default, static = generate_both(
        model, prompt(2, 5), seed=3, do_sample=True, top_k=0, num_return_sequences=2, max_new_tokens=30
    )
    assert torch.equal(static.sequences, default.sequences)
    for ours, expected in zip(static.scores, default.scores):
        torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)


def test_beam_search_equals_the_default_cache():
    model = scrambled_lm(mem_len=MEM_LEN)
    default, static = generate_both(
        model, prompt(2, 10), num_beams=3, num_return_sequences=2, length_penalty=0.0, max_new_tokens=20
    )
    assert torch.equal(static.sequences, default.sequences)
    torch.testing.assert_close(static.sequences_scores, default.sequences_scores, atol=TOLERANCE, rtol=0)


def test_left_padding_and_given_mems_equal_the_default_cache():
    model = scrambled_lm(mem_len=MEM_LEN)
    ids = prompt(2, 6, seed=5)
    ids[1, :3] = PAD
    default, static = generate_both(model, ids, mask=(ids != PAD).long(), max_new_tokens=20)
    assert_greedy_decodings_agree(static.sequences, static.scores, default.sequences, default.scores, atol=TOLERANCE)
    with torch.no_grad():
        mems = model(prompt(2, 5, seed=6)).mems
    default, static = generate_both(model, prompt(2, 4), mems=mems, num_beams=2, max_new_tokens=12)
    assert torch.equal(static.sequences, default.sequences)


def test_a_static_decoding_step_makes_no_host_sync():
    model = scrambled_lm(mem_len=MEM_LEN, same_length=True)
    cache = StaticMemoryCache(model.config.n_layer, MEM_LEN)
    with torch.no_grad():
        model(prompt(2, 5), cache=cache)
        with HostSyncCounter() as syncs:
            for step in range(MEM_LEN + 3):  # (the same ops once the ring wraps around)
                model(prompt(2, 1, seed=step), attention_mask=torch.ones(2, 1, dtype=torch.long), cache=cache)
    assert syncs.count == 0, syncs.ops


def test_the_static_cache_refuses_what_it_cannot_do_with_one_line():
    model = scrambled_lm(mem_len=MEM_LEN)
    ids = prompt(1, 4)
    with pytest.raises(ValueError, match="attn_type 0"):
        scrambled_lm(mem_len=MEM_LEN, attn_type=1).generate(ids, cache_implementation="static", max_new_tokens=2)
    cache = StaticMemoryCache(model.config.n_layer, MEM_LEN)
    with pytest.raises(ValueError, match="eval mode under torch.no_grad"):
        model(ids, cache=cache)
    with torch.no_grad():
        model(ids, cache=cache)
        with pytest.raises(ValueError, match="one token per step"):
            model(ids, cache=cache)
        with pytest.raises(ValueError, match="holds batch 1 in torch.float32; got 2"):
            model(prompt(2, 1), cache=cache)
    assert not cache.is_croppable
    with pytest.raises(ValueError, match="decoding has started"):
        cache.crop(-1)
    cache.reset()  # (an empty cache again, for a new prompt)
    with torch.no_grad():
        assert not cache.ring and model(prompt(2, 3), cache=cache).logits.shape == (2, 3, 90)
    with pytest.raises(ValueError, match="needs a memory"):
        StaticMemoryCache(2, 0)
    with pytest.raises(ValueError, match="`cache_implementation` or `cache`, not both"):
        model.generate(ids, cache=MemoryCache(2, MEM_LEN), cache_implementation="static", max_new_tokens=2)


def test_compiled_steps_equal_eager_ones_without_graph_breaks_or_recompilation():
    """generate() compiles the step as for transformers' own models (`compile_config`; on CPU only with
    `_compile_all_devices`): one graph for every step of 256 tokens and of another prompt length, the memory
    wrapping around the slots many times."""
    model = scrambled_lm(mem_len=MEM_LEN, same_length=True)
    config = counting_compile_config(mode="default")
    for length, new_tokens in ((5, 256), (2 * MEM_LEN + 1, 3 * MEM_LEN)):
        ids = prompt(2, length)
        default = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
            return_dict_in_generate=True, output_scores=True,
        )  # fmt: skip
        compiled = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
            cache_implementation="static", compile_config=config, return_dict_in_generate=True, output_scores=True,
        )  # fmt: skip
        assert_greedy_decodings_agree(
            compiled.sequences, compiled.scores, default.sequences, default.scores, atol=TOLERANCE
        )
    assert_one_graph()


def test_the_caches_are_what_transformers_tests_check():
    """transformers' generation tests (test_generate_with_static_cache, ..._from_inputs_embeds_with_static_cache,
    ..._compile_model_forward_fullgraph): the static cache is a compileable `StaticCache`, not a `DynamicCache`, one
    layer per model layer, keys [B, H, generate()'s cache length, D] while that fits in mem_len + 1 slots; the
    default cache is a `DynamicCache`, not compileable. A cache made by hand is one too."""
    n_layer, n_head, d_head = 2, 4, 8
    for prompt_length, new_tokens, embeds in ((3, 4, False), (3, 4, True), (3, 20, False)):
        model, ids = scrambled_lm(mem_len=MEM_LEN), prompt(2, prompt_length)
        inputs = dict(inputs_embeds=model.get_input_embeddings()(ids)) if embeds else dict(input_ids=ids)
        default, static = (
            model.generate(**inputs, do_sample=False, max_new_tokens=new_tokens, cache_implementation=implementation,
                           return_dict_in_generate=True)  # fmt: skip
            for implementation in (None, "static")
        )
        assert isinstance(default.cache, DynamicCache) and not default.cache.is_compileable
        cache = static.cache
        assert isinstance(cache, StaticCache) and not isinstance(cache, DynamicCache) and cache.is_compileable
        slots = min(prompt_length + new_tokens - 1, MEM_LEN + 1)
        assert len(cache) == n_layer and cache.get_max_length() == slots
        assert [layer.keys.shape for layer in cache.layers] == [(2, n_head, slots, d_head)] * n_layer
    with torch.no_grad():
        assert isinstance(model(ids, cache=StaticMemoryCache(n_layer, MEM_LEN)).cache, StaticCache)


def test_a_shorter_generation_reuses_the_compiled_step():
    """transformers' test_static_cache_no_recompile_with_smaller_length: the slots follow generate()'s cache length
    (here shorter than the memory), never fewer than the last call's, so a shorter call runs the same graph."""
    model = scrambled_lm(mem_len=MEM_LEN)
    config = counting_compile_config(backend="eager")  # (dynamo counts the graphs)
    for new_tokens in (5, 2):
        out = model.generate(prompt(2, 3), do_sample=False, max_new_tokens=new_tokens, cache_implementation="static",
                             compile_config=config, return_dict_in_generate=True)  # fmt: skip
        assert out.cache.get_max_length() == 3 + 5 - 1
    assert_one_graph()


def test_flex_attention_steps_equal_eager_ones():
    """flex_attention's static steps (one query over the slots, its position scores read per slot in the score_mod)
    and its left-padded prompt (a padded query sees no key) give eager's tokens and scores."""
    ids = prompt(2, 5)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    outputs = []
    for implementation in ("eager", "flex_attention"):
        model = scrambled_lm(mem_len=MEM_LEN)
        model.set_attn_implementation(implementation)
        outputs.append(model.generate(ids, attention_mask=mask, cache_implementation="static", max_new_tokens=12,
                                      do_sample=False, return_dict_in_generate=True, output_scores=True))  # fmt: skip
    eager, flex = outputs
    assert_greedy_decodings_agree(flex.sequences, flex.scores, eager.sequences, eager.scores, atol=TOLERANCE)


def counting_compile_config(**options) -> CompileConfig:
    """generate()'s `compile_config` (on CPU too: `_compile_all_devices`), with Dynamo reset: its `counters` then
    count this test's graphs, graph breaks and recompilations (`assert_one_graph`)."""
    config = CompileConfig(fullgraph=True, dynamic=False, **options)
    config._compile_all_devices = True
    torch._dynamo.reset()
    counters.clear()
    return config


def assert_one_graph():
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"] and not counters["recompiles"], (counters["graph_break"], counters["recompiles"])
