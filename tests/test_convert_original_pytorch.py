"""`transformers-xl convert --from original-pytorch`: kimiyoung/transformer-xl `model.pt` files, read without the
original code, give the original model's log-probabilities and memories (tests/fixtures/original_pytorch, made by
its script from stand-in modules with the original names, layout and semantics)."""

import importlib.util
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from transformers_xl import TransfoXLLMHeadModel, TransfoXLTokenizer
from transformers_xl.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "original_pytorch"
SEGMENT = 6


def convert(*args) -> int:
    return main(["convert", *map(str, args)])


def assert_matches_original(model, expected):
    ids, mems = expected["input_ids"], None
    with torch.no_grad():
        for k in range(3):
            segment = ids[:, k * SEGMENT : (k + 1) * SEGMENT]
            out = model.eval()(segment, mems=mems)
            torch.testing.assert_close(out.logits, expected[f"seg{k}.logprobs"], atol=1e-5, rtol=0)
            for i, mem in enumerate(out.mems):
                torch.testing.assert_close(mem, expected[f"seg{k}.mems.{i}"], atol=1e-5, rtol=0)
            # the original's loss: targets are the next tokens (the last one is the next segment's first)
            following = ids[:, k * SEGMENT + 1 : (k + 1) * SEGMENT + 1]
            if following.shape[1] == SEGMENT:
                nll = -out.logits.gather(-1, following[..., None]).squeeze(-1)
                torch.testing.assert_close(nll, expected[f"seg{k}.nll"], atol=1e-5, rtol=0)
            mems = out.mems


def test_the_original_code_is_not_importable_here():
    assert importlib.util.find_spec("mem_transformer") is None
    assert importlib.util.find_spec("proj_adaptive_softmax") is None


@pytest.mark.parametrize("case", ["div2_tied", "div1_untied_gpu"])
def test_whole_model_pickle_converts_with_its_own_hyper_parameters(case, tmp_path):
    output = tmp_path / "out"
    assert convert(FIXTURES / case / "model.pt", output, "--from", "original-pytorch") == 0
    config = json.loads((output / "config.json").read_text())
    assert config["untie_r"] is False and config["zero_initial_mems"] is False
    if case == "div2_tied":
        assert config["tie_projs"] == [False, True, False, True] and config["tie_weight"] is True
        assert config["cutoffs"] == [10, 20, 30] and config["div_val"] == 2 and config["mem_len"] == 4
    else:
        assert config["tie_projs"] == [False, True, True] and config["tie_weight"] is False
        assert config["pre_lnorm"] and config["same_length"] and config["clamp_len"] == 3 and config["d_embed"] == 8
    assert_matches_original(TransfoXLLMHeadModel.from_pretrained(output), load_file(FIXTURES / case / "expected.safetensors"))


def test_vocab_pkl_gives_the_folder_its_tokenizer(tmp_path):
    """--vocab vocab.pkl (the legacy pickled vocabulary, read without running it) -> tokenizer.json + config."""
    vocab = FIXTURES.parent / "hf_legacy" / "transfo_xl_lm" / "vocab.pkl"
    output = tmp_path / "out"
    assert convert(FIXTURES / "div2_tied" / "model.pt", output, "--from", "original-pytorch", "--vocab", vocab) == 0
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in output.iterdir()}
    text = "the a of , he was at his"
    reference = TransfoXLTokenizer(pretrained_vocab_file=str(vocab))(text)["input_ids"]
    assert transformers.AutoTokenizer.from_pretrained(output)(text)["input_ids"] == reference


@pytest.mark.parametrize("specials", [["<eos>", "<unk>"], ["<S>", "<UNK>"]])  # (wt103, lm1b: no `<formula>`)
def test_an_original_vocab_txt_gives_exactly_its_own_symbols(specials, tmp_path):
    """A kimiyoung vocab.txt as long as the model's vocabulary: no special token is added after its symbols."""
    symbols = [*specials, *(f"w{i}" for i in range(38))]
    (tmp_path / "vocab.txt").write_text("".join(f"{symbol}\n" for symbol in symbols))
    output = tmp_path / "out"
    source = FIXTURES / "div2_tied" / "model.pt"
    assert convert(source, output, "--from", "original-pytorch", "--vocab", tmp_path / "vocab.txt") == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(output)
    assert len(tokenizer) == 40 == json.loads((output / "config.json").read_text())["vocab_size"]
    assert tokenizer.convert_ids_to_tokens(list(range(40))) == symbols
    assert tokenizer("w3 w37 unseen")["input_ids"] == [5, 39, 1]
    assert tokenizer.unk_token == specials[1] and tokenizer.eos_token == ("<eos>" if "<eos>" in specials else None)


def test_a_checkpoint_saved_on_a_gpu_converts_on_the_cpu(tmp_path, capsys):
    data = (FIXTURES / "div1_untied_gpu" / "model.pt").read_bytes()
    assert b"cuda:0" in data and not data.startswith(b"PK")  # CUDA storages, torch's legacy format
    assert convert(FIXTURES / "div1_untied_gpu" / "model.pt", tmp_path / "out", "--from", "original-pytorch") == 0
    assert "Reading tensors: 100%|" in capsys.readouterr().err  # (the legacy format's storages, with a progress bar)


