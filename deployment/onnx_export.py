"""An ONNX graph of a model and its memory, verified in ONNX Runtime against eager PyTorch before it is published.

The graph (`model.onnx`) takes `input_ids` [batch, segment] (XLNetForMultipleChoice: [batch, choices, segment]) and
`memory` [n_layer, memory, batch, d_model] (the layers' `mems` stacked, time-major), and returns the head's outputs
(the Transformer-XL LM's `logits` are log-probabilities) and `new_memory`, the memory for the next segment: the last
`mem_len` layer inputs over [memory; segment] (all of them where XLNet's mem_len is null). The memory length is free:
a stream starts from an empty memory (length 0), or from `mem_len` zero vectors for a Transformer-XL whose config
sets `zero_initial_mems` (the graph's metadata `initial_memory_length` says which), and feeds each `new_memory` back.
Without `dynamic` the batch size and segment length are those the graph was exported with.

The graph is written into a staging folder beside OUTPUT with the model's config.json (and its tokenizer files,
when the model folder has them), run in ONNX Runtime over a short stream of segments carrying the memory, compared
with the eager model, and only then published at OUTPUT (see `conversion.publish`).
"""

import logging
import shutil
import sys
from pathlib import Path

import torch

from ..conversion.publish import StagingFolder, check_apart
from .streaming import StreamingModel

DEFAULT_TOLERANCE = 1e-4
# int8 weights move every output: ONNX Runtime's dynamic quantization (per-tensor weight scales, activations
# quantized per call) is checked with a looser bound and, for scores over classes or words, top-1 agreement. The
# difference grows as the memory fills (issue 39: 0.448 over 3 segments, 0.661 over the 13 that fill a memory).
DEFAULT_INT8_TOLERANCE = 1.0
DEFAULT_INT8_AGREEMENT = 0.9
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model")
VERIFIED_SEGMENTS = 3
SUPPORTED_OPSETS = range(18, 24)
"""18: the exporter's own operator set (asked for less, it writes 18 anyway); 23: the newest torch.onnx converts to."""


def log(message: str):
    print(f"transformers-xl export: {message}", file=sys.stderr, flush=True)


def _keep_last_memory(proto, mem_len: int | None):
    """Rename the graph's last output, "states" (the layer inputs over [memory; segment]), to "new_memory",
    through an ONNX `Slice` that keeps the last `mem_len` positions (axis 1), or all of them when mem_len is None.
    A negative start clamps at the first position, so the memory grows until it is mem_len long: the one shape
    torch.export cannot trace on both sides of (see streaming.py)."""
    from onnx import TensorProto, helper

    graph = proto.graph
    states = graph.output[-1]
    if mem_len is None:
        graph.node.append(helper.make_node("Identity", [states.name], ["new_memory"]))
    else:
        constants = {"keep_from": -mem_len, "keep_to": torch.iinfo(torch.int64).max, "memory_axis": 1}
        for name, value in constants.items():
            graph.initializer.append(helper.make_tensor(f"new_memory_{name}", TensorProto.INT64, [1], [value]))
        inputs = [states.name] + [f"new_memory_{name}" for name in constants]
        graph.node.append(helper.make_node("Slice", inputs, ["new_memory"], name="keep_last_mem_len"))
    dims = [dim.dim_value or dim.dim_param for dim in states.type.tensor_type.shape.dim]
    dims[1] = "new_memory_length"
    new_memory = helper.make_tensor_value_info("new_memory", states.type.tensor_type.elem_type, dims)
    graph.output.remove(states)
    graph.output.append(new_memory)


def _memory_length_limit(model) -> int | None:
    """The memory the model keeps: mem_len, or None where XLNet keeps every position (mem_len null or 0)."""
    return model.config.mem_len or None


def initial_memory_length(model) -> int:
    """How long a stream's first memory is: 0 (empty), or mem_len zeros for Transformer-XL's `zero_initial_mems`."""
    return model.config.mem_len if getattr(model.config, "zero_initial_mems", False) else 0


