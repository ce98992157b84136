"""torch.export with dynamic segment and memory lengths, for every class of both models: the exported program gives
eager's outputs at lengths other than the example's, without `mems` (segments up to mem_len: the boundary of
docs/deployment.md) and with them, through transformers' own `DynamoExporter` with `DynamoConfig(dynamic=True)`.
Then the deployment wrapper's one-line refusals."""

import re

import pytest
import torch
from torch.export import Dim
from transformers.exporters.configs import DynamoConfig
from transformers.exporters.exporter_dynamo import DynamoExporter

import transformers_xl
from transformers_xl.deployment.streaming import StreamingModel, check_exportable

MEM_LEN, VOCAB, BATCH = 8, 100, 2
TRANSFO_XL = ["TransfoXLModel", "TransfoXLLMHeadModel", "TransfoXLForSequenceClassification"]
XLNET = ["XLNetModel", "XLNetLMHeadModel", "XLNetForSequenceClassification", "XLNetForTokenClassification",
         "XLNetForMultipleChoice", "XLNetForQuestionAnsweringSimple", "XLNetForQuestionAnswering"]  # fmt: skip
TOP_K = 3  # XLNetForQuestionAnswering's start_n_top and end_n_top: its segments have at least this many tokens


def tiny(name: str, **overrides):
    torch.manual_seed(0)
    if name.startswith("TransfoXL"):
        settings = dict(
            vocab_size=VOCAB, cutoffs=[40], d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32, div_val=2,
            n_layer=1, mem_len=MEM_LEN, tgt_len=MEM_LEN, dropout=0.0, dropatt=0.0, num_labels=3, pad_token_id=0,
        )  # fmt: skip
        config = transformers_xl.TransfoXLConfig(**{**settings, **overrides})
    else:
        settings = dict(
            vocab_size=VOCAB, d_model=16, n_layer=1, n_head=2, d_inner=32, mem_len=MEM_LEN, dropout=0.0,
            num_labels=2 if "QuestionAnswering" in name else 3, start_n_top=TOP_K, end_n_top=TOP_K,
        )  # fmt: skip
        config = transformers_xl.XLNetConfig(**{**settings, **overrides})
    return getattr(transformers_xl, name)(config).eval()


def ids(name, length, seed):
    """Ids [batch, (choices,) length], without the padding id 0 (the classifier would look for the last token)."""
    rows = (BATCH, 2) if name == "XLNetForMultipleChoice" else (BATCH,)
    return torch.randint(1, VOCAB, (*rows, length), generator=torch.Generator().manual_seed(seed))


def memory(name, length, seed):
    rows = 2 * BATCH if name == "XLNetForMultipleChoice" else BATCH
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(length, rows, 16, generator=generator) for _ in range(1))


def tensors(outputs) -> list[torch.Tensor]:
    """Every tensor of a ModelOutput (or of the flat tuple an exported program returns), in order."""
    values = outputs.values() if hasattr(outputs, "values") else outputs
    found = []
    for value in values:
        found += tensors(value) if isinstance(value, (tuple, list)) else [value] if value is not None else []
    return found


def assert_equal_outputs(actual, expected):
    actual, expected = tensors(actual), tensors(expected)
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def shortest(name):
    return TOP_K if name == "XLNetForQuestionAnswering" else 1


@pytest.mark.parametrize("name", TRANSFO_XL + XLNET)
def test_export_without_mems_has_a_dynamic_segment_length(name):
    """Without `mems`: one program for every segment length up to mem_len (the returned memory is the segment)."""
    model = tiny(name)
    segment = Dim("segment", min=shortest(name), max=MEM_LEN)
    seq_axis = 2 if name == "XLNetForMultipleChoice" else 1
    program = torch.export.export(model, (ids(name, 5, 0),), dynamic_shapes=({seq_axis: segment},))
    for length in sorted({shortest(name), 4, MEM_LEN}):
        inputs = ids(name, length, length)
        with torch.no_grad():
            assert_equal_outputs(program.module()(inputs), model(inputs))


@pytest.mark.parametrize("name", TRANSFO_XL + XLNET)
def test_dynamo_exporter_with_mems_has_dynamic_segment_and_memory_lengths(name):
    """transformers' DynamoExporter, `DynamoConfig(dynamic=True)`, with `mems` (it failed in `check_mems`, which
    hashed the traced lengths): eager's outputs at other segment and memory lengths, a decoding step included."""
    model = tiny(name)
    extra = {"use_mems": True} if name.startswith("XLNet") else {}
    example = {"input_ids": ids(name, 5, 0), "mems": memory(name, MEM_LEN, 0), **extra}
    program = DynamoExporter().export(model, dict(example), config=DynamoConfig(dynamic=True)).program
    lengths = [(TOP_K, MEM_LEN), (11, MEM_LEN), (6, 5), (4, MEM_LEN + 4)]
    lengths += [(1, MEM_LEN)] if shortest(name) == 1 else []  # (a decoding step)
    for length, memory_length in lengths:
        inputs = {"input_ids": ids(name, length, length), "mems": memory(name, memory_length, length), **extra}
        with torch.no_grad():
            assert_equal_outputs(program.module()(**inputs), model(**inputs))


def test_transfo_xl_positions_are_exact_integers():
    """The distances k-1 ... -1 built with an integer step (exportable) are the float-step values they replaced."""
    model = tiny("TransfoXLModel")
    positions = model._position_embedding(MEM_LEN + 4, -1, torch.float32, "cpu")
    expected = model.pos_emb(torch.arange(MEM_LEN + 4, -2, -1.0))
    torch.testing.assert_close(positions, expected, atol=0, rtol=0)


@pytest.mark.parametrize(
    "name, overrides, training, expected",
    [
        ("TransfoXLLMHeadModel", {"sample_softmax": 20}, True, "training mode with a sampled softmax"),
        ("XLNetLMHeadModel", {"dropout": 0.1}, True, "XLNetLMHeadModel is in training mode (dropout)"),
        ("TransfoXLLMHeadModel", {"mem_len": 0}, False, "mem_len=0 keeps no memory"),
    ],
)
def test_unsupported_settings_are_refused_in_one_line(name, overrides, training, expected):
    model = tiny(name, **overrides).train(training)
    with pytest.raises(ValueError, match=re.escape(expected)) as error:
        StreamingModel(model)
    assert "\n" not in str(error.value)


def test_a_model_of_another_library_is_refused_in_one_line():
    with pytest.raises(ValueError, match="Linear has no export here; expected one of transformers-xl's") as error:
        check_exportable(torch.nn.Linear(2, 2))
    assert "\n" not in str(error.value)
