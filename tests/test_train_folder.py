"""`transformers-xl train` and the user's data: `--overwrite` removes only what train wrote, inputs and a user's own
files and `corpus/` are never touched, one run per folder (a lock), and one line (no traceback) for a full disk,
Ctrl-C, a non-finite loss and a text or vocabulary that would give a meaningless result."""

import errno
import subprocess
import sys

import pytest
import torch
from safetensors import SafetensorError
from test_train import train, write_corpus
from transformers import Trainer

from transformers_xl.conversion.publish import host_name, owner_name
from transformers_xl.training.run_folder import LOCK, MARKER

STEPS = ["--max-steps", "6", "--save-steps", "3", "--logging-steps", "3", "--batch-size", "4", "--tgt-len", "8"]


@pytest.fixture
def corpus(tmp_path):
    train_file, valid_file = write_corpus(tmp_path)
    return ["--recipe", "tiny", "--train-file", train_file, "--valid-file", valid_file, *STEPS]


def last_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and "Traceback" not in "\n".join(lines)
    return lines[-1]


def test_overwrite_removes_only_what_the_run_wrote(tmp_path, corpus, capsys):
    output = tmp_path / "out"
    assert train(*corpus, "--output-dir", output) == 0
    (output / "notes.txt").write_text("mine")
    (output / "data").mkdir()
    (output / "data" / "x.txt").write_text("mine too")
    assert train(*corpus, "--output-dir", output) == 2
    assert "already holds a train run" in last_error_line(capsys)
    assert train(*corpus[:-8], "--max-steps", 3, *corpus[-6:], "--output-dir", output, "--overwrite") == 0
    assert (output / "notes.txt").read_text() == "mine" and (output / "data" / "x.txt").read_text() == "mine too"
    assert (output / "checkpoint-3").is_dir() and not (output / "checkpoint-6").exists()  # (the earlier run's)
    assert not (output / LOCK).exists()


def test_an_output_folder_holding_an_input_is_refused(tmp_path, corpus, capsys):
    output = tmp_path / "out"
    output.mkdir()
    inside = output / "train.txt"
    inside.write_text((tmp_path / "train.txt").read_text())
    for options in ([*corpus, "--output-dir", output], [*corpus, "--output-dir", output, "--overwrite"]):
        options[options.index("--train-file") + 1] = inside
        assert train(*options) == 2
        assert f"--output-dir {output} holds --train-file {inside}" in last_error_line(capsys)
    assert [path.name for path in output.iterdir()] == ["train.txt"]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_folder_that_is_not_a_run_is_refused_without_suggesting_overwrite(tmp_path, corpus, capsys, overwrite):
    output = tmp_path / "mine"
    output.mkdir()
    (output / "thesis.tex").write_text("mine")
    assert train(*corpus, "--output-dir", output, *overwrite) == 2
    error = last_error_line(capsys)
    assert "holds files that transformers-xl train did not write (thesis.tex)" in error and "--overwrite" not in error
    assert [path.name for path in output.iterdir()] == ["thesis.tex"]


@pytest.mark.parametrize("key", [None, "{not json", '{"recipe": "tiny"}'])
def test_a_users_own_corpus_folder_is_never_overwritten(tmp_path, corpus, capsys, key):
    output = tmp_path / "out"
    (output / "corpus").mkdir(parents=True)
    (output / "corpus" / "train.txt").write_text("my own corpus")
    if key is not None:
        (output / "corpus" / "key.json").write_text(key)
    assert train(*corpus, "--output-dir", output) == 2
    assert "a corpus/ folder that is not a corpus cache written by train" in last_error_line(capsys)
    assert (output / "corpus" / "train.txt").read_text() == "my own corpus"
    assert sorted(path.name for path in output.rglob("*")) == sorted(["corpus", "train.txt"] + (["key.json"] * bool(key)))


def test_a_damaged_key_of_the_runs_own_cache_is_rebuilt(tmp_path, corpus, capsys):
    output = tmp_path / "out"
    assert train(*corpus, "--output-dir", output) == 0
    (output / "corpus" / "key.json").write_text("{not json")
    assert train(*corpus, "--output-dir", output, "--overwrite") == 0
    assert (output / "corpus" / "key.json").read_text().startswith('{"recipe": "tiny"')


def test_a_second_run_into_a_locked_folder_stops(tmp_path, corpus, capsys):
    output = tmp_path / "out"
    output.mkdir()
    (output / LOCK).write_text(owner_name())  # (this process: running)
    assert train(*corpus, "--output-dir", output) == 2
    assert f"--output-dir {output} is in use by another transformers-xl train" in last_error_line(capsys)
    assert [path.name for path in output.iterdir()] == [LOCK]
    (output / LOCK).write_text("elsewhere-123-456")  # (another host's run: it cannot be checked, so it is kept)
    assert train(*corpus, "--output-dir", output) == 2
    assert "(process 123 on elsewhere, lock" in last_error_line(capsys) and (output / LOCK).exists()


