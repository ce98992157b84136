"""`transformers-xl train`'s checkpoints are complete or absent: a resume after a kill at any checkpoint ends
bit-identical to an uninterrupted run, skips incomplete checkpoints and says so, does nothing to a finished run,
and names changed settings in one line."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from test_train import train, write_corpus

from transformers_xl.training.memory_trainer import CHECKPOINT_FILES

STEPS = ["--max-steps", "6", "--save-steps", "2", "--logging-steps", "2", "--batch-size", "4", "--tgt-len", "8"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted run of 6 steps with a checkpoint every 2 (dropout on: the random state matters too)."""
    folder = tmp_path_factory.mktemp("straight")
    train_file, valid_file = write_corpus(folder)
    common = ["--recipe", "tiny", "--train-file", train_file, "--valid-file", valid_file, *STEPS]
    assert train(*common, "--output-dir", folder / "out") == 0
    return common, folder / "out"


def killed_after(run, copy, step):
    """The run's folder as a kill right after checkpoint-`step` leaves it, with the next checkpoint half-written."""
    shutil.copytree(run, copy, symlinks=True)
    for path in copy.iterdir():
        if path.name.startswith("checkpoint-") and int(path.name.split("-")[1]) > step:
            shutil.rmtree(path)
        elif path.is_file() and not path.name.startswith("."):
            path.unlink()  # the final model and results, written after the last step
    if (run / f"checkpoint-{step + 2}").exists():
        half = copy / ".partial" / f"checkpoint-{step + 2}"
        half.mkdir(parents=True)
        shutil.copy(run / f"checkpoint-{step + 2}" / "model.safetensors", half)


def final_loss(run) -> float:
    return json.loads((run / "eval_results.json").read_text())["results"]["valid"]["loss"]


@pytest.mark.parametrize("step", [2, 4])
def test_a_resume_after_a_kill_ends_bit_identical(straight, tmp_path, capsys, step):
    common, run = straight
    killed_after(run, tmp_path / "resumed", step)
    capsys.readouterr()
    # (another seed: the weights, random state, schedule and memory all come from the checkpoint)
    assert train(*common, "--output-dir", tmp_path / "resumed", "--resume", "--seed", 5) == 0
    assert f"continuing from {tmp_path / 'resumed' / f'checkpoint-{step}'} (step {step} of 6)" in capsys.readouterr().err
    expected, resumed = (load_file(folder / "model.safetensors") for folder in (run, tmp_path / "resumed"))
    assert expected.keys() == resumed.keys() and all(torch.equal(resumed[key], expected[key]) for key in expected)
    assert final_loss(tmp_path / "resumed") == final_loss(run)
    assert not (tmp_path / "resumed" / ".partial").exists()  # (the half-written checkpoint was removed)


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda c: (c / "optimizer.pt").unlink(), "no optimizer.pt"),
        (lambda c: (c / "scheduler.pt").unlink(), "no scheduler.pt"),
        (lambda c: (c / "memory-rank0.safetensors").unlink(), "no memory-rank0.safetensors"),
        (lambda c: (c / "trainer_state.json").unlink(), "no trainer_state.json"),
        (lambda c: (c / "model.safetensors").write_bytes(b"x" * 1000), "model.safetensors has 1000 bytes"),
        (lambda c: [p.unlink() for p in c.iterdir()], f"no {CHECKPOINT_FILES}: not written to the end"),
    ],
)  # fmt: skip
def test_a_resume_skips_incomplete_checkpoints_and_says_which(straight, tmp_path, capsys, damage, problem):
    common, run = straight
    killed_after(run, tmp_path / "resumed", 6)
    damage(tmp_path / "resumed" / "checkpoint-6")
    capsys.readouterr()
    assert train(*common, "--output-dir", tmp_path / "resumed", "--resume") == 0
    error = capsys.readouterr().err
    assert f"skipped the incomplete checkpoint {tmp_path / 'resumed' / 'checkpoint-6'} ({problem}" in error
    assert "continuing from" in error and "checkpoint-4 (step 4 of 6)" in error
    expected, resumed = (load_file(folder / "model.safetensors") for folder in (run, tmp_path / "resumed"))
    assert all(torch.equal(resumed[key], expected[key]) for key in expected)


def test_a_finished_run_resumed_says_so_and_changes_nothing(straight, capsys):
    common, run = straight
    before = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    capsys.readouterr()
    assert train(*common, "--output-dir", run, "--resume") == 0
    captured = capsys.readouterr()
    assert f"the run in {run} is finished (step 6 of 6)" in captured.err and "loss" not in captured.out
    after = {path: path.stat().st_mtime_ns for path in run.rglob("*")}
    assert after.keys() - {run / ".transformers-xl-train.lock"} == before.keys() and after == before


def test_all_steps_done_without_the_final_model_evaluates_and_writes_it(straight, tmp_path):
    common, run = straight
    killed_after(run, tmp_path / "resumed", 6)
    assert train(*common, "--output-dir", tmp_path / "resumed", "--resume") == 0
    assert not (tmp_path / "resumed" / "checkpoint-7").exists()
    assert final_loss(tmp_path / "resumed") == final_loss(run)


def test_a_resume_with_other_settings_names_them(straight, tmp_path, capsys):
    common, run = straight
    killed_after(run, tmp_path / "resumed", 4)
    (tmp_path / "other.txt").write_text((run.parent / "train.txt").read_text() + "w1 w2\n")
    changed = [*common, "--batch-size", "2", "--tgt-len", "16", "--train-file", tmp_path / "other.txt"]
    capsys.readouterr()
    assert train(*changed, "--output-dir", tmp_path / "resumed", "--resume") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("transformers-xl train: --resume: ") and (
        "was trained with other settings: --batch-size 4 (now 2); --eval-tgt-len 8 (now 16); the train file (another "
        "size or content); --mem-len 8 (now 16); --tgt-len 8 (now 16). Resume with the run's settings" in error[0]
    ), error


def test_checkpoints_and_the_model_follow_the_umask(straight):
    _, run = straight
    for path in [run / "model.safetensors", run / "config.json", *(run / "checkpoint-2").iterdir()]:
        assert path.stat().st_mode & 0o777 == 0o666 & ~_umask(), path


def _umask() -> int:
    import os

    umask = os.umask(0)
    os.umask(umask)
    return umask
