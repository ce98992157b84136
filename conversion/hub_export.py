"""The one writer of Hub folders: a converted checkpoint in, a verified folder out (`push` sends it to the Hub).

The folder holds `model.safetensors` (sharded above `max_shard_size`), `config.json` naming the head and an
`auto_map` onto the modeling files copied beside it (transformers' remote code, see `remote_code`),
`generation_config.json` for the LM heads, the tokenizer where a vocabulary is known, and a model card. It is written
into a staging folder next to OUTPUT, reloaded and compared with the source, and only then published at OUTPUT
(`publish`: a rename that replaces nothing, or with `force` only a folder we wrote): a failed or interrupted
conversion leaves no OUTPUT behind (nor a half-replaced one).
"""

import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
from huggingface_hub import ModelCard, ModelCardData
from safetensors import SafetensorError
from transformers import PreTrainedModel
from transformers.utils import logging

from .converted import ConvertedCheckpoint, checkpoint_state_dict, does_not_fit
from .publish import OutputError, StagingFolder
from .remote_code import full_auto_map
from .source_files import read_json

DEFAULT_MAX_SHARD_SIZE = "5GB"
DEFAULT_TOLERANCE = 1e-4
SAMPLE_SEGMENTS, SAMPLE_LENGTH = 3, 8


def log(message: str):
    print(f"transformers-xl convert: {message}", file=sys.stderr, flush=True)


# --- the model --------------------------------------------------------------------------------------------------


def build_model(converted: ConvertedCheckpoint) -> PreTrainedModel:
    """`model_class(config)` holding exactly the converted tensors (no copy: they are assigned, not loaded into
    freshly initialised parameters, which keeps the peak memory near one copy of the weights)."""
    with torch.device("meta"):
        model = converted.model_class(converted.config)
    expected = {name: tuple(t.shape) for name, t in checkpoint_state_dict(model).items()}
    given = {name: tuple(t.shape) for name, t in converted.state_dict.items()}
    problems = [f"missing {name} {list(shape)}" for name, shape in expected.items() if name not in given]
    problems += [f"unexpected {name} {list(shape)}" for name, shape in given.items() if name not in expected]
    problems += [
        f"{name} has shape {list(given[name])}, the config needs {list(shape)}"
        for name, shape in expected.items()
        if name in given and given[name] != shape
    ]
    if problems:
        raise does_not_fit(f"The weights of {converted.source}", converted.model_class, problems)
    model.load_state_dict(converted.state_dict, assign=True)
    model.tie_weights()
    for name, tensor in checkpoint_state_dict(model).items():  # a tie the config asks for must hold in the weights
        source = converted.state_dict[name]
        if tensor.data_ptr() != source.data_ptr() and not torch.equal(tensor, source):
            raise ValueError(
                f"The config ties {name} to another weight, but {converted.source} holds different values for it "
                "(check tie_weight / tie_projs)."
            )
    return model.eval()


def sample_inputs(model: PreTrainedModel, segment: int) -> dict:
    """A fixed batch of 2 rows of token ids for `segment` (several choices for multiple-choice heads)."""
    generator = torch.Generator().manual_seed(segment)
    shape = (2, 2, SAMPLE_LENGTH) if "MultipleChoice" in type(model).__name__ else (2, SAMPLE_LENGTH)
    return {"input_ids": torch.randint(0, model.config.vocab_size, shape, generator=generator)}


def _tensors(output) -> list[torch.Tensor]:
    """Every floating-point tensor in a model output (logits, hidden states, memories, ...), in a fixed order."""
    if isinstance(output, torch.Tensor):
        return [output] if output.is_floating_point() else []
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    return []


@torch.no_grad()
def max_difference(source: PreTrainedModel, converted: PreTrainedModel) -> float:
    """Largest absolute difference between the outputs of two models of the same kind over a few consecutive
    segments, each one attending to the previous ones through the memory (`mems`)."""
    largest, mems = 0.0, (None, None)
    for segment in logging.tqdm(range(SAMPLE_SEGMENTS), desc="Comparing outputs", unit="segment"):
        inputs = sample_inputs(source, segment)
        outputs = []
        for model, model_mems in zip((source, converted), mems):
            outputs.append(model.eval()(**inputs, mems=model_mems))
        for a, b in zip(*(_tensors(out) for out in outputs), strict=True):
            largest = max(largest, (a.float() - b.float()).abs().max().item())
        mems = tuple(getattr(out, "mems", None) for out in outputs)
    return largest


# --- the tokenizer ----------------------------------------------------------------------------------------------

# File kinds a tokenizer can be made from, by model type, and how a file's name tells its kind.
TOKENIZER_KINDS = {
    "transfo-xl": {"tokenizer.json", "vocab.pkl", "vocab.bin", "vocab.txt"},
    "xlnet": {"tokenizer.json", "spiece.model"},
}
SETTINGS_FILE = "tokenizer_config.json"


