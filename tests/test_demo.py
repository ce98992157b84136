"""`transformers-xl demo`: the quick run end to end (metrics, plot, a model folder that reloads with the Auto classes,
with and without the plugin, and gives the trained model's outputs); the data split, the character tokenizer, the
fairness of the speed comparison, and clear errors for bad options."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import transformers_xl  # noqa: F401  (registers transfo-xl with the Auto classes)
from transformers_xl.cli import main
from transformers_xl.training import demo


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The quick run's output folder and metrics."""
    output = tmp_path_factory.mktemp("demo") / "out"
    assert main(["demo", "--quick", "--output-dir", str(output), "--seed", "3"]) == 0
    return output, json.loads((output / "metrics.json").read_text())


def test_quick_run_writes_finite_metrics_and_its_settings(quick_run):
    _, metrics = quick_run
    for key in ("bpc_with_memory", "bpc_without_memory", "eval_speedup", "eval_seconds_per_char_memory",
                "eval_seconds_per_char_window", "speed_bpc_memory", "speed_bpc_window", "final_training_bpc",
                "train_time_s", "wall_time_s"):  # fmt: skip
        assert isinstance(metrics[key], float) and math.isfinite(metrics[key]) and metrics[key] > 0, key
    settings = metrics["settings"]
    assert settings["quick"] is True and settings["seed"] == 3
    assert {name: settings[name] for name in demo.QUICK} == demo.QUICK
    assert metrics["attention_length"] == settings["mem_len"]
    assert settings["train_chars"] == (settings["steps"] * settings["segment_len"] + 1) * settings["batch_size"]
    assert settings["eval_chars_used"] == settings["eval_chars"] and settings["speed_chars_used"] == settings["speed_chars"]
    assert settings["train_files"] >= 1 and settings["eval_files"] >= 1 and settings["parameters"] > 0
    steps = [step for step, _ in metrics["learning_curve"]]
    assert steps == sorted(steps) and steps[-1] == settings["steps"]
    assert all(math.isfinite(bits) for _, bits in metrics["learning_curve"])
    assert metrics["sample"].startswith(demo.SAMPLE_PROMPT) and len(metrics["sample"]) > len(demo.SAMPLE_PROMPT)


