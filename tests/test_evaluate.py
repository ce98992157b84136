"""`transformers-xl evaluate`: the original eval.py's loss on the same weights and text (against the original code's
own numbers on converted original checkpoints, and against eval.py's loop written out for other settings), the
<unk> rate, the line ends, and one clear error line for each bad input."""

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, TransfoXLTokenizer, XLNetConfig, XLNetLMHeadModel
from transformers_xl.cli import main
from transformers_xl.training import evaluate as evaluate_module

ORIGINAL = Path(__file__).parent / "fixtures" / "original_pytorch"
WORDS = [f"w{i}" for i in range(45)]
VOCAB = ["<eos>", *WORDS, "<unk>", "<S>"]  # 48 symbols (the tokenizer adds <formula>: 49)


def evaluate(*args) -> int:
    return main(["evaluate", *map(str, args)])


@pytest.mark.parametrize("case, vocab_size", [("div2_tied", 40), ("div1_untied_gpu", 36)])
def test_equals_the_original_code_on_a_converted_original_checkpoint(case, vocab_size, tmp_path):
    """The fixtures hold the original model's per-token NLL over 3 segments of 6 tokens x 2 rows (memory from
    empty; div1_untied_gpu with same_length and clamp_len). The two rows written as one stream and evaluated with
    2 rows of 18 tokens: 17 predictions per row, the first 17 of the original's 18."""
    symbols = [*(f"w{i}" for i in range(vocab_size - 3)), "<eos>", "<formula>", "<unk>"]
    (tmp_path / "vocab.txt").write_text("".join(f"{s}\n" for s in symbols))
    model_dir = tmp_path / "model"
    assert main(["convert", str(ORIGINAL / case / "model.pt"), str(model_dir), "--from", "original-pytorch",
                 "--vocab", str(tmp_path / "vocab.txt")]) == 0  # fmt: skip
    expected = load_file(ORIGINAL / case / "expected.safetensors")
    (tmp_path / "text.txt").write_text(" ".join(symbols[i] for i in expected["input_ids"].reshape(-1).tolist()))
    original_nll = torch.cat([expected["seg0.nll"], expected["seg1.nll"], expected["seg2.nll"]], dim=1)[:, :17]
    report = tmp_path / "report.json"
    assert evaluate(model_dir, tmp_path / "text.txt", "--batch-size", 2, "--tgt-len", 6, "--line-end", "none",
                    "--json", report) == 0  # fmt: skip
    result = json.loads(report.read_text())["results"][0]
    assert result["loss"] == pytest.approx(original_nll.double().mean().item(), abs=1e-5)
    assert result["predicted_tokens"] == 34 and result["unit"] == "character"
    assert result["bits_per_character"] == pytest.approx(result["loss"] / math.log(2))


def tiny_model_folder(folder, **config):
    torch.manual_seed(0)
    settings = dict(
        vocab_size=49, cutoffs=[10, 30], div_val=2, d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32,
        n_layer=2, mem_len=6, tgt_len=5, clamp_len=-1, same_length=False, dropout=0.0,
    )  # fmt: skip
    model = TransfoXLLMHeadModel(TransfoXLConfig(**{**settings, **config}))
    with torch.no_grad():  # weights large enough for the context (and so the memory settings) to matter
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(parameter.numel()))
    model.save_pretrained(folder)
    TransfoXLTokenizer(vocab=VOCAB).save_pretrained(folder)
    return model.eval()


def write_text(path, lines=40, seed=0, extra=""):
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(lines):
        length = int(torch.randint(0, 9, (), generator=generator))
        rows.append("  ".join(WORDS[i] for i in torch.randint(45, (length,), generator=generator).tolist()))
    path.write_text("\n".join(rows) + extra + "\n")
    return rows


