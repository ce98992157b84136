"""Transformer-XL on transformers' attention interface: "eager" (the terms written out), "sdpa" and
"flex_attention" give the same numbers, with the memory, every layer and head; `from_pretrained(...,
attn_implementation=...)` and `set_attn_implementation` choose among them."""

import pytest
import torch

import transformers_xl.modeling.modeling_transfo_xl as modeling
from test_modeling_transfo_xl import random_ids, scrambled, tiny_config
from transformers_xl import TransfoXLLMHeadModel

IMPLEMENTATIONS = ["eager", "sdpa", "flex_attention"]


def model_with(implementation, seed=0, **overrides):
    torch.manual_seed(seed)
    model = TransfoXLLMHeadModel(tiny_config(**overrides))
    model.set_attn_implementation(implementation)
    return scrambled(model).eval()


def eager_calls(monkeypatch):
    """Count the calls of the eager reference (the default `get_interface` falls back to)."""
    calls = []
    original = modeling.eager_attention_forward
    monkeypatch.setattr(modeling, "eager_attention_forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


@pytest.mark.parametrize("attn_type, options", [(0, {"same_length": True, "clamp_len": 3}), (0, {"untie_r": False}),
                                                (1, {}), (2, {}), (3, {"pre_lnorm": True})])  # fmt: skip
def test_implementations_agree_with_memory_in_every_layer(attn_type, options):
    """Two segments (the second attending to the first's memory: q != k) and a padded batch: every layer's output
    within 1e-4 of eager's in fp32."""
    ids = random_ids(2, 5)
    padding = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    outputs = {}
    for implementation in IMPLEMENTATIONS:
        model = model_with(implementation, attn_type=attn_type, **options)
        with torch.no_grad():
            mems = model(ids).mems
            second = model(ids, mems=mems, output_hidden_states=True)
            padded = model(ids, attention_mask=padding, output_hidden_states=True)
        outputs[implementation] = second.hidden_states + padded.hidden_states
    for implementation in IMPLEMENTATIONS[1:]:
        for got, want in zip(outputs[implementation], outputs["eager"]):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=0, msg=implementation)


def test_eager_and_sdpa_training_gradients_agree():
    ids = random_ids(2, 6)
    gradients = {}
    for implementation in ("eager", "sdpa"):
        model = model_with(implementation, same_length=True).train()
        mems = model(ids).mems
        model(ids, mems=mems, labels=ids).loss.backward()
        gradients[implementation] = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert gradients["sdpa"].keys() == gradients["eager"].keys()
    for name, gradient in gradients["sdpa"].items():
        torch.testing.assert_close(gradient, gradients["eager"][name], atol=1e-4, rtol=1e-4, msg=name)


def test_from_pretrained_and_set_attn_implementation_choose_the_function(tmp_path, monkeypatch):
    model_with("sdpa").save_pretrained(tmp_path)
    calls = eager_calls(monkeypatch)
    ids = random_ids(1, 4)
    default = TransfoXLLMHeadModel.from_pretrained(tmp_path).eval()
    assert default.config._attn_implementation == "sdpa"
    default(ids)
    assert not calls
    eager = TransfoXLLMHeadModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    eager(ids)
    assert len(calls) == eager.config.n_layer
    default.set_attn_implementation("eager")  # takes effect at the next call
    default(ids)
    assert len(calls) == 2 * eager.config.n_layer
    default.set_attn_implementation("sdpa")
    default(ids)
    assert len(calls) == 2 * eager.config.n_layer


def test_output_attentions_uses_eager_and_returns_probabilities(monkeypatch):
    calls = eager_calls(monkeypatch)
    model = model_with("sdpa")
    out = model(random_ids(2, 5), output_attentions=True)
    assert len(calls) == model.config.n_layer
    assert all(probs.shape == (2, 4, 5, 5) for probs in out.attentions)
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(2, 4, 5))


def test_flex_attention_under_torch_compile_equals_eager():
    """flex_attention inside a compiled graph (fullgraph; Dynamo and AOT autograd's graph, inference on CPU) gives the
    eager reference's log-probabilities, with the memory."""
    from test_compile import compile_fullgraph

    ids = random_ids(2, 5)
    reference, flex = model_with("eager"), model_with("flex_attention")
    compiled = compile_fullgraph(flex)
    with torch.no_grad():
        mems = reference(ids).mems
        expected = reference(ids, mems=mems).logits
        torch.testing.assert_close(compiled(ids, mems=mems).logits, expected, atol=1e-4, rtol=0)


