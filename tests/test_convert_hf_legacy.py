"""`transformers-xl convert --from hf-legacy`: transformers 4.x folders -> modern Hub folders, checked against the
outputs transformers 4.37.2 computed from the same folders (tests/fixtures/hf_legacy, made by its script)."""

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from transformers_xl import TransfoXLLMHeadModel, TransfoXLTokenizer, XLNetForQuestionAnswering
from transformers_xl.cli import main
from transformers_xl.conversion.remote_code import OWN_AUTO_CLASS

FIXTURES = Path(__file__).parent / "fixtures" / "hf_legacy"
SEGMENT = 6
HEADS = {
    "transfo_xl_lm": "TransfoXLLMHeadModel",
    "xlnet_lm": "XLNetLMHeadModel",
    "xlnet_classifier": "XLNetForSequenceClassification",
    "xlnet_squad": "XLNetForQuestionAnswering",
}


def convert(*args) -> int:
    return main(["convert", *map(str, args)])


def assert_matches_legacy(model, expected, atol=1e-5):
    """The model's outputs over the fixture's 3 segments (each attending to the previous through `mems`) equal
    the ones transformers 4.37.2 computed."""
    ids, mems = expected["input_ids"], None
    with torch.no_grad():
        for k in range(3):
            out = model.eval()(ids[:, k * SEGMENT : (k + 1) * SEGMENT], mems=mems)
            fields = {key.split(".", 1)[1] for key in expected if key.startswith(f"seg{k}.")}
            assert fields, "no expected outputs"
            for field in fields:
                if field.startswith("mems."):
                    actual = out.mems[int(field.split(".")[1])]
                else:
                    actual = getattr(out, "logits" if field == "prediction_scores" else field)
                torch.testing.assert_close(actual, expected[f"seg{k}.{field}"], atol=atol, rtol=0, msg=field)
            mems = out.mems


def only_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


@pytest.mark.parametrize("name", HEADS)
def test_legacy_folder_converts_and_matches_transformers_4(name, tmp_path):
    output = tmp_path / "out"
    assert convert(FIXTURES / name, output, "--from", "hf-legacy") == 0
    files = only_files(output)
    assert "model.safetensors" in files and "README.md" in files
    assert not any(f.endswith((".bin", ".pkl")) for f in files)  # no pickle left
    config = json.loads((output / "config.json").read_text())
    head = HEADS[name]
    assert config["architectures"] == [head]
    assert config["auto_map"][OWN_AUTO_CLASS[head]].endswith("." + head)  # the head's Auto class gives the head
    modeling_file = "modeling_transfo_xl.py" if name.startswith("transfo") else "modeling_xlnet.py"
    assert modeling_file in files and "relative_attention.py" in files
    assert ("tokenizer.json" in files) == (name in ("transfo_xl_lm", "xlnet_lm"))
    assert ("generation_config.json" in files) == name.endswith("_lm")

    model_class = getattr(__import__("transformers_xl"), head)
    assert_matches_legacy(model_class.from_pretrained(output), load_file(FIXTURES / name / "expected.safetensors"))


def test_a_converted_transfo_xl_folder_starts_from_4x_zero_memory_and_says_what_it_verified(tmp_path, capsys):
    """4.x started Transformer-XL from mem_len zero vectors (docs/models.md, "Memory"): the converted folder does
    too, as its config says, and the verification line says that it compared two runs of this package, not 4.x."""
    assert convert(FIXTURES / "transfo_xl_lm", tmp_path / "out", "--from", "hf-legacy") == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["zero_initial_mems"] is True
    line = next(line for line in capsys.readouterr().err.splitlines() if "verification" in line)
    assert "vs the source folder run by transformers-xl, not by transformers 4.x; both start from mem_len zero" in line
    assert "zero_initial_mems=True" in line and "max abs difference 0 " in line
    assert "not by transformers 4.x" in (tmp_path / "out" / "README.md").read_text()


def test_xlnet_folders_load_in_transformers_own_xlnet(tmp_path):
    for name in ("xlnet_classifier", "xlnet_squad"):
        assert convert(FIXTURES / name, tmp_path / name, "--from", "hf-legacy") == 0
    expected = load_file(FIXTURES / "xlnet_classifier" / "expected.safetensors")
    builtin = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "xlnet_classifier")
    assert type(builtin) is transformers.XLNetForSequenceClassification  # (no trust_remote_code: built in)
    assert_matches_legacy(builtin, expected)
    squad = transformers.XLNetForQuestionAnswering.from_pretrained(tmp_path / "xlnet_squad")
    assert_matches_legacy(squad, load_file(FIXTURES / "xlnet_squad" / "expected.safetensors"))


