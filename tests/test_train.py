"""`transformers-xl train`: the tiny recipe end to end (a folder the Auto classes load, the paper's evaluation at
the end), the corpus cached and reused, a character recipe scaled down, the vocabulary and the
schedule of the original code, and one clear error line for each bad input (resume: test_train_checkpoints.py;
the output folder and failures during training: test_train_folder.py)."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import transformers_xl  # noqa: F401  (registers transfo-xl with the Auto classes)
from transformers_xl.cli import main
from transformers_xl.training.corpus import count_vocabulary
from transformers_xl.training.recipes import RECIPES, learning_rate_factor, scaled

FAST = ["--max-steps", "6", "--save-steps", "3", "--logging-steps", "3", "--batch-size", "4", "--tgt-len", "8"]


def write_corpus(folder: Path, lines=200, seed=0):
    generator = random.Random(seed)
    words = [f"w{i}" for i in range(60)]
    weights = [1 / (i + 1) for i in range(60)]
    for name, count in (("train.txt", lines), ("valid.txt", lines // 4)):
        text = "\n".join(" ".join(generator.choices(words, weights, k=generator.randint(2, 12))) for _ in range(count))
        (folder / name).write_text(text + "\n")
    return folder / "train.txt", folder / "valid.txt"


def train(*options) -> int:
    return main(["train", *map(str, options)])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    train_file, valid_file = write_corpus(folder)
    output = folder / "out"
    assert train(
        "--recipe", "tiny", "--train-file", train_file, "--valid-file", valid_file, "--output-dir", output,
        "--save-steps", 100, "--eval-steps", 100, "--threads", 1,
    ) == 0  # fmt: skip  (the whole recipe: 200 steps of 8 x 32 words)
    return train_file, valid_file, output


def test_tiny_recipe_writes_a_folder_the_auto_classes_load(tiny_run, capsys):
    train_file, valid_file, output = tiny_run
    model = AutoModelForCausalLM.from_pretrained(output)
    tokenizer = AutoTokenizer.from_pretrained(output)
    symbols = (output / "corpus" / "vocab.txt").read_text().split()
    assert type(model).__name__ == "TransfoXLLMHeadModel" and model.config.vocab_size == len(symbols) == len(tokenizer)
    assert tokenizer.convert_tokens_to_ids(symbols) == list(range(len(symbols)))
    # The config carries the recipe's evaluation settings, so `evaluate` with its defaults gives the final numbers.
    settings = RECIPES["tiny"].eval_settings
    assert (model.config.tgt_len, model.config.mem_len, model.config.same_length) == (32, 64, True)
    final = json.loads((output / "eval_results.json").read_text())
    assert final["settings"] == settings
    assert main(["evaluate", str(output), str(valid_file), "--json", str(output.parent / "again.json")]) == 0
    again = json.loads((output.parent / "again.json").read_text())["results"][0]
    assert again["loss"] == pytest.approx(final["results"]["valid"]["loss"], abs=1e-5)
    # The id stream is the original reader's: each line's words, then <eos>.
    ids = np.load(output / "corpus" / "train.npy")
    expected = [symbols.index(w) for line in train_file.read_text().splitlines() for w in [*line.split(), "<eos>"]]
    assert ids.tolist() == expected
    state = json.loads((output / "checkpoint-200" / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "eval_loss" in entry] == [100, 200]
    assert final["results"]["valid"]["loss"] < math.log(len(symbols)) - 0.3  # it learnt (uniform: log |V|)


def test_a_rerun_reuses_the_encoded_corpus(tiny_run, capsys):
    train_file, valid_file, output = tiny_run
    cached = {path.name: path.stat().st_mtime_ns for path in (output / "corpus").iterdir()}
    common = ["--recipe", "tiny", "--train-file", train_file, "--valid-file", valid_file, "--output-dir", output]
    assert train(*common, *FAST, "--max-steps", 1) == 2
    assert "already holds a train run (checkpoint-100, checkpoint-200, config.json, ...); pass --resume to " \
        "continue it or --overwrite to start again." in capsys.readouterr().err
    copy = output.parent / "copy"
    copy.mkdir()
    (copy / "corpus").symlink_to(output / "corpus")  # (the cache of the first run, in a fresh folder)
    assert train(*common[:-1], copy, *FAST, "--max-steps", 1) == 0
    assert "reusing the encoded corpus" in capsys.readouterr().err
    assert {path.name: path.stat().st_mtime_ns for path in (output / "corpus").iterdir()} == cached


def test_a_character_recipe_scaled_down(tmp_path):
    """text8: a character vocabulary over every split (no <eos>, no <unk>), the model of hub_configs/text8 scaled."""
    text = "the quick brown fox jumps over the lazy dog " * 60
    (tmp_path / "train.txt").write_text("\n".join(" ".join(text[i : i + 80]) for i in range(0, len(text), 80)))
    (tmp_path / "valid.txt").write_text(" ".join("a zebra quietly jumps " * 150) + "\n")
    output = tmp_path / "out"
    assert train("--recipe", "text8", "--scale", 0.05, "--train-file", tmp_path / "train.txt", "--valid-file",
                 tmp_path / "valid.txt", "--output-dir", output, *FAST) == 0  # fmt: skip
    symbols = (output / "corpus" / "vocab.txt").read_text().split("\n")[:-1]
    assert sorted(symbols) == sorted(set("thequickbrownfoxjumpsoverlazydog" + "zebraquietly"))
    model = AutoModelForCausalLM.from_pretrained(output)
    assert (model.config.n_layer, model.config.n_head, model.config.d_model) == (1, 1, 128)
    assert (model.config.mem_len, model.config.clamp_len) == (3800, 1000)  # the paper's evaluation settings
    tokenizer = AutoTokenizer.from_pretrained(output)
    assert tokenizer("z e b r a")["input_ids"] == [symbols.index(c) for c in "zebra"]
    assert json.loads((output / "eval_results.json").read_text())["results"]["valid"]["unit"] == "character"


def test_the_vocabulary_is_counted_as_the_original(tmp_path, monkeypatch):
    """Vocab.build_vocab: specials first, then by decreasing count, ties in first-seen order, min_freq, max_size
    (the same when the file is read in batches of a few characters)."""
    from transformers_xl.training import corpus

    (tmp_path / "a.txt").write_text("  d b a\n\nc a b  e\n   b a c\n")
    assert count_vocabulary([tmp_path / "a.txt"], ("<eos>",)) == ["<eos>", "b", "a", "c", "d", "e"]
    monkeypatch.setattr(corpus, "BATCH_CHARACTERS", 4)
    assert count_vocabulary([tmp_path / "a.txt"], ("<eos>",)) == ["<eos>", "b", "a", "c", "d", "e"]
    assert count_vocabulary([tmp_path / "a.txt"], ("<eos>",), min_freq=2) == ["<eos>", "b", "a", "c"]
    assert count_vocabulary([tmp_path / "a.txt"], ("<eos>",), max_size=2) == ["<eos>", "b", "a"]


def test_the_schedule_is_train_pys():
    """Linear warm-up lr * step / warmup, then CosineAnnealingLR(max_step) stepped with the global step."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2.5e-4)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 100, eta_min=0.0)
    factor = learning_rate_factor(10, 100)
    for step in range(1, 101):
        optimizer.step()
        cosine.step()
        expected = 2.5e-4 * step / 10 if step < 10 else optimizer.param_groups[0]["lr"]
        assert 2.5e-4 * factor(step) == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_scale_shrinks_depth_width_and_batch():
    recipe = scaled(RECIPES["wt103"], 0.25)
    model = recipe.model
    assert (model["n_layer"], model["n_head"], model["d_head"], model["d_model"], model["d_embed"],
            model["d_inner"]) == (4, 4, 64, 256, 256, 1024)  # fmt: skip
    assert (recipe.batch_size, recipe.tgt_len, recipe.max_steps) == (32, 384, 4_000_000)


