"""`transformers-xl train`: a Transformer-XL trained on a corpus with one of the paper's recipes, then evaluated.

What it reads, writes and caches, the command's options and its help are in transformers_xl_cli/train.py.
"""

import hashlib
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from .corpus import CorpusError, check_readable, count_vocabulary, encode_file
from .evaluate import config_settings, evaluate_stream
from .memory_trainer import MemoryTrainer
from .recipes import RECIPES, learning_rate_factor, scaled
from .streams import TextStream

CORPUS_FOLDER = "corpus"


class TrainingError(ValueError):
    """Options, files or folders that cannot be used, said in one line."""


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        plan = prepare(args)
        results = train(plan)
    except (TrainingError, CorpusError) as error:
        print(f"transformers-xl train: {error}", file=sys.stderr)
        return 2
    for name, result in results.items():
        print(f"{name}: loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f} | "
              f"bits per {result['unit']} {result['loss'] / np.log(2):.4f}")  # fmt: skip
    print(f"wrote the model and its tokenizer to {args.output_dir}")
    return 0


# --- the plan: recipe, output folder, corpus ---------------------------------------------------------------------


def prepare(args) -> dict:
    """Everything checked and the corpus encoded (or read from the cache) before any training starts."""
    recipe = scaled(RECIPES[args.recipe], args.scale)
    tgt_len = args.tgt_len or recipe.tgt_len
    recipe = replace(
        recipe,
        batch_size=args.batch_size or recipe.batch_size,
        tgt_len=tgt_len,
        eval_tgt_len=args.eval_tgt_len or (recipe.eval_tgt_len if args.tgt_len is None else tgt_len),
        learning_rate=args.learning_rate or recipe.learning_rate,
        warmup_steps=recipe.warmup_steps if args.warmup_steps is None else args.warmup_steps,
        max_steps=args.max_steps or recipe.max_steps,
    )
    files = {"train": args.train_file, "valid": args.valid_file} | ({"test": args.test_file} if args.test_file else {})
    files = {split: check_readable(path) for split, path in files.items()}
    vocab_file = check_readable(args.vocab) if args.vocab else None
    output = Path(args.output_dir)
    if output.exists() and not output.is_dir():
        raise TrainingError(f"--output-dir {output} is a file; expected a folder (created if missing).")
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if recipe.batch_size % processes:
        raise TrainingError(f"--batch-size {recipe.batch_size} does not split over {processes} processes.")
    training_args = training_arguments(args, recipe, output, processes)
    with training_args.main_process_first(desc="the output folder and the corpus"):  # (one process writes them)
        prepare_output_folder(output, args.resume, args.overwrite)
        symbols, streams = load_corpus(recipe, files, vocab_file, args, output / CORPUS_FOLDER)
    cutoffs = args.cutoffs if args.cutoffs is not None else recipe.model.get("cutoffs", [])
    check_cutoffs(recipe, cutoffs, len(symbols), args.cutoffs is not None)
    check_lengths(streams, recipe.batch_size, max(recipe.eval_settings["batch_size"], processes))
    return {"args": args, "recipe": recipe, "symbols": symbols, "streams": streams, "cutoffs": cutoffs,
            "output": output, "mem_len": tgt_len if args.mem_len is None else args.mem_len,
            "training_args": training_args, "processes": processes}  # fmt: skip


def training_arguments(args, recipe, output: Path, processes: int):
    """Trainer's settings for the recipe: Adam (AdamW without weight decay) built in `train`, clipping 0.25."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(output), max_steps=recipe.max_steps, per_device_train_batch_size=recipe.batch_size // processes,
        per_device_eval_batch_size=max(1, recipe.eval_settings["batch_size"] // processes),
        learning_rate=recipe.learning_rate, weight_decay=0.0, max_grad_norm=0.25, save_steps=args.save_steps,
        eval_strategy="steps" if args.eval_steps else "no", eval_steps=args.eval_steps,
        logging_steps=args.logging_steps, report_to=args.report_to, seed=args.seed, bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(), dataloader_pin_memory=False, disable_tqdm=False,
    )  # fmt: skip


def prepare_output_folder(output: Path, resume: bool, overwrite: bool):
    """Refuse a folder with anything but the corpus cache in it, unless resuming or overwriting (which keeps the
    cache: it is checked against the files before reuse)."""
    contents = [path for path in output.iterdir() if path.name != CORPUS_FOLDER] if output.is_dir() else []
    if resume:
        if not any(path.name.startswith("checkpoint-") for path in contents):
            raise TrainingError(f"--resume: {output} holds no checkpoint to resume from.")
    elif contents:
        if not overwrite:
            raise TrainingError(
                f"--output-dir {output} already holds a run ({', '.join(sorted(p.name for p in contents)[:3])}, ...); "
                "pass --resume to continue it or --overwrite to start again."
            )
        for path in contents:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    output.mkdir(parents=True, exist_ok=True)


def check_lengths(streams, train_rows, eval_rows):
    """Each stream must fill its rows with at least 2 tokens each (one prediction per row)."""
    for split, ids in streams.items():
        rows = train_rows if split == "train" else eval_rows
        if len(ids) // rows < 2:
            raise TrainingError(
                f"the {split} file gives {len(ids)} tokens, too few for {rows} rows of at least 2 tokens"
                + (" (pass a smaller --batch-size)." if split == "train" else " (the evaluation's batch).")
            )


def check_cutoffs(recipe, cutoffs, vocab_size, given):
    """The adaptive softmax's clusters must each hold ids: the last cutoff below the vocabulary size."""
    if cutoffs and cutoffs[-1] >= vocab_size:
        reference = recipe.reference_vocab_size or vocab_size
        suggestion = [max(1, round(c * vocab_size / reference)) for c in cutoffs]
        suggestion = sorted(set(suggestion)) if suggestion[-1] < vocab_size else []
        source = "--cutoffs" if given else f"the {recipe.name} recipe's adaptive softmax cutoffs"
        hint = f"--cutoffs {','.join(map(str, suggestion))} (in proportion) or " if suggestion else ""
        raise TrainingError(
            f"{source} {cutoffs} need a vocabulary of more than {cutoffs[-1]} symbols, but this corpus gives "
            f"{vocab_size}; pass {hint}--cutoffs none (a full softmax), or a larger corpus / vocabulary."
        )


