"""Two processes under `accelerate launch` on CPU (gloo): the run finishes, each rank reads its own contiguous rows
(disjoint from the other's), carries its own memory, saves it with the checkpoint, and both report the same
evaluation over all rows."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_accelerate_launch(tmp_path):
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines",
        "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        str(Path(__file__).with_name("two_process_training.py")), str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [rank["world_size"] for rank in ranks] == [2, 2]
    # Stream position i holds token i; 4 rows of 40, 3 steps of 8 tokens: rank 0 reads rows 0-1, rank 1 rows 2-3.
    rows = [rank["rows"] for rank in ranks]
    assert rows[0] == [list(range(0, 24)), list(range(40, 64))]
    assert rows[1] == [list(range(80, 104)), list(range(120, 144))]
    # Each rank: training chains its memory from an empty start; evaluation (5 segments) starts empty again.
    for rank in ranks:
        assert rank["fed_previous_memory"] == ["empty", True, True] + ["empty", True, True, True, True]
    assert ranks[0]["eval_loss"] == ranks[1]["eval_loss"]
    # Each rank saved the memory of its own rows with the checkpoint.
    checkpoint = tmp_path / "checkpoint-2"
    memories = [load_file(checkpoint / f"memory-rank{r}.safetensors")["0"] for r in range(2)]
    assert memories[0].shape == memories[1].shape == (8, 2, 16) and not torch.equal(*memories)