def test_bad_input_gets_one_clear_line(tmp_path, capsys):
    train_file, valid_file = write_corpus(tmp_path)
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "vocab.txt").write_text("<eos>\nw1 12\nw2 7\n")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "model.safetensors").write_text("")
    base = ["--recipe", "tiny", "--train-file", train_file, "--valid-file", valid_file]
    cases = [
        ([*base[:3], tmp_path / "nope.txt", *base[4:], "--output-dir", tmp_path / "o1"], "nope.txt: no such file"),
        ([*base[:5], tmp_path / "empty.txt", "--output-dir", tmp_path / "o2"], "empty.txt: the file is empty"),
        ([*base, "--output-dir", tmp_path / "taken"], "holds files that transformers-xl train did not write "
         "(model.safetensors); train writes only into a new or empty folder or one of its own runs"),
        ([*base, "--output-dir", tmp_path / "o3", "--resume"], "holds no train run to resume"),
        (["--recipe", "wt103", *base[2:], "--output-dir", tmp_path / "o4"],
         "adaptive softmax cutoffs [20000, 40000, 200000] need a vocabulary of more than 200000 symbols, but this "
         "corpus gives 62; pass --cutoffs 5,9,46 (in proportion) or --cutoffs none"),
        ([*base, "--output-dir", tmp_path / "o6", "--batch-size", "5000"],
         "too few for 5000 rows of at least 2 tokens (pass a smaller --batch-size)"),
        ([*base, "--output-dir", tmp_path / "o7", "--vocab", tmp_path / "vocab.txt"], "no <unk> in it"),
        ([*base, "--output-dir", tmp_path / "o5", "--cutoffs", "30,100"], "--cutoffs [30, 100] need a vocabulary of more "
         "than 100 symbols, but this corpus gives 62; pass --cutoffs none"),
    ]  # fmt: skip
    for options, message in cases:
        assert train(*options) == 2, message
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.startswith("transformers-xl train: ") and message in error, error
    assert [path.name for path in (tmp_path / "taken").iterdir()] == ["model.safetensors"]  # (nothing written there)
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3", "o4", "o5", "o6", "o7"))