def test_tokenizers_are_rebuilt_without_pickle(tmp_path):
    assert convert(FIXTURES / "transfo_xl_lm", tmp_path / "txl", "--from", "hf-legacy") == 0
    assert convert(FIXTURES / "xlnet_lm", tmp_path / "xlnet", "--from", "hf-legacy") == 0
    text = "the a of , he was at his"
    legacy = TransfoXLTokenizer(pretrained_vocab_file=str(FIXTURES / "transfo_xl_lm" / "vocab.pkl"))
    converted = transformers.AutoTokenizer.from_pretrained(tmp_path / "txl")
    assert converted(text)["input_ids"] == legacy(text)["input_ids"]
    assert len(converted) <= json.loads((tmp_path / "txl" / "config.json").read_text())["vocab_size"]
    xlnet = transformers.AutoTokenizer.from_pretrained(tmp_path / "xlnet")
    reference = transformers.XLNetTokenizer.from_pretrained(FIXTURES / "xlnet_lm")
    assert xlnet("the was at")["input_ids"] == reference("the was at")["input_ids"]


def test_vocab_option_replaces_the_found_vocabulary(tmp_path):
    words = tmp_path / "vocab.txt"
    words.write_text("".join(f"w{i}\n" for i in range(20)) + "<unk>\n<eos>\n")
    assert convert(FIXTURES / "transfo_xl_lm", tmp_path / "out", "--from", "hf-legacy", "--vocab", words) == 0
    tokenizer = TransfoXLTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.convert_tokens_to_ids(["w3", "<eos>"]) == [3, 21]
    # generation stops at this vocabulary's end token (the source config said 0)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["eos_token_id"] == 21
    assert transformers.GenerationConfig.from_pretrained(tmp_path / "out").eos_token_id == 21


def test_a_missing_vocabulary_is_never_silent(tmp_path, capsys):
    """No vocabulary beside the weights: a warning; where a tokenizer_config.json promises a tokenizer, an error
    unless --no-tokenizer says to write none."""
    assert convert(FIXTURES / "xlnet_classifier", tmp_path / "classifier", "--from", "hf-legacy") == 0
    warning = "warning: the output has no tokenizer: no vocabulary beside the source (spiece.model, tokenizer.json)"
    assert warning in capsys.readouterr().err

    source = tmp_path / "source"
    shutil.copytree(FIXTURES / "transfo_xl_lm", source)
    (source / "vocab.pkl").unlink()
    assert convert(source, tmp_path / "out", "--from", "hf-legacy") == 1
    error = capsys.readouterr().err
    assert f"error: {source / 'tokenizer_config.json'} describes a tokenizer, but its vocabulary is missing" in error
    assert "--no-tokenizer" in error and not (tmp_path / "out").exists()
    assert convert(source, tmp_path / "out", "--from", "hf-legacy", "--no-tokenizer") == 0
    assert not any(p.name.startswith("tokenizer") for p in (tmp_path / "out").iterdir())
    assert "--no-tokenizer" in (tmp_path / "out" / "README.md").read_text()  # (the command, as run)
    with pytest.raises(SystemExit):  # (argparse: not allowed with)
        convert(source, tmp_path / "other", "--from", "hf-legacy", "--no-tokenizer", "--vocab", source / "x.txt")
    assert "not allowed with argument" in capsys.readouterr().err


def test_sharded_output_loads(tmp_path):
    output = tmp_path / "out"
    assert convert(FIXTURES / "transfo_xl_lm", output, "--from", "hf-legacy", "--max-shard-size", "10KB") == 0
    shards = sorted(p.name for p in output.glob("model-*.safetensors"))
    assert len(shards) > 1 and (output / "model.safetensors.index.json").is_file()
    assert not (output / "model.safetensors").exists()
    model = TransfoXLLMHeadModel.from_pretrained(output)
    assert_matches_legacy(model, load_file(FIXTURES / "transfo_xl_lm" / "expected.safetensors"))


# --- bad inputs: a clear error, exit status 1, nothing written ---------------------------------------------------


def damaged_copy(tmp_path, name, change_state=None, change_config=None, file_bytes=None) -> Path:
    folder = tmp_path / "source"
    shutil.copytree(FIXTURES / name, folder)
    if change_state is not None:
        state = torch.load(folder / "pytorch_model.bin", weights_only=True)
        change_state(state)
        torch.save(state, folder / "pytorch_model.bin")
    if change_config is not None:
        config = json.loads((folder / "config.json").read_text())
        change_config(config)
        (folder / "config.json").write_text(json.dumps(config))
    if file_bytes is not None:
        data = (folder / "pytorch_model.bin").read_bytes()
        (folder / "pytorch_model.bin").write_bytes(file_bytes(data))
    return folder


def drop_layer_norm(state):
    del state["transformer.layers.0.pos_ff.layer_norm.weight"]


def add_stray(state):
    state["transformer.layers.0.stray"] = torch.zeros(3)