def eval_py(model, ids, batch_size, tgt_len, mem_len, clamp_len, same_length):
    """The original eval.py written out: LMOrderedIterator's rows and segments (data x[i:i+L], target
    x[i+1:i+1+L], L = min(tgt_len, n_step - 1 - i)), `reset_length` / `clamp_len` / `same_length` set, memory from
    empty and passed as `mems`, total_loss += seq_len * segment mean; the NLL from the log-probabilities."""
    config = model.config
    config.mem_len, config.clamp_len, config.same_length = mem_len, clamp_len, same_length
    config.zero_initial_mems = False  # (the original's memory starts empty)
    n_step = len(ids) // batch_size
    data = torch.tensor(ids[: n_step * batch_size]).view(batch_size, n_step)
    total_loss, total_len, mems = 0.0, 0, None
    with torch.no_grad():
        for i in range(0, n_step - 1, tgt_len):
            seq_len = min(tgt_len, n_step - 1 - i)
            out = model(input_ids=data[:, i : i + seq_len], mems=mems)
            target = data[:, i + 1 : i + 1 + seq_len]
            loss = -out.logits.gather(2, target[..., None]).mean().item()
            total_loss, total_len, mems = total_loss + seq_len * loss, total_len + seq_len, out.mems
    return total_loss / total_len


@pytest.mark.parametrize(
    "options, settings",
    [
        ([], dict(batch_size=10, tgt_len=5, mem_len=6, clamp_len=-1, same_length=False)),  # the config's defaults
        (["--batch-size", 3, "--tgt-len", 4, "--mem-len", 9, "--clamp-len", 2, "--same-length"],
         dict(batch_size=3, tgt_len=4, mem_len=9, clamp_len=2, same_length=True)),
        (["--batch-size", 2, "--tgt-len", 7, "--mem-len", 0], dict(batch_size=2, tgt_len=7, mem_len=0, clamp_len=-1,
                                                                    same_length=False)),
    ],
)  # fmt: skip
def test_equals_eval_py_written_out(tmp_path, options, settings):
    """(The folder asks for transformers 4.x's zero memory at the start, as converted 4.x folders do: the protocol
    starts empty all the same.)"""
    model = tiny_model_folder(tmp_path / "model", zero_initial_mems=True)
    lines = write_text(tmp_path / "test.txt")
    ids = [VOCAB.index(symbol) for line in lines for symbol in [*line.split(), "<eos>"]]
    report = tmp_path / "report.json"
    assert evaluate(tmp_path / "model", tmp_path / "test.txt", "--json", report, *options) == 0
    output = json.loads(report.read_text())
    assert {key: output["settings"][key] for key in settings} == settings and output["settings"]["line_end"] == "eos"
    result = output["results"][0]
    assert result["loss"] == pytest.approx(eval_py(model, ids, **settings), abs=1e-5)
    n_step = len(ids) // settings["batch_size"]
    assert result["predicted_tokens"] == (n_step - 1) * settings["batch_size"] and result["unit"] == "token"
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert result["symbols"] == len(ids) - len(lines) and result["unk_rate"] == 0


def test_bf16_is_close(tmp_path):
    tiny_model_folder(tmp_path / "model")
    write_text(tmp_path / "test.txt")
    losses = []
    for options in ([], ["--bf16"]):
        assert evaluate(tmp_path / "model", tmp_path / "test.txt", "--json", tmp_path / "r.json", *options) == 0
        losses.append(json.loads((tmp_path / "r.json").read_text())["results"][0]["loss"])
    assert losses[0] != losses[1] and losses[1] == pytest.approx(losses[0], rel=3e-2)


def test_unknown_symbols_are_counted_apart_from_the_texts_own_unk(tmp_path, capsys):
    tiny_model_folder(tmp_path / "model")
    (tmp_path / "test.txt").write_text("w1 w2 novel <unk> w3\nW4 w5 <unk>\n" * 5)
    assert evaluate(tmp_path / "model", tmp_path / "test.txt", "--batch-size", 2, "--json", tmp_path / "r.json") == 0
    result = json.loads((tmp_path / "r.json").read_text())["results"][0]
    assert result["symbols"] == 40 and result["unknown_symbols"] == 10 and result["unk_rate"] == 0.25
    assert "<unk> rate 25.0000%" in capsys.readouterr().out


