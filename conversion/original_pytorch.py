"""kimiyoung/transformer-xl PyTorch checkpoints (`model.pt`) -> `ConvertedCheckpoint`, without the original code.

The original train.py saves the whole model (`torch.save(model)`): a pickle of `mem_transformer.MemTransformerLM`
and the modules inside it. It is read with torch's weights-only unpickler, which only rebuilds tensors and plain
containers; the model classes it names (the original ones and torch.nn's) are let in as empty placeholders, never
imported, whose pickled attributes are simply recorded; any other global is refused by name. Nothing from the file
runs. The hyper-parameters then come from those attributes (`n_token`, `cutoffs`, `div_val`, `mem_len`, ...), the
ties from which tensors are shared. A bare `state_dict()` is read the same way and needs `--config`.

Semantic differences handled here (shared/reference/legacy-formats.md, section 3):
- the original reads tail cluster i's probability from head column -i, transformers from column cutoffs[0] + i - 1:
  the rows of `crit.cluster_weight` / `crit.cluster_bias` are reversed, which gives the same log-probabilities;
- `r_w_bias` / `r_r_bias` are shared by every layer: untie_r=False (or copied into each layer if a given config
  unties them);
- the memory starts empty, as our default does (`zero_initial_mems=False`).
"""

import _compat_pickle
import io
import pickle
import pickletools
import struct
import zipfile
from pathlib import Path

import torch
from transformers.utils import logging

from ..modeling.configuration_transfo_xl import TransfoXLConfig
from ..modeling.modeling_transfo_xl import TransfoXLLMHeadModel
from .converted import ConvertedCheckpoint
from .source_files import check_zip_entries, read_json, refused_pickle

# The classes a whole-model pickle may name: the original code's (any module path ending in one of these modules)
# and the torch.nn modules it is built from.
ORIGINAL_MODULES = {"mem_transformer", "proj_adaptive_softmax", "log_uniform_sampler"}
ORIGINAL_CLASSES = {
    "MemTransformerLM", "RelPartialLearnableDecoderLayer", "RelPartialLearnableMultiHeadAttn", "PositionwiseFF",
    "AdaptiveEmbedding", "PositionalEmbedding", "ProjectedAdaptiveLogSoftmax", "LogUniformSampler",
    "RelLearnableDecoderLayer", "RelLearnableMultiHeadAttn", "DecoderLayer", "MultiHeadAttn",
}  # fmt: skip
TORCH_MODULES = {
    f"torch.nn.modules.{name}"
    for name in (
        "container.ModuleList", "container.ParameterList", "container.Sequential", "linear.Linear",
        "sparse.Embedding", "normalization.LayerNorm", "dropout.Dropout", "activation.ReLU",
    )
}  # fmt: skip


class _Placeholder:
    """Stands for a module class of the pickle: keeps the pickled attributes, has no behaviour."""


def _pickle_globals(path: Path) -> set[str]:
    """The `module.name` globals the checkpoint's pickle refers to, read by disassembling it (nothing runs)."""
    found = set()
    with open(path, "rb") as handle:
        if zipfile.is_zipfile(handle):
            with zipfile.ZipFile(handle) as archive:
                name = next(n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
                stream, count = io.BytesIO(archive.read(name)), 1
        else:  # torch's legacy format: magic number, protocol, system info, then the object (then the storages)
            handle.seek(0)
            stream, count = handle, 4
        for _ in range(count):
            for opcode, argument, _ in pickletools.genops(stream):
                if opcode.name == "GLOBAL":
                    found.add(argument.replace(" ", "."))
    return found


def _placeholders(found: set[str]) -> list[tuple[type, str]]:
    result = []
    for full_name in sorted(found):
        module, _, name = full_name.rpartition(".")
        if full_name in TORCH_MODULES or (module.rpartition(".")[2] in ORIGINAL_MODULES and name in ORIGINAL_CLASSES):
            result.append((type(name, (_Placeholder,), {}), full_name))
    return result


class _LegacyUnpickler(pickle.Unpickler):
    """Unpickler for torch's legacy (pre-1.6, non-zip) format, in which the original checkpoints were saved. torch's
    weights-only loader refuses these files, because they also record each module class's source code; here the
    globals are restricted to torch's weights-only allowlist plus the placeholders, and the source is ignored."""

    def __init__(self, file, placeholders):
        super().__init__(file)
        self.allowed = {**torch._weights_only_unpickler._get_allowed_globals(), **{n: c for c, n in placeholders}}
        self.storages = {}

    def find_class(self, module, name):
        # Python 2 names in protocol-2 pickles (`__builtin__.set`), mapped as pickle itself maps them
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if f"{module}.{name}" not in self.allowed:
            raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name}")
        return self.allowed[f"{module}.{name}"]

    def persistent_load(self, saved_id):
        kind = saved_id[0].decode() if isinstance(saved_id[0], bytes) else saved_id[0]
        if kind == "module":  # (class, file name, source code): the class is a placeholder, the code is not run
            return saved_id[1]
        if kind != "storage":
            raise pickle.UnpicklingError(f"Unsupported persistent id {kind!r}")
        storage_type, key, _location, numel, view = saved_id[1:]
        dtype = storage_type.dtype
        size = torch._utils._element_size(dtype)
        if key not in self.storages:
            self.storages[key] = torch.storage.TypedStorage(
                wrap_storage=torch.UntypedStorage(numel * size), dtype=dtype, _internal=True
            )
        storage = self.storages[key]
        if view is not None:
            _, offset, view_numel = view
            untyped = storage._untyped_storage[offset * size : (offset + view_numel) * size]
            storage = torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)
        return storage