# A few units in the last place of outputs of magnitude ~4 (bf16 keeps 8 bits of mantissa, fp16 11)
HALF_PRECISION_ATOL = {torch.bfloat16: 0.1, torch.float16: 0.02}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eager_and_sdpa_agree_in_half_precision_on_a_padded_batch(dtype):
    """transformers' test_eager_matches_sdpa_inference, in short: a half-precision model, a left-padded batch, a
    segment over a memory; sdpa's last hidden states at the real positions within half precision's tolerance of
    eager's (the padding's finfo.min must not turn into NaN or leak). Padded positions are not compared: their rows
    see no key, and what they hold differs between implementations in fp16, as in transformers' models."""
    ids, padding = random_ids(2, 5), torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    outputs = {}
    for implementation in ("eager", "sdpa"):
        model = model_with(implementation).to(dtype)
        with torch.no_grad():
            padded = model.transformer(ids, attention_mask=padding)
            second = model.transformer(ids, mems=model.transformer(ids).mems)
        outputs[implementation] = (padded.last_hidden_state[padding.bool()], second.last_hidden_state)
    for got, want in zip(outputs["sdpa"], outputs["eager"]):
        assert got.dtype == dtype and got.isfinite().all()
        torch.testing.assert_close(got.float(), want.float(), atol=HALF_PRECISION_ATOL[dtype], rtol=0)


def test_hidden_states_and_attentions_keep_their_gradients():
    """transformers' test_retain_grad_hidden_states_attentions: the returned hidden states and attention
    probabilities are the ones the loss was computed from, so gradients reach them (attribution methods rely on it)."""
    assert_gradients_reach_hidden_states_and_attentions(model_with("sdpa"), random_ids(2, 5), random_ids(2, 5, seed=2))


def assert_gradients_reach_hidden_states_and_attentions(model, ids, labels):
    out = model(ids, labels=labels, output_hidden_states=True, output_attentions=True)
    hidden, attention = out.hidden_states[0], out.attentions[0]
    hidden.retain_grad()
    attention.retain_grad()
    out.loss.backward()
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0
    assert attention.grad is not None and attention.grad.abs().sum() > 0


def test_flex_attention_compiles_once_across_lengths_memories_and_grad_modes(monkeypatch):
    """flex_attention's kernel is compiled once for segments of 5 and 7 tokens over memories of 0, 5 and 6 (the
    lengths rounded up to a block), and a training step in between (on CPU: sdpa, torch has no flex backward) neither
    recompiles nor fails; the outputs stay eager's."""
    from torch._dynamo.utils import counters

    from transformers_xl.modeling.relative_attention import ALL_ATTENTION_FUNCTIONS

    used = []
    for name in ("sdpa", "flex_attention"):
        function = ALL_ATTENTION_FUNCTIONS[name]
        monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, name, lambda *a, _n=name, _f=function, **k: used.append(_n) or _f(*a, **k))
    torch._dynamo.reset()
    counters.clear()
    reference, flex = model_with("eager"), model_with("flex_attention")
    for ids in (random_ids(2, 5), random_ids(2, 7)):
        with torch.no_grad():
            mems = reference(ids).mems
            torch.testing.assert_close(flex(ids, mems=mems).logits, reference(ids, mems=mems).logits, atol=1e-4, rtol=0)
            flex(ids)
        flex.train()
        flex(ids, labels=ids).loss.backward()
        flex.eval()
    assert counters["stats"]["unique_graphs"] == 1
    assert used.count("sdpa") == 2 * flex.config.n_layer and used.count("flex_attention") == 4 * flex.config.n_layer


def test_flex_masks_are_built_without_a_host_sync():
    """The BlockMask of a causal, padded mask over [memory; segment] (built once per forward) makes no host sync."""
    from host_syncs import HostSyncCounter

    from transformers_xl.modeling.relative_attention import causal_memory_mask, flex_mask

    mask = causal_memory_mask(5, 7)[None, None] | torch.tensor([[False] * 11 + [True], [True] + [False] * 11])[:, None, None]
    with HostSyncCounter() as syncs:
        flex = flex_mask(mask, 5, 12, "cpu")
    assert syncs.ops == []
    assert flex.block_mask.shape[-2:] == (128, 128) and flex.empty_rows.shape == (2, 1, 5, 1)