def vocabulary_kind(path: str) -> str:
    """`--vocab FILE` -> its kind, from the name ("my-vocab.pkl" -> "vocab.pkl", "sp.model" -> "spiece.model")."""
    suffixes = {".json": "tokenizer.json", ".pkl": "vocab.pkl", ".bin": "vocab.bin", ".txt": "vocab.txt"}
    suffixes[".model"] = "spiece.model"
    kind = suffixes.get(Path(path).suffix)
    if kind is None or not Path(path).is_file():
        raise ValueError(
            f"--vocab {path}: expected an existing tokenizer.json, vocab.pkl, vocab.bin, vocab.txt or spiece.model file."
        )
    return kind


def load_tokenizer(model_type: str, files: dict[str, str]):
    """The tokenizer of a model type from the files found or given (None when there are none). Files found in a
    transformers folder load with their `tokenizer_config.json` settings; a lone file is read with the defaults."""
    kinds = [kind for kind in files if kind != SETTINGS_FILE]
    if not kinds:
        return None
    wrong = [kind for kind in kinds if kind not in TOKENIZER_KINDS[model_type]]
    if wrong:
        raise ValueError(
            f"A {model_type} model cannot use a {', '.join(wrong)} vocabulary; "
            f"expected one of {sorted(TOKENIZER_KINDS[model_type])}."
        )
    if model_type == "transfo-xl":
        from ..tokenization.tokenization_transfo_xl import TransfoXLTokenizer as tokenizer_class

        arguments = {
            "tokenizer.json": "tokenizer_file",
            "vocab.pkl": "pretrained_vocab_file",
            "vocab.bin": "pretrained_vocab_file_torch",
            "vocab.txt": "vocab_file",
        }
    else:
        from transformers import XLNetTokenizer as tokenizer_class

        arguments = {"tokenizer.json": "tokenizer_file", "spiece.model": "vocab_file"}
    if "spiece.model" in files:
        try:
            import google.protobuf  # noqa: F401  (transformers reads the model's normaliser with it)
            import sentencepiece
        except ImportError as error:
            raise ValueError(f"A spiece.model needs the sentencepiece and protobuf packages ({error}).") from None
    for kind in ("tokenizer.json", SETTINGS_FILE):
        if kind in files:
            read_json(files[kind])  # (a broken one is named as such)
    try:
        if "spiece.model" in files:  # (read it with SentencePiece first: transformers falls back to other formats)
            sentencepiece.SentencePieceProcessor(model_file=files["spiece.model"])
        if SETTINGS_FILE in files:
            folder = Path(files[SETTINGS_FILE]).parent
            if all(Path(files[kind]) == folder / kind for kind in kinds):
                return tokenizer_class.from_pretrained(folder)
        kind = next(kind for kind in arguments if kind in files)
        return tokenizer_class(**tokenizer_class.convert_to_native_format(**{arguments[kind]: files[kind]}))
    except Exception as error:  # (tokenizers raises a plain Exception for a tokenizer.json it cannot use)
        shown = ", ".join(files[kind] for kind in kinds)
        raise ValueError(f"Cannot read the vocabulary {shown} (a damaged or wrong file?): {error}") from error


def _no_vocabulary(model_type: str, files: dict[str, str]):
    """No vocabulary: an error where a tokenizer config promises a tokenizer, else a warning (never silence)."""
    expected = ", ".join(sorted(TOKENIZER_KINDS[model_type]))
    if SETTINGS_FILE in files:
        raise ValueError(
            f"{files[SETTINGS_FILE]} describes a tokenizer, but its vocabulary is missing (expected one of {expected} "
            "beside it); pass --vocab FILE, or --no-tokenizer to write the model without a tokenizer."
        )
    log(f"warning: the output has no tokenizer: no vocabulary beside the source ({expected}) and no --vocab given")


def save_tokenizer(tokenizer, model_type: str, folder: Path):
    """Write `tokenizer.json` + `tokenizer_config.json`. Transformer-XL's names the generic `TokenizersBackend`,
    which runs the whole pipeline from `tokenizer.json` in any transformers 5, plugin or not (its own class holds no
    extra behaviour at encoding time); XLNet's names transformers' own `XLNetTokenizer`."""
    tokenizer.save_pretrained(folder)
    for leftover in ("vocab.txt", "special_tokens_map.json"):  # (the plain word list is in tokenizer.json)
        (folder / leftover).unlink(missing_ok=True)
    if model_type == "transfo-xl":
        path = folder / SETTINGS_FILE
        settings = json.loads(path.read_text(encoding="utf-8"))
        settings["tokenizer_class"] = "TokenizersBackend"
        path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# --- the model card ---------------------------------------------------------------------------------------------


# The Hub task of each head, by the end of its class name (the base models' hidden states: feature extraction).
PIPELINE_TAGS = {
    "LMHeadModel": "text-generation",
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForMultipleChoice": "multiple-choice",
    "ForQuestionAnswering": "question-answering",
    "ForQuestionAnsweringSimple": "question-answering",
    "Model": "feature-extraction",
}
UNKNOWN_LICENSE = "unknown"  # the Hub's identifier for a license not stated; `--license` sets one


def pipeline_tag(head: str) -> str:
    return next(tag for ending, tag in PIPELINE_TAGS.items() if head.endswith(ending))


