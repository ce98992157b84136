"""XLNet's attention implementations ("eager", "sdpa", "flex_attention") give the same outputs and gradients and are
chosen by `from_pretrained(attn_implementation=...)` / `set_attn_implementation`; a training step, an evaluation
forward with labels and a decoding step make no host sync; results are bit-identical in separate processes."""

import copy
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import transformers_xl.modeling.modeling_xlnet as ours
from host_syncs import HostSyncCounter
from test_attention_transfo_xl import assert_gradients_reach_hidden_states_and_attentions
from transformers_xl.modeling.configuration_xlnet import XLNetConfig
from transformers_xl.modeling.relative_attention import ALL_ATTENTION_FUNCTIONS

IMPLEMENTATIONS = ["eager", "sdpa", "flex_attention"]
VOCAB = 99
TINY = dict(vocab_size=VOCAB, d_model=32, n_head=4, d_inner=37, n_layer=2, dropout=0.0, mem_len=None, pad_token_id=5)
CONFIGS = {
    "bi": {},
    "uni": {"attn_type": "uni"},
    "uni_same_length": {"attn_type": "uni", "same_length": True},
    "bi_data_clamp_len": {"bi_data": True, "clamp_len": 3},
}


@pytest.fixture(autouse=True)
def fresh_compiled_flex_attention():
    """flex_attention compiles once per rounded shape and score_mod flavour, within Dynamo's per-process recompile
    limit: each test starts with nothing compiled, so that the tests do not depend on their order."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def tiny(class_name="XLNetLMHeadModel", **overrides):
    torch.manual_seed(0)
    return getattr(ours, class_name)(XLNetConfig(**{**TINY, **overrides})).eval()


def ids(batch=2, length=7, seed=1):
    return torch.randint(6, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def permutation_inputs(batch=2, length=7, num_predict=3):
    """Every input at once: padding, two segments, a factorisation order hiding the last `num_predict` tokens,
    which are the targets (both streams run)."""
    attention_mask = torch.ones(batch, length)
    attention_mask[0, :2] = 0
    perm_mask = torch.zeros(batch, length, length)
    perm_mask[:, :, -num_predict:] = 1
    target_mapping = torch.zeros(batch, num_predict, length)
    target_mapping[:, torch.arange(num_predict), torch.arange(length - num_predict, length)] = 1
    token_type_ids = (torch.arange(length) >= length // 2).long().expand(batch, -1)
    return dict(input_ids=ids(batch, length), attention_mask=attention_mask, perm_mask=perm_mask,
                target_mapping=target_mapping, token_type_ids=token_type_ids)  # fmt: skip


def outputs_by_implementation(model, **inputs):
    """Each implementation's logits and hidden states (both streams, every layer), without gradients."""
    results = {}
    for implementation in IMPLEMENTATIONS:
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            output = model(**inputs, output_hidden_states=True)
        results[implementation] = (output.logits, *output.hidden_states)
    return results


def assert_all_agree(results, atol=1e-4):
    reference = results["eager"]
    for implementation, tensors in results.items():
        for index, (expected, actual) in enumerate(zip(reference, tensors)):
            torch.testing.assert_close(actual, expected, atol=atol, rtol=0, msg=f"{implementation}, tensor {index}")


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_implementations_agree_on_both_streams_with_a_memory(config_name):
    model = tiny(**CONFIGS[config_name])
    with torch.no_grad():
        mems = model(ids(2, 5, seed=3), use_mems=True).mems
    assert_all_agree(outputs_by_implementation(model, mems=mems, **permutation_inputs()))


@pytest.mark.parametrize("class_name", [name for name in ours.__all__ if name.startswith("XLNetFor")])
def test_implementations_agree_for_every_head(class_name):
    """(The shapes of the test above: two sequences, 5 remembered positions, 7 new.)"""
    model = tiny(class_name, num_labels=2)
    input_ids = ids(1, 7)[:, None].expand(-1, 2, -1) if class_name == "XLNetForMultipleChoice" else ids(2, 7)
    with torch.no_grad():
        mems = model.transformer(ids(2, 5, seed=3), use_mems=True).mems
    results = {}
    for implementation in IMPLEMENTATIONS:
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            output = model(input_ids=input_ids, mems=mems, output_hidden_states=True)
        results[implementation] = [value for value in output.to_tuple() if torch.is_tensor(value)]
        results[implementation] += list(output.hidden_states)
    assert_all_agree(results)


