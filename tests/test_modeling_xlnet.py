"""XLNet: parity with transformers' XLNet on the same weights, checkpoints both ways, Auto classes, Trainer, errors.

Reference models are built with transformers' XLNet at test time (tiny, random, seeded); ours loads their state dict
strictly, so every comparison is on identical weights.
Run: HF_HUB_OFFLINE=1 python -m pytest tests/test_modeling_xlnet.py
"""

import copy
import json
import re

import pytest
import torch
import transformers

import transformers_xl
import transformers_xl.modeling.modeling_xlnet as ours
from transformers_xl.modeling.configuration_xlnet import XLNetConfig

ATOL = 1e-5
VOCAB = 99
TINY = dict(
    vocab_size=VOCAB,
    d_model=32,
    n_head=4,
    d_inner=37,
    n_layer=2,
    dropout=0.0,
    summary_last_dropout=0.0,
    mem_len=None,
    start_n_top=3,
    end_n_top=3,
    pad_token_id=5,
)
HEADS = [
    "XLNetModel",
    "XLNetLMHeadModel",
    "XLNetForSequenceClassification",
    "XLNetForTokenClassification",
    "XLNetForMultipleChoice",
    "XLNetForQuestionAnsweringSimple",
    "XLNetForQuestionAnswering",
]


def make_pair(class_name="XLNetLMHeadModel", seed=0, **overrides):
    """(transformers' model, our model) with identical random weights, in eval mode."""
    kwargs = {**TINY, **overrides}
    torch.manual_seed(seed)
    reference = getattr(transformers, class_name)(transformers.XLNetConfig(**kwargs)).eval()
    model = getattr(ours, class_name)(XLNetConfig(**kwargs)).eval()
    model.load_state_dict(reference.state_dict(), strict=True)
    return reference, model


def assert_close(expected, actual, atol=ATOL, path="output"):
    """Every field of transformers' output equals ours (float tensors to atol, integer ones exactly, recursively)."""
    if isinstance(expected, dict):  # ModelOutput
        assert set(k for k, v in expected.items() if v is not None) == set(
            k for k, v in actual.items() if v is not None
        ), f"{path}: fields differ"
        for key, value in expected.items():
            if value is not None:
                assert_close(value, actual[key], atol, f"{path}.{key}")
    elif isinstance(expected, (tuple, list)):
        assert len(expected) == len(actual), f"{path}: {len(expected)} vs {len(actual)} entries"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_close(e, a, atol, f"{path}[{i}]")
    elif torch.is_tensor(expected):
        assert expected.shape == actual.shape, f"{path}: shape {tuple(expected.shape)} vs {tuple(actual.shape)}"
        if expected.is_floating_point():
            diff = (expected.float() - actual.float()).abs().max().item() if expected.numel() else 0.0
            assert diff <= atol, f"{path}: max abs diff {diff:.3g} > {atol}"
        else:
            assert torch.equal(expected, actual), f"{path}: integer tensors differ"
    else:
        assert expected == actual, f"{path}: {expected!r} vs {actual!r}"


def compare(reference, model, **inputs):
    """transformers' outputs == ours on the same inputs."""
    with torch.no_grad():
        expected = reference(**inputs)
        actual = model(**inputs)
    assert_close(expected, actual)
    return expected, actual


def _row(value, b, key=None):
    if key == "mems" and value is not None:  # time-major: batch is dim 1
        return tuple(m[:, b : b + 1] for m in value)
    if isinstance(value, (tuple, list)):
        return type(value)(_row(v, b) for v in value)
    return value[b : b + 1] if torch.is_tensor(value) and value.dim() else value


def compare_rowwise(reference, model, **inputs):
    """Ours on the whole batch == transformers on each row alone. Needed for attn_type "uni" with a padding mask or
    perm_mask: transformers' XLNet crashes there for batch_size > 1 (`attn_mask += data_mask` broadcasts a
    [q, k, 1, 1] tensor in place against [q, k, batch, 1])."""
    inputs = {key: value for key, value in inputs.items() if key != "labels"}  # a batch mean is not per row
    with torch.no_grad():
        actual = model(**inputs)
        for b in range(len(inputs["input_ids"])):
            expected = reference(**{key: _row(value, b, key) for key, value in inputs.items()})
            assert_close(expected, {key: _row(value, b, key) for key, value in actual.items()})
    return actual


