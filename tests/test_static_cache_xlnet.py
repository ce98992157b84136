"""XLNet's static memory cache (`generate(..., cache_implementation="static")`): the default cache's tokens and
scores with two-token decoding steps of fixed shapes, compiled by generate() without graph breaks, recompilations
or host syncs."""

import pytest
import torch
from transformers import DynamicCache, StaticCache

from greedy_decoding import assert_greedy_decodings_agree
from host_syncs import HostSyncCounter
from test_generation_xlnet import ids, scrambled_pair
from test_static_cache import assert_one_graph, counting_compile_config
from transformers_xl.modeling.memory_cache import MemoryCache, StaticMemoryCache

# The keys are summed in slot order and the position scores gathered, not shifted: rounding differs by a few 1e-6
# on these scrambled weights (peaked distributions).
TOLERANCE = 1e-5
PAD = 5


def scrambled_lm(**overrides):
    return scrambled_pair(**overrides)[1]


def generate_both(model, prompt, seed=3, **settings):
    """generate() with the default and with the static cache (same seed for sampling) -> the two outputs."""
    outputs = []
    for cache_implementation in (None, "static"):
        torch.manual_seed(seed)
        outputs.append(
            model.generate(
                prompt, cache_implementation=cache_implementation, return_dict_in_generate=True, output_scores=True,
                pad_token_id=PAD, **{"do_sample": False, **settings},
            )  # fmt: skip
        )
    assert isinstance(outputs[0].cache, MemoryCache) and isinstance(outputs[1].cache, StaticMemoryCache)
    return outputs


def assert_same(default, static):
    assert torch.equal(static.sequences, default.sequences)
    for ours, expected in zip(static.scores, default.scores, strict=True):
        torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)


# mem_len: None (the pretrained checkpoints': slots up to max_length), shorter and longer than the prompt, 1 and 2
# (the memory is then empty before each step: a step sees its two tokens only).
@pytest.mark.parametrize("mem_len", [None, 1, 2, 6, 30])
@pytest.mark.parametrize("batch", [1, 4])
def test_greedy_equals_the_default_cache_for_every_memory_length(mem_len, batch):
    model = scrambled_lm(mem_len=mem_len)
    for length in (1, 9):
        default, static = generate_both(model, ids(batch, length), max_new_tokens=20)
        assert_same(default, static)
        for ours, expected in zip(static.cache.mems, default.cache.mems, strict=True):  # the memory, oldest first
            torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)
        assert static.cache.get_seq_length() == static.sequences.shape[1] - 1  # every token but the last


@pytest.mark.parametrize("batch, prompt_length", [(1, 16), (4, 1024)])
def test_256_greedy_tokens_equal_the_default_caches(batch, prompt_length):
    model = scrambled_lm(mem_len=None)
    default, static = generate_both(model, ids(batch, prompt_length), max_new_tokens=256)
    assert_greedy_decodings_agree(static.sequences, static.scores, default.sequences, default.scores, atol=TOLERANCE)


# mem_len 2 and a one-token prompt's first step: the memory is empty, and under "uni" with same_length the next
# position's query then sees no key: it averages the keys held, the two fed tokens (slots not written stay out).
@pytest.mark.parametrize(
    "overrides",
    [dict(attn_type="uni"), dict(attn_type="uni", same_length=True), dict(clamp_len=3), dict(same_length=True)],
)
@pytest.mark.parametrize("mem_len", [None, 2, 6])
def test_every_attention_option_equals_the_default_cache(overrides, mem_len):
    model = scrambled_lm(mem_len=mem_len, **overrides)
    for length in (1, 9):
        assert_same(*generate_both(model, ids(2, length), max_new_tokens=12))


@pytest.mark.parametrize("mem_len", [None, 6])
def test_sampling_and_beams_equal_the_default_cache(mem_len):
    model = scrambled_lm(mem_len=mem_len)
    sampling = dict(do_sample=True, top_k=0, num_return_sequences=2)
    assert_same(*generate_both(model, ids(2, 5), max_new_tokens=12, **sampling))
    default, static = generate_both(model, ids(2, 5), max_new_tokens=12, num_beams=3, num_return_sequences=2)
    assert torch.equal(static.sequences, default.sequences)
    torch.testing.assert_close(static.sequences_scores, default.sequences_scores, atol=TOLERANCE, rtol=0)


def test_padding_is_ignored_as_by_the_default_cache():
    """XLNet's generation ignores `attention_mask` (transformers' does too: tests/test_generation_xlnet.py)."""
    model = scrambled_lm(mem_len=6)
    prompt = ids(2, 6)
    prompt[1, :3] = PAD
    assert_same(*generate_both(model, prompt, attention_mask=(prompt != PAD).long(), max_new_tokens=10))


def test_a_static_decoding_step_makes_no_host_sync():
    model = scrambled_lm(mem_len=6, attn_type="uni", same_length=True)
    cache = StaticMemoryCache(model.config.n_layer, 6, slot_count=6, step_length=2)
    with torch.no_grad():
        model(ids(2, 5), cache=cache, predict_next_token=True)
        with HostSyncCounter() as syncs:
            for step in range(8):  # (the same ops once the ring wraps around)
                model(ids(2, 2, seed=step), cache=cache, predict_next_token=True)
    assert syncs.count == 0, syncs.ops