def reshape_cluster(state):
    state["crit.cluster_weight"] = torch.zeros(5, 16)


BAD = {
    "missing tensor": (dict(change_state=drop_layer_norm), "missing transformer.layers.0.pos_ff.layer_norm.weight"),
    "unknown tensor": (dict(change_state=add_stray), "unexpected transformer.layers.0.stray"),
    "mis-shaped tensor": (dict(change_state=reshape_cluster), "crit.cluster_weight: stored [5, 16]"),
    "truncated file": (dict(file_bytes=lambda data: data[: len(data) // 2]), "truncated or damaged"),
    "other model kind": (dict(change_config=lambda c: c.update(model_type="bert")), "'bert' checkpoint"),
    "unknown head": (dict(change_config=lambda c: c.update(architectures=["TransfoXLForPony"])), "TransfoXLForPony"),
    "config not fitting": (dict(change_config=lambda c: c.update(d_inner=40)), "pos_ff.CoreNet.0.weight: stored"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_sources_fail_clearly_and_leave_nothing(case, tmp_path, capsys):
    changes, message = BAD[case]
    source = damaged_copy(tmp_path, "transfo_xl_lm", **changes)
    before = only_files(tmp_path)
    assert convert(source, tmp_path / "out", "--from", "hf-legacy") == 1
    assert message in capsys.readouterr().err
    assert only_files(tmp_path) == before  # no OUTPUT, no temporary folder


def test_a_vocabulary_of_the_wrong_kind_or_size_is_refused(tmp_path, capsys):
    spiece = FIXTURES / "xlnet_lm" / "spiece.model"
    assert convert(FIXTURES / "transfo_xl_lm", tmp_path / "out", "--from", "hf-legacy", "--vocab", spiece) == 1
    assert "cannot use a spiece.model vocabulary" in capsys.readouterr().err
    big = tmp_path / "vocab.txt"
    big.write_text("".join(f"w{i}\n" for i in range(100)) + "<unk>\n")
    assert convert(FIXTURES / "transfo_xl_lm", tmp_path / "out", "--from", "hf-legacy", "--vocab", big) == 1
    assert "more than the model's" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


class RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_damaged_or_unsafe_vocabularies_are_refused_by_name(tmp_path, capsys):
    """--vocab files that cannot be read: a pickle that would run code (it does not), a truncated SentencePiece
    model, a word list that is not text. Each: exit status 1, the file named, nothing written."""
    marker = tmp_path / "executed"
    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": RunsCode(marker)}))
    (tmp_path / "spiece.model").write_bytes((FIXTURES / "xlnet_lm" / "spiece.model").read_bytes()[:100])
    (tmp_path / "vocab.txt").write_bytes(b"\xff\xfe not utf-8")
    cases = [("transfo_xl_lm", "vocab.pkl", "references `posix.system`"), ("xlnet_lm", "spiece.model", "ModelProto"),
             ("transfo_xl_lm", "vocab.txt", "is not UTF-8 text: byte 0xff at byte offset 0")]  # fmt: skip
    for name, vocab, reason in cases:
        assert convert(FIXTURES / name, tmp_path / "out", "--from", "hf-legacy", "--vocab", tmp_path / vocab) == 1
        error = capsys.readouterr().err
        assert f"Cannot read the vocabulary {tmp_path / vocab}" in error and reason in error, error
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spiece.model", "vocab.pkl", "vocab.txt"]


def test_a_bin_whose_pickle_would_run_code_is_refused_saying_so(tmp_path, capsys):
    source, marker = tmp_path / "source", tmp_path / "executed"
    shutil.copytree(FIXTURES / "transfo_xl_lm", source)
    state = torch.load(source / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "payload": RunsCode(marker)}, source / "pytorch_model.bin")
    assert convert(source, tmp_path / "out", "--from", "hf-legacy") == 1
    error = capsys.readouterr().err
    assert "refused: loading it would run code (the pickle refers to posix.system)" in error, error
    assert "weights_only" not in error and "damaged" not in error
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, released, message", [
    # (lm_loss.weight is tied to the embeddings: transformers' loader alone fails on it)
    ("xlnet_lm", "xlnet-base-cased", "lm_loss.weight: stored [40, 16], the config needs [32000, 768]"),
    ("transfo_xl_lm", "transfo-xl-wt103", "crit.cluster_weight: stored [2, 16], the config needs [3, 1024]"),
])  # fmt: skip
def test_a_released_config_by_name_that_does_not_fit_names_the_shapes(name, released, message, tmp_path, capsys):
    assert convert(FIXTURES / name, tmp_path / "out", "--from", "hf-legacy", "--config", released) == 1
    error = capsys.readouterr().err
    assert message in error and "does not fit" in error and "... and " in error  # (the first 25 problems only)
    assert list(tmp_path.iterdir()) == []
