"""Converting original TF checkpoints (`transformers-xl convert --from tf`).

The fixtures in fixtures/tf/ were written by real TensorFlow (make_tf_fixtures.py): the original graphs re-created
in conversion/tf_reference.py, random weights, Saver V2 checkpoints, and the graphs' outputs over several segments
with memory (language models) or one batch (fine-tuning heads). TensorFlow is not needed to run these tests.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from transformers_xl.conversion.tf_bundle import CheckpointError, TFCheckpoint
from transformers_xl.conversion.tf_checkpoint import read_tf_checkpoint, squad_difference


FIXTURES = Path(__file__).parent / "fixtures" / "tf"
TXL_CASES = ["txl_div1", "txl_div1_proj_untied", "txl_div2", "txl_div2_untied_no_same_dim", "txl_no_cutoffs"]
ATOL = 1e-5


def txl_args(case):
    folder = FIXTURES / case
    return folder, folder / "train_flags.json", folder / "corpus-info.json"


def xlnet_args(case):
    folder = FIXTURES / case
    return folder, folder / "xlnet_config.json"


def load(converted):
    model = converted.model_class(converted.config)
    model.load_state_dict(converted.state_dict, strict=True)
    return model.eval()


def close(ours, theirs):
    theirs = torch.from_numpy(np.asarray(theirs))
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours.float(), theirs.float(), atol=ATOL, rtol=0)


# ----- outputs match the TF graph ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", TXL_CASES)
def test_transfo_xl_reproduces_the_tf_graph_over_segments(case):
    converted = read_tf_checkpoint(*txl_args(case))
    config = converted.config
    assert (config.layer_norm_epsilon, config.same_length_span, config.zero_initial_mems) == (1e-12, 1, True)
    model = load(converted)
    expected = np.load(FIXTURES / case / "expected.npz")
    mems = None
    with torch.no_grad():
        for segment in range(expected["input_ids"].shape[0]):  # the first starts from zero memory, as in TF
            ids = torch.from_numpy(expected["input_ids"][segment]).t().long()
            output = model(ids, mems=mems)
            mems = output.mems
            close(output.logits, expected["log_probs"][segment].transpose(1, 0, 2))
            close(torch.stack(mems), expected["mems"][segment])


def segment_inputs(expected, segment):
    """Our (batch-first) inputs from the fixture's time-major TF inputs of one segment."""
    def get(key):
        return torch.from_numpy(expected[f"{segment}/input/{key}"])

    inputs = {"input_ids": get("input_ids").t().long(), "token_type_ids": get("seg_ids").t().long()}
    if f"{segment}/input/input_mask" in expected:
        inputs["input_mask"] = get("input_mask").t()
    return inputs


def test_xlnet_language_model_reproduces_the_tf_graph_over_segments():
    converted = read_tf_checkpoint(*xlnet_args("xlnet_lm"))
    assert converted.config.ff_activation == "gelu_new" and converted.config.mem_len == 6
    model = load(converted)
    expected = np.load(FIXTURES / "xlnet_lm" / "expected.npz")
    mems = None
    with torch.no_grad():
        for segment in range(3):
            output = model(**segment_inputs(expected, segment), mems=mems, use_mems=True)
            mems = output.mems
            close(output.logits, expected[f"{segment}/output/lm"].transpose(1, 0, 2))
            close(torch.stack(mems), expected[f"{segment}/output/mems"])
    mask_emb = TFCheckpoint(FIXTURES / "xlnet_lm" / "model.ckpt-2000").read("model/transformer/mask_emb/mask_emb")
    assert torch.equal(model.transformer.mask_emb, mask_emb)


@pytest.mark.parametrize("task, num_labels", [("mnli", 3), ("sts-b", 1)])
def test_xlnet_sequence_classification_and_regression_heads(task, num_labels):
    converted = read_tf_checkpoint(*xlnet_args("xlnet_glue"), task=task)
    assert converted.model_class.__name__ == "XLNetForSequenceClassification"
    assert converted.config.num_labels == num_labels and converted.config.finetuning_task == task
    assert (converted.config.problem_type == "regression") == (num_labels == 1)
    model = load(converted)
    expected = np.load(FIXTURES / "xlnet_glue" / "expected.npz")
    with torch.no_grad():
        logits = model(**segment_inputs(expected, 0)).logits
    kind = "classification" if num_labels > 1 else "regression"
    close(logits.view(-1) if num_labels == 1 else logits, expected[f"0/output/{kind}_{task}"])


def test_xlnet_multiple_choice_head():
    converted = read_tf_checkpoint(*xlnet_args("xlnet_race"))
    assert converted.model_class.__name__ == "XLNetForMultipleChoice"
    assert converted.config.ff_activation == "relu"
    model = load(converted)
    expected = np.load(FIXTURES / "xlnet_race" / "expected.npz")
    inputs = {key: value.reshape(2, 2, -1) for key, value in segment_inputs(expected, 0).items()}
    with torch.no_grad():
        close(model(**inputs).logits, expected["0/output/race"])


def test_xlnet_squad_heads():
    converted = read_tf_checkpoint(*xlnet_args("xlnet_squad"))
    assert converted.model_class.__name__ == "XLNetForQuestionAnswering"
    assert (converted.config.start_n_top, converted.config.end_n_top) == (3, 2)
    model = load(converted)
    expected = np.load(FIXTURES / "xlnet_squad" / "expected.npz")
    inputs = segment_inputs(expected, 0)
    with torch.no_grad():
        output = model(
            **inputs,
            p_mask=torch.from_numpy(expected["0/input/p_mask"]),
            cls_index=torch.from_numpy(expected["0/input/cls_index"]).long(),
        )
    reference = {key.removeprefix("0/output/"): expected[key] for key in expected if key.startswith("0/output/")}
    assert squad_difference(output, reference, 3, 2) < ATOL
