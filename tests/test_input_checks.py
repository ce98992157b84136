"""Bad input fails with a clear error before any computation, for both models and every head (modeling/input_checks.py);
half precision stays finite on fully padded rows and fully masked queries."""

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

import transformers_xl
import transformers_xl.modeling.modeling_transfo_xl as transfo_xl
import transformers_xl.modeling.modeling_xlnet as xlnet
from transformers_xl import TransfoXLConfig
from transformers_xl.modeling.configuration_xlnet import XLNetConfig

VOCAB, BATCH, LENGTH, CHOICES, MEM_LEN, D_MODEL = 60, 2, 5, 3, 4, 16
# every model class of both modeling files
TRANSFO_XL_HEADS = [name for name in transfo_xl.__all__ if not name.endswith("PreTrainedModel")]
HEADS = TRANSFO_XL_HEADS + [name for name in xlnet.__all__ if name.startswith("XLNet") and "PreTrained" not in name]
LABELLED_HEADS = [name for name in HEADS if name not in ("TransfoXLModel", "XLNetModel")]


def build(name, **overrides):
    torch.manual_seed(0)
    if name.startswith("TransfoXL"):
        config = TransfoXLConfig(
            vocab_size=VOCAB, cutoffs=[20, 40], d_model=D_MODEL, d_embed=D_MODEL, n_head=2, d_head=8, d_inner=24,
            div_val=2, n_layer=2, mem_len=MEM_LEN, tgt_len=LENGTH, dropout=0.0, dropatt=0.0, pad_token_id=0,
            **overrides,
        )  # fmt: skip
        return getattr(transformers_xl, name)(config).eval()
    config = XLNetConfig(
        vocab_size=VOCAB, d_model=D_MODEL, n_head=2, d_inner=24, n_layer=2, dropout=0.0, summary_last_dropout=0.0,
        mem_len=MEM_LEN, start_n_top=2, end_n_top=2, pad_token_id=0, **overrides,
    )  # fmt: skip
    return getattr(xlnet, name)(config).eval()


