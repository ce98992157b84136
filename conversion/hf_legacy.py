"""Legacy transformers 4.x folders (Transformer-XL or XLNet) -> `ConvertedCheckpoint`.

Our models read these folders as they are (4.x parameter names; `pytorch_model.bin` unpickled with torch's
weights-only loader, so nothing in it runs). This reader adds what a conversion needs on top: strict checks (every
stored weight used, none missing, every shape as the config says), the vocabulary files beside the weights, and the
loaded model kept as the source that the written folder is verified against.
"""

import pickle
from functools import partial
from pathlib import Path

import torch
import yaml
from huggingface_hub.repocard import metadata_load
from safetensors import SafetensorError, safe_open

from ..modeling import modeling_transfo_xl, modeling_xlnet
from .converted import ConvertedCheckpoint, checkpoint_state_dict, does_not_fit
from .hub_export import SETTINGS_FILE, max_difference
from .remote_code import OWN_AUTO_CLASS
from .source_files import check_zip_entries, read_json, refused_pickle

MODULES = {"transfo-xl": modeling_transfo_xl, "xlnet": modeling_xlnet}
DEFAULT_HEADS = {"transfo-xl": "TransfoXLLMHeadModel", "xlnet": "XLNetLMHeadModel"}
# (one file, or the index of its shards), in the order transformers prefers them
WEIGHT_FILES = (
    ("model.safetensors", "model.safetensors.index.json"),
    ("pytorch_model.bin", "pytorch_model.bin.index.json"),
)
# What a damaged weights file raises while it is read.
UNREADABLE = (OSError, RuntimeError, EOFError, KeyError, pickle.UnpicklingError, SafetensorError)
VOCABULARY_FILES = ("tokenizer.json", "vocab.pkl", "vocab.bin", "vocab.txt", "spiece.model", SETTINGS_FILE)


def read_hf_legacy(source, config=None) -> ConvertedCheckpoint:
    """Read the folder `source`; `config` (a config.json path) replaces the folder's own config."""
    folder = Path(source)
    config_file = Path(config) if config is not None else folder / "config.json"
    if not folder.is_dir() or not config_file.is_file():
        raise ValueError(f"{source}: expected a transformers folder with a config.json (or pass --config).")
    config_dict = read_json(config_file)
    model_type = config_dict.get("model_type")
    if model_type not in MODULES:
        raise ValueError(f"{source}: a {model_type!r} checkpoint; expected model_type 'transfo-xl' or 'xlnet'.")
    head = (config_dict.get("architectures") or [DEFAULT_HEADS[model_type]])[0]
    model_class = getattr(MODULES[model_type], head, None)
    if model_class is None or head not in OWN_AUTO_CLASS:
        heads = sorted(name for name in OWN_AUTO_CLASS if hasattr(MODULES[model_type], name))
        raise ValueError(f"{source}: unknown {model_type} head {head!r}; expected one of {heads}.")
    ours = model_class.config_class.from_dict(config_dict)
    compared_with = "the source folder run by transformers-xl, not by transformers 4.x"
    if model_type == "transfo-xl" and "zero_initial_mems" not in config_dict:
        # transformers 4.x started every stream from mem_len zero vectors that are attended to; so does the written
        # folder, which therefore gives 4.x's numbers (our default, the original code's, is an empty first memory)
        ours.zero_initial_mems = True
        compared_with += "; both start from mem_len zero vectors of memory, as 4.x did: zero_initial_mems=True"

    try:
        stored = stored_shapes(folder)
        with torch.device("meta"):
            needed = {name: tuple(t.shape) for name, t in checkpoint_state_dict(model_class(ours)).items()}
        # Shapes first: transformers' loader fails on a tied weight whose stored shape does not fit (it compares
        # the tie on the meta device), so a config that does not fit the weights would read as a damaged file.
        mismatched = sorted(name for name in stored.keys() & needed.keys() if stored[name] != needed[name])
        if mismatched:
            shapes = [f"{name}: stored {list(stored[name])}, the config needs {list(needed[name])}"
                      for name in mismatched]  # fmt: skip
            raise does_not_fit(f"{source}: the weights", model_class, shapes)
        model, info = model_class.from_pretrained(
            folder,
            config=ours,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # (reported below with the other problems, by name)
        )
    except UNREADABLE as error:
        raise ValueError(f"{source}: cannot read the weights (a truncated or damaged file?): {error}") from error
    problems = [f"missing {name}" for name in sorted(info["missing_keys"])]
    problems += [f"unexpected {name}" for name in sorted(info["unexpected_keys"])]
    problems += [f"{name}: stored {list(a)}, the config needs {list(b)}" for name, a, b in info["mismatched_keys"]]
    if problems:
        raise does_not_fit(f"{source}: the weights", model_class, problems)

    model.eval()
    return ConvertedCheckpoint(
        model_class=model_class,
        config=model.config,
        state_dict=checkpoint_state_dict(model),
        source=f"transformers 4.x folder {folder.name} ({head})",
        compare_with_source=partial(max_difference, model),
        compared_with=compared_with,
        tokenizer_files={kind: str(folder / kind) for kind in VOCABULARY_FILES if (folder / kind).is_file()},
        license=card_license(folder / "README.md"),
    )


def card_license(card: Path) -> str | None:
    """The `license` of a model card's metadata (a Hub folder's README.md), or None without one."""
    if not card.is_file():
        return None
    try:
        metadata = metadata_load(card) or {}
    except (ValueError, UnicodeDecodeError, yaml.YAMLError):  # a README without valid metadata says nothing
        return None
    license = metadata.get("license")
    return license if isinstance(license, str) and license.strip() else None


def stored_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight the folder stores, without reading the weights (safetensors headers; pickles
    unpickled by torch's weights-only loader onto the meta device)."""
    for single, index in WEIGHT_FILES:
        if (folder / single).is_file():
            files = [folder / single]
            break
        if (folder / index).is_file():
            weight_map = read_json(folder / index)["weight_map"]
            files = [folder / name for name in sorted(set(weight_map.values()))]
            break
    else:
        names = ", ".join(name for pair in WEIGHT_FILES for name in pair)
        raise ValueError(f"{folder}: no weights; expected one of {names}.")
    shapes = {}
    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(path, framework="pt") as weights:
                shapes.update({name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()})
        else:
            check_zip_entries(path)
            try:
                state = torch.load(path, map_location="meta", weights_only=True)
            except pickle.UnpicklingError as error:
                raise refused_pickle(path, error, "tensors and plain containers") from None
            shapes.update({name: tuple(tensor.shape) for name, tensor in state.items()})
    return shapes