def export_graph(streaming: StreamingModel, path: Path, *, dynamic: bool, batch_size: int, segment_length: int,
                 opset: int | None):  # fmt: skip
    """torch.onnx.export (the dynamo exporter) of `streaming` to `path`, with the memory slice and metadata."""
    import onnx

    model = streaming.model
    memory_length = max(2, _memory_length_limit(model) or segment_length)  # (an example of 0 or 1 would be fixed)
    example = streaming.example_inputs(2 if dynamic else batch_size, segment_length, memory_length)
    with torch.no_grad():
        program = torch.onnx.export(
            streaming, example, dynamo=True, opset_version=opset, input_names=["input_ids", "memory"],
            output_names=streaming.output_names(*example), dynamic_shapes=streaming.dynamic_shapes(dynamic),
            verbose=False,
        )  # fmt: skip
    proto = program.model_proto
    _keep_last_memory(proto, _memory_length_limit(model))
    metadata = {
        "transformers_xl.model_class": type(model).__name__,
        "mem_len": str(_memory_length_limit(model) or "null"),
        "initial_memory_length": str(initial_memory_length(model)),
        "memory_layout": "[n_layer, memory, batch, d_model]: each layer's mems, time-major",
    }
    for key, value in metadata.items():
        proto.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(proto)
    onnx.save(proto, path)