def test_double_eos_lines(tmp_path):
    """lm1b: each line is `<S> ... <S>`, default when the tokenizer adds it."""
    model = tiny_model_folder(tmp_path / "model")
    tokenizer = TransfoXLTokenizer(vocab=VOCAB, add_double_eos=True)
    tokenizer.save_pretrained(tmp_path / "model")
    lines = write_text(tmp_path / "test.txt", seed=1)
    ids = [VOCAB.index(symbol) for line in lines for symbol in ["<S>", *line.split(), "<S>"]]
    assert evaluate(tmp_path / "model", tmp_path / "test.txt", "--batch-size", 2, "--json", tmp_path / "r.json") == 0
    output = json.loads((tmp_path / "r.json").read_text())
    assert output["settings"]["line_end"] == "double-eos"
    expected = eval_py(model, ids, batch_size=2, tgt_len=5, mem_len=6, clamp_len=-1, same_length=False)
    assert output["results"][0]["loss"] == pytest.approx(expected, abs=1e-5)


def test_bad_input_gets_one_clear_line(tmp_path, capsys):
    tiny_model_folder(tmp_path / "model")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("w1 w2\nw3\n")
    (tmp_path / "binary.txt").write_bytes(b"w1 \xff\xfe w2\n")
    XLNetLMHeadModel(XLNetConfig(vocab_size=20, d_model=16, n_head=2, d_inner=16, n_layer=1)).save_pretrained(
        tmp_path / "xlnet"
    )
    cases = [
        ((tmp_path / "model", tmp_path / "empty.txt"), "empty.txt: the file is empty"),
        ((tmp_path / "model", tmp_path / "missing.txt"), "missing.txt: no such file"),
        ((tmp_path / "model", tmp_path / "short.txt"), "5 tokens are too few for --batch-size 10 rows"),
        ((tmp_path / "model", tmp_path / "binary.txt"), "binary.txt, line 1: not UTF-8 text"),
        ((tmp_path / "xlnet", tmp_path / "short.txt"), "is a 'xlnet' model; expected a Transformer-XL language model"),
        ((tmp_path / "nowhere", tmp_path / "short.txt"), "nowhere: no such folder."),
        ((tmp_path / "model", tmp_path / "short.txt", tmp_path / "gone.txt"), "gone.txt: no such file"),
        ((tmp_path / "model", tmp_path / "short.txt", "--json", tmp_path / "no" / "r.json"), "its folder does not exist"),
        ((tmp_path / "model", tmp_path / "short.txt", "--device", "nodevice"), "--device nodevice: "),
    ]  # fmt: skip
    for args, message in cases:
        assert evaluate(*args) == 2, message
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith("transformers-xl evaluate: ") and message in error, error


def test_a_character_vocabulary_without_unk_refuses_unknown_symbols(tmp_path, capsys):
    torch.manual_seed(0)
    config = TransfoXLConfig(vocab_size=4, cutoffs=[], adaptive=False, d_model=8, d_embed=8, n_head=2, d_head=4,
                             d_inner=8, n_layer=1, mem_len=4, tgt_len=4)  # fmt: skip
    TransfoXLLMHeadModel(config).save_pretrained(tmp_path / "model")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "c": 2, "d": 3}))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend).save_pretrained(tmp_path / "model")
    (tmp_path / "chars.txt").write_text("a b c d a b x c\n" * 4)
    assert evaluate(tmp_path / "model", tmp_path / "chars.txt", "--batch-size", 2) == 2
    assert "4 symbol(s) are not in the vocabulary, which has no unknown symbol" in capsys.readouterr().err
    (tmp_path / "chars.txt").write_text("a b c d a b d c\n" * 4)
    assert evaluate(tmp_path / "model", tmp_path / "chars.txt", "--batch-size", 2) == 0
    assert "bits per character" in capsys.readouterr().out  # (no <eos> in the vocabulary: line end none)