def compare_any(reference, model, **inputs):
    """`compare`, or a workaround where transformers' XLNet cannot run the batch itself: attn_type "uni" with a
    padding mask or perm_mask crashes for batch_size > 1. Then ours is compared with transformers row by row, or
    (bi_data, whose rows come in forward / backward pairs) with transformers in "bi" mode given the causal mask as
    part of perm_mask: the same masks and, for every visible pair, the same relative distance."""
    masked = any(inputs.get(key) is not None for key in ("attention_mask", "input_mask", "perm_mask"))
    if reference.config.attn_type != "uni" or not masked:
        return compare(reference, model, **inputs)
    if not reference.config.bi_data:
        return compare_rowwise(reference, model, **inputs)
    assert inputs.get("mems") is None or not reference.config.same_length, "not expressible as a perm_mask"
    bidirectional = copy.deepcopy(reference)
    bidirectional.transformer.attn_type = "bi"
    length = inputs["input_ids"].shape[1]
    causal = torch.ones(length, length).triu(1)
    if reference.config.same_length:
        causal = causal + torch.ones(length, length).tril(-1)
    perm_mask = inputs.get("perm_mask")
    perm_mask = causal.expand(len(inputs["input_ids"]), -1, -1) + (0 if perm_mask is None else perm_mask)
    with torch.no_grad():
        expected = bidirectional(**{**inputs, "perm_mask": perm_mask})
        actual = model(**inputs)
    assert_close(expected, actual)
    return actual