def test_encoding_in_small_batches_gives_the_same_stream(tmp_path, monkeypatch):
    """Files are read and encoded in batches of lines of about BATCH_CHARACTERS (bounded memory)."""
    from transformers_xl.training import corpus

    train_file, _ = write_corpus(tmp_path)
    vocab = {s: i for i, s in enumerate(count_vocabulary([train_file], ("<eos>",)))}
    whole = corpus.encode_file(train_file, vocab, "eos", None)
    monkeypatch.setattr(corpus, "BATCH_CHARACTERS", 20)
    pieces = corpus.encode_file(train_file, vocab, "eos", None)
    assert np.array_equal(whole.ids, pieces.ids) and (whole.words, whole.unknown) == (pieces.words, pieces.unknown)
    assert len(whole.ids) == sum(len(line.split()) + 1 for line in train_file.read_text().splitlines())
    (tmp_path / "cr.txt").write_bytes(b"w1 w2\rw3\r\nw4\n")  # lines end as Python's text files (the original) end them
    assert corpus.encode_file(tmp_path / "cr.txt", vocab, "eos", None).ids.tolist() == [
        vocab[s] for s in ["w1", "w2", "<eos>", "w3", "<eos>", "w4", "<eos>"]
    ]


def test_two_processes_under_accelerate_launch(tmp_path):
    """The same command under `accelerate launch` (2 CPU processes, gloo): each rank trains its half of the rows
    with its own memory (saved beside the checkpoint); one folder comes out."""
    import os
    import subprocess
    import sys

    from test_training_accelerate import free_port

    train_file, valid_file = write_corpus(tmp_path)
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
        "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m",
        "transformers_xl", "train", "--recipe", "tiny", "--train-file", str(train_file), "--valid-file",
        str(valid_file), "--output-dir", str(tmp_path / "out"), *FAST,
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = tmp_path / "out" / "checkpoint-3"
    assert {f"memory-rank{r}.safetensors" for r in (0, 1)} <= {path.name for path in checkpoint.iterdir()}
    assert load_file(checkpoint / "memory-rank0.safetensors")["0"].shape[1] == 2  # 2 of the 4 rows per rank
    assert "valid" in json.loads((tmp_path / "out" / "eval_results.json").read_text())["results"]
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out").config.vocab_size == 62