def test_the_static_cache_refuses_what_it_cannot_do_with_one_line():
    prompt = ids(2, 4)
    with pytest.raises(ValueError, match="with reuse_len None or >= 3"):
        scrambled_lm(mem_len=6, reuse_len=2).generate(prompt, cache_implementation="static", max_new_tokens=2)
    model = scrambled_lm(mem_len=6)
    for given in (dict(use_mems=False), dict(mems=model(prompt, use_mems=True).mems)):
        with pytest.raises(ValueError, match="pass no `cache` or `mems` with it"):
            model.generate(prompt, cache_implementation="static", max_new_tokens=2, **given)
    with torch.no_grad(), pytest.raises(ValueError, match=r"generate\(\)'s \(two tokens a step\)"):
        model(prompt, cache=StaticMemoryCache(model.config.n_layer, 6), predict_next_token=True)  # (Transformer-XL's)
    cache = StaticMemoryCache(model.config.n_layer, 6, slot_count=6, step_length=2)
    with pytest.raises(ValueError, match="eval mode under torch.no_grad"):
        model(prompt, cache=cache)
    with torch.no_grad():
        model(prompt, cache=cache, predict_next_token=True)
        with pytest.raises(ValueError, match="takes the last two tokens with predict_next_token, nothing else"):
            model(ids(2, 3), cache=cache, predict_next_token=True)
        with pytest.raises(ValueError, match="takes the last two tokens"):
            model(ids(2, 2), cache=cache, predict_next_token=True, attention_mask=torch.ones(2, 2))
        with pytest.raises(ValueError, match="holds batch 2 in torch.float32; got 1"):
            model(ids(1, 2), cache=cache, predict_next_token=True)


def test_compiled_steps_equal_eager_ones_without_graph_breaks_or_recompilation():
    """generate() compiles the step as for transformers' own models (`compile_config`; on CPU only with
    `_compile_all_devices`): one graph for every step of 256 tokens and of a shorter prompt (mem_len None: the slots
    stay those of the first call's max_length, as transformers' StaticCache)."""
    model = scrambled_lm(mem_len=None)
    config = counting_compile_config(mode="default")
    for length, new_tokens in ((9, 256), (4, 20)):
        settings = dict(do_sample=False, max_new_tokens=new_tokens, pad_token_id=PAD, return_dict_in_generate=True,
                        output_scores=True)  # fmt: skip
        default = model.generate(ids(2, length), **settings)
        compiled = model.generate(ids(2, length), cache_implementation="static", compile_config=config, **settings)
        assert_greedy_decodings_agree(
            compiled.sequences, compiled.scores, default.sequences, default.scores, atol=TOLERANCE
        )
    assert_one_graph()


# transformers' XLNet tester's reuse_len (15, longer than the prompt), one shorter than the prompt (its steps then
# rewrite both newest remembered positions), the shortest served (3: a step's two tokens and the dummy), bi_data.
@pytest.mark.parametrize(
    "overrides, prompt_length",
    [(dict(reuse_len=15), 7), (dict(reuse_len=4), 9), (dict(reuse_len=3, attn_type="uni", same_length=True), 8),
     (dict(bi_data=True), 6), (dict(bi_data=True, reuse_len=4), 9)],
)  # fmt: skip
def test_reuse_len_and_bi_data_equal_the_default_cache(overrides, prompt_length):
    default, static = generate_both(scrambled_lm(mem_len=6, **overrides), ids(2, prompt_length), max_new_tokens=12)
    assert_same(default, static)


def test_the_caches_are_what_transformers_tests_check():
    """transformers' generation tests (test_generate_with_static_cache, ..._compile_model_forward_fullgraph): the
    static cache is a compileable `StaticCache`, not a `DynamicCache`, one layer per model layer, keys [B, H,
    generate()'s cache length, D] up to mem_len slots; the default cache is a `DynamicCache`, not compileable."""
    for mem_len, new_tokens in ((30, 4), (6, 20)):
        model = scrambled_lm(mem_len=mem_len, reuse_len=15)
        default, static = generate_both(model, ids(2, 5), max_new_tokens=new_tokens)
        assert isinstance(default.cache, DynamicCache) and not default.cache.is_compileable
        cache, config = static.cache, model.config
        assert isinstance(cache, StaticCache) and not isinstance(cache, DynamicCache) and cache.is_compileable
        slots = min(5 + new_tokens - 1, mem_len)
        assert len(cache) == config.n_layer and cache.get_max_length() == slots
        assert [layer.keys.shape for layer in cache.layers] == [(2, config.n_head, slots, config.d_head)] * 2


def test_a_shorter_generation_reuses_the_compiled_step():
    """transformers' test_static_cache_no_recompile_with_smaller_length, with its XLNet tester's reuse_len: the
    slots follow generate()'s cache length, never fewer than the last call's, so a shorter call runs the same graph."""
    model = scrambled_lm(mem_len=30, reuse_len=15)
    config = counting_compile_config(backend="eager")  # (dynamo counts the graphs)
    for new_tokens in (5, 2):
        out = model.generate(ids(2, 7), do_sample=False, max_new_tokens=new_tokens, cache_implementation="static",
                             compile_config=config, pad_token_id=PAD, return_dict_in_generate=True)  # fmt: skip
        assert out.cache.get_max_length() == 7 + 5 - 1
    assert_one_graph()


def test_flex_attention_steps_equal_eager_ones():
    """flex_attention's static steps (three rows over the slots, read per slot with the step's additive mask in the
    score_mod) give eager's tokens and scores."""
    outputs = []
    for implementation in ("eager", "flex_attention"):
        model = scrambled_lm(mem_len=6)
        model.set_attn_implementation(implementation)
        outputs.append(model.generate(ids(2, 5), cache_implementation="static", max_new_tokens=10, do_sample=False,
                                      return_dict_in_generate=True, output_scores=True, pad_token_id=PAD))  # fmt: skip
    assert_same(*outputs)
