"""Converting original TF checkpoints (`transformers-xl convert --from tf`).

The fixtures in fixtures/tf/ were written by real TensorFlow (make_tf_fixtures.py): the original graphs re-created
in conversion/tf_reference.py, random weights, Saver V2 checkpoints, and the graphs' outputs over several segments
with memory (language models) or one batch (fine-tuning heads). TensorFlow is not needed to run these tests.
"""

import importlib.util
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import sentencepiece
import torch
import transformers

import transformers_xl
from transformers_xl import TransfoXLLMHeadModel
from transformers_xl.cli import main
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
# Through the command: the folder it writes, loaded back, reproduces the graph; XLNet folders load in transformers'
# own XLNet too (no remote code) and give the same numbers.


def convert(source, output, *options) -> int:
    return main(["convert", str(source), str(output), "--from", "tf", *map(str, options)])


def converted_folder(case, tmp_path, *options) -> Path:
    folder = FIXTURES / case
    if case.startswith("txl"):
        options = ("--config", folder / "train_flags.json", "--corpus-info", folder / "corpus-info.json", *options)
    else:
        options = ("--config", folder / "xlnet_config.json", *options)
    assert convert(folder, tmp_path / "out", *options) == 0
    return tmp_path / "out"


def xlnet_models(folder, head):
    """Ours and transformers' own class for the folder's head, both from the folder."""
    assert json.loads((folder / "config.json").read_text())["architectures"] == [head]
    return [getattr(module, head).from_pretrained(folder).eval() for module in (transformers_xl, transformers)]


@pytest.mark.parametrize("case", TXL_CASES)
def test_transfo_xl_reproduces_the_tf_graph_over_segments(case, tmp_path):
    model = TransfoXLLMHeadModel.from_pretrained(converted_folder(case, tmp_path)).eval()
    config = model.config
    assert (config.layer_norm_epsilon, config.same_length_span, config.zero_initial_mems) == (1e-12, 1, True)
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


def test_xlnet_language_model_reproduces_the_tf_graph_over_segments(tmp_path):
    spiece = Path(__file__).parent / "fixtures" / "hf_legacy" / "xlnet_lm" / "spiece.model"
    folder = converted_folder("xlnet_lm", tmp_path, "--vocab", spiece)
    expected = np.load(FIXTURES / "xlnet_lm" / "expected.npz")
    for model in xlnet_models(folder, "XLNetLMHeadModel"):
        assert model.config.ff_activation == "gelu_new" and model.config.mem_len == 6
        mems = None
        with torch.no_grad():
            for segment in range(3):
                output = model(**segment_inputs(expected, segment), mems=mems, use_mems=True)
                mems = output.mems
                close(output.logits, expected[f"{segment}/output/lm"].transpose(1, 0, 2))
                close(torch.stack(mems), expected[f"{segment}/output/mems"])
        mask_emb = TFCheckpoint(FIXTURES / "xlnet_lm" / "model.ckpt-2000").read("model/transformer/mask_emb/mask_emb")
        assert torch.equal(model.transformer.mask_emb, mask_emb)
    # --vocab spiece.model: the folder's tokenizer is that SentencePiece model, then <sep> <cls> as XLNet appends them
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(spiece))
    expected_ids = pieces.encode("the was at") + [pieces.piece_to_id("<sep>"), pieces.piece_to_id("<cls>")]
    assert transformers.AutoTokenizer.from_pretrained(folder)("the was at")["input_ids"] == expected_ids


def test_a_vocabulary_beside_the_checkpoint_is_found(tmp_path):
    """The released XLNet zips hold spiece.model beside xlnet_model.ckpt: the folder gets the tokenizer."""
    source = copy_case("xlnet_lm", tmp_path)
    shutil.copy(Path(__file__).parent / "fixtures" / "hf_legacy" / "xlnet_lm" / "spiece.model", source)
    assert convert(source, tmp_path / "out", "--config", source / "xlnet_config.json") == 0
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "out").convert_ids_to_tokens(3) == "<cls>"