def test_damaged_or_meaningless_input_is_refused_before_a_result(tmp_path, capsys, monkeypatch):
    """Each gives one line and exit status 2, and no result: a loss of NaN, a perplexity of 1 over nothing, or a
    perplexity of <unk> is not a measurement."""
    model = tmp_path / "model"
    tiny_model_folder(model)
    write_text(tmp_path / "test.txt")
    (tmp_path / "blank.txt").write_text("\n  \n\n" * 10)
    (tmp_path / "other.txt").write_text("alpha beta w1 gamma delta\n" * 10)

    def variant(name, change):
        folder = tmp_path / name
        shutil.copytree(model, folder)
        change(folder)
        return folder

    damaged = variant("damaged", lambda f: (f / "model.safetensors").write_bytes(
        (f / "model.safetensors").read_bytes()[:1000]))  # fmt: skip
    nan_model = tiny_model_folder(tmp_path / "nan")
    with torch.no_grad():
        list(nan_model.parameters())[-1].view(-1)[0] = float("nan")
    nan_model.save_pretrained(tmp_path / "nan")
    specials = variant("specials", lambda f: TransfoXLTokenizer(vocab=["<eos>", "<unk>"]).save_pretrained(f))
    cases = [
        ((damaged, "test.txt"), f"{damaged / 'model.safetensors'}: damaged weights (Error while deserializing header: "
         "invalid header length); expected a complete safetensors file."),
        ((tmp_path / "nan", "test.txt"), "holds non-finite values (NaN or infinity)."),
        ((tmp_path / "missing", "test.txt"), f"{tmp_path / 'missing'}: no such folder."),
        ((tmp_path, "test.txt"), f"{tmp_path}: no config.json in this folder; expected a model folder."),
        ((model, "test.txt", "--json", tmp_path), f"--json {tmp_path} is a folder; expected the path of a file to write"),
        ((model, "test.txt", "--device", "cuda"), "--device cuda: no cuda device on this machine"),
        ((model, "blank.txt"), "blank.txt: no symbols in it (only blank lines or whitespace)"),
        ((specials, "test.txt"), "the tokenizer's vocabulary holds only special symbols"),
        ((model, "other.txt"), "80.0% of its symbols (40 of 50) are not in the vocabulary"),
    ]  # fmt: skip
    for (folder, text, *options), message in cases:
        if "cuda" in options and torch.cuda.is_available():
            continue
        assert evaluate(folder, tmp_path / text, "--batch-size", 2, *options) == 2, message
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith("transformers-xl evaluate: ") and message in error, error
        assert "Hub" not in error and "Traceback" not in error
    assert evaluate(model, tmp_path / "other.txt", "--batch-size", 2, "--allow-unknown") == 0
    assert "<unk> rate 80.0000%" in capsys.readouterr().out

    def overflowed(*args, **kwargs):
        return {"loss": float("nan"), "perplexity": float("nan"), "predicted_tokens": 1, "seconds": 1.0,
                "tokens_per_second": 1.0}  # fmt: skip

    monkeypatch.setattr(evaluate_module, "evaluate_stream", overflowed)
    assert evaluate(model, tmp_path / "test.txt", "--json", tmp_path / "r.json") == 2
    assert "test.txt: the loss is nan, not a result" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_the_json_file_follows_the_umask_and_is_written_whole(tmp_path):
    tiny_model_folder(tmp_path / "model")
    write_text(tmp_path / "test.txt")
    umask = os.umask(0o027)
    try:
        assert evaluate(tmp_path / "model", tmp_path / "test.txt", "--json", tmp_path / "r.json") == 0
    finally:
        os.umask(umask)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o640
    assert json.loads((tmp_path / "r.json").read_text())["results"][0]["loss"] > 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model", "r.json", "test.txt"]