def token_ids(name, seed=0):
    shape = (BATCH, CHOICES, LENGTH) if name == "XLNetForMultipleChoice" else (BATCH, LENGTH)
    return torch.randint(1, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def labels_for(name):
    """Valid labels (or span positions) for the head."""
    if name.endswith("LMHeadModel"):
        return {"labels": token_ids(name, seed=1)}
    if name.endswith("TokenClassification"):
        return {"labels": torch.tensor([[0, 1, 1, 0, -100], [1, 1, 0, 0, 1]])}
    if name.endswith("MultipleChoice"):
        return {"labels": torch.tensor([0, 2])}
    if name.startswith("XLNetForQuestionAnswering"):
        return {"start_positions": torch.tensor([1, 3]), "end_positions": torch.tensor([2, 4])}
    return {"labels": torch.tensor([1, 0])}  # sequence classification


def mems_for(name, dtype=torch.float32, device="cpu"):
    rows = BATCH * CHOICES if name == "XLNetForMultipleChoice" else BATCH
    return tuple(torch.zeros(MEM_LEN, rows, D_MODEL, dtype=dtype, device=device) for _ in range(2))


@contextmanager
def nothing_computed(model, modules=None):
    """Fails the test if any leaf module (embedding, linear, norm: where the computation happens) runs, or any of
    `modules` when given."""

    def refuse(module, args):
        raise AssertionError(f"{type(module).__name__} ran before the input was refused")

    modules = modules if modules is not None else [m for m in model.modules() if not any(m.children())]
    handles = [module.register_forward_pre_hook(refuse) for module in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def refused(model, error, match, **inputs):
    with nothing_computed(model), pytest.raises(error, match=match):
        model(**inputs)


# --- labels ----------------------------------------------------------------------------------------------------


def wrong_shape_labels(name):
    if name.startswith("XLNetForQuestionAnswering"):
        return {"start_positions": torch.tensor([1, 3, 0]), "end_positions": torch.tensor([2, 4, 0])}, "start_positions"
    if name.endswith(("LMHeadModel", "TokenClassification")):
        return {"labels": labels_for(name)["labels"][:, :-1]}, "labels"  # [1, 2] labels for [1, 3] ids, say
    return {"labels": torch.tensor([[1, 0], [0, 1]])}, "labels"


@pytest.mark.parametrize("name", LABELLED_HEADS)
def test_labels_whose_shape_does_not_match_the_inputs_are_refused(name):
    model = build(name)
    bad, argument = wrong_shape_labels(name)
    model(input_ids=token_ids(name), **labels_for(name))  # the right shape passes
    refused(model, ValueError, rf"{name}: `{argument}` has shape .*; expected \[batch_size", input_ids=token_ids(name),
            **bad)  # fmt: skip


@pytest.mark.parametrize("name", ["XLNetLMHeadModel", "XLNetForTokenClassification"])
def test_labels_follow_target_mapping(name):
    """With `target_mapping`, per-token labels are one per prediction: [batch_size, num_predict]."""
    model = build(name)
    target_mapping = F.one_hot(torch.tensor([[1, 3], [0, 4]]), LENGTH).float()
    model(input_ids=token_ids(name), target_mapping=target_mapping, labels=torch.tensor([[1, 0], [0, 1]]))
    refused(model, ValueError, r"`labels` has shape \(2, 5\); expected \[batch_size, num_predict\] = \(2, 2\)",
            input_ids=token_ids(name), target_mapping=target_mapping, **labels_for(name))  # fmt: skip


# --- mems ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HEADS)
def test_mems_of_another_dtype_are_refused(name):
    model = build(name)
    model(input_ids=token_ids(name), mems=mems_for(name))
    refused(model, TypeError, r"`mems\[0\]` has dtype torch.float64; expected torch.float32",
            input_ids=token_ids(name), mems=mems_for(name, torch.float64))  # fmt: skip


@pytest.mark.parametrize("name", HEADS)
def test_mems_on_another_device_are_refused(name):
    """The meta device stands in for a GPU: any device other than the model's is refused."""
    model = build(name)
    refused(model, ValueError, r"`mems\[0\]` is on device meta; expected cpu",
            input_ids=token_ids(name), mems=mems_for(name, device="meta"))  # fmt: skip


def test_mems_under_autocast_are_accepted():
    """Under autocast the hidden states may be in the autocast dtype: mems in it pass."""
    for name in ("TransfoXLLMHeadModel", "XLNetLMHeadModel"):
        model = build(name)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=token_ids(name), mems=mems_for(name, torch.bfloat16))
        assert torch.isfinite(out.logits).all()


def test_a_cache_of_another_dtype_is_refused():
    for name in ("TransfoXLLMHeadModel", "XLNetLMHeadModel"):
        model = build(name)
        cache = xlnet.MemoryCache.from_mems(mems_for(name, torch.float64), MEM_LEN)
        refused(model, TypeError, r"`mems\[0\]` has dtype torch.float64", input_ids=token_ids(name), cache=cache)


# --- input_ids -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HEADS)
def test_float_input_ids_are_refused(name):
    model = build(name)
    refused(model, TypeError, r"`input_ids` has dtype torch.float32; expected integer token ids",
            input_ids=token_ids(name).float())  # fmt: skip


@pytest.mark.parametrize("name", HEADS)
def test_input_ids_without_a_batch_dimension_are_refused(name):
    model = build(name)
    expected = r"\[batch_size, num_choices, seq_len\]" if name.endswith("MultipleChoice") else r"\[batch_size, seq_len\]"
    refused(model, ValueError, rf"`input_ids`.*\(5,\).*expected {expected}|expected `input_ids` {expected}.*\(3, 5\)",
            input_ids=token_ids(name)[0])  # fmt: skip


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("empty", ["no tokens", "no sequences", "no embedded tokens"])
def test_empty_sequences_are_refused(name, empty):
    model = build(name)
    ids = token_ids(name)
    if empty == "no tokens":
        inputs = {"input_ids": ids[..., :0]}
    elif empty == "no sequences":
        inputs = {"input_ids": ids[:0]}
    else:
        inputs = {"inputs_embeds": torch.zeros(*ids[..., :0].shape, D_MODEL)}
    refused(model, ValueError, r"has shape .*; expected at least one sequence of one token or more", **inputs)


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("bad_id", [VOCAB, 10 * VOCAB, -1])
def test_ids_outside_the_vocabulary_are_refused(name, bad_id):
    model = build(name)
    ids = token_ids(name)
    ids[0, ..., 2] = bad_id
    refused(model, ValueError,
            rf"`input_ids` has \d+ value\(s\) out of range, in \[{bad_id}, {bad_id}\]; expected token ids in "
            rf"\[0, {VOCAB - 1}\] \(vocab_size={VOCAB}\)", input_ids=ids)  # fmt: skip


# --- attention_mask --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("shape", ["one row too many", "no batch dimension"])
def test_attention_mask_of_the_wrong_shape_is_refused(name, shape):
    model = build(name)
    ids = token_ids(name)
    mask = torch.ones(BATCH + 1, *ids.shape[1:]) if shape == "one row too many" else torch.ones(ids.shape[1:])
    refused(model, ValueError, r"`attention_mask` has shape .*; expected \[batch_size", input_ids=ids,
            attention_mask=mask)  # fmt: skip


@pytest.mark.parametrize("name", TRANSFO_XL_HEADS)
def test_transfo_xl_attention_mask_must_cover_the_segment(name):
    """Transformer-XL's mask covers at least the segment (or the history before it too, as in `generate`): fewer
    columns are refused."""
    model = build(name)
    refused(model, ValueError, "attention_mask has 3 columns; expected at least the segment length",
            input_ids=token_ids(name), mems=mems_for(name), attention_mask=torch.ones(BATCH, 3))  # fmt: skip
    model(input_ids=token_ids(name), mems=mems_for(name), attention_mask=torch.ones(BATCH, MEM_LEN + LENGTH))


# --- labels out of range ---------------------------------------------------------------------------------------

OUT_OF_RANGE = [
    ("TransfoXLLMHeadModel", {}, torch.full((BATCH, LENGTH), VOCAB), rf"expected token ids in \[0, {VOCAB - 1}\]"),
    ("XLNetLMHeadModel", {}, torch.full((BATCH, LENGTH), -2), rf"expected token ids in \[0, {VOCAB - 1}\]"),
    ("TransfoXLForSequenceClassification", {}, torch.tensor([1, 2]), r"expected class ids in \[0, 1\]"),
    ("XLNetForSequenceClassification", {}, torch.tensor([-1, 0]), r"expected class ids in \[0, 1\]"),
    ("XLNetForSequenceClassification", {"num_labels": 3, "problem_type": "single_label_classification"},
     torch.tensor([[3], [0]]), r"expected class ids in \[0, 2\] \(num_labels=3\) or -100"),
    ("TransfoXLForSequenceClassification", {"problem_type": "multi_label_classification"},
     torch.tensor([[0.0, 2.0], [1.0, 0.0]]), r"expected multi-label targets in \[0, 1\]"),
    ("XLNetForSequenceClassification", {"problem_type": "multi_label_classification"},
     torch.tensor([[0.0, 1.0], [-1.0, 0.0]]), r"expected multi-label targets in \[0, 1\]"),
    ("XLNetForTokenClassification", {}, torch.tensor([[0, 1, 2, 0, 1], [0] * 5]), r"expected class ids in \[0, 1\]"),
    ("XLNetForMultipleChoice", {}, torch.tensor([0, CHOICES]), r"expected choice indices in \[0, 2\]"),
]  # fmt: skip


@pytest.mark.parametrize("name,config,labels,message", OUT_OF_RANGE, ids=[f"{c[0]}-{i}" for i, c in enumerate(OUT_OF_RANGE)])
def test_labels_outside_the_label_range_are_refused(name, config, labels, message):
    model = build(name, **config)
    refused(model, ValueError, rf"`labels` has \d+ value\(s\) out of range.*{message}", input_ids=token_ids(name),
            labels=labels)  # fmt: skip


@pytest.mark.parametrize(
    "name,config,labels",
    [
        ("TransfoXLForSequenceClassification", {}, torch.tensor([-100, 1])),  # -100: ignored
        ("XLNetForSequenceClassification", {}, torch.tensor([[1], [-100]])),
        ("XLNetForMultipleChoice", {}, torch.tensor([-100, 2])),
        ("XLNetForTokenClassification", {}, torch.tensor([[-100] * 5, [1, 0, -100, 1, 1]])),
        ("TransfoXLForSequenceClassification", {"num_labels": 1}, torch.tensor([7.5, -3.0])),  # regression: any value
        ("XLNetForSequenceClassification", {"num_labels": 1}, torch.tensor([[7.5], [-3.0]])),
        ("XLNetForSequenceClassification", {"num_labels": 2, "problem_type": "regression"},
         torch.tensor([[7.5, 1.0], [-3.0, 0.0]])),
        ("XLNetForSequenceClassification", {"problem_type": "multi_label_classification"},
         torch.tensor([[0.0, 1.0], [0.25, 1.0]])),
    ],
)  # fmt: skip
def test_ignored_regression_and_multi_label_labels_pass(name, config, labels):
    model = build(name, **config)
    assert torch.isfinite(model(input_ids=token_ids(name), labels=labels).loss)


def test_regression_labels_of_the_wrong_shape_are_refused():
    model = build("XLNetForSequenceClassification", num_labels=2, problem_type="regression")
    refused(model, ValueError, r"`labels` has shape \(2,\); expected \[batch_size, num_labels\] = \(2, 2\) for regression",
            input_ids=token_ids("XLNetModel"), labels=torch.tensor([1.0, 2.0]))  # fmt: skip


# --- span positions --------------------------------------------------------------------------------------------


def test_simple_qa_ignores_positions_past_the_end_and_refuses_negative_ones():
    """transformers' behaviour: positions >= seq_len (the answer lies outside this window) are ignored. Negative
    positions, which transformers would clamp to 0 and train on, are refused."""
    model = build("XLNetForQuestionAnsweringSimple")
    ids = token_ids("XLNetModel")
    out = model(input_ids=ids, start_positions=torch.tensor([1, LENGTH + 3]), end_positions=torch.tensor([2, 3]))
    with torch.no_grad():
        logits = model(input_ids=ids)
    expected = (F.cross_entropy(logits.start_logits[:1], torch.tensor([1])) + F.cross_entropy(logits.end_logits,
                torch.tensor([2, 3]))) / 2  # fmt: skip
    torch.testing.assert_close(out.loss, expected)
    refused(model, ValueError, r"`end_positions` has 1 value\(s\) out of range, in \[-1, -1\]; expected token "
            r"positions >= 0 \(positions past the end of the sequence are ignored", input_ids=ids, start_positions=torch.tensor([1, 2]),
            end_positions=torch.tensor([-1, 3]))  # fmt: skip


def test_simple_qa_needs_two_labels():
    """One start and one end logit per token: any other `num_labels` would fail deep in the forward (transformers'
    too), so the model refuses to be built."""
    with pytest.raises(ValueError, match=r"config.num_labels=3; expected 2"):
        xlnet.XLNetForQuestionAnsweringSimple(XLNetConfig(vocab_size=50, d_model=16, n_layer=1, n_head=2, d_inner=32,
                                                          num_labels=3))  # fmt: skip


@pytest.mark.parametrize("field,value", [("start_positions", LENGTH), ("end_positions", -1), ("cls_index", 9)])
def test_qa_refuses_positions_outside_the_sequence(field, value):
    model = build("XLNetForQuestionAnswering")
    inputs = {**labels_for("XLNetForQuestionAnswering"), "cls_index": torch.tensor([4, 4]),
              "is_impossible": torch.tensor([0.0, 1.0])}  # fmt: skip
    model(input_ids=token_ids("XLNetModel"), **inputs)
    inputs[field] = torch.tensor([0, value])
    refused(model, ValueError, rf"`{field}` has 1 value\(s\) out of range, in \[{value}, {value}\]; expected token "
            r"positions in \[0, 4\]\.", input_ids=token_ids("XLNetModel"), **inputs)  # fmt: skip


# --- half precision --------------------------------------------------------------------------------------------


def padded_inputs(name):
    """Row 0 entirely padding; row 1 left-padded, so its first query may attend to nothing (Transformer-XL: causal and
    padded; XLNet: a query stream hidden from every token by perm_mask). Labels ignore the padding."""
    ids = token_ids(name)
    mask = torch.ones(ids.shape)
    mask[0] = 0
    mask[1, ..., 0] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, **labels_for(name)}
    if "labels" in inputs and inputs["labels"].shape == ids.shape:
        inputs["labels"] = inputs["labels"].masked_fill(mask == 0, -100)
    if name.startswith("XLNet") and not name.endswith("MultipleChoice"):
        inputs["perm_mask"] = torch.ones(BATCH, LENGTH, LENGTH)  # no query sees any token: fully masked queries
        inputs["target_mapping"] = F.one_hot(torch.tensor([[0, 3], [1, 4]]), LENGTH).float()
        if name.endswith(("LMHeadModel", "TokenClassification")):
            inputs["labels"] = torch.tensor([[1, 0], [0, 1]])
        elif name.startswith("XLNetForQuestionAnswering"):
            inputs.update(start_positions=torch.tensor([0, 1]), end_positions=torch.tensor([1, 1]))
        if name == "XLNetForQuestionAnswering":
            inputs["p_mask"] = torch.tensor([[1.0, 1.0], [0.0, 1.0]])  # no admissible answer position in row 0
    return inputs