def test_the_stale_lock_of_a_dead_process_is_reported_and_cleared(tmp_path, corpus, capsys):
    output = tmp_path / "out"
    output.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (output / LOCK).write_text(f"{host_name()}-{pid}-12345")
    assert train(*corpus, "--output-dir", output) == 0
    assert f"removed the lock {output / LOCK} of process {pid}, which no longer runs" in capsys.readouterr().err
    assert not (output / LOCK).exists() and (output / "model.safetensors").is_file()


def _failing_step(monkeypatch, at_step, outcome):
    """Trainer's training step, which from `at_step` on raises `outcome` or returns it as the loss."""
    step = Trainer.training_step

    def training_step(self, *args, **kwargs):
        loss = step(self, *args, **kwargs)
        if self.state.global_step + 1 >= at_step:
            if isinstance(outcome, BaseException):
                raise outcome
            return torch.tensor(outcome)
        return loss

    monkeypatch.setattr(Trainer, "training_step", training_step)


def test_ctrl_c_says_where_training_stopped_and_how_to_resume(tmp_path, corpus, capsys, monkeypatch):
    output = tmp_path / "out"
    _failing_step(monkeypatch, 5, KeyboardInterrupt())
    assert train(*corpus, "--output-dir", output) == 130
    assert last_error_line(capsys).endswith(  # (after the progress bar Trainer leaves on the line)
        f"transformers-xl train: interrupted at step 4 of 6; the last complete checkpoint is {output / 'checkpoint-3'}: "
        "run the same command with --resume to continue from it."
    )
    assert not (output / LOCK).exists() and not (output / "model.safetensors").exists()


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_non_finite_loss_stops_the_run(tmp_path, corpus, capsys, monkeypatch, loss):
    _failing_step(monkeypatch, 2, loss)
    assert train(*corpus, "--output-dir", tmp_path / "out") == 2
    assert f"the training loss is {loss} at step 2; training stopped" in last_error_line(capsys)
    assert not (tmp_path / "out" / "eval_results.json").exists()


@pytest.mark.parametrize(
    "failure, message",
    [
        (OSError(errno.ENOSPC, "No space left on device", "optimizer.pt"), "optimizer.pt: No space left on device"),
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
         "writing checkpoint-3 failed ([enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598); is the "
         "disk full?"),  # (what torch.save raises on a full disk)
    ],
)  # fmt: skip
def test_a_full_disk_gives_one_line(tmp_path, corpus, capsys, monkeypatch, failure, message):
    def no_space(*args, **kwargs):
        raise failure

    monkeypatch.setattr(torch, "save", no_space)
    assert train(*corpus, "--output-dir", tmp_path / "out") == 2
    assert message in last_error_line(capsys)
    assert not (tmp_path / "out" / "checkpoint-3").exists()  # (no incomplete checkpoint in place)


def test_a_safetensors_write_error_gives_one_line(tmp_path, corpus, capsys, monkeypatch):
    import transformers.modeling_utils

    def fail(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: Read-only file system (os error 30)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", fail)
    assert train(*corpus, "--output-dir", tmp_path / "out") == 2
    assert "Read-only file system" in last_error_line(capsys)


def test_meaningless_texts_and_vocabularies_are_refused(tmp_path, corpus, capsys):
    (tmp_path / "blank.txt").write_text("\n \n\n\t\n" * 50)
    (tmp_path / "other.txt").write_text("x y z\n" * 200)
    cases = [
        (["--train-file", tmp_path / "blank.txt"], "blank.txt: no symbols in it"),
        (["--min-freq", 100_000], "the vocabulary counted with --min-freq 100000 holds only special symbols"),
        (["--valid-file", tmp_path / "other.txt"], "other.txt: 100.0% of its symbols (600 of 600) are not in the"),
    ]
    for number, (change, message) in enumerate(cases):
        options = list(corpus)
        if change[0] in options:
            options[options.index(change[0]) + 1] = change[1]
        else:
            options += change
        assert train(*options, "--output-dir", tmp_path / f"o{number}") == 2
        assert message in last_error_line(capsys)
        assert not (tmp_path / f"o{number}").exists()
    options = list(corpus)
    options[options.index("--valid-file") + 1] = tmp_path / "other.txt"
    assert train(*options, "--output-dir", tmp_path / "allowed", "--allow-unknown") == 0


def test_a_non_finite_final_evaluation_writes_no_model(tmp_path, corpus, capsys, monkeypatch):
    from transformers_xl.training import train as train_module

    monkeypatch.setattr(train_module, "evaluate_stream", lambda *args, **kwargs: {"loss": float("nan")})
    assert train(*corpus, "--output-dir", tmp_path / "out") == 2
    assert "the final evaluation on the valid file gives a loss of nan" in last_error_line(capsys)
    assert not any((tmp_path / "out" / name).exists() for name in ("model.safetensors", "eval_results.json"))


def test_a_damaged_marker_gives_one_line_and_removes_nothing(tmp_path, corpus, capsys):
    output = tmp_path / "out"
    assert train(*corpus, "--output-dir", output) == 0
    (output / MARKER).write_text("{not json")
    before = sorted(output.rglob("*"))
    assert train(*corpus, "--output-dir", output, "--overwrite") == 2
    assert f"{output / MARKER}: damaged (not the JSON list of the files" in last_error_line(capsys)
    assert sorted(output.rglob("*")) == before