def ids(batch=2, length=7, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(6, VOCAB, (batch, length), generator=generator)


def plm_inputs(batch=2, length=8, num_predict=3, seed=2):
    """A permutation-LM batch: random factorisation orders, the last `num_predict` tokens of each order predicted."""
    generator = torch.Generator().manual_seed(seed)
    perm_mask = torch.zeros(batch, length, length)
    target_mapping = torch.zeros(batch, num_predict, length)
    for b in range(batch):
        order = torch.randperm(length, generator=generator)
        rank = torch.empty(length, dtype=torch.long)
        rank[order] = torch.arange(length)
        # i may not see j when j comes later in the order, or at all when j is a target (its content is hidden)
        is_target = rank >= length - num_predict
        perm_mask[b] = ((rank[None, :] > rank[:, None]) & is_target[None, :]).float()
        for m, position in enumerate(order[-num_predict:].sort().values):
            target_mapping[b, m, position] = 1.0
    return perm_mask, target_mapping


# --------------------------------------------------------------------------------------------------------------
# Parity: every head
# --------------------------------------------------------------------------------------------------------------


def head_inputs(class_name, with_labels):
    inputs = {"input_ids": ids(2, 7)}
    generator = torch.Generator().manual_seed(3)
    if class_name == "XLNetForMultipleChoice":
        inputs = {"input_ids": ids(6, 7).view(2, 3, 7), "attention_mask": torch.ones(2, 3, 7)}
        inputs["attention_mask"][:, :, :2] = 0
        if with_labels:
            inputs["labels"] = torch.tensor([0, 2])
    elif with_labels:
        if class_name == "XLNetLMHeadModel":
            labels = torch.randint(0, VOCAB, (2, 7), generator=generator)
            labels[0, :3] = -100
            inputs["labels"] = labels
        elif class_name == "XLNetForSequenceClassification":
            inputs["labels"] = torch.tensor([1, 0])
        elif class_name == "XLNetForTokenClassification":
            labels = torch.randint(0, 2, (2, 7), generator=generator)
            labels[1, -2:] = -100
            inputs["labels"] = labels
        elif class_name == "XLNetForQuestionAnsweringSimple":
            inputs.update(start_positions=torch.tensor([1, 3]), end_positions=torch.tensor([2, 9]))
        elif class_name == "XLNetForQuestionAnswering":
            inputs.update(
                start_positions=torch.tensor([1, 3]),
                end_positions=torch.tensor([2, 5]),
                cls_index=torch.tensor([6, 6]),
                is_impossible=torch.tensor([0.0, 1.0]),
            )
    return inputs


@pytest.mark.parametrize(
    "class_name,with_labels",
    [(name, False) for name in HEADS] + [(name, True) for name in HEADS if name != "XLNetModel"],
)
def test_every_head_matches_transformers(class_name, with_labels):
    reference, model = make_pair(class_name)
    inputs = head_inputs(class_name, with_labels)
    compare(reference, model, **inputs, output_hidden_states=True)


@pytest.mark.parametrize("problem_type,labels", [
    ("regression", torch.tensor([0.5, -1.0])),
    ("multi_label_classification", torch.tensor([[1.0, 0.0], [1.0, 1.0]])),
])
def test_sequence_classification_losses_match(problem_type, labels):
    num_labels = 1 if problem_type == "regression" else 2
    reference, model = make_pair("XLNetForSequenceClassification", num_labels=num_labels, problem_type=problem_type)
    compare(reference, model, input_ids=ids(), labels=labels)


@pytest.mark.parametrize("summary_type", ["first", "mean", "cls_index"])
def test_sequence_summary_types_match(summary_type):
    reference, model = make_pair("XLNetForSequenceClassification", summary_type=summary_type)
    extra = {"input_ids": ids()}
    compare(reference, model, **extra)


# --------------------------------------------------------------------------------------------------------------
# Parity: inputs and configurations
# --------------------------------------------------------------------------------------------------------------

CONFIGS = {
    "bi": {},
    "uni": {"attn_type": "uni"},
    "uni_same_length": {"attn_type": "uni", "same_length": True},
    "bi_data": {"bi_data": True},
    "clamp_len": {"clamp_len": 3},
    "bi_data_clamp_uni": {"bi_data": True, "clamp_len": 2, "attn_type": "uni"},
    "gelu_new_3_layers": {"ff_activation": "gelu_new", "n_layer": 3},
    "chunked_feed_forward": {"chunk_size_feed_forward": 2},  # transformers chunks the batch dim, we the sequence
}


def padded_inputs():
    attention_mask = torch.ones(2, 7)
    attention_mask[0, :3] = 0  # left padding (XLNet's convention)
    attention_mask[1, -1] = 0
    token_type_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 3, 4]])
    return attention_mask, token_type_ids


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_inputs_match_transformers(config_name):
    reference, model = make_pair("XLNetLMHeadModel", **CONFIGS[config_name])
    attention_mask, token_type_ids = padded_inputs()
    input_ids = ids()
    compare(reference, model, input_ids=input_ids, output_hidden_states=True)
    compare_any(reference, model, input_ids=input_ids, attention_mask=attention_mask)
    compare_any(reference, model, input_ids=input_ids, input_mask=1 - attention_mask)
    compare_any(reference, model, input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    inputs_embeds = model.transformer.word_embedding(input_ids).detach()
    compare(reference, model, inputs_embeds=inputs_embeds, token_type_ids=token_type_ids)


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_query_stream_matches_transformers(config_name):
    """perm_mask + target_mapping: the two-stream path; outputs are the query stream at the targets."""
    reference, model = make_pair("XLNetLMHeadModel", **CONFIGS[config_name])
    perm_mask, target_mapping = plm_inputs(2, 8, 3)
    attention_mask = torch.ones(2, 8)
    attention_mask[1, :2] = 0
    token_type_ids = torch.tensor([[0] * 4 + [1] * 4, [0] * 6 + [1, 2]])
    labels = ids(2, 3, seed=5)
    compare_any(
        reference, model, input_ids=ids(2, 8), perm_mask=perm_mask, target_mapping=target_mapping, labels=labels,
        output_hidden_states=True, output_attentions=True,
    )
    compare_any(
        reference, model, input_ids=ids(2, 8), perm_mask=perm_mask, target_mapping=target_mapping,
        attention_mask=attention_mask, token_type_ids=token_type_ids,
    )
    # perm_mask alone (content stream only) and target_mapping alone (query stream, full visibility)
    compare_any(reference, model, input_ids=ids(2, 8), perm_mask=perm_mask)
    compare(reference, model, input_ids=ids(2, 8), target_mapping=target_mapping)


@pytest.mark.parametrize("config_name", ["bi", "uni", "uni_same_length", "bi_data", "clamp_len"])
@pytest.mark.parametrize("mem_len,reuse_len", [(None, None), (5, None), (6, 4)])
def test_mems_over_two_segments_match_transformers(config_name, mem_len, reuse_len):
    reference, model = make_pair("XLNetLMHeadModel", mem_len=mem_len, reuse_len=reuse_len, **CONFIGS[config_name])
    first, second = ids(2, 7, seed=1), ids(2, 6, seed=2)
    expected, actual = compare(reference, model, input_ids=first, use_mems=True)
    assert len(actual.mems) == TINY["n_layer"]
    kept = min(reuse_len or 7, mem_len or 7)
    assert actual.mems[0].shape == (kept, 2, TINY["d_model"])  # time-major, like transformers
    attention_mask, _ = padded_inputs()
    perm_mask, target_mapping = plm_inputs(2, 6, 2)
    token_type_ids = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        # our mems into transformers and transformers' mems into ours: the memories are interchangeable
        for mems in (expected.mems, actual.mems):
            compare(reference, model, input_ids=second, mems=mems, use_mems=True, token_type_ids=token_type_ids)
            compare_any(reference, model, input_ids=second, mems=mems, perm_mask=perm_mask,
                        target_mapping=target_mapping, attention_mask=attention_mask[:, :6], use_mems=True)


@pytest.mark.parametrize("config_name", ["bi", "bi_data"])
@pytest.mark.parametrize("head", ["language model", "permutation"])
def test_training_gradients_match_transformers(config_name, head):
    """The loss and every parameter's gradient of a training step with memory (our written-out attention backward,
    linear cross-entropy and recomputed feed-forward activation) equal transformers' autograd ones."""
    reference, model = make_pair("XLNetLMHeadModel", mem_len=5, **CONFIGS[config_name])
    with torch.no_grad():
        mems = reference(input_ids=ids(2, 7, seed=1), use_mems=True).mems
    inputs = dict(input_ids=ids(2, 6, seed=2), mems=mems, use_mems=True,
                  token_type_ids=torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 0, 0]]))  # fmt: skip
    if head == "permutation":
        inputs["perm_mask"], inputs["target_mapping"] = plm_inputs(2, 6, 2)
        inputs["labels"] = ids(2, 2, seed=3)
    else:
        inputs["labels"] = inputs["input_ids"].masked_fill(torch.tensor([[0, 0, 1, 0, 0, 0]] * 2).bool(), -100)
    gradients = []
    for side in (reference, model):
        side.train()
        loss = side(**inputs).loss
        loss.backward()
        gradients.append((loss, {name: p.grad for name, p in side.named_parameters() if p.grad is not None}))
    (expected_loss, expected), (loss, actual) = gradients
    for name in [name for name in actual if re.search(r"\.rel_attn\.[qkvor]\.weight$", name)]:
        # (the projections are nn.Linear layers [out, in]; transformers' parameters [d_model, n_head, d_head])
        gradient = actual.pop(name)
        gradient = gradient if name.endswith(".o.weight") else gradient.t()
        actual[name[: -len(".weight")]] = gradient.unflatten(1, (model.config.n_head, -1))
    assert_close(expected_loss, loss)
    assert expected.keys() == actual.keys()
    for name, gradient in expected.items():
        assert_close(gradient, actual[name], path=name)