def load_corpus(recipe, files, vocab_file, args, cache: Path):
    """(vocabulary, {split: id stream}): from the cache when it was made from the same files and settings, else
    counted / read and encoded, and cached."""
    key = {
        "recipe": recipe.name, "line_end": recipe.line_end, "special": recipe.special, "unk": recipe.unk_token,
        "min_freq": args.min_freq, "max_size": args.max_size,
        "files": {split: _fingerprint(path) for split, path in files.items()},
        "vocab": _fingerprint(vocab_file) if vocab_file else None,
    }  # fmt: skip
    key_file = cache / "key.json"
    if key_file.is_file() and json.loads(key_file.read_text()) == json.loads(json.dumps(key)):
        symbols = (cache / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
        streams = {split: np.load(cache / f"{split}.npy", mmap_mode="r") for split in files}
        print(f"transformers-xl train: reusing the encoded corpus in {cache}", file=sys.stderr)
        return symbols, streams
    symbols = read_vocab(vocab_file) if vocab_file else build_vocabulary(recipe, files, args)
    if recipe.unk_token and recipe.unk_token not in symbols:
        raise TrainingError(f"--vocab {vocab_file}: no {recipe.unk_token} in it; the {recipe.name} recipe's tokenizer "
                            "encodes unseen words with it (the original requires it too).")  # fmt: skip
    vocab = {symbol: index for index, symbol in enumerate(symbols)}
    cache.mkdir(parents=True, exist_ok=True)
    key_file.unlink(missing_ok=True)  # (the cache is valid only once every file is written)
    streams = {}
    for split, path in files.items():
        encoded = encode_file(path, vocab, recipe.line_end, recipe.unk_token, description=f"encoding {split}")
        if encoded.unknown:
            print(f"transformers-xl train: {split}: {encoded.unknown} of {encoded.words} symbols are not in the "
                  f"vocabulary ({encoded.unknown / encoded.words:.3%}), encoded as {recipe.unk_token}", file=sys.stderr)  # fmt: skip
        np.save(cache / f"{split}.npy", encoded.ids)
        streams[split] = np.load(cache / f"{split}.npy", mmap_mode="r")
    (cache / "vocab.txt").write_text("".join(f"{symbol}\n" for symbol in symbols), encoding="utf-8")
    key_file.write_text(json.dumps(key))
    return symbols, streams


def _fingerprint(path: Path) -> dict:
    """What identifies a file's content cheaply: its size, modification time and a hash of its first MiB."""
    stat = path.stat()
    with open(path, "rb") as file:
        head = hashlib.sha256(file.read(1 << 20)).hexdigest()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "head": head}