def _legacy_load(path: Path, placeholders) -> object:
    with open(path, "rb") as handle:
        # (a fresh unpickler per pickle: each one buffers ahead of what it consumed)
        magic, _protocol, system = (_LegacyUnpickler(handle, []).load() for _ in range(3))
        if magic != 0x1950A86A20F9469CFC6C or not system.get("little_endian", True):
            raise ValueError("not a torch checkpoint (or a big-endian one)")
        unpickler = _LegacyUnpickler(handle, placeholders)
        result = unpickler.load()
        keys = _LegacyUnpickler(handle, []).load()  # then each storage: its element count (int64), its raw bytes
        for key in logging.tqdm(keys, desc="Reading tensors", unit="tensor"):
            storage = unpickler.storages[key]
            size = torch._utils._element_size(storage.dtype)
            (numel,) = struct.unpack("<q", handle.read(8))
            data = handle.read(numel * size)
            if numel * size != storage._untyped_storage.nbytes() or len(data) != numel * size:
                raise EOFError(f"storage {key} is incomplete")
            target = torch.empty(0, dtype=torch.uint8).set_(storage._untyped_storage)
            target.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return result


def load_pickle(path) -> object:
    """The checkpoint's object with placeholders for its module classes; tensors on the CPU wherever they were saved."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file (expected a model.pt of kimiyoung/transformer-xl).")
    if zipfile.is_zipfile(path):
        check_zip_entries(path)
    try:
        placeholders = _placeholders(_pickle_globals(path))
        if not zipfile.is_zipfile(path):
            return _legacy_load(path, placeholders)
        with torch.serialization.safe_globals(placeholders):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        allowed = "tensors, plain containers and Transformer-XL or torch.nn module classes"
        raise refused_pickle(path, error, allowed) from None
    except (RuntimeError, EOFError, ValueError, zipfile.BadZipFile, StopIteration, struct.error) as error:
        raise ValueError(f"{path}: cannot read the checkpoint (a truncated or damaged file?): {error}") from error


def _named_tensors(module, prefix=""):
    """state_dict()-style names of a placeholder module tree's parameters and persistent buffers."""
    state = vars(module)
    for name, tensor in {**state.get("_parameters", {}), **state.get("_buffers", {})}.items():
        if tensor is not None and name not in state.get("_non_persistent_buffers_set", ()):
            yield prefix + name, tensor
    for name, child in state.get("_modules", {}).items():
        if child is not None:
            yield from _named_tensors(child, f"{prefix}{name}.")


def _child(module, path: str):
    for name in path.split("."):
        module = vars(module)["_modules"][name]
    return module


def _shared(a, b) -> bool:
    return a is not None and b is not None and a.data_ptr() == b.data_ptr() and a.shape == b.shape