@pytest.mark.parametrize("untie_r", [False, True])
def test_bare_state_dict_converts_with_a_config(untie_r, tmp_path):
    config = json.loads((FIXTURES / "div2_tied_state_dict" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "untie_r": untie_r}))
    output = tmp_path / "out"
    source = FIXTURES / "div2_tied_state_dict" / "model.pt"
    assert convert(source, output, "--from", "original-pytorch", "--config", tmp_path / "config.json") == 0
    model = TransfoXLLMHeadModel.from_pretrained(output)
    if untie_r:  # the shared biases were copied into every layer
        layers = model.transformer.layers
        torch.testing.assert_close(layers[0].dec_attn.r_w_bias, layers[1].dec_attn.r_w_bias)
    assert_matches_original(model, load_file(FIXTURES / "div2_tied" / "expected.safetensors"))


# --- bad inputs: a clear error, exit status 1, nothing written, nothing run --------------------------------------


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("legacy_format", [False, True])
def test_a_pickle_referring_to_code_is_refused_and_not_run(legacy_format, tmp_path, capsys):
    marker = tmp_path / "executed"
    source = tmp_path / "model.pt"
    torch.save({"weight": torch.zeros(2), "payload": Payload(marker)}, source,
               _use_new_zipfile_serialization=not legacy_format)  # fmt: skip
    assert convert(source, tmp_path / "out", "--from", "original-pytorch") == 1
    error = capsys.readouterr().err
    assert "refused: loading it would run code (the pickle refers to posix.system)" in error, error
    assert "weights_only" not in error
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.fixture
def pickled_model(tmp_path, monkeypatch):
    """Pickles a stand-in MemTransformerLM (div2_tied's layout) with some attributes changed, then makes the stand-in
    code unimportable again before the conversion runs."""
    stand_in = str(FIXTURES / "stand_in")

    def save(**attributes):
        monkeypatch.syspath_prepend(stand_in)
        try:
            from mem_transformer import MemTransformerLM

            model = MemTransformerLM(n_token=40, n_layer=1, n_head=2, d_model=16, d_head=8, d_inner=32, dropout=0.0,
                                     dropatt=0.0, cutoffs=[10], tgt_len=4, ext_len=0, mem_len=4)  # fmt: skip
            vars(model).update(attributes)
            torch.save(model, tmp_path / "model.pt")
        finally:
            for name in ("mem_transformer", "proj_adaptive_softmax"):
                sys.modules.pop(name, None)
            sys.path.remove(stand_in)
        return tmp_path / "model.pt"

    return save


@pytest.mark.parametrize("attributes", [dict(attn_type=1), dict(attn_type=3), dict(sample_softmax=64)])
def test_a_model_of_an_ablation_setting_is_refused_by_name(attributes, pickled_model, tmp_path, capsys):
    source = pickled_model(**attributes)
    assert convert(source, tmp_path / "out", "--from", "original-pytorch") == 1
    name, value = next(iter(attributes.items()))
    assert f"{name}={value}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    assert importlib.util.find_spec("mem_transformer") is None


def write_state(tmp_path, change):
    state = torch.load(FIXTURES / "div2_tied_state_dict" / "model.pt", weights_only=True)
    change(state)
    torch.save(state, tmp_path / "model.pt")
    return tmp_path / "model.pt"


BAD = {
    "missing tensor": (lambda s: s.pop("layers.1.pos_ff.CoreNet.3.bias"), "missing transformer.layers.1.pos_ff"),
    "unknown tensor": (lambda s: s.update(stray=torch.zeros(2)), "unexpected transformer.stray"),
    "mis-shaped tensor": (lambda s: s.update(r_w_bias=torch.zeros(3, 8)), "transformer.r_w_bias has shape [3, 8]"),
    "other model kind": (lambda s: s.update({"transformer.word_emb.x": torch.zeros(1)}), "not the original code's"),
    "projections the config ties, stored apart": (
        lambda s: s.update({"crit.out_projs.1": s["crit.out_projs.1"] + 1}), "ties crit.out_projs.1"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_bad_state_dicts_fail_clearly(case, tmp_path, capsys):
    change, message = BAD[case]
    source = write_state(tmp_path, change)
    config = FIXTURES / "div2_tied_state_dict" / "config.json"
    assert convert(source, tmp_path / "out", "--from", "original-pytorch", "--config", config) == 1
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_truncated_files_and_missing_configs_fail_clearly(tmp_path, capsys):
    for case in ("div2_tied", "div1_untied_gpu"):
        data = (FIXTURES / case / "model.pt").read_bytes()
        (tmp_path / "model.pt").write_bytes(data[: len(data) * 2 // 3])
        assert convert(tmp_path / "model.pt", tmp_path / "out", "--from", "original-pytorch") == 1
        assert "truncated or damaged" in capsys.readouterr().err
    shutil.copy(FIXTURES / "div2_tied_state_dict" / "model.pt", tmp_path / "model.pt")
    assert convert(tmp_path / "model.pt", tmp_path / "out", "--from", "original-pytorch") == 1
    assert "pass --config" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_a_config_that_does_not_fit_names_the_tensors(tmp_path, capsys):
    config = json.loads((FIXTURES / "div2_tied_state_dict" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "d_inner": 40}))
    source = FIXTURES / "div2_tied_state_dict" / "model.pt"
    assert convert(source, tmp_path / "out", "--from", "original-pytorch", "--config", tmp_path / "config.json") == 1
    assert "transformer.layers.0.pos_ff.CoreNet.0.weight has shape [32, 16], the config needs [40, 16]" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "out").exists()


def test_pickle_module_is_not_needed_to_read_a_plain_pickle(tmp_path, capsys):
    """A file that is not a torch checkpoint at all (a plain pickle of a string) is refused as unreadable."""
    (tmp_path / "model.pt").write_bytes(pickle.dumps("hello"))
    assert convert(tmp_path / "model.pt", tmp_path / "out", "--from", "original-pytorch") == 1
    assert "model.pt" in capsys.readouterr().err