def read_vocab(path: Path) -> list[str]:
    """The original `_build_from_file`: the first column of each line, in order (duplicates kept once)."""
    symbols = [line.split()[0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not symbols:
        raise TrainingError(f"--vocab {path}: no symbols in it.")
    return list(dict.fromkeys(symbols))


def build_vocabulary(recipe, files, args) -> list[str]:
    """Counted as the original counts: the training file (word corpora) or every file (characters)."""
    paths = list(files.values()) if recipe.vocab_from_valid else [files["train"]]
    symbols = count_vocabulary(paths, recipe.special, args.min_freq, args.max_size)
    if recipe.unk_token and recipe.unk_token not in symbols:
        symbols.append(recipe.unk_token)  # (so that words unseen in training can be encoded later)
    return symbols


# --- training ------------------------------------------------------------------------------------------------------


class RecipeTrainer(MemoryTrainer):
    """MemoryTrainer whose evaluations keep train.py's attention length: segments of eval_tgt_len with a memory of
    mem_len + tgt_len - eval_tgt_len."""

    def __init__(self, *args, eval_mem_len: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_mem_len = eval_mem_len

    def evaluation_loop(self, *args, **kwargs):
        with config_settings(self.model.config, mem_len=self.eval_mem_len):
            return super().evaluation_loop(*args, **kwargs)


def build_model(plan):
    from ..modeling.configuration_transfo_xl import TransfoXLConfig
    from ..modeling.modeling_transfo_xl import TransfoXLLMHeadModel

    recipe, symbols = plan["recipe"], plan["symbols"]
    model = dict(recipe.model)
    cutoffs = plan["cutoffs"]
    model.update(cutoffs=cutoffs, tie_projs=(model.get("tie_projs") or [False])[: len(cutoffs) + 1])
    model["tie_projs"] += [model["tie_projs"][-1]] * (len(cutoffs) + 1 - len(model["tie_projs"]))
    if not cutoffs:
        model.update(adaptive=False, div_val=1)
    specials = {"eos_token_id": symbols.index("<eos>")} if "<eos>" in symbols else {}
    try:
        config = TransfoXLConfig(
            vocab_size=len(symbols), tgt_len=recipe.tgt_len, mem_len=plan["mem_len"], same_length=False,
            clamp_len=-1, init="normal", init_std=0.02, proj_init_std=0.01, tie_weight=True, **model, **specials,
        )  # fmt: skip
    except ValueError as error:
        raise TrainingError(f"the {recipe.name} recipe at --scale {plan['args'].scale}: {error}") from None
    torch.manual_seed(plan["args"].seed)
    return TransfoXLLMHeadModel(config)


def build_tokenizer(plan):
    """Word recipes: a `TransfoXLTokenizer` (raw text through the Moses pipeline, as the released wt103 one);
    characters: a whitespace-split WordLevel tokenizer over the symbols (the prepared files' format)."""
    recipe, symbols = plan["recipe"], plan["symbols"]
    if recipe.character_level:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        backend = Tokenizer(models.WordLevel({symbol: i for i, symbol in enumerate(symbols)}))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False)
    from ..tokenization.tokenization_transfo_xl import TransfoXLTokenizer

    double = recipe.line_end == "double-eos"
    return TransfoXLTokenizer(
        vocab=symbols, unk_token=recipe.unk_token, eos_token="<S>" if double else "<eos>", add_double_eos=double,
        additional_special_tokens=[],
    )  # fmt: skip


def train(plan) -> dict:
    from .demo import save_model

    args, recipe, output, training_args = plan["args"], plan["recipe"], plan["output"], plan["training_args"]
    processes, eval_batch = plan["processes"], training_args.per_device_eval_batch_size
    model = build_model(plan)
    tokenizer = build_tokenizer(plan)
    if len(tokenizer) != model.config.vocab_size:
        raise TrainingError(f"the tokenizer has {len(tokenizer)} symbols, the model {model.config.vocab_size}.")
    streams = plan["streams"]
    train_stream = TextStream(torch.from_numpy(np.array(streams["train"])), recipe.batch_size, recipe.tgt_len,
                              varlen=args.varlen, seed=args.seed)  # fmt: skip
    valid_stream = TextStream(torch.from_numpy(np.array(streams["valid"])), eval_batch * processes,
                              recipe.eval_tgt_len)  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor(recipe.warmup_steps, recipe.max_steps))
    trainer = RecipeTrainer(
        model=model, args=training_args, train_dataset=train_stream, eval_dataset=valid_stream,
        optimizers=(optimizer, schedule), eval_mem_len=plan["mem_len"] + recipe.tgt_len - recipe.eval_tgt_len,
    )  # fmt: skip
    trainer.train(resume_from_checkpoint=True if args.resume else None)

    model = trainer.model.eval()
    final = recipe.eval_settings
    results = {}
    if trainer.is_world_process_zero():
        for split in [s for s in ("valid", "test") if s in streams]:
            ids = torch.from_numpy(np.array(streams[split], dtype=np.int64))
            results[split] = evaluate_stream(
                model, ids, final["batch_size"], final["tgt_len"], final["mem_len"], final["clamp_len"],
                final["same_length"], bf16=args.bf16,
            ) | {"unit": "character" if recipe.character_level else "token"}  # fmt: skip
        with config_settings(model.config, **{k: final[k] for k in ("tgt_len", "mem_len", "clamp_len", "same_length")}):
            save_model(model, tokenizer, output)
        (output / "eval_results.json").write_text(json.dumps({"settings": final, "results": results}, indent=2))
    trainer.accelerator.end_training()
    return results