def model_card(model: PreTrainedModel, converted: ConvertedCheckpoint, command: str, verification: dict,
               license: str) -> ModelCard:  # fmt: skip
    head = type(model).__name__
    data = ModelCardData(
        library_name="transformers",
        license=license,
        tags=["transformers-xl", model.config.model_type, "custom_code"],
        pipeline_tag=pipeline_tag(head),
        converted_from=converted.source,
        conversion_command=command,
        verification=verification,
    )
    auto_class = model.config.auto_map
    loader = next(auto for auto, target in auto_class.items() if target.endswith("." + head))
    content = f"""---
{data.to_yaml()}
---

# {head}

Converted from {converted.source} by `transformers-xl convert`:

```bash
{command}
```

Verification: {verification["method"]}; largest absolute difference {verification["max_abs_diff"]:.3g}
(tolerance {verification["tolerance"]:g}).

The model code is in this folder, so it loads without installing `transformers-xl`:

```python
from transformers import {loader}

model = {loader}.from_pretrained("path/or/repo", trust_remote_code=True)
```
"""
    return ModelCard(content)


# --- the folder -------------------------------------------------------------------------------------------------


def write_folder(
    converted: ConvertedCheckpoint,
    output,
    *,
    force: bool = False,
    vocab: str | None = None,
    with_tokenizer: bool = True,
    command: str = "(Python API)",
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    tolerance: float = DEFAULT_TOLERANCE,
    license: str | None = None,
) -> float:
    """Write `converted` as a Hub folder at `output` (atomically, see `publish`) and return the verified max
    difference. `vocab` replaces the vocabulary found beside the source; `with_tokenizer=False` writes none.
    `license` (a Hub license identifier) replaces the source's; without either the card says "unknown"."""
    output = Path(output).absolute()
    files = dict(converted.tokenizer_files)
    if vocab is not None:
        files = {kind: path for kind, path in files.items() if kind == SETTINGS_FILE}
        files[vocabulary_kind(vocab)] = vocab
    tokenizer = None
    if with_tokenizer:
        tokenizer = load_tokenizer(converted.config.model_type, files)  # (bad vocabularies fail before any writing)
        if tokenizer is None:
            _no_vocabulary(converted.config.model_type, files)
    if tokenizer is not None and len(tokenizer) > converted.config.vocab_size:
        raise ValueError(
            f"The vocabulary has {len(tokenizer)} tokens, more than the model's {converted.config.vocab_size}."
        )
    license = license or converted.license
    if license is None:
        log(f"license: {UNKNOWN_LICENSE} (the source states none; --license ID sets the model card's)")
    end = getattr(tokenizer, "eos_token_id", None)
    if end is not None and end != converted.config.eos_token_id:  # generation stops at the vocabulary's end token
        log(f"eos_token_id {end} ({tokenizer.eos_token}) from the vocabulary (not {converted.config.eos_token_id})")
        converted.config.eos_token_id = end

    publishing = StagingFolder(output, force, marker={"command": command}, say=log, command="convert")
    with publishing as staged, _write_failures(staged):
        staging = staged.path
        log(f"building {converted.model_class.__name__} from {converted.source}")
        model = build_model(converted)
        model.config.auto_map = full_auto_map(model)
        log(f"writing {staging}")
        model.save_pretrained(staging, max_shard_size=max_shard_size)
        if tokenizer is not None:
            save_tokenizer(tokenizer, model.config.model_type, staging)

        log("verifying: reloading the written folder")
        reloaded = converted.model_class.from_pretrained(staging)
        if converted.compare_with_source is not None:
            method = f"outputs of the written folder vs {converted.compared_with}"
            difference = converted.compare_with_source(reloaded)
        else:
            method = "outputs of the written folder vs the converted weights in memory (the source cannot be run here)"
            difference = max_difference(model, reloaded)
        del reloaded
        log(f"verification ({method}): max abs difference {difference:.3g} (tolerance {tolerance:g})")
        if not difference <= tolerance:  # (NaN fails too)
            raise ValueError(
                f"Verification failed: the converted model's outputs differ from the source's by {difference:.3g} "
                f"(tolerance {tolerance:g})."
            )
        verification = {"method": method, "max_abs_diff": float(difference), "tolerance": tolerance, "passed": True}
        model_card(model, converted, command, verification, license or UNKNOWN_LICENSE).save(staging / "README.md")
        staged.publish()
    log(f"wrote {output}")
    return difference


@contextmanager
def _write_failures(staged: StagingFolder):
    """A failed write (a full or read-only disk, ...) as one clear error naming the path and the cause, whichever
    library wrote: Python's OSError, safetensors' SafetensorError, tokenizers' plain Exception ("(os error 28)")."""
    try:
        yield
    except Exception as error:
        code = error.errno if isinstance(error, OSError) else None
        if code is None and (type(error) is Exception or isinstance(error, SafetensorError)):
            found = re.search(r"\(os error (\d+)\)", str(error))
            code = int(found.group(1)) if found else None
        if code is None:
            raise
        where = getattr(error, "filename", None) or staged.path
        raise OutputError(f"cannot write {staged.output}: {os.strerror(code)} (writing {where})") from error
