"""The paper's evaluation protocol (the original `eval.py`) over text files, and `transformers-xl evaluate`.

The protocol, the command's options and its help are in transformers_xl_cli/evaluate.py.
"""

import json
import math
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from safetensors import SafetensorError, safe_open

from ..modeling.memory_cache import MemoryCache
from . import memory_curve
from .corpus import CorpusError, check_encoded, check_readable, check_vocabulary, encode_file


class EvaluationError(ValueError):
    """Input that cannot be evaluated (the model, the options or a text file), said in one line."""


def run(args) -> int:
    try:
        report = evaluate_files(args)
    except (EvaluationError, CorpusError) as error:
        print(f"transformers-xl evaluate: {error}", file=sys.stderr)
        return 2
    unit = report["results"][0]["unit"]
    if args.memory_lengths:
        print(memory_curve.markdown(report["results"], unit), end="")
    for result in [] if args.memory_lengths else report["results"]:
        print(
            f"{result['file']}: loss {result['loss']:.5f} | perplexity {result['perplexity']:.3f} | "
            f"bits per {unit} {result[f'bits_per_{unit}']:.5f} | {result['predicted_tokens']} tokens predicted "
            f"(<unk> rate {result['unk_rate']:.4%}) | {result['seconds']:.1f} s, {result['tokens_per_second']:.0f} "
            "tokens/s"
        )
    if args.json:
        try:
            write_whole(output_files(args, report))
        except OSError as error:
            print(f"transformers-xl evaluate: --json {args.json}: cannot write ({error.strerror or error})",
                  file=sys.stderr)  # fmt: skip
            return 2
    return 0


def output_paths(args) -> list[Path]:
    """`--json PATH`, and with `--memory-lengths` the table and plot beside it: PATH's name ending .csv, .md, .png
    (in place of .json)."""
    path = Path(args.json)
    stem = path.with_suffix("") if path.suffix == ".json" else path
    extra = [".csv", ".md", ".png"] if args.memory_lengths else []
    return [path, *(stem.with_name(stem.name + suffix) for suffix in extra)]


def output_files(args, report: dict) -> dict[Path, bytes]:
    """The contents of `output_paths`: the report as JSON, then the curve's table as CSV and markdown and its plot."""
    paths = output_paths(args)
    contents = [(json.dumps(report, indent=2) + "\n").encode()]
    if args.memory_lengths:
        results, settings = report["results"], report["settings"]
        unit = results[0]["unit"]
        title = (f"{Path(settings['model']).name}: segments of {settings['tgt_len']}, {settings['batch_size']} rows, "
                 f"clamp_len {settings['clamp_len']}, same_length {settings['same_length']}")  # fmt: skip
        contents += [memory_curve.csv_text(results, unit).encode(), memory_curve.markdown(results, unit).encode(),
                     memory_curve.plot_png(results, unit, title, settings["model_mem_len"])]  # fmt: skip
    return dict(zip(paths, contents))