def config_from_model(model) -> TransfoXLConfig:
    """The hyper-parameters of a pickled `MemTransformerLM`, from its attributes and which tensors it shares."""
    attrs = vars(model)
    attn_type = attrs.get("attn_type", 0)
    if attn_type != 0 or attrs.get("sample_softmax", -1) > 0:
        raise ValueError(
            f"MemTransformerLM with attn_type={attn_type}, sample_softmax={attrs.get('sample_softmax')}: only the "
            "Transformer-XL attention (attn_type 0) with the adaptive softmax converts."
        )
    word_emb, crit = vars(_child(model, "word_emb")), _child(model, "crit")
    layer = _child(model, "layers.0")
    tensors = dict(_named_tensors(model))
    n_clusters = len(word_emb["cutoffs"])
    emb_source = [0 if word_emb["div_val"] == 1 else i for i in range(n_clusters)]
    tie_weight = all(
        _shared(tensors.get(f"crit.out_layers.{i}.weight"), tensors.get(f"word_emb.emb_layers.{i}.weight"))
        for i in range(len(vars(_child(crit, "out_layers"))["_modules"]))
    )
    tie_projs = [
        _shared(tensors.get(f"crit.out_projs.{i}"), tensors.get(f"word_emb.emb_projs.{emb_source[i]}"))
        for i in range(n_clusters)
    ]
    attention, feed_forward = vars(_child(layer, "dec_attn")), vars(_child(layer, "pos_ff"))
    return TransfoXLConfig(
        vocab_size=attrs["n_token"],
        cutoffs=word_emb["cutoffs"][:-1],
        d_model=attrs["d_model"],
        d_embed=attrs["d_embed"],
        n_head=attrs["n_head"],
        d_head=attrs["d_head"],
        d_inner=feed_forward["d_inner"],
        div_val=word_emb["div_val"],
        pre_lnorm=bool(feed_forward["pre_lnorm"]),
        n_layer=attrs["n_layer"],
        mem_len=attrs["mem_len"],
        tgt_len=attrs["tgt_len"],
        ext_len=attrs["ext_len"],
        clamp_len=attrs["clamp_len"],
        same_length=attrs["same_length"],
        tie_weight=tie_weight,
        tie_projs=tie_projs,
        untie_r=False,
        dropout=vars(_child(model, "drop"))["p"],
        dropatt=vars(_child(layer, "dec_attn.dropatt"))["p"],
        layer_norm_epsilon=vars(_child(layer, "pos_ff.layer_norm"))["eps"],
    )


def our_names(tensors: dict, config: TransfoXLConfig) -> dict:
    """Original names -> ours: the `transformer.` prefix, the r biases (shared or copied per layer) and the tail
    clusters in transformers' order."""
    state = {}
    for name, tensor in tensors.items():
        if name in ("crit.cluster_weight", "crit.cluster_bias"):
            state[name] = tensor.flip(0).contiguous()  # head column -i -> cutoffs[0] + i - 1
        elif name in ("r_w_bias", "r_r_bias") and config.untie_r:
            for i in range(config.n_layer):
                state[f"transformer.layers.{i}.dec_attn.{name}"] = tensor.clone()
        elif name.startswith("crit."):
            state[name] = tensor
        else:
            state["transformer." + name] = tensor
    return state


def read_original_pytorch(source, config=None) -> ConvertedCheckpoint:
    """Read a kimiyoung `model.pt` (whole model or bare state dict); `config` (a config.json path) is required for a
    state dict and replaces the pickled hyper-parameters of a whole model."""
    loaded = load_pickle(source)
    if isinstance(loaded, _Placeholder):
        if type(loaded).__name__ != "MemTransformerLM":
            raise ValueError(f"{source}: holds a {type(loaded).__name__}, expected a MemTransformerLM.")
        tensors = dict(_named_tensors(loaded))
        found_config = config_from_model(loaded)
    elif isinstance(loaded, dict) and loaded and all(isinstance(t, torch.Tensor) for t in loaded.values()):
        tensors, found_config = dict(loaded), None
    else:
        raise ValueError(f"{source}: expected a pickled MemTransformerLM or a state dict of tensors, got {type(loaded)}.")
    if config is not None:
        found_config = TransfoXLConfig.from_dict(read_json(config))
    if found_config is None:
        raise ValueError(f"{source}: a bare state dict carries no hyper-parameters; pass --config (a config.json).")
    if any(name.startswith(("transformer.", "model/")) for name in tensors):
        raise ValueError(f"{source}: these are not the original code's weight names (try --from hf-legacy or tf).")
    found_config.zero_initial_mems = False  # the original starts from an empty memory
    return ConvertedCheckpoint(
        model_class=TransfoXLLMHeadModel,
        config=found_config,
        state_dict=our_names(tensors, found_config),
        source=f"original PyTorch checkpoint {Path(source).name} (kimiyoung/transformer-xl)",
    )