def floating_tensors(value):
    if torch.is_tensor(value):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in floating_tensors(v)]
    return []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "name,with_labels", [(name, False) for name in HEADS] + [(name, True) for name in LABELLED_HEADS]
)
@pytest.mark.parametrize("attention", ["fused", "explicit"])
def test_half_precision_fully_padded_rows_and_fully_masked_queries_stay_finite(dtype, name, with_labels, attention):
    """Both attention paths: torch's fused kernel (inference) and the explicit scores (gradients, or attentions)."""
    model = build(name).to(dtype)
    inputs = padded_inputs(name)
    if not with_labels:
        inputs = {k: v for k, v in inputs.items() if k not in ("labels", "start_positions", "end_positions")}
    with torch.no_grad():
        out = model(**inputs, output_attentions=attention == "explicit")
    tensors = floating_tensors(dict(out))
    assert tensors and all(torch.isfinite(t).all() for t in tensors), [k for k, v in out.items()]


def test_a_config_edited_after_it_was_built_is_checked_by_the_model():
    """transformers' own tests (and users) set fields on a built config: a vocabulary below Transformer-XL's cutoffs
    is named, not a negative tensor size deep in the adaptive embedding. (XLNet models also take transformers' own
    XLNetConfig, which has no such checks.)"""
    config = build("TransfoXLModel").config
    config.vocab_size = 3
    with pytest.raises(ValueError, match="TransfoXLConfig: invalid `cutoffs`"):
        transformers_xl.TransfoXLModel(config)