def verification_stream(streaming: StreamingModel, dynamic: bool, batch_size: int, segment_length: int):
    """Segments of ids to verify with: `VERIFIED_SEGMENTS` of the exported length, and with `dynamic` other
    lengths and batch sizes too (a shorter segment, and a longer one past mem_len); then more of the exported length
    until the memory has filled to mem_len and slid by a segment, the stream the int8 graph's error grows over."""
    shortest = streaming.shortest_segment()
    lengths = [segment_length] * VERIFIED_SEGMENTS
    if dynamic:
        lengths = [segment_length, max(shortest, segment_length // 2), segment_length + 3, shortest]
    while sum(lengths) < (_memory_length_limit(streaming.model) or 0) + segment_length:
        lengths.append(segment_length)
    rows = batch_size + 1 if dynamic else batch_size  # (not the exported example's batch size, 2)
    return [streaming.example_inputs(rows, length, 0, seed=1 + i)[0] for i, length in enumerate(lengths)]


def compare_with_eager(model, session, segments) -> dict:
    """Feed `segments` through the eager model (its own mems) and the ONNX Runtime session (its own memory): the
    largest absolute difference over every float output and the memory, and the top-1 agreement: of the class /
    word / position scores' best, and of the positions the beam-search QA head picks."""
    streaming = StreamingModel(model)
    names = [output.name for output in session.get_outputs()]
    eager_mems, memory = None, None
    worst, agreeing, scored = 0.0, 0, 0
    for input_ids in segments:
        rows = input_ids.shape[0] * (input_ids.shape[1] if input_ids.dim() == 3 else 1)
        if memory is None:
            length = initial_memory_length(model)
            memory = torch.zeros(model.config.n_layer, length, rows, model.config.d_model).numpy()
        with torch.no_grad():
            extra = {"use_mems": True} if streaming.is_xlnet else {}
            eager = model(input_ids, mems=eager_mems, return_dict=True, **extra)
        outputs = dict(zip(names, session.run(None, {"input_ids": input_ids.numpy(), "memory": memory})))
        for name, got in outputs.items():
            expected = torch.stack(eager.mems) if name == "new_memory" else eager[name]
            got = torch.from_numpy(got)
            if got.shape != expected.shape:
                raise ValueError(f"Verification failed: ONNX Runtime's {name} has shape {tuple(got.shape)}, eager's "
                                 f"{tuple(expected.shape)}.")  # fmt: skip
            if not expected.is_floating_point():  # (the beam-search QA head's top-k positions: near-ties may swap)
                agreeing, scored = agreeing + (got == expected).sum().item(), scored + expected.numel()
                continue
            worst = max(worst, (got.double() - expected.double()).abs().max().item() if got.numel() else 0.0)
            if name in ("logits", "start_logits", "end_logits") and got.numel():
                agreeing += (got.argmax(-1) == expected.argmax(-1)).sum().item()
                scored += expected[..., 0].numel()
        eager_mems, memory = eager.mems, outputs["new_memory"]
    return {"max_abs_diff": worst, "top1_agreement": agreeing / scored if scored else None}


def verify(model, path: Path, segments, tolerance: float, agreement: float | None, what: str) -> dict:
    """Run `path` in ONNX Runtime against eager; a ValueError unless within `tolerance` (and `agreement`)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    result = compare_with_eager(model, session, segments)
    difference, top1 = result["max_abs_diff"], result["top1_agreement"]
    shown = "" if top1 is None else f", top-1 agreement {top1:.1%}" + ("" if agreement is None else f" (at least "
                                                                         f"{agreement:.0%})")  # fmt: skip
    log(f"verified {what} in ONNX Runtime against eager over {len(segments)} segments carrying the memory: max abs "
        f"difference {difference:.3g} (tolerance {tolerance:g}){shown}")  # fmt: skip
    if not difference <= tolerance or (agreement is not None and top1 is not None and top1 < agreement):
        raise ValueError(f"Verification failed: {what} differs from eager by {difference:.3g} (tolerance {tolerance:g})"
                         f"{shown}.")  # fmt: skip
    return result


def quantize_int8(source: Path, target: Path):
    """ONNX Runtime's dynamic quantization: int8 weights for every MatMul / Gemm, activations quantized per call."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # (it warns on the root logger about every activation product it leaves in fp32)
    try:
        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)


def export_onnx(
    model,
    output,
    *,
    dynamic: bool = False,
    quantize: str | None = None,
    opset: int | None = None,
    batch_size: int = 1,
    segment_length: int = 64,
    tolerance: float = DEFAULT_TOLERANCE,
    int8_tolerance: float = DEFAULT_INT8_TOLERANCE,
    int8_agreement: float = DEFAULT_INT8_AGREEMENT,
    source_folder=None,
    force: bool = False,
) -> dict:
    """Write OUTPUT/model.onnx (see the module docstring) and return what the verification measured."""
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize={quantize!r} is not supported; expected None or 'int8'.")
    if opset is not None and opset not in SUPPORTED_OPSETS:
        raise ValueError(f"opset {opset} is not supported; expected {SUPPORTED_OPSETS.start} to "
                         f"{SUPPORTED_OPSETS.stop - 1}.")  # fmt: skip
    if source_folder is not None:
        check_apart(Path(output), Path(source_folder))
    streaming = StreamingModel(model).eval()  # (refuses a model or setting with no exported form, in one line)
    if segment_length < streaming.shortest_segment() or batch_size < 1:
        raise ValueError(f"segment length {segment_length} and batch size {batch_size}: expected a batch of at least 1 "
                         f"and segments of at least {streaming.shortest_segment()} tokens for {type(model).__name__}.")
    segments = verification_stream(streaming, dynamic, batch_size, segment_length)
    with StagingFolder(output, force, marker={"format": "onnx"}, say=log, command="export") as staged:
        graph = staged.path / "model.onnx"
        log(f"exporting {type(model).__name__} ({'dynamic' if dynamic else 'fixed'} batch and segment length)")
        export_graph(streaming, graph, dynamic=dynamic, batch_size=batch_size, segment_length=segment_length,
                     opset=opset)  # fmt: skip
        report = {"fp32": verify(model, graph, segments, tolerance, None, "the graph")}
        if quantize == "int8":
            quantized = staged.path / "model.int8.onnx"
            quantize_int8(graph, quantized)
            report["int8"] = verify(model, quantized, segments, int8_tolerance, int8_agreement, "the int8 graph")
            quantized.replace(graph)
        model.config.save_pretrained(staged.path)
        for name in TOKENIZER_FILES if source_folder is not None else ():
            if (Path(source_folder) / name).is_file():
                shutil.copy(Path(source_folder) / name, staged.path / name)
        staged.publish()
    log(f"wrote {Path(output).absolute() / 'model.onnx'}")
    return report