# --- --memory-lengths: the protocol at several memory lengths, a table and a plot ------------------------------


def test_memory_lengths_evaluate_each_length_with_the_protocol_and_write_the_table_and_plot(tmp_path, capsys):
    """Each length is eval.py's loop with only the memory changed (rows, segments, clamp_len, same_length kept), in
    increasing order, lengths beyond the model's mem_len (6) included. At length 0 same_length is off: it would
    attend to no position (transformers 4.x's mask then attends to the segment's future tokens too)."""
    import csv

    import matplotlib.image

    model = tiny_model_folder(tmp_path / "model")
    lines = write_text(tmp_path / "test.txt")
    ids = [VOCAB.index(symbol) for line in lines for symbol in [*line.split(), "<eos>"]]
    assert evaluate(tmp_path / "model", tmp_path / "test.txt", "--memory-lengths", "12,0,3", "--tgt-len", 4,
                    "--batch-size", 3, "--same-length", "--json", tmp_path / "curve.json") == 0  # fmt: skip
    output = json.loads((tmp_path / "curve.json").read_text())
    assert output["settings"]["memory_lengths"] == [0, 3, 12] and output["settings"]["model_mem_len"] == 6
    assert "mem_len" not in output["settings"]
    results = output["results"]
    assert [(r["mem_len"], r["same_length"]) for r in results] == [(0, False), (3, True), (12, True)]
    for r in results:
        expected = eval_py(model, ids, batch_size=3, tgt_len=4, mem_len=r["mem_len"], clamp_len=-1,
                           same_length=r["mem_len"] > 0)  # fmt: skip
        assert r["loss"] == pytest.approx(expected, abs=1e-5)
        assert r["predicted_tokens"] == results[0]["predicted_tokens"] and r["seconds"] > 0
    assert len({round(r["loss"], 6) for r in results}) == 3  # (the memory matters to these weights)

    rows = list(csv.DictReader((tmp_path / "curve.csv").open()))
    assert list(rows[0]) == ["file", "mem_len", "same_length", "loss", "perplexity", "bits_per_token",
                             "predicted_tokens", "seconds", "tokens_per_second"]  # fmt: skip
    assert [(int(row["mem_len"]), float(row["loss"])) for row in rows] == [(r["mem_len"], r["loss"]) for r in results]
    table = (tmp_path / "curve.md").read_text()
    assert table.splitlines()[0].startswith("| file | memory length |") and len(table.splitlines()) == 2 + 3
    assert f"| 12 | yes | {results[2]['loss']:.5f} | {results[2]['perplexity']:.3f} |" in table
    assert table in capsys.readouterr().out  # (printed too)
    height, width, _ = matplotlib.image.imread(tmp_path / "curve.png").shape
    assert width >= 600 and height >= 400
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.csv", "curve.json", "curve.md", "curve.png", "model",
                                                          "test.txt"]  # fmt: skip