def test_implementations_agree_on_a_decoding_step_and_greedy_generation():
    """A decoding step attends the content rows and the query row after them in one call, over a cache."""
    model = tiny(mem_len=6)
    with torch.no_grad():
        prompt_inputs = model.prepare_inputs_for_generation(ids(2, 4), use_mems=True)
        model(**prompt_inputs)
    cache = prompt_inputs["cache"]
    logits = {}
    for implementation in IMPLEMENTATIONS:
        model.set_attn_implementation(implementation)
        inputs = model.prepare_inputs_for_generation(ids(2, 5), cache=copy.deepcopy(cache), use_mems=True)
        with torch.no_grad():
            logits[implementation] = (model(**inputs).logits,)
    assert_all_agree(logits)
    scores = {}
    for implementation in IMPLEMENTATIONS:  # (flex: the lengths grow within a block, no recompilation)
        model.set_attn_implementation(implementation)
        generated = model.generate(ids(2, 4), max_new_tokens=5, do_sample=False, return_dict_in_generate=True,
                                   output_scores=True)  # fmt: skip
        scores[implementation] = generated.scores
    assert_all_agree(scores)


@pytest.mark.parametrize("config_name", ["bi", "bi_data_clamp_len"])
def test_training_gradients_of_eager_and_sdpa_agree(config_name):
    """Both streams, a memory and every input; in training mode (no dropout, so that both draw nothing)."""
    gradients = {}
    for implementation in ("eager", "sdpa"):
        model = tiny(**CONFIGS[config_name]).train()
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            mems = model(ids(2, 5, seed=3), use_mems=True).mems
        inputs = permutation_inputs()
        labels = ids(2, 3, seed=4)
        model(**inputs, mems=mems, labels=labels).loss.backward()
        gradients[implementation] = [parameter.grad for parameter in model.parameters()]
    for expected, actual in zip(gradients["eager"], gradients["sdpa"]):
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)


def test_implementation_is_chosen_at_loading_and_switched_later(tmp_path, monkeypatch):
    """`attn_implementation` of from_pretrained and `set_attn_implementation` pick the function each layer calls;
    the default is "sdpa"."""
    calls = []
    for name in ("sdpa", "flex_attention"):
        function = ALL_ATTENTION_FUNCTIONS[name]

        def spy(*args, _name=name, _function=function, **kwargs):
            calls.append(_name)
            return _function(*args, **kwargs)

        monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, name, spy)
    tiny().save_pretrained(tmp_path)

    def used(model):
        calls.clear()
        with torch.no_grad():
            model(ids())
        return set(calls), len(calls)

    assert used(ours.XLNetLMHeadModel.from_pretrained(tmp_path)) == ({"sdpa"}, 2)
    model = ours.XLNetLMHeadModel.from_pretrained(tmp_path, attn_implementation="eager")
    assert model.config._attn_implementation == "eager" and used(model) == (set(), 0)
    model = ours.XLNetLMHeadModel.from_pretrained(tmp_path, attn_implementation="flex_attention")
    assert used(model) == ({"flex_attention"}, 2)
    model.set_attn_implementation("sdpa")
    assert used(model) == ({"sdpa"}, 2)
    model.set_attn_implementation("eager")
    assert used(model) == (set(), 0)


# ---------------------------------------------------------------------------------------------------------------
# Host syncs: none in a training step, an evaluation forward with labels or a decoding step
# ---------------------------------------------------------------------------------------------------------------


def test_training_step_makes_no_host_sync():
    model = tiny(dropout=0.1).train()
    with torch.no_grad():
        mems = model(ids(2, 5, seed=3), use_mems=True).mems
    with HostSyncCounter() as syncs:
        loss = model(**permutation_inputs(), mems=mems, labels=ids(2, 3, seed=4)).loss
        loss.backward()
    assert syncs.ops == []


@pytest.mark.parametrize("class_name", ["XLNetLMHeadModel", "XLNetForSequenceClassification",
                                        "XLNetForTokenClassification", "XLNetForQuestionAnsweringSimple"])  # fmt: skip
def test_evaluation_forward_with_labels_makes_no_host_sync(class_name):
    model = tiny(class_name, num_labels=2)
    inputs = dict(input_ids=ids(), attention_mask=torch.ones(2, 7), token_type_ids=torch.zeros(2, 7, dtype=torch.long))
    if class_name == "XLNetForQuestionAnsweringSimple":
        labels = dict(start_positions=torch.tensor([1, 2]), end_positions=torch.tensor([3, 9]))
    else:
        per_token = {"XLNetLMHeadModel": ids(2, 7, seed=2), "XLNetForTokenClassification": ids(2, 7, seed=2) % 2}
        labels = dict(labels=per_token.get(class_name, torch.tensor([0, 1])))
    with torch.no_grad():
        mems = model(**inputs, use_mems=True).mems
    with torch.no_grad(), HostSyncCounter() as syncs:
        model(**inputs, **labels, mems=mems)
    assert syncs.ops == []


def test_decoding_step_makes_no_host_sync():
    """One step of generate(): its inputs prepared against the cache, then the forward (bf16 too)."""
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny(mem_len=6).to(dtype)
        prompt = ids(2, 4)
        with torch.no_grad():
            inputs = model.prepare_inputs_for_generation(prompt, use_mems=True)
            next_token = model(**inputs).logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([prompt, next_token], dim=1)
            with HostSyncCounter() as syncs:
                model(**model.prepare_inputs_for_generation(tokens, cache=inputs["cache"], use_mems=True))
        assert syncs.ops == [], dtype