@pytest.mark.parametrize("task, num_labels", [("mnli", 3), ("sts-b", 1)])
def test_xlnet_sequence_classification_and_regression_heads(task, num_labels, tmp_path):
    folder = converted_folder("xlnet_glue", tmp_path, "--task", task)
    expected = np.load(FIXTURES / "xlnet_glue" / "expected.npz")
    kind = "classification" if num_labels > 1 else "regression"
    for model in xlnet_models(folder, "XLNetForSequenceClassification"):
        assert model.config.num_labels == num_labels and model.config.finetuning_task == task
        assert (model.config.problem_type == "regression") == (num_labels == 1)
        with torch.no_grad():
            logits = model(**segment_inputs(expected, 0)).logits
        close(logits.view(-1) if num_labels == 1 else logits, expected[f"0/output/{kind}_{task}"])


def test_xlnet_multiple_choice_head(tmp_path):
    folder = converted_folder("xlnet_race", tmp_path)
    expected = np.load(FIXTURES / "xlnet_race" / "expected.npz")
    inputs = {key: value.reshape(2, 2, -1) for key, value in segment_inputs(expected, 0).items()}
    for model in xlnet_models(folder, "XLNetForMultipleChoice"):
        assert model.config.ff_activation == "relu"
        with torch.no_grad():
            close(model(**inputs).logits, expected["0/output/race"])


def test_xlnet_squad_heads(tmp_path):
    folder = converted_folder("xlnet_squad", tmp_path)
    expected = np.load(FIXTURES / "xlnet_squad" / "expected.npz")
    reference = {key.removeprefix("0/output/"): expected[key] for key in expected if key.startswith("0/output/")}
    for model in xlnet_models(folder, "XLNetForQuestionAnswering"):
        assert (model.config.start_n_top, model.config.end_n_top) == (3, 2)
        with torch.no_grad():
            output = model(
                **segment_inputs(expected, 0),
                p_mask=torch.from_numpy(expected["0/input/p_mask"]),
                cls_index=torch.from_numpy(expected["0/input/cls_index"]).long(),
            )
        assert squad_difference(output, reference, 3, 2) < ATOL


# ----- finding the checkpoint --------------------------------------------------------------------------------------


def copy_case(case, tmp_path):
    return Path(shutil.copytree(FIXTURES / case, tmp_path / case))


def test_source_may_be_a_prefix_an_index_file_or_a_folder_whose_state_file_names_another_machine(tmp_path):
    folder = copy_case("txl_div1", tmp_path)
    by_folder = read_tf_checkpoint(*txl_args("txl_div1")).state_dict
    for source in (folder / "model.ckpt-1000", folder / "model.ckpt-1000.index"):
        converted = read_tf_checkpoint(source, folder / "train_flags.json", folder / "corpus-info.json")
        assert all(torch.equal(converted.state_dict[k], v) for k, v in by_folder.items())
    # The state file of a training run names absolute paths of the machine that trained.
    (folder / "checkpoint").write_text('model_checkpoint_path: "/cluster/run7/model.ckpt-1000"\n')
    converted = read_tf_checkpoint(folder, folder / "train_flags.json", folder / "corpus-info.json")
    assert converted.state_dict.keys() == by_folder.keys()
    (folder / "checkpoint").write_text('model_checkpoint_path: "/cluster/run7/model.ckpt-2000"\n')
    with pytest.raises(CheckpointError, match=r"names '/cluster/run7/model.ckpt-2000', which is neither there nor in"):
        read_tf_checkpoint(folder, folder / "train_flags.json", folder / "corpus-info.json")
    (folder / "checkpoint").unlink()
    with pytest.raises(CheckpointError, match=r"no `checkpoint` state file.*found model.ckpt-1000.index"):
        read_tf_checkpoint(folder, folder / "train_flags.json", folder / "corpus-info.json")
    with pytest.raises(CheckpointError, match=r"nor a checkpoint prefix \(no .*model.ckpt-5.index\)"):
        read_tf_checkpoint(folder / "model.ckpt-5", folder / "train_flags.json", folder / "corpus-info.json")