def test_attention_probabilities_and_eager_path_match():
    """output_attentions=True takes the eager path: same probabilities as transformers, same outputs as fused."""
    reference, model = make_pair("XLNetLMHeadModel", attn_type="uni")
    perm_mask, target_mapping = plm_inputs(2, 8, 3)
    attention_mask = torch.ones(2, 8)
    attention_mask[0, :2] = 0
    for extra in ({}, {"perm_mask": perm_mask, "target_mapping": target_mapping}):
        inputs = dict(input_ids=ids(2, 8), attention_mask=attention_mask, **extra)
        compare_any(reference, model, **inputs, output_attentions=True)
        with torch.no_grad():
            assert_close(model(**inputs).logits, model(**inputs, output_attentions=True).logits, atol=1e-6)


def test_question_answering_top_k_with_p_mask_and_cls_index():
    reference, model = make_pair("XLNetForQuestionAnswering")
    p_mask = torch.zeros(2, 7)
    p_mask[:, :2] = 1
    p_mask[:, -1] = 1
    attention_mask, token_type_ids = padded_inputs()
    compare(reference, model, input_ids=ids(), p_mask=p_mask, cls_index=torch.tensor([6, 5]))
    compare(reference, model, input_ids=ids(), attention_mask=attention_mask, token_type_ids=token_type_ids,
            p_mask=p_mask)
    compare(reference, model, input_ids=ids(), p_mask=p_mask, start_positions=torch.tensor([2, 3]),
            end_positions=torch.tensor([4, 3]), cls_index=torch.tensor([6, 6]), is_impossible=torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize("class_name", HEADS)
def test_tuple_outputs_match(class_name):
    reference, model = make_pair(class_name)
    inputs = head_inputs(class_name, with_labels=True)
    with torch.no_grad():
        expected = reference(**inputs, use_mems=True, return_dict=False)
        actual = model(**inputs, use_mems=True, return_dict=False)
    assert isinstance(actual, tuple)
    assert_close(expected, actual)
    # config.return_dict=False too (the heads still read the base model's output by name)
    reference.config.return_dict = model.config.return_dict = False
    with torch.no_grad():
        assert_close(reference(**inputs), model(**inputs))


# --------------------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mem_len", [4, None])  # 4: the memory is cut while generating
@pytest.mark.parametrize("use_mems", [False, True])
def test_greedy_generation_matches_transformers(use_mems, mem_len):
    reference, model = make_pair("XLNetLMHeadModel", mem_len=mem_len)
    prompt = ids(2, 5)
    settings = dict(max_new_tokens=8, do_sample=False, use_mems=use_mems, pad_token_id=5)
    expected = reference.generate(prompt, **settings)
    actual = model.generate(prompt, **settings)
    assert torch.equal(expected, actual)


def test_sampling_matches_transformers():
    reference, model = make_pair("XLNetLMHeadModel", mem_len=16)
    settings = dict(max_new_tokens=6, do_sample=True, top_k=5, pad_token_id=5)
    torch.manual_seed(3)
    expected = reference.generate(ids(2, 5), **settings)
    torch.manual_seed(3)
    assert torch.equal(expected, model.generate(ids(2, 5), **settings))


def test_generation_in_bfloat16():
    """transformers' XLNet cannot generate in half precision (fp32 position encodings meet bf16 weights); ours can."""
    _, model = make_pair("XLNetLMHeadModel", mem_len=16)
    output = model.to(torch.bfloat16).generate(ids(2, 5), max_new_tokens=4, do_sample=False, pad_token_id=5)
    assert output.shape == (2, 9)


def test_beam_search_matches_transformers():
    reference, model = make_pair("XLNetLMHeadModel", mem_len=16)
    prompt = ids(2, 5)
    settings = dict(max_new_tokens=4, num_beams=3, do_sample=False, pad_token_id=5)
    assert torch.equal(reference.generate(prompt, **settings), model.generate(prompt, **settings))


# --------------------------------------------------------------------------------------------------------------
# Checkpoints both ways, legacy folders
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("class_name", HEADS)
def test_checkpoints_round_trip_both_ways(class_name, tmp_path):
    reference, model = make_pair(class_name)
    inputs = head_inputs(class_name, with_labels=False)

    model.save_pretrained(tmp_path / "ours")
    loaded, info = getattr(transformers, class_name).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    compare(loaded.eval(), model, **inputs)

    reference.save_pretrained(tmp_path / "theirs")
    loaded, info = getattr(ours, class_name).from_pretrained(tmp_path / "theirs", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    compare(reference, loaded.eval(), **inputs)


def test_legacy_transformers_4_folder_loads(tmp_path):
    """A 4.x-style folder: Hub-style config.json (mem_len null, n_token) and a pytorch_model.bin with every key."""
    reference, _ = make_pair("XLNetLMHeadModel")
    config = {
        "architectures": ["XLNetLMHeadModel"], "attn_type": "bi", "bi_data": False, "bos_token_id": 1,
        "clamp_len": -1, "d_head": 8, "d_inner": 37, "d_model": 32, "dropout": 0.1, "end_n_top": 5,
        "eos_token_id": 2, "ff_activation": "gelu", "initializer_range": 0.02, "layer_norm_eps": 1e-12,
        "mem_len": None, "model_type": "xlnet", "n_head": 4, "n_layer": 2, "pad_token_id": 5, "reuse_len": None,
        "same_length": False, "start_n_top": 5, "summary_activation": "tanh", "summary_last_dropout": 0.1,
        "summary_type": "last", "summary_use_proj": True, "n_token": VOCAB, "untie_r": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 250}},
        "transformers_version": "4.37.2",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = reference.state_dict()
    assert "lm_loss.weight" in state  # 4.x files hold the tied copy too
    torch.save(state, tmp_path / "pytorch_model.bin")
    model, info = ours.XLNetLMHeadModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert model.config.vocab_size == VOCAB and model.config.mem_len is None
    assert model.lm_loss.weight.data_ptr() == model.transformer.word_embedding.weight.data_ptr()
    compare(reference, model.eval(), input_ids=ids(), use_mems=True)


def test_hub_configs_load_and_bad_values_raise():
    large_2019 = {"n_token": 32000, "d_model": 1024, "n_head": 16, "d_inner": 4096, "n_layer": 24,
                  "max_position_embeddings": 512, "dropatt": 0.1, "init": "normal", "init_range": 0.1,
                  "init_std": 0.02, "untie_r": True, "ff_activation": "gelu"}
    config = XLNetConfig(**large_2019)
    assert config.vocab_size == 32000 and config.d_head == 64 and config.max_position_embeddings is None
    for field, value, allowed in [
        ("attn_type", "both", "'bi'"),
        ("ff_activation", "gelu_tanh", "gelu_new"),
        ("mem_len", -2, "non-negative"),
        ("d_head", 7, "d_model // n_head"),
        ("summary_type", "attn", "not implemented"),
        ("dropout", 1.0, "[0, 1)"),
        ("n_head", 5, "divisor"),
    ]:
        with pytest.raises(ValueError, match=rf"`{field}`=.*expected.*{__import__('re').escape(allowed)}"):
            XLNetConfig(**{**TINY, field: value})


# --------------------------------------------------------------------------------------------------------------
# Auto classes
# --------------------------------------------------------------------------------------------------------------


def test_auto_classes_opt_in_and_back(tmp_path):
    reference, _ = make_pair("XLNetLMHeadModel")
    reference.save_pretrained(tmp_path)
    # importing the plugin leaves transformers' XLNet in charge
    assert type(transformers.AutoModelForCausalLM.from_pretrained(tmp_path)) is transformers.XLNetLMHeadModel
    transformers_xl.use_for_auto_classes()
    try:
        assert type(transformers.AutoConfig.from_pretrained(tmp_path)) is XLNetConfig
        assert type(transformers.AutoModelForCausalLM.from_pretrained(tmp_path)) is ours.XLNetLMHeadModel
        assert type(transformers.AutoModel.from_pretrained(tmp_path)) is ours.XLNetModel
        # the built-in classes stay reachable explicitly
        assert type(transformers.AutoModel.from_config(transformers.XLNetConfig(**TINY))) is transformers.XLNetModel
    finally:
        transformers_xl.use_builtin_auto_classes()
    assert type(transformers.AutoModelForCausalLM.from_pretrained(tmp_path)) is transformers.XLNetLMHeadModel


def test_exported_folder_loads_as_remote_code(tmp_path):
    reference, model = make_pair("XLNetForSequenceClassification")
    folder = tmp_path / "xlnet-tiny-remote"
    model.save_pretrained(folder)  # the package registers every class for remote code (conversion/remote_code.py)
    for file_name in ("configuration_xlnet.py", "modeling_xlnet.py", "relative_attention.py", "memory_cache.py"):
        assert (folder / file_name).is_file()
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForSequenceClassification"] == "modeling_xlnet.XLNetForSequenceClassification"

    remote = transformers.AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)
    assert type(remote).__name__ == "XLNetForSequenceClassification"
    assert type(remote).__module__.startswith("transformers_modules")  # our code, loaded from the folder
    compare(reference, remote.eval(), input_ids=ids())
    # without trust_remote_code the same folder is an ordinary transformers XLNet checkpoint
    builtin = transformers.AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=False)
    assert type(builtin) is transformers.XLNetForSequenceClassification
    compare(builtin.eval(), model, input_ids=ids())