def test_bad_values_still_raise_a_clear_error():
    """The value checks make no host sync, yet on CPU a bad id still gets its ValueError at once."""
    model = tiny()
    with pytest.raises(ValueError, match=r"`input_ids` has 1 value\(s\) out of range, in \[99, 99\]"):
        model(torch.tensor([[1, 2, VOCAB]]))
    with pytest.raises(ValueError, match=r"`labels` has 1 value\(s\) out of range, in \[-2, -2\]"):
        model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, -2, 3]]))


# ---------------------------------------------------------------------------------------------------------------
# Determinism across processes
# ---------------------------------------------------------------------------------------------------------------

DETERMINISM_SCRIPT = textwrap.dedent(
    """
    import hashlib, sys
    import torch
    import transformers_xl.modeling.modeling_xlnet as ours
    from transformers_xl.modeling.configuration_xlnet import XLNetConfig

    digest = hashlib.sha256()
    def add(tensor):
        digest.update(tensor.detach().float().contiguous().numpy().tobytes())

    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic)
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(0)
            config = XLNetConfig(vocab_size=99, d_model=32, n_head=4, d_inner=37, n_layer=2, dropout=0.1, mem_len=6)
            model = ours.XLNetLMHeadModel(config).to(dtype).train()
            ids = torch.randint(6, 99, (2, 7), generator=torch.Generator().manual_seed(1))
            perm_mask = torch.zeros(2, 7, 7)
            perm_mask[:, :, -3:] = 1
            target_mapping = torch.eye(7)[-3:].expand(2, -1, -1).contiguous()
            for step in range(2):  # two training steps: forward with labels, backward, SGD
                output = model(ids, perm_mask=perm_mask, target_mapping=target_mapping, labels=ids[:, -3:])
                output.loss.backward()
                add(output.loss), add(output.logits)
                with torch.no_grad():
                    for parameter in model.parameters():
                        if parameter.grad is None:  # (the segment terms: no token_type_ids)
                            continue
                        add(parameter.grad)
                        parameter -= 0.1 * parameter.grad
                        parameter.grad = None
            model.eval()
            with torch.no_grad():
                add(model(ids, labels=ids).loss)
            generated = model.generate(ids[:, :4], max_new_tokens=4, do_sample=False, return_dict_in_generate=True,
                                       output_scores=True)
            for scores in generated.scores:
                add(scores)
    print(digest.hexdigest())
    """
)


def test_same_bits_in_three_processes():
    """Training steps (loss, logits, gradients), an evaluation forward and greedy generation scores, fp32 and bf16,
    with and without `torch.use_deterministic_algorithms`: the same bytes in every process."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    digests = set()
    for _ in range(3):
        result = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT], capture_output=True, text=True,
                                env=environment, timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        digests.add(result.stdout.strip().splitlines()[-1])
    assert len(digests) == 1, digests


def test_generation_keeps_no_copy_of_the_weights():
    """The model holds its weights once: after a bf16 generate(), no module holds a tensor besides its parameters
    and buffers (no kept fp16 / packed copies, no snapshots)."""
    model = tiny(mem_len=6).to(torch.bfloat16)
    model.generate(ids(2, 4), max_new_tokens=3, do_sample=False)
    for name, module in model.named_modules():
        extra = [key for key, value in vars(module).items() if torch.is_tensor(value)]
        assert not extra, (name, extra)


# A few units in the last place of outputs of magnitude ~4 (bf16 keeps 8 bits of mantissa, fp16 11)
HALF_PRECISION_ATOL = {torch.bfloat16: 0.1, torch.float16: 0.02}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eager_and_sdpa_agree_in_half_precision_on_a_padded_batch(dtype):
    """transformers' test_eager_matches_sdpa_inference, in short: a half-precision model, a left-padded batch with
    two segments and both streams; sdpa's outputs at the real positions within half precision's tolerance of eager's
    (the padding's -inf / finfo.min must not turn into NaN or leak)."""
    model = tiny().to(dtype)
    inputs = permutation_inputs()
    real = inputs["attention_mask"].bool()
    results = {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            output = model(**inputs, output_hidden_states=True)
        results[implementation] = [output.logits] + [h[real] for h in output.hidden_states if h.shape[1] == real.shape[1]]
    for got, want in zip(results["sdpa"], results["eager"]):
        assert got.dtype == dtype and got.isfinite().all()
        torch.testing.assert_close(got.float(), want.float(), atol=HALF_PRECISION_ATOL[dtype], rtol=0)


def test_hidden_states_and_attentions_keep_their_gradients():
    """transformers' test_retain_grad_hidden_states_attentions (see test_attention_transfo_xl's)."""
    assert_gradients_reach_hidden_states_and_attentions(tiny(), ids(), ids(seed=2))
