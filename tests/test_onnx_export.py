"""`transformers-xl export MODEL OUTPUT --format onnx`: the graph runs in ONNX Runtime over a stream of segments,
its memory carried from one to the next starting empty, with eager's outputs and memory (checked here
independently of the command's own verification); --dynamic frees the batch size and segment length; --quantize
int8 quantizes every weight product; bad input fails in one line and leaves no OUTPUT."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxscript", reason="the ONNX exporter needs the onnx extra: pip install 'transformers-xl[onnx]'")
onnxruntime = pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'transformers-xl[onnx]'")
onnx = pytest.importorskip("onnx", reason="needs the onnx extra: pip install 'transformers-xl[onnx]'")

from test_export import MEM_LEN, VOCAB, ids, tiny  # noqa: E402

from transformers_xl.cli import main  # noqa: E402
from transformers_xl.conversion import publish  # noqa: E402
from transformers_xl.deployment import onnx_export  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"


def export(tmp_path, name, *options, **overrides):
    """Save a tiny `name` model, export it with the command line; (model, OUTPUT, exit status)."""
    model = tiny(name, **overrides)
    folder, output = tmp_path / "model", tmp_path / "onnx"
    model.save_pretrained(folder)
    status = main(["export", str(folder), str(output), "--format", "onnx", "--segment-length", "6", *options])
    return model, output, status


def stream(model, output, segments):
    """Run `segments` through OUTPUT's graph in ONNX Runtime and through the eager model, each with its own memory
    (the graph's from its metadata's initial length), and compare every output and the memory."""
    session = onnxruntime.InferenceSession(str(output / "model.onnx"))
    metadata = session.get_modelmeta().custom_metadata_map
    names = [output.name for output in session.get_outputs()]
    assert names[-1] == "new_memory" and [i.name for i in session.get_inputs()] == ["input_ids", "memory"]
    extra = {"use_mems": True} if model.config.model_type == "xlnet" else {}
    memory, mems = None, None
    for segment in segments:
        rows = segment.shape[0] * (segment.shape[1] if segment.dim() == 3 else 1)
        if memory is None:
            initial = int(metadata["initial_memory_length"])
            memory = torch.zeros(model.config.n_layer, initial, rows, model.config.d_model).numpy()
        outputs = dict(zip(names, session.run(None, {"input_ids": segment.numpy(), "memory": memory})))
        with torch.no_grad():
            expected = model(segment, mems=mems, **extra)
        for name in names[:-1]:
            torch.testing.assert_close(torch.from_numpy(outputs[name]), expected[name], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.from_numpy(outputs["new_memory"]), torch.stack(expected.mems), atol=1e-4,
                                   rtol=1e-4)  # fmt: skip
        memory, mems = outputs["new_memory"], expected.mems
    return memory


def test_transformer_xl_lm_streams_through_onnx_runtime_with_its_memory(tmp_path, capsys):
    """Fixed batch and segment length; the memory starts empty, grows, then slides at mem_len (the graph's Slice).
    With `same_length`, whose mask depends on how far memory + segment exceed mem_len on both sides of it."""
    model, output, status = export(tmp_path, "TransfoXLLMHeadModel", "--batch-size", "2", same_length=True)
    assert status == 0
    assert "verified the graph in ONNX Runtime against eager" in capsys.readouterr().err
    assert sorted(path.name for path in output.iterdir() if not path.name.startswith(".")) == [
        "config.json", "configuration_transfo_xl.py", "model.onnx"
    ]  # fmt: skip
    memory = stream(model, output, [ids("TransfoXLLMHeadModel", 6, seed) for seed in range(3)])
    assert memory.shape[1] == MEM_LEN


@pytest.mark.parametrize(
    "name, overrides",
    # (the QA head's weights large enough that its top-k candidates are not near ties, which may swap between runtimes)
    [("XLNetLMHeadModel", {}), ("XLNetForQuestionAnswering", {"initializer_range": 0.3}),
     ("TransfoXLLMHeadModel", {"same_length": True})],
)
def test_dynamic_graph_takes_other_batch_sizes_and_segment_lengths(tmp_path, capsys, name, overrides):
    """--dynamic: batch sizes and segment lengths other than the export's (the beam-search QA head's top-k over the
    segment included; Transformer-XL's `same_length` span, which depends on how far memory + segment exceed
    mem_len), the memory growing and sliding."""
    model, output, status = export(tmp_path, name, "--dynamic", **overrides)
    assert status == 0
    message = capsys.readouterr().err
    assert "max abs difference" in message and "(tolerance 0.0001)" in message
    lengths = [7, 3, 12, 4] if name == "XLNetForQuestionAnswering" else [7, 1, 12, 2]
    segments = [torch.randint(1, VOCAB, (3, n), generator=torch.Generator().manual_seed(n)) for n in lengths]
    assert stream(model, output, segments).shape[1] == MEM_LEN


@pytest.mark.parametrize(
    "source, source_format, same_length, options",
    [
        ("hf_legacy/transfo_xl_lm", "hf-legacy", False, ["--quantize", "int8"]),
        ("hf_legacy/transfo_xl_lm", "hf-legacy", True, []),
        ("original_pytorch/div2_tied/model.pt", "original-pytorch", False, []),
    ],
)
def test_dynamic_export_of_converted_checkpoints(tmp_path, capsys, source, source_format, same_length, options):
    """--dynamic for converted Transformer-XL checkpoints, `same_length` False as well as True: the relative shift's
    view of the flattened scores failed to trace (GuardOnDataDependentSymNode); the copy torch.export traces does."""
    folder = tmp_path / "converted"
    assert main(["convert", str(FIXTURES / source), str(folder), "--from", source_format]) == 0
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "same_length": same_length}))
    command = ["export", str(folder), str(tmp_path / "onnx"), "--format", "onnx", "--dynamic", "--segment-length", "5"]
    assert main(command + options) == 0
    message = capsys.readouterr().err
    assert "verified the graph in ONNX Runtime" in message
    assert ("verified the int8 graph" in message) == ("int8" in options)


def test_int8_graph_quantizes_every_weight_product_and_says_how_close_it_is(tmp_path, capsys):
    """--quantize int8 (and --opset 20) on a classifier whose stream starts from mem_len zeros (zero_initial_mems, in
    the metadata)."""
    name = "TransfoXLForSequenceClassification"
    model, output, status = export(tmp_path, name, "--quantize", "int8", "--opset", "20", zero_initial_mems=True)
    assert status == 0
    message = capsys.readouterr().err
    assert "verified the int8 graph" in message and "tolerance 1)" in message and "top-1 agreement" in message
    graph = onnx.load(output / "model.onnx")
    operators = [node.op_type for node in graph.graph.node]
    assert operators.count("MatMulInteger") >= 6  # (q, k and v, output and feed-forward projections, classifier)
    assert {prop.key: prop.value for prop in graph.metadata_props}["initial_memory_length"] == str(MEM_LEN)
    assert {opset.domain: opset.version for opset in graph.opset_import}[""] == 20


@pytest.mark.parametrize("dynamic", [False, True])
def test_the_verification_stream_fills_the_memory_and_slides_it(dynamic):
    """Both graphs, fp32 and int8, are verified until the memory is full and a segment more: int8's difference grows
    as the memory fills."""
    streaming = onnx_export.StreamingModel(tiny("TransfoXLLMHeadModel"))
    segments = onnx_export.verification_stream(streaming, dynamic, batch_size=1, segment_length=2)
    assert sum(segment.shape[-1] for segment in segments) >= MEM_LEN + 2


def test_a_failed_verification_leaves_no_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(onnx_export, "compare_with_eager", lambda *args: {"max_abs_diff": 0.5, "top1_agreement": 1.0})
    _, output, status = export(tmp_path, "XLNetModel")
    assert status == 1
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message == ("transformers-xl export: error: Verification failed: the graph differs from eager by 0.5 "
                       "(tolerance 0.0001), top-1 agreement 100.0%.")  # fmt: skip
    assert not output.exists() and [path.name for path in tmp_path.iterdir()] == ["model"]


def test_a_folder_of_another_model_is_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    assert main(["export", str(folder), str(tmp_path / "out"), "--format", "onnx"]) == 1
    error = capsys.readouterr().err.strip()
    assert error == (f"transformers-xl export: error: {folder}: config.json names architectures ['BertModel']; "
                     "expected one transformers-xl class (a Transformer-XL or XLNet model).")  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_an_existing_output_is_kept(tmp_path, capsys):
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "mine.txt").write_text("kept")
    _, output, status = export(tmp_path, "XLNetModel")
    assert status == 1
    assert "exists; pass --force to replace it." in capsys.readouterr().err
    assert [path.name for path in output.iterdir()] == ["mine.txt"]


def test_force_never_replaces_the_source_nor_a_converted_folder(tmp_path, capsys):
    """`export SRC SRC --force` (or an OUTPUT holding SRC) would delete the model it exports; a converted folder is
    not an export's to replace. Both refused in one line, before any work, with every file kept."""
    converted = tmp_path / "converted"
    assert main(["convert", str(FIXTURES / "hf_legacy/xlnet_lm"), str(converted), "--from", "hf-legacy"]) == 0
    before = sorted(path.name for path in converted.iterdir())
    capsys.readouterr()
    tiny("XLNetModel").save_pretrained(tmp_path / "model")
    for source, output, message in (
        (converted, converted, f"OUTPUT {converted} would replace SOURCE {converted}; write elsewhere."),
        (converted, tmp_path, f"OUTPUT {tmp_path} would replace SOURCE {converted}; write elsewhere."),
        (tmp_path / "model", converted, "is not a folder written by transformers-xl export (transformers-xl convert "
                                        "wrote it); --force replaces only such a folder."),
    ):
        assert main(["export", str(source), str(output), "--format", "onnx", "--force"]) == 1
        assert message in capsys.readouterr().err.strip().splitlines()[-1]  # (after the loading's progress bar)
        assert sorted(path.name for path in converted.iterdir()) == before