# --------------------------------------------------------------------------------------------------------------
# Training: Trainer with gradient accumulation, gradient checkpointing, half precision
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("class_name", ["XLNetLMHeadModel", "XLNetForTokenClassification"])
def test_trainer_gradient_accumulation_equals_full_batch(class_name, trainer_step_update):
    """One SGD step (lr 1) with 2 accumulated half batches == one step on the full batch, although the halves hold
    different numbers of labelled tokens (so a per-micro-batch mean / accumulation steps would differ)."""
    generator = torch.Generator().manual_seed(7)
    num_labels = VOCAB if class_name == "XLNetLMHeadModel" else 2
    rows = []
    for i in range(4):
        labels = torch.randint(0, num_labels, (6,), generator=generator)
        labels[: [0, 1, 3, 5][i]] = -100  # 6, 5, 3, 1 labelled tokens: every split into halves is uneven
        rows.append({"input_ids": torch.randint(6, VOCAB, (6,), generator=generator), "labels": labels})

    def make_model():
        torch.manual_seed(0)
        return getattr(ours, class_name)(XLNetConfig(**TINY))

    def one_step(batch_size, accumulation):
        return trainer_step_update(make_model, rows, batch_size, accumulation)

    full, accumulated = one_step(4, 1), one_step(2, 2)
    for name in full:
        assert torch.allclose(full[name], accumulated[name], atol=1e-6, rtol=1e-4), name