@pytest.fixture(scope="module")
def repeating_text_model(tmp_path_factory):
    """A tiny character-level model trained (a few seconds) to continue a 12-character period in which no character
    alone says what comes next, and that period repeated as a text file."""
    folder = tmp_path_factory.mktemp("repeating")
    period = torch.tensor([1, 3, 0, 0, 3, 1, 3, 1, 3, 0, 0, 1])
    ids = period.repeat(20)
    torch.manual_seed(0)
    config = TransfoXLConfig(vocab_size=6, cutoffs=[], adaptive=False, d_model=32, d_embed=32, n_head=2, d_head=16,
                             d_inner=64, n_layer=2, mem_len=4, tgt_len=4, clamp_len=-1, same_length=False,
                             dropout=0.0)  # fmt: skip
    model = TransfoXLLMHeadModel(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    windows = torch.stack([ids[start : start + 25] for start in range(12)])  # (every phase of the period)
    for _ in range(80):
        model(input_ids=windows[:, :-1], shift_labels=windows[:, 1:]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder / "model")
    TransfoXLTokenizer(vocab=["a", "b", "c", "d", "<unk>"]).save_pretrained(folder / "model")  # (+ <formula>: 6 ids)
    (folder / "text.txt").write_text(" ".join("abcd"[i] for i in ids.tolist()) + "\n")
    return folder


def test_a_longer_memory_lowers_the_loss_where_the_text_repeats(repeating_text_model, tmp_path):
    """Segments of 4: without memory the first characters of a segment see too little of the period to place
    themselves in it; with 4 or more positions of memory (up to 4x the model's own 4) every one does."""
    folder = repeating_text_model
    assert evaluate(folder / "model", folder / "text.txt", "--memory-lengths", "0,4,8,16", "--batch-size", 4,
                    "--line-end", "none", "--json", tmp_path / "curve.json") == 0  # fmt: skip
    results = json.loads((tmp_path / "curve.json").read_text())["results"]
    bpc = {r["mem_len"]: r["bits_per_character"] for r in results}
    assert results[0]["unit"] == "character" and "bits per character" in (tmp_path / "curve.md").read_text()
    assert all(bpc[length] < bpc[0] / 4 for length in (4, 8, 16)), bpc


@pytest.mark.parametrize("value", ["a", "-1", "1,,2", "", "1.5", "0, x", "٣"])
def test_bad_memory_lengths_get_one_clear_line(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate(tmp_path / "model", tmp_path / "test.txt", "--memory-lengths", value)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"argument --memory-lengths: expected comma-separated non-negative integers (e.g. "
                          f"0,64,128), got {value!r}")  # fmt: skip


def test_memory_lengths_refuse_repeats_mem_len_and_xlnet(tmp_path, capsys):
    for options, message in [
        (["--memory-lengths", "0,8,0"], "argument --memory-lengths: expected distinct memory lengths, got '0,8,0'"),
        (["--memory-lengths", "0,8", "--mem-len", "8"], "argument --mem-len: not allowed with argument --memory-lengths"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            evaluate(tmp_path / "model", tmp_path / "test.txt", *options)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    XLNetLMHeadModel(XLNetConfig(vocab_size=20, d_model=16, n_head=2, d_inner=16, n_layer=1, mem_len=8)).save_pretrained(
        tmp_path / "xlnet"
    )
    write_text(tmp_path / "test.txt")
    assert evaluate(tmp_path / "xlnet", tmp_path / "test.txt", "--memory-lengths", "0,8") == 2
    assert "is a 'xlnet' model; expected a Transformer-XL language model" in capsys.readouterr().err


def test_the_curves_files_are_written_whole_or_not_at_all(tmp_path, capsys, monkeypatch):
    """A folder in the way of one of them is refused before evaluating; a write that fails (a full disk, here on the
    plot) leaves none of them, no temporary file, and the earlier curve.json as it was."""
    tiny_model_folder(tmp_path / "model")
    write_text(tmp_path / "test.txt")
    (tmp_path / "curve.png").mkdir()
    assert evaluate(tmp_path / "model", tmp_path / "test.txt", "--memory-lengths", "0,4", "--json",
                    tmp_path / "curve.json") == 2  # fmt: skip
    assert f"--json {tmp_path / 'curve.json'}: {tmp_path / 'curve.png'} is a folder" in capsys.readouterr().err
    (tmp_path / "curve.png").rmdir()

    (tmp_path / "curve.json").write_text("an earlier run\n")
    real_open = os.open

    def disk_full(path, *args, **kwargs):
        if ".png." in str(path):
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(evaluate_module.os, "open", disk_full)
    assert evaluate(tmp_path / "model", tmp_path / "test.txt", "--memory-lengths", "0,4", "--json",
                    tmp_path / "curve.json") == 2  # fmt: skip
    assert "cannot write (No space left on device)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curve.json", "model", "test.txt"]
    assert (tmp_path / "curve.json").read_text() == "an earlier run\n"