def write_whole(files: dict[Path, bytes]):
    """Write every file whole or none of them: each into a temporary file beside it, then all renamed (the
    temporaries removed if any write fails), with the permissions the umask gives (os.open applies it; mkstemp
    would make the file private)."""
    temporaries = {path: path.with_name(f".{path.name}.{os.getpid()}.partial") for path in files}
    try:
        for path, data in files.items():
            with os.fdopen(os.open(temporaries[path], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as file:
                file.write(data)
        for path, temporary in temporaries.items():
            os.replace(temporary, path)
    finally:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)


def resolve_device(name: str | None) -> str:
    """The torch device to run on: `name` if it exists here, else one line saying why not (CUDA on a machine without
    it); by default cuda if available, else cpu."""
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as error:
        raise EvaluationError(f"--device {name}: {str(error).splitlines()[0]}") from None
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and not (hasattr(backend, "is_available") and backend.is_available()):
        raise EvaluationError(f"--device {name}: no {device.type} device on this machine (torch {torch.__version__}).")
    return name


def evaluate_files(args) -> dict:
    """Load the model and its tokenizer, then evaluate each file; the settings and one result per file."""
    for path in args.text_files:
        check_readable(path)  # (all of them before anything runs)
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise EvaluationError(f"--json {args.json}: its folder does not exist.")
    for path in output_paths(args) if args.json else []:  # (the JSON file, and with --memory-lengths those beside it)
        if path.is_dir():
            name = args.json if path == Path(args.json) else f"{args.json}: {path}"
            raise EvaluationError(f"--json {name} is a folder; expected the path of a file to write.")
    device = resolve_device(args.device)
    model, tokenizer = load_model(args.model)
    config = model.config
    settings = {
        "model": args.model,
        "batch_size": args.batch_size,
        "tgt_len": args.tgt_len if args.tgt_len is not None else config.tgt_len,
        **({"memory_lengths": args.memory_lengths, "model_mem_len": config.mem_len} if args.memory_lengths else
           {"mem_len": args.mem_len if args.mem_len is not None else config.mem_len}),
        "clamp_len": args.clamp_len if args.clamp_len is not None else config.clamp_len,
        "same_length": args.same_length if args.same_length is not None else config.same_length,
        "line_end": args.line_end or default_line_end(tokenizer),
        "bf16": args.bf16,
        "device": device,
    }
    if not isinstance(settings["tgt_len"], int) or settings["tgt_len"] < 1:
        raise EvaluationError(f"the config's tgt_len is {settings['tgt_len']!r}; pass --tgt-len.")
    try:
        model.to(settings["device"])
    except (RuntimeError, ValueError, AssertionError) as error:
        raise EvaluationError(f"--device {settings['device']}: {str(error).splitlines()[0]}") from None
    vocab = tokenizer.get_vocab()
    check_vocabulary(sorted(vocab), set(tokenizer.all_special_tokens), f"{args.model}: the tokenizer's vocabulary")
    if max(vocab.values()) >= config.vocab_size:
        raise EvaluationError(
            f"{args.model}: the tokenizer has ids up to {max(vocab.values())} but the model's vocabulary has "
            f"{config.vocab_size}."
        )
    results = []
    for path in args.text_files:
        encoded = encode_file(
            path, vocab, settings["line_end"], tokenizer.unk_token, getattr(tokenizer, "lower_case", False)
        )
        check_encoded(path, encoded, tokenizer.unk_token, args.allow_unknown)
        ids = torch.from_numpy(encoded.ids.astype(np.int64))
        if len(ids) // settings["batch_size"] < 2:
            raise EvaluationError(
                f"{path}: {len(ids)} tokens are too few for --batch-size {settings['batch_size']} rows of at least 2 "
                "tokens each; use a smaller --batch-size."
            )
        lengths = settings.get("memory_lengths") or [settings["mem_len"]]
        curve = evaluate_memory_lengths(model, ids, lengths, **{k: settings[k] for k in EVALUATION_SETTINGS})
        for result in curve:
            if not math.isfinite(result["loss"]):
                at = f" at memory length {result['mem_len']}" if args.memory_lengths else ""
                raise EvaluationError(f"{path}: the loss{at} is {result['loss']}, not a result (the model overflowed"
                                      f"{' in bf16' if settings['bf16'] else ''}).")  # fmt: skip
            unit = "character" if settings["line_end"] == "none" else "token"
            result = {
                "file": str(path),
                "unit": unit,
                **result,
                f"bits_per_{unit}": result["loss"] / math.log(2),
                "symbols": encoded.words,
                "unknown_symbols": encoded.unknown,
                "unk_rate": encoded.unknown / max(encoded.words, 1),
            }
            results.append(result)
    return {"settings": settings, "results": results}


EVALUATION_SETTINGS = ("batch_size", "tgt_len", "clamp_len", "same_length", "bf16")


def evaluate_memory_lengths(model, ids, memory_lengths, **settings) -> list[dict]:
    """`evaluate_stream` of `ids` at each memory length, all else the same (rows, segments, `clamp_len`,
    `same_length`: see `attends_same_length`); one result per length, with its `mem_len` and `same_length`.
    Lengths beyond the model's own `mem_len` are allowed: the relative encodings extend to any distance."""
    return [
        {"mem_len": mem_len, "same_length": attends_same_length(mem_len, settings["same_length"]),
         **evaluate_stream(model, ids, mem_len=mem_len, **settings)}
        for mem_len in memory_lengths
    ]  # fmt: skip


def attends_same_length(mem_len: int, same_length: bool) -> bool:
    """Whether `same_length` applies: with it every query attends to the `mem_len` newest positions (its own
    included), so at memory length 0 to none; the evaluation then reads each segment causally (the model without
    memory). (There eval.py's mask is all -inf, giving NaN; transformers 4.x's attends to the whole segment, future
    tokens included.)"""
    return same_length and mem_len > 0


def load_model(name):
    """The model (eval mode) and its tokenizer; one clear error for anything that is not a Transformer-XL LM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .. import TransfoXLLMHeadModel  # (registers transfo-xl with the Auto classes)

    if not Path(name).exists() and looks_local(name):
        raise EvaluationError(f"{name}: no such folder.")
    if Path(name).is_dir() and not (Path(name) / "config.json").is_file():
        raise EvaluationError(f"{name}: no config.json in this folder; expected a model folder.")
    if Path(name).is_dir():
        check_weight_files(Path(name))
    try:
        config = AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as error:
        raise EvaluationError(f"{name}: cannot load a model config ({str(error).splitlines()[0]}).") from None
    if config.model_type != "transfo-xl":
        raise EvaluationError(
            f"{name} is a {config.model_type!r} model; expected a Transformer-XL language model (model_type "
            "'transfo-xl')."
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(name, config=config)
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError, SafetensorError) as error:
        raise EvaluationError(f"{name}: cannot load the model and its tokenizer ({str(error).splitlines()[0]}).") from None
    if not isinstance(model, TransfoXLLMHeadModel):
        raise EvaluationError(f"{name} loads as {type(model).__name__}; expected TransfoXLLMHeadModel.")
    for weight_name, weight in model.state_dict().items():
        if weight.is_floating_point() and not torch.isfinite(weight).all():
            raise EvaluationError(f"{name}: the weight {weight_name} holds non-finite values (NaN or infinity).")
    return model.eval(), tokenizer


def check_weight_files(folder: Path):
    """Every safetensors file of a model folder opens (its header parses, its data is all there), so that a
    truncated file is named: safetensors' own error names neither the file nor the folder."""
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(path, framework="pt"):
                pass
        except (SafetensorError, OSError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            message = f"{path}: damaged weights ({reason}); expected a complete safetensors file."
            raise EvaluationError(message) from None


def looks_local(name: str) -> bool:
    """Whether MODEL names a path rather than a Hub id ("name" or "org/name"): absolute, relative with ./ or ../,
    under ~, with a backslash or more than one slash."""
    return name.startswith(("/", ".", "~")) or "\\" in name or name.strip("/").count("/") > 1


def default_line_end(tokenizer) -> str:
    if getattr(tokenizer, "add_double_eos", False):
        return "double-eos"
    return "eos" if "<eos>" in tokenizer.get_vocab() else "none"


@contextmanager
def config_settings(config, **values):
    """The config's attention settings changed for the evaluation, restored after."""
    saved = {name: getattr(config, name) for name in values}
    for name, value in values.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def evaluate_stream(model, ids, batch_size: int, tgt_len: int, mem_len: int, clamp_len: int, same_length: bool,
                    bf16: bool = False, progress: bool = True) -> dict:  # fmt: skip
    """eval.py's loop: `ids` cut into `batch_size` rows, segments of `tgt_len` predicting the next tokens, the
    memory kept in a `MemoryCache` (its keys and values are not re-projected each segment) under inference mode."""
    device = model.device
    n_step = len(ids) // batch_size
    rows = torch.as_tensor(ids)[: n_step * batch_size].view(batch_size, n_step).to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    cache = MemoryCache(model.config.n_layer, mem_len)
    total_loss, total_len = 0.0, 0
    start = time.perf_counter()
    with torch.inference_mode(), autocast, config_settings(  # (the memory starts empty, as in eval.py)
        model.config, mem_len=mem_len, clamp_len=clamp_len, same_length=attends_same_length(mem_len, same_length),
        zero_initial_mems=False,
    ):
        for i in tqdm(range(0, n_step - 1, tgt_len), desc="evaluating", unit="segment", disable=not progress,
                      dynamic_ncols=True):  # fmt: skip
            seq_len = min(tgt_len, n_step - 1 - i)
            out = model(
                input_ids=rows[:, i : i + seq_len], shift_labels=rows[:, i + 1 : i + 1 + seq_len],
                cache=cache if mem_len > 0 else None, use_cache=mem_len > 0,
            )  # fmt: skip
            total_loss += seq_len * out.loss.float().item()
            total_len += seq_len
    seconds = time.perf_counter() - start
    loss = total_loss / total_len
    predicted = total_len * batch_size
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 700.0)),
        "predicted_tokens": predicted,
        "seconds": seconds,
        "tokens_per_second": predicted / seconds if seconds > 0 else math.inf,
    }
