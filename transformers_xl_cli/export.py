"""Export a model with its memory as an ONNX graph, verified in ONNX Runtime before it is written.

    transformers-xl export MODEL OUTPUT --format onnx [--dynamic] [--quantize int8] [--opset N]

MODEL is a model folder (from `save_pretrained` or `transformers-xl convert`). OUTPUT is a folder that gets
model.onnx (inputs `input_ids` and `memory`, outputs the head's outputs and `new_memory`), the model's config.json
and its tokenizer files; it appears only once ONNX Runtime's outputs over segments carrying the memory match the
eager model's (docs/deployment.md shows a streaming loop). Needs the `onnx` extra: pip install "transformers-xl[onnx]".
"""

import argparse

# The defaults of transformers_xl.deployment.onnx_export, written out so that `--help` needs no import of it
# (tests/test_cli.py checks that they agree).
DEFAULT_TOLERANCE = 1e-4
DEFAULT_INT8_TOLERANCE = 1.0
SUPPORTED_OPSETS = range(18, 24)


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
    from transformers_xl.deployment import cli

    return cli.run(args)
