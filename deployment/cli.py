"""Export a model with its memory as an ONNX graph, verified in ONNX Runtime before it is written.

    transformers-xl export MODEL OUTPUT --format onnx [--dynamic] [--quantize int8] [--opset N]

MODEL is a model folder (from `save_pretrained` or `transformers-xl convert`). OUTPUT is a folder that gets
model.onnx (inputs `input_ids` and `memory`, outputs the head's outputs and `new_memory`), the model's config.json
and its tokenizer files; it appears only once ONNX Runtime's outputs over segments carrying the memory match the
eager model's (docs/deployment.md shows a streaming loop). Needs the `onnx` extra: pip install "transformers-xl[onnx]".
"""

import argparse
import json
from pathlib import Path

from safetensors import SafetensorError

from ..conversion.publish import OutputError
from .onnx_export import DEFAULT_INT8_TOLERANCE, DEFAULT_TOLERANCE, SUPPORTED_OPSETS, export_onnx, log


def load_model(folder: str):
    """The transformers-xl class that config.json's `architectures` names, loaded from `folder`."""
    import transformers_xl

    config_path = Path(folder) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; expected a model folder (save_pretrained or convert).")
    architectures = json.loads(config_path.read_text()).get("architectures") or []
    classes = [getattr(transformers_xl, name, None) for name in architectures]
    if not classes or classes[0] is None or not hasattr(classes[0], "from_pretrained"):
        raise ValueError(f"{folder}: config.json names architectures {architectures}; expected one transformers-xl "
                         "class (a Transformer-XL or XLNet model).")  # fmt: skip
    return classes[0].from_pretrained(folder).eval()


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("model", metavar="MODEL", help="the model folder to export")
    parser.add_argument("output", metavar="OUTPUT", help="the folder to write (refused if it exists, see --force)")
    parser.add_argument("--format", required=True, choices=["onnx"], help="the graph format")
    parser.add_argument("--dynamic", action="store_true",
                        help="free batch size and segment length (the memory length is always free)")
    parser.add_argument("--quantize", choices=["int8"], help="ONNX Runtime's dynamic int8 quantization of the graph")
    parser.add_argument("--opset", type=int, help=f"ONNX opset version, {SUPPORTED_OPSETS.start} to "
                        f"{SUPPORTED_OPSETS.stop - 1} (default: the exporter's)")  # fmt: skip
    parser.add_argument("--batch-size", type=int, default=1, help="the batch size of a fixed graph (default 1)")
    parser.add_argument("--segment-length", type=int, default=64, help="the segment length of a fixed graph "
                        "(and the one exported from with --dynamic; default 64)")  # fmt: skip
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="verification: largest difference")
    parser.add_argument("--int8-tolerance", type=float, default=DEFAULT_INT8_TOLERANCE,
                        help="verification of the int8 graph: largest difference")
    parser.add_argument("--force", action="store_true", help="replace an OUTPUT an earlier export wrote")


def run(args) -> int:
    try:
        import onnxruntime  # noqa: F401  (said up front rather than after the export)
        import onnxscript  # noqa: F401
    except ImportError as error:
        log(f"error: {error.name} is not installed; expected the onnx extra: pip install \"transformers-xl[onnx]\"")
        return 1
    try:
        model = load_model(args.model)
        export_onnx(
            model, args.output, dynamic=args.dynamic, quantize=args.quantize, opset=args.opset,
            batch_size=args.batch_size, segment_length=args.segment_length, tolerance=args.tolerance,
            int8_tolerance=args.int8_tolerance, source_folder=args.model, force=args.force,
        )  # fmt: skip
    except (ValueError, TypeError, FileNotFoundError, OutputError, OSError) as error:
        log(f"error: {error}")
        return 1
    except SafetensorError as error:
        log(f"error: {args.model}: damaged weights ({error})")
        return 1
    return 0