def test_training_state_is_ignored():
    names = TFCheckpoint(FIXTURES / "txl_div1" / "model.ckpt-1000").entries
    assert {"global_step", "beta1_power", "beta2_power", "transformer/r_w_bias/Adam_1"} <= names.keys()
    assert "model/transformer/seg_embed/adam_v" in TFCheckpoint(FIXTURES / "xlnet_lm" / "model.ckpt-2000").entries
    assert "transformer.layers.0.dec_attn.r_w_bias" in read_tf_checkpoint(*txl_args("txl_div1")).state_dict


# ----- damaged files -----------------------------------------------------------------------------------------------


def test_truncated_or_corrupt_files_are_reported(tmp_path):
    folder = copy_case("txl_div2", tmp_path)
    args = (folder, folder / "train_flags.json", folder / "corpus-info.json")
    data = folder / "model.ckpt-1000.data-00000-of-00001"
    original = data.read_bytes()
    data.write_bytes(original[: len(original) // 2])
    truncated = r"model.ckpt-1000.data-00000-of-00001 is truncated \(\d+ bytes; variable '.+' needs bytes"
    with pytest.raises(CheckpointError, match=truncated):
        read_tf_checkpoint(*args)
    corrupt = bytearray(original)
    corrupt[len(corrupt) // 2] ^= 0xFF
    data.write_bytes(bytes(corrupt))
    with pytest.raises(CheckpointError, match=r"'transformer/.+' is corrupt \(checksum mismatch\)"):
        read_tf_checkpoint(*args)
    data.write_bytes(original)
    index = folder / "model.ckpt-1000.index"
    index.write_bytes(index.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"model.ckpt-1000.index is truncated or not a TF checkpoint index"):
        read_tf_checkpoint(*args)
    data.unlink()
    index.write_bytes((FIXTURES / "txl_div2" / "model.ckpt-1000.index").read_bytes())
    with pytest.raises(CheckpointError, match=r"data file model.ckpt-1000.data-00000-of-00001 is missing"):
        read_tf_checkpoint(*args)


# ----- checkpoints and configs that do not fit ---------------------------------------------------------------------


def flags_with(case, **changes):
    return {**json.loads((FIXTURES / case / "train_flags.json").read_text()), **changes}


def test_missing_unknown_and_mis_shaped_variables_are_all_named():
    folder, _, corpus = txl_args("txl_div1")
    with pytest.raises(ValueError) as error:
        read_tf_checkpoint(folder, flags_with("txl_div1", n_layer=3), corpus)
    assert "missing variable transformer/layer_2/rel_attn/qkv/kernel (expected shape [8, 24])" in str(error.value)
    assert "variable transformer/r_w_bias has shape [2, 2, 4]; the config expects [3, 2, 4]" in str(error.value)
    unknown = r"unknown variable transformer/layer_1/rel_attn/qkv/kernel \[8, 24\] maps to no parameter"
    with pytest.raises(ValueError, match=unknown):
        read_tf_checkpoint(folder, flags_with("txl_div1", n_layer=1), corpus)
    shape = r"variable transformer/layer_0/ff/layer_1/kernel has shape \[8, 16\]; the config expects \[8, 12\]"
    with pytest.raises(ValueError, match=shape):
        read_tf_checkpoint(folder, flags_with("txl_div1", d_inner=12), corpus)
    # div_val 1 checkpoint read as div_val 2: the cluster tables are missing, the single table is unknown.
    both = r"(?s)missing variable transformer/adaptive_embed/cutoff_0/.*unknown variable transformer/adaptive_embed/"
    with pytest.raises(ValueError, match=both):
        read_tf_checkpoint(folder, flags_with("txl_div1", div_val=2), corpus)


def test_checkpoint_of_the_wrong_kind_or_of_neither():
    txl, xlnet = txl_args("txl_div1"), xlnet_args("xlnet_lm")
    with pytest.raises(ValueError, match=r"--config is a 'xlnet' config, but the checkpoint is a Transformer-XL"):
        read_tf_checkpoint(txl[0], {"model_type": "xlnet"}, txl[2])
    with pytest.raises(ValueError, match=r"--config: expected the keys of xlnet_config.json .*missing \['n_token'"):
        read_tf_checkpoint(xlnet[0], flags_with("txl_div1"))
    with pytest.raises(ValueError, match=r"--corpus-info applies to Transformer-XL checkpoints; this is an XLNet"):
        read_tf_checkpoint(*xlnet, corpus_info=txl[2])
    neither = r"neither a Transformer-XL .* nor an XLNet checkpoint .*; it holds bert/embeddings/word_embeddings"
    with pytest.raises(ValueError, match=neither):
        read_tf_checkpoint(FIXTURES / "not_a_model", txl[1], txl[2])


def test_bad_configs():
    folder, flags, corpus = txl_args("txl_div1")
    with pytest.raises(ValueError, match=r"--config: unknown flags \['n_layers'\]"):
        read_tf_checkpoint(folder, flags_with("txl_div1", n_layers=2), corpus)
    with pytest.raises(ValueError, match=r"--corpus-info is required with original training flags"):
        read_tf_checkpoint(folder, flags)
    with pytest.raises(ValueError, match=r"--corpus-info: cutoffs \[0, 20, 30\] must start at 0 and end at vocab_size"):
        read_tf_checkpoint(folder, flags, {"vocab_size": 40, "cutoffs": [0, 20, 30]})
    with pytest.raises(ValueError, match=r"--config: .*missing\.json does not exist"):
        read_tf_checkpoint(folder, folder / "missing.json", corpus)
    with pytest.raises(ValueError, match=r"div_val=2 without cutoffs"):
        no_cutoffs, _, no_cutoffs_corpus = txl_args("txl_no_cutoffs")
        read_tf_checkpoint(no_cutoffs, flags_with("txl_no_cutoffs", div_val=2), no_cutoffs_corpus)
    xlnet_folder, xlnet_config = xlnet_args("xlnet_lm")
    config = json.loads(xlnet_config.read_text())
    with pytest.raises(ValueError, match=r"ff_activation 'swish'; the original XLNet has 'gelu' or 'relu'"):
        read_tf_checkpoint(xlnet_folder, {**config, "ff_activation": "swish"})
    shape = r"model/transformer/word_embedding/lookup_table has shape \[40, 8\]; the config expects \[50, 8\]"
    with pytest.raises(ValueError, match=shape):
        read_tf_checkpoint(xlnet_folder, {**config, "n_token": 50})


def test_the_command_shows_progress_on_its_long_steps(tmp_path, capsys):
    converted_folder("txl_div2", tmp_path)
    err = capsys.readouterr().err
    steps = ["Reading TF variables", "Writing model shards", "Loading weights"]
    if importlib.util.find_spec("tensorflow") is None:  # (with TensorFlow, the original graph is run instead)
        steps.append("Comparing outputs")
    for step in steps:
        assert re.search(rf"{step}: 100%\|", err), step


def truncate_data(folder):
    data = folder / "model.ckpt-1000.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:100])


# Each: (flags changed, the source folder changed, a released --config instead of the flags, the error)
COMMAND_ERRORS = {
    "missing variables": (dict(n_layer=3), None, None, "missing variable transformer/layer_2/rel_attn/qkv/kernel"),
    "unknown variables": (dict(n_layer=1), None, None, "unknown variable transformer/layer_1/ff/layer_1/bias [16]"),
    "mis-shaped variables": (dict(d_inner=12), None, None, "transformer/layer_0/ff/layer_1/kernel has shape [8, 16]"),
    "truncated file": ({}, truncate_data, None, "model.ckpt-1000.data-00000-of-00001 is truncated"),
    "other model kind": ({}, None, "xlnet-base-cased", "a 'xlnet' config, but the checkpoint is a Transformer-XL"),
    "config not fitting": ({}, None, "enwik8", "lookup_table has shape [40, 8]; the config expects [204, 1024]"),
}  # fmt: skip


@pytest.mark.parametrize("case", COMMAND_ERRORS)
def test_the_command_fails_clearly_and_leaves_nothing(case, tmp_path, capsys):
    changes, damage, released, message = COMMAND_ERRORS[case]
    source = copy_case("txl_div1", tmp_path)
    (source / "train_flags.json").write_text(json.dumps(flags_with("txl_div1", **changes)))
    if damage is not None:
        damage(source)
    options = ["--config", source / "train_flags.json", "--corpus-info", source / "corpus-info.json"]
    if released is not None:  # a released config by name (it holds the vocabulary: no corpus info)
        options = ["--config", released]
    assert convert(source, tmp_path / "out", *options) == 1
    assert message in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["txl_div1"]  # no OUTPUT, no temporary folder


def test_a_transformers_config_converts_like_the_training_flags():
    folder, flags, corpus = txl_args("txl_div2")
    from_flags = read_tf_checkpoint(folder, flags, corpus)
    config = {**from_flags.config.to_dict(), "layer_norm_epsilon": 1e-5, "zero_initial_mems": False}
    from_config = read_tf_checkpoint(folder, config)
    assert from_config.config.layer_norm_epsilon == 1e-12 and from_config.config.zero_initial_mems  # TF numerics
    assert all(torch.equal(from_config.state_dict[k], v) for k, v in from_flags.state_dict.items())
    mismatch = r"--corpus-info says vocab_size 40, cutoffs \[20, 30\]; --config says 40, \[20\]$"
    with pytest.raises(ValueError, match=mismatch):
        read_tf_checkpoint(folder, {**config, "cutoffs": [20], "tie_projs": [False, True]}, corpus)


def test_an_xlnet_transformers_config_converts_like_xlnet_config_json():
    """A transformers XLNet config (as on the Hub: ff_activation "gelu") gets the original's tanh GELU too."""
    folder, config = xlnet_args("xlnet_lm")
    from_released = read_tf_checkpoint(folder, config)
    theirs = transformers.XLNetConfig(**{**json.loads(config.read_text()), "ff_activation": "gelu", "mem_len": 6})
    from_transformers = read_tf_checkpoint(folder, theirs.to_dict())
    assert from_transformers.config.ff_activation == "gelu_new" and from_transformers.config.mem_len == 6
    assert from_transformers.state_dict.keys() == from_released.state_dict.keys()
    assert all(torch.equal(from_transformers.state_dict[k], v) for k, v in from_released.state_dict.items())


def test_xlnet_head_choice():
    folder, config = xlnet_args("xlnet_glue")
    several = r"several heads: 'mnli' \(classification\), 'sts-b' \(regression\); choose one with --task"
    with pytest.raises(ValueError, match=several):
        read_tf_checkpoint(folder, config)
    with pytest.raises(ValueError, match=r"--task 'qnli': the checkpoint holds no such head; heads found: 'mnli'"):
        read_tf_checkpoint(folder, config, task="qnli")
    with pytest.raises(ValueError, match=r"missing variable model/lm_loss/bias"):
        read_tf_checkpoint(folder, config, task="lm")
    with pytest.raises(ValueError, match=r"--task 'mnli' applies to XLNet checkpoints"):
        read_tf_checkpoint(*txl_args("txl_div1"), task="mnli")
    # A fine-tuned graph has no mask embedding (only pretraining builds it): ours gets zeros, never read by heads.
    converted = read_tf_checkpoint(folder, config, task="mnli")
    assert not converted.state_dict["transformer.mask_emb"].any()
    # the original graph is run for the verification exactly where TensorFlow is installed
    assert (converted.compare_with_source is None) == (importlib.util.find_spec("tensorflow") is None)


def test_compare_with_source_runs_the_original_graph():
    pytest.importorskip("tensorflow")
    for converted in (read_tf_checkpoint(*txl_args("txl_div2")), read_tf_checkpoint(*xlnet_args("xlnet_squad"))):
        assert converted.compare_with_source(load(converted)) < ATOL