NOTHING_TO_PREDICT = {  # labels that are all ignored (-100; QA: answers past the end of the window)
    "XLNetLMHeadModel": {"labels": torch.full((2, 7), -100)},
    "XLNetForSequenceClassification": {"labels": torch.full((2,), -100)},
    "XLNetForTokenClassification": {"labels": torch.full((2, 7), -100)},
    "XLNetForMultipleChoice": {"input_ids": ids(6, 7).view(2, 3, 7), "labels": torch.full((2,), -100)},
    "XLNetForQuestionAnsweringSimple": {"start_positions": torch.tensor([7, 9]), "end_positions": torch.tensor([8, 7])},
}


@pytest.mark.parametrize("num_items_in_batch", [None, 0, torch.tensor(0)])
@pytest.mark.parametrize("class_name", list(NOTHING_TO_PREDICT))
def test_a_batch_with_nothing_to_predict_has_zero_loss_and_zero_gradients(class_name, num_items_in_batch):
    """Not 0 / 0 = NaN, which an optimizer step would write into every weight (Trainer passes a count of 0 when
    no micro-batch of the step has a label)."""
    if num_items_in_batch is not None and not getattr(ours, class_name).accepts_loss_kwargs:
        pytest.skip("Trainer passes num_items_in_batch only to heads that take it")
    _, model = make_pair(class_name)
    model.train()
    inputs = {"input_ids": ids(2, 7), **NOTHING_TO_PREDICT[class_name]}
    if num_items_in_batch is not None:
        inputs["num_items_in_batch"] = num_items_in_batch
    loss = model(**inputs).loss
    loss.backward()
    assert loss.item() == 0.0
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    assert gradients and all(not g.any() for g in gradients)


