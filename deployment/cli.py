"""`transformers-xl export`: load the model folder and export it as an ONNX graph, verified before it is written.

The command's options and help are in transformers_xl_cli/export.py.
"""

import json
from pathlib import Path

from safetensors import SafetensorError

from ..conversion.publish import OutputError
from .onnx_export import export_onnx, log


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