def test_the_held_out_curve_spans_no_memory_to_four_times_the_trained_memory(quick_run, tmp_path):
    """`evaluate --memory-lengths`'s evaluation at 0, 1/4, 1/2, 1, 2 and 4 times the trained memory: the bpc with
    and without memory are two of its points, and the middle panel plots it, with the evaluation time."""
    _, metrics = quick_run
    mem_len = metrics["settings"]["mem_len"]
    curve = metrics["memory_curve"]
    assert [point["mem_len"] for point in curve] == [0, mem_len // 4, mem_len // 2, mem_len, 2 * mem_len, 4 * mem_len]
    bits = {point["mem_len"]: point["bits_per_character"] for point in curve}
    assert (bits[0], bits[mem_len]) == (metrics["bpc_without_memory"], metrics["bpc_with_memory"])
    assert all(point["predicted_tokens"] == curve[0]["predicted_tokens"] and point["seconds"] > 0 for point in curve)
    figure = demo.plot(metrics, tmp_path / "plot.png")
    bpc_line = figure.axes[1].get_lines()[0]
    assert list(bpc_line.get_xdata()) == list(bits) and list(bpc_line.get_ydata()) == list(bits.values())
    seconds_line = figure.axes[3].get_lines()[0]  # (the panel's second y axis)
    assert list(seconds_line.get_ydata()) == [point["seconds"] for point in curve]


def test_the_speed_panel_shows_both_sides_bits_per_character(quick_run, tmp_path):
    _, metrics = quick_run
    figure = demo.plot(metrics, tmp_path / "plot.png")
    speed_panel = figure.axes[2]
    labels = [text.get_text() for text in speed_panel.texts]
    assert labels == [f"{1000 * metrics['eval_seconds_per_char_memory']:.2f} ms\n{metrics['speed_bpc_memory']:.3f} bpc",
                      f"{1000 * metrics['eval_seconds_per_char_window']:.2f} ms\n{metrics['speed_bpc_window']:.3f} bpc"]


def test_quick_run_writes_a_png_plot(quick_run):
    import matplotlib.image

    output, _ = quick_run
    path = output / "demo.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(path).shape
    assert width > 1000 and height > 300


def test_the_model_folder_reloads_with_the_auto_classes_and_gives_the_trained_models_outputs(quick_run):
    """The same sampled text as the run printed (same seed): the reloaded weights and tokenizer are the trained ones;
    and the held-out bits per character with memory, recomputed from the folder, are the run's."""
    output, metrics = quick_run
    model = AutoModelForCausalLM.from_pretrained(output / "model")
    tokenizer = AutoTokenizer.from_pretrained(output / "model")
    assert type(model).__name__ == "TransfoXLLMHeadModel" and model.config.mem_len == metrics["settings"]["mem_len"]
    assert demo.generate_sample(model, tokenizer, seed=3) == metrics["sample"]

    _, _, held_out = demo.stdlib_files()
    settings = metrics["settings"]
    ids, _ = demo.read_stream(tokenizer, held_out, settings["eval_chars"], "held-out")
    model.eval()
    total, count, mems = 0.0, 0, None
    with torch.no_grad():
        stream = transformers_xl.training.TextStream(ids, settings["batch_size"], settings["segment_len"])
        for segment in range(stream.num_segments):
            items = [stream[segment * stream.num_rows + row] for row in range(stream.num_rows)]
            batch, targets = (torch.stack([item[key] for item in items]) for key in ("input_ids", "shift_labels"))
            out = model(input_ids=batch, mems=mems)  # (the log-probabilities: each position predicts its target)
            total -= out.logits.gather(2, targets[..., None]).sum().item()
            count, mems = count + targets.numel(), out.mems
    assert total / count / math.log(2) == pytest.approx(metrics["bpc_with_memory"], rel=1e-5)


NO_PLUGIN = r"""
import sys
sys.modules["transformers_xl"] = None  # `import transformers_xl` now fails: the plugin is absent
import torch, transformers
model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
tokenizer = transformers.AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
assert type(model).__module__.startswith("transformers_modules"), type(model)
ids = tokenizer(sys.argv[2], return_tensors="pt")["input_ids"]
with torch.no_grad():
    torch.save(model(ids).logits, sys.argv[3])
assert sys.modules["transformers_xl"] is None and not any(name.startswith("transformers_xl.") for name in sys.modules)
"""


def test_the_model_folder_loads_with_trust_remote_code_without_the_plugin(quick_run, tmp_path):
    output, _ = quick_run
    text = "def f(x):\n\treturn x  # ok\n"
    tokenizer = AutoTokenizer.from_pretrained(output / "model")
    model = AutoModelForCausalLM.from_pretrained(output / "model").eval()
    with torch.no_grad():
        expected = model(tokenizer(text, return_tensors="pt")["input_ids"]).logits
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-I", "-c", NO_PLUGIN, str(output / "model"), text, str(tmp_path / "logits.pt")],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected, atol=1e-5, rtol=0)


# --- the pieces ------------------------------------------------------------------------------------------------


def test_files_are_split_deterministically_into_disjoint_training_and_held_out_sets():
    root, training, held_out = demo.stdlib_files()
    assert (root, training, held_out) == demo.stdlib_files()
    assert training and held_out and not set(training) & set(held_out)
    assert 0.05 < len(held_out) / (len(training) + len(held_out)) < 0.2
    assert all(path.suffix == ".py" and "site-packages" not in path.parts for path in training + held_out)


def test_the_character_tokenizer_gives_one_token_per_character_and_decodes_exactly():
    tokenizer = demo.character_tokenizer()
    text = "class A:\n\tx = {'a': [1, 2]}  # ~`|\\\n\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    assert tokenizer("é")["input_ids"] == [tokenizer.unk_token_id]
    assert len(tokenizer) == 2 + len(demo.CHARACTERS)


def test_state_reuse_and_the_sliding_window_predict_from_the_same_context():
    """With one layer the memory holds plain embeddings, so Transformer-XL with memory A and `same_length` attends
    to exactly the keys of a window of A: the same predictions. With two layers they differ (the memory's second
    layer inputs were computed with context from before the window). The model's settings are restored."""
    ids = torch.randint(20, (60,), generator=torch.Generator().manual_seed(0))
    for n_layer in (1, 2):
        model = demo.build_model({**demo.QUICK, "n_layer": n_layer, "mem_len": 5, "seed": 0}, vocab_size=20)
        with torch.no_grad():  # weights large enough for the context to change the predictions
            for parameter in model.parameters():
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(parameter.numel()))
        speed = demo.evaluation_speed(model, ids, attention_length=8, segment_len=3, chars=40)
        assert speed["chars"] == 40 and speed["speedup"] > 0
        assert (model.config.mem_len, model.config.same_length) == (5, False)
        if n_layer == 1:
            assert speed["bpc_memory"] == pytest.approx(speed["bpc_window"], rel=1e-5)
        else:
            assert speed["bpc_memory"] != pytest.approx(speed["bpc_window"], rel=1e-5)


@pytest.mark.parametrize(
    "options, message",
    [
        (["--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
        (["--d-model", "wide"], "argument --d-model: expected a positive integer, got 'wide'"),
        (["--learning-rate", "-1"], "argument --learning-rate: expected a positive number, got '-1'"),
        (["--size", "3"], "unrecognized arguments: --size 3"),
    ],
)
def test_bad_options_are_refused_by_the_parser(options, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *options])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "options, message",
    [
        (["--d-model", "30", "--n-head", "4"], "--n-head 4 must divide --d-model 30"),
        (["--eval-chars", "7"], "--eval-chars 7 cannot fill --batch-size 4 rows"),
        (["--output-dir", "README.md"], "--output-dir README.md is a file; expected a folder"),
    ],
)
def test_inconsistent_options_are_refused_before_anything_runs(options, message, capsys, tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text("not a folder")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--quick", "--output-dir", "out", *options]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_python_without_its_standard_library_sources_gets_a_clear_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "stdlib" / "json").mkdir(parents=True)
    (tmp_path / "stdlib" / "json" / "__init__.pyc").write_bytes(b"")
    monkeypatch.setattr(demo.sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path / "stdlib")})
    assert main(["demo", "--quick", "--output-dir", str(tmp_path / "out")]) == 1
    assert "found no .py files in the standard library folder" in capsys.readouterr().err
