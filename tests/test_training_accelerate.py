"""Two processes under `accelerate launch` on CPU (gloo). DDP: the run finishes, each rank reads its own contiguous
rows (disjoint from the other's), carries its own memory, saves it with the checkpoint, and both report the same
evaluation over all rows. FSDP2: each layer is a unit of its own, each rank holds half of the weights, carries its
own memory, and the losses are one process's."""

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


def launch(options, script, *arguments):
    """Run `script` in 2 processes under `accelerate launch` with the launcher's `options`."""
    command = [
        sys.executable, "-m", "accelerate.commands.launch", *options, "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
        str(Path(__file__).with_name(script)), *map(str, arguments),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_two_process_accelerate_launch(tmp_path):
    launch(["--multi_gpu"], "two_process_training.py", tmp_path)
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


FSDP_LAYERS = {"transfo-xl": "FSDPTransfoXLLayer", "xlnet": "FSDPXLNetLayer"}


def test_fsdp_two_processes_train_as_one(tmp_path):
    """`fully_shard` on each layer by hand (`:layers`) and by accelerate's auto-wrap policy, which takes the layer
    classes from the model's `_no_split_modules` (`:accelerate`), on accelerate's FSDP state (set by the script: on
    CPU accelerate itself picks DDP). The one-process reference runs meanwhile."""
    script = Path(__file__).with_name("two_process_fsdp.py")
    specs = ["transfo-xl:layers", "transfo-xl:accelerate", "xlnet:layers", "xlnet:accelerate"]
    fsdp = ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"]
    with subprocess.Popen([sys.executable, str(script), str(tmp_path / "one"), *FSDP_LAYERS],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as one:  # fmt: skip
        launch(fsdp, "two_process_fsdp.py", tmp_path / "two", *specs)
        errors = one.communicate(timeout=300)[1]
    assert one.returncode == 0, errors[-3000:]
    reference = json.loads((tmp_path / "one" / "rank0.json").read_text())
    ranks = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text()) for r in range(2)]
    for spec in specs:
        model = spec.partition(":")[0]
        for rank in ranks:
            run = rank[spec]
            assert run["fed_previous_memory"] == ["empty", True, True], spec
            assert run["units"].count(FSDP_LAYERS[model]) == 2, (spec, run["units"])  # both layers
            losses, expected = run["losses"], reference[model]["losses"]
            assert len(losses) == len(expected) == 3 and max(abs(a - b) for a, b in zip(losses, expected)) < 1e-5
        shares = [rank[spec]["shares"] for rank in ranks]
        assert all(abs(shares[0][name] + shares[1][name] - 1) < 1e-12 for name in shares[0]), spec
        held_whole = [name for name in shares[0] if max(shares[0][name], shares[1][name]) == 1]
        assert held_whole == (["transformer.mask_emb"] if model == "xlnet" else []), spec  # ([1, 1, d]: one row)