def test_gradient_checkpointing_gives_the_same_gradients():
    _, model = make_pair("XLNetLMHeadModel", n_layer=3)
    perm_mask, target_mapping = plm_inputs(2, 8, 3)
    inputs = dict(input_ids=ids(2, 8), perm_mask=perm_mask, target_mapping=target_mapping, labels=ids(2, 3, seed=9))
    model.train()
    model(**inputs).loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    # `activation_checkpointing_enable` is the newer name of `gradient_checkpointing_enable`
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    assert all(layer.gradient_checkpointing for layer in model.transformer.layer)
    model(**inputs).loss.backward()
    for name, grad in expected.items():
        assert torch.allclose(grad, dict(model.named_parameters())[name].grad, atol=1e-6), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_with_padding_has_no_nan(dtype):
    _, model = make_pair("XLNetLMHeadModel", attn_type="uni")
    fp32 = model
    model = ours.XLNetLMHeadModel(XLNetConfig(**TINY, attn_type="uni")).eval()
    model.load_state_dict(fp32.state_dict())
    model = model.to(dtype)
    attention_mask = torch.zeros(2, 7)
    attention_mask[0, 4:] = 1  # mostly padding
    attention_mask[1, :] = 1
    perm_mask, target_mapping = plm_inputs(2, 7, 3)
    for extra in ({}, {"perm_mask": perm_mask, "target_mapping": target_mapping}):
        with torch.no_grad():
            half = model(ids(), attention_mask=attention_mask, use_mems=True, **extra)
            full = fp32(ids(), attention_mask=attention_mask, **extra)
        assert half.logits.dtype == dtype and torch.isfinite(half.logits).all()
        assert all(mem.dtype == dtype for mem in half.mems)
        assert (half.logits.float() - full.logits).abs().max() < 0.1
    # a training step in half precision stays finite too
    model.train()
    loss = model(ids(), attention_mask=attention_mask, labels=ids(seed=3)).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# --------------------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inputs,message", [
    (dict(perm_mask=torch.zeros(2, 7, 6)),
     r"`perm_mask` has shape \(2, 7, 6\); expected \[batch_size, seq_len, seq_len\] = \(2, 7, 7\)"),
    (dict(perm_mask=torch.zeros(7, 7)), r"`perm_mask` has shape \(7, 7\); expected"),
    (dict(target_mapping=torch.zeros(2, 3, 8)),
     r"`target_mapping` has shape \(2, 3, 8\); expected \[batch_size, num_predict, seq_len\] = \(2, num_predict"),
    (dict(target_mapping=torch.zeros(3, 1, 7)), r"`target_mapping` has shape \(3, 1, 7\)"),
    (dict(target_mapping=torch.zeros(2, 7)), r"`target_mapping` has shape \(2, 7\)"),
    (dict(token_type_ids=torch.full((2, 7), 5)),
     r"`token_type_ids` has 14 value\(s\) out of range, in \[5, 5\]; expected segment ids in \[0, 4\]"),
    (dict(token_type_ids=torch.full((2, 7), -1)), r"`token_type_ids` has 14 value\(s\) out of range, in \[-1, -1\]"),
    (dict(token_type_ids=torch.zeros(2, 6, dtype=torch.long)), r"`token_type_ids` has shape \(2, 6\)"),
    (dict(attention_mask=torch.ones(2, 8)), r"`attention_mask` has shape \(2, 8\)"),
    (dict(attention_mask=torch.ones(2, 7), input_mask=torch.zeros(2, 7)), r"only one of `attention_mask`"),
    (dict(mems=tuple(torch.zeros(3, 2, 32) for _ in range(3))), r"`mems` has 3 entries; expected one per layer \(2\)"),
    (dict(mems=tuple(torch.zeros(3, 4, 32) for _ in range(2))),
     r"`mems\[0\]` has shape \(3, 4, 32\); expected \[mem_len, batch_size=2, d_model=32\]"),
    (dict(mems=tuple(torch.zeros(2, 3, 32) for _ in range(2))), r"expected \[mem_len, batch_size=2"),
    (dict(mems=(torch.zeros(3, 2, 32), torch.zeros(4, 2, 32))), r"same mem_len for every layer"),
])
def test_bad_inputs_raise_value_errors(inputs, message):
    _, model = make_pair("XLNetLMHeadModel")
    with pytest.raises(ValueError, match=message):
        model(input_ids=ids(2, 7), **inputs)


def test_bad_inputs_more():
    _, model = make_pair("XLNetLMHeadModel", bi_data=True)
    with pytest.raises(ValueError, match="even batch_size, got 3"):
        model(input_ids=ids(3, 7))
    with pytest.raises(ValueError, match="exactly one of `input_ids` and `inputs_embeds`"):
        model()
    expected = r"`inputs_embeds` has shape \(2, 7, 16\); expected \[batch_size, seq_len, d_model=32\]"
    with pytest.raises(ValueError, match=expected):
        model(inputs_embeds=torch.zeros(2, 7, 16))
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['attention_maks'\\]"):
        model(input_ids=ids(), attention_maks=torch.ones(2, 7))