def test_of_two_exports_to_one_output_the_first_to_finish_wins(tmp_path, capsys, monkeypatch):
    """The other export publishes while this one writes: this one stops with one line and keeps the other's folder;
    a staging folder left by a killed export is removed and reported."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # (its pid is free now)
    stale = tmp_path / f".onnx.{publish.host_name()}-{dead.pid}-1.abc123.partial"
    stale.mkdir()
    export_graph = onnx_export.export_graph

    def meanwhile(*args, **kwargs):
        export_graph(*args, **kwargs)
        with onnx_export.StagingFolder(tmp_path / "onnx", command="export") as other:
            (other.path / "config.json").write_text("{}")
            (other.path / "model.onnx").write_text("the other run's")
            other.publish()

    monkeypatch.setattr(onnx_export, "export_graph", meanwhile)
    _, output, status = export(tmp_path, "XLNetModel")
    assert status == 1
    error = capsys.readouterr().err
    assert f"removed {stale}, left by process {dead.pid}, which no longer runs" in error
    assert error.strip().splitlines()[-1] == (
        f"transformers-xl export: error: {output} appeared while this run was writing; it is left as it is and the new "
        "folder was not kept (run again with another OUTPUT, or with --force to replace a folder written by "
        "transformers-xl)."
    )  # fmt: skip
    assert (output / "model.onnx").read_text() == "the other run's"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model", "onnx"]


@pytest.mark.parametrize("opset", ["5", "17", "24"])
def test_an_opset_outside_the_supported_range_is_refused(tmp_path, capsys, opset):
    _, output, status = export(tmp_path, "XLNetModel", "--opset", opset)
    assert status == 1 and not output.exists()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"transformers-xl export: error: opset {opset} is not supported; expected 18 to 23."
    )


def test_damaged_weights_are_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "model"
    tiny("XLNetModel").save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert main(["export", str(folder), str(tmp_path / "onnx"), "--format", "onnx"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"transformers-xl export: error: {folder}: damaged weights (Error while deserializing header: invalid header "
        "length)"
    )
    assert not (tmp_path / "onnx").exists()
