"""`transformers-xl train`: a Transformer-XL trained on a corpus with one of the paper's recipes, then evaluated.

What it reads, writes and caches, the command's options and its help are in transformers_xl_cli/train.py.
"""

import contextlib
import hashlib
import json
import math
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .corpus import CorpusError, check_encoded, check_readable, check_vocabulary, count_vocabulary, encode_file
from .evaluate import config_settings, evaluate_stream
from .memory_trainer import STAGING, MemoryTrainer, last_complete_checkpoint
from .recipes import RECIPES, learning_rate_factor, scaled
from .run_folder import CORPUS, OutputFolderError, RunFolder, is_corpus_cache
from .streams import TextStream

INTERRUPTED = 130  # the exit status of a run stopped with Ctrl-C (128 + SIGINT)
RESULTS = "eval_results.json"  # the final evaluation, written last: its presence says that the run is finished


class TrainingError(ValueError):
    """Options, files or folders that cannot be used, said in one line."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training: the message says at which step and how to resume."""


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        plan = prepare(args)
        # (the main process of an `accelerate launch` holds the lock for all of them)
        with plan["folder"].locked() if plan["main"] else contextlib.nullcontext(plan["folder"]):
            results = train_in_folder(plan)
    except (TrainingError, CorpusError, OutputFolderError) as error:
        return _fail(str(error))
    except KeyboardInterrupt as interrupted:
        _fail(str(interrupted) if isinstance(interrupted, TrainingInterrupted) else "interrupted before training "
              "started; run the command again to start.")  # fmt: skip
        return INTERRUPTED
    except SafetensorError as error:
        return _fail(f"writing or reading weights in {args.output_dir} failed: {error}")
    except OSError as error:
        where = f"{error.filename}: " if error.filename else f"{args.output_dir}: "
        return _fail(f"{where}{error.strerror or error}")
    if results is None:
        return 0
    for name, result in results.items():
        print(f"{name}: loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f} | "
              f"bits per {result['unit']} {result['loss'] / np.log(2):.4f}")  # fmt: skip
    print(f"wrote the model and its tokenizer to {args.output_dir}")
    return 0


def _fail(message: str) -> int:
    print(f"transformers-xl train: {message}", file=sys.stderr)
    return 2


# --- the plan: recipe, output folder, corpus ---------------------------------------------------------------------


def prepare(args) -> dict:
    """Options and input files checked, nothing written: the plan of the run."""
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
    for option, path in [*((f"--{split}-file", path) for split, path in files.items()), ("--vocab", vocab_file)]:
        if path is not None and output.resolve() in (path.resolve(), *path.resolve().parents):
            raise TrainingError(f"--output-dir {output} holds {option} {path}; pick an output folder apart from the "
                                "inputs (train would write over them).")  # fmt: skip
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if recipe.batch_size % processes:
        raise TrainingError(f"--batch-size {recipe.batch_size} does not split over {processes} processes.")
    training_args = training_arguments(args, recipe, output, processes)
    mem_len = tgt_len if args.mem_len is None else args.mem_len
    cutoffs = args.cutoffs if args.cutoffs is not None else recipe.model.get("cutoffs", [])
    settings = {
        "recipe": recipe.name, "scale": args.scale, "batch_size": recipe.batch_size, "tgt_len": tgt_len,
        "mem_len": mem_len, "eval_tgt_len": recipe.eval_tgt_len, "learning_rate": recipe.learning_rate,
        "warmup_steps": recipe.warmup_steps, "max_steps": recipe.max_steps, "cutoffs": cutoffs,
        "min_freq": args.min_freq, "max_size": args.max_size, "varlen": args.varlen, "bf16": args.bf16,
        "processes": processes, "files": {split: _content(path) for split, path in files.items()},
        "vocab": _content(vocab_file) if vocab_file else None,
    }  # fmt: skip
    return {"args": args, "recipe": recipe, "files": files, "vocab_file": vocab_file, "cutoffs": cutoffs,
            "output": output, "folder": RunFolder(output, say=_say), "mem_len": mem_len, "settings": settings,
            "training_args": training_args, "processes": processes, "main": training_args.process_index == 0}  # fmt: skip


def open_output(plan):
    """The folder opened for the run (fresh, overwritten or resumed), the corpus encoded or read from the cache and
    checked, and for a resume the checkpoint to continue; a failure leaves no folder this run created."""
    args, recipe, folder = plan["args"], plan["recipe"], plan["folder"]
    try:
        with plan["training_args"].main_process_first(desc="the output folder and the corpus"):  # (one writes them)
            if plan["main"]:
                folder.open(plan["settings"], args.resume, args.overwrite)
            else:
                folder.marker = folder.read_marker()
            symbols, streams = load_corpus(recipe, plan["files"], plan["vocab_file"], args, folder)
        check_cutoffs(recipe, plan["cutoffs"], len(symbols), args.cutoffs is not None)
        check_lengths(streams, recipe.batch_size, max(recipe.eval_settings["batch_size"], plan["processes"]))
    except BaseException:
        if plan["main"]:
            folder.discard()
        raise
    checkpoint = resume_checkpoint(plan) if args.resume else None
    return {**plan, "symbols": symbols, "streams": streams, "checkpoint": checkpoint}


def resume_checkpoint(plan) -> Path:
    """The last complete checkpoint of the run, said on stderr with the incomplete ones skipped."""
    output = plan["output"]
    checkpoint, skipped = last_complete_checkpoint(output)
    for path, problem in skipped if plan["main"] else []:
        _say(f"--resume: skipped the incomplete checkpoint {path} ({problem})")
    if checkpoint is None:
        raise TrainingError(f"--resume: {output} holds no complete checkpoint to resume from.")
    if plan["main"]:
        _say(f"--resume: continuing from {checkpoint} (step {_step(Path(checkpoint))} of {plan['recipe'].max_steps})")
    return Path(checkpoint)


def _say(message: str):
    print(f"transformers-xl train: {message}", file=sys.stderr, flush=True)


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


def load_corpus(recipe, files, vocab_file, args, folder: RunFolder):
    """(vocabulary, {split: id stream}): from the cache OUTPUT/corpus when it was made from the same files and
    settings, else counted / read, encoded, checked and cached."""
    key = {
        "recipe": recipe.name, "line_end": recipe.line_end, "special": recipe.special, "unk": recipe.unk_token,
        "min_freq": args.min_freq, "max_size": args.max_size, "allow_unknown": args.allow_unknown,
        "files": {split: _fingerprint(path) for split, path in files.items()},
        "vocab": _fingerprint(vocab_file) if vocab_file else None,
    }  # fmt: skip
    cache = folder.path / CORPUS
    key_file = cache / "key.json"
    if is_corpus_cache(cache) and json.loads(key_file.read_text()) == json.loads(json.dumps(key)):
        symbols = (cache / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
        streams = {split: np.load(cache / f"{split}.npy", mmap_mode="r") for split in files}
        _say(f"reusing the encoded corpus in {cache}")
        return symbols, streams
    symbols = read_vocab(vocab_file) if vocab_file else build_vocabulary(recipe, files, args)
    if recipe.unk_token and recipe.unk_token not in symbols:
        raise TrainingError(f"--vocab {vocab_file}: no {recipe.unk_token} in it; the {recipe.name} recipe's tokenizer "
                            "encodes unseen words with it (the original requires it too).")  # fmt: skip
    vocab = {symbol: index for index, symbol in enumerate(symbols)}
    encoded = {}
    for split, path in files.items():
        encoded[split] = encode_file(path, vocab, recipe.line_end, recipe.unk_token, description=f"encoding {split}")
        check_encoded(path, encoded[split], recipe.unk_token, allow_unknown=True)  # (a file without symbols first)
    source = f"--vocab {vocab_file}" if vocab_file else f"the vocabulary counted with --min-freq {args.min_freq}"
    check_vocabulary(symbols, {*recipe.special, recipe.unk_token}, source)
    for split, path in files.items():
        check_encoded(path, encoded[split], recipe.unk_token, args.allow_unknown)
        if encoded[split].unknown:
            _say(f"{split}: {encoded[split].unknown} of {encoded[split].words} symbols are not in the vocabulary "
                 f"({encoded[split].unknown / encoded[split].words:.3%}), encoded as {recipe.unk_token}")  # fmt: skip
    folder.claim(CORPUS)
    cache.mkdir(exist_ok=True)
    key_file.unlink(missing_ok=True)  # (the cache is valid only once every file is written)
    for split in files:
        np.save(cache / f"{split}.npy", encoded[split].ids)
    (cache / "vocab.txt").write_text("".join(f"{symbol}\n" for symbol in symbols), encoding="utf-8")
    key_file.write_text(json.dumps(key))
    return symbols, {split: np.load(cache / f"{split}.npy", mmap_mode="r") for split in files}


def _fingerprint(path: Path) -> dict:
    """What identifies a file's content cheaply: its size, modification time and a hash of its first MiB."""
    stat = path.stat()
    with open(path, "rb") as file:
        head = hashlib.sha256(file.read(1 << 20)).hexdigest()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "head": head}


def _content(path: Path) -> dict:
    """What a resume compares of an input file: its size and the hash of its first MiB (not its path or time)."""
    fingerprint = _fingerprint(path)
    return {"size": fingerprint["size"], "head": fingerprint["head"]}


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
    """MemoryTrainer whose evaluations keep train.py's attention length (segments of eval_tgt_len with a memory of
    mem_len + tgt_len - eval_tgt_len), whose checkpoints are listed in the run folder's manifest before they are
    written, and which stops at a non-finite loss."""

    def __init__(self, *args, eval_mem_len: int, folder: RunFolder | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_mem_len = eval_mem_len
        self.folder = folder  # (None in the processes of an `accelerate launch` but the main one)

    def _save_checkpoint(self, model, trial):
        """MemoryTrainer's; torch.save's failures (a full disk is a RuntimeError there) said in one line."""
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.folder is not None:
            self.folder.claim(STAGING, name)
        try:
            super()._save_checkpoint(model, trial)
        except RuntimeError as error:
            raise TrainingError(f"{self.args.output_dir}: writing {name} failed ({str(error).splitlines()[0]}); is "
                                "the disk full?") from None  # fmt: skip

    def evaluation_loop(self, *args, **kwargs):
        with config_settings(self.model.config, mem_len=self.eval_mem_len):
            return super().evaluation_loop(*args, **kwargs)

    def training_step(self, *args, **kwargs):
        """Trainer's step; a non-finite loss stops the run (Trainer would log the mean of the finite ones)."""
        loss = super().training_step(*args, **kwargs)
        if not torch.isfinite(loss).all():
            raise TrainingError(
                f"the training loss is {loss.item()} at step {self.state.global_step + 1}; training stopped (the "
                "checkpoints before it are kept). A lower --learning-rate or more --warmup-steps may help."
            )
        return loss


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


def train_in_folder(plan) -> dict | None:
    """Open the output folder, then train and evaluate; None for a finished run resumed (nothing to do)."""
    plan = open_output(plan)
    checkpoint, output, max_steps = plan["checkpoint"], plan["output"], plan["recipe"].max_steps
    finished = plan["folder"].owns(RESULTS) and (output / RESULTS).is_file()
    if checkpoint is not None and _step(checkpoint) >= max_steps and finished:
        if plan["main"]:
            _say(f"--resume: the run in {output} is finished (step {_step(checkpoint)} of {max_steps}); its results "
                 f"are in {output / RESULTS}, left as they are.")  # fmt: skip
        return None
    return train(plan)


def _step(checkpoint: Path) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


def train(plan) -> dict:
    args, recipe, output, training_args = plan["args"], plan["recipe"], plan["output"], plan["training_args"]
    processes, eval_batch, folder = plan["processes"], training_args.per_device_eval_batch_size, plan["folder"]
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
        folder=folder if plan["main"] else None,
    )  # fmt: skip
    if plan["main"] and args.report_to != ["none"] and not (output / "runs").exists():
        folder.claim("runs")  # (where Trainer's tensorboard logger writes)
    checkpoint = plan["checkpoint"]
    try:
        if checkpoint is not None and _step(checkpoint) >= recipe.max_steps:
            trainer._load_from_checkpoint(str(checkpoint))  # (all steps done; the final model was not written)
        else:
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        results = write_final(plan, trainer, tokenizer) if trainer.is_world_process_zero() else {}
    except KeyboardInterrupt:
        last, _ = last_complete_checkpoint(output)
        how = "no checkpoint was written yet: run the same command with --overwrite to start again"
        if last:
            how = f"the last complete checkpoint is {last}: run the same command with --resume to continue from it"
        step = trainer.state.global_step
        raise TrainingInterrupted(f"interrupted at step {step} of {recipe.max_steps}; {how}.") from None
    trainer.accelerator.end_training()
    return results


def write_final(plan, trainer, tokenizer) -> dict:
    """The paper's evaluation of the trained model on the validation (and test) file; the model (with the
    evaluation settings in its config), tokenizer and results written into a staging folder and moved into the
    output folder, the results last. A non-finite loss writes nothing."""
    from .demo import save_model

    recipe, streams, final = plan["recipe"], plan["streams"], plan["recipe"].eval_settings
    model = trainer.model.eval()
    results = {}
    for split in [s for s in ("valid", "test") if s in streams]:
        ids = torch.from_numpy(np.array(streams[split], dtype=np.int64))
        results[split] = evaluate_stream(
            model, ids, final["batch_size"], final["tgt_len"], final["mem_len"], final["clamp_len"],
            final["same_length"], bf16=plan["args"].bf16,
        ) | {"unit": "character" if recipe.character_level else "token"}  # fmt: skip
        if not math.isfinite(results[split]["loss"]):
            raise TrainingError(f"the final evaluation on the {split} file gives a loss of {results[split]['loss']} "
                                "(non-finite weights); the model is not written.")  # fmt: skip
    staging = plan["folder"].staging("final")
    with config_settings(model.config, **{k: final[k] for k in ("tgt_len", "mem_len", "clamp_len", "same_length")}):
        save_model(model, tokenizer, staging)
    (staging / RESULTS).write_text(json.dumps({"settings": final, "results": results}, indent=2))
    plan["folder"].move_in(staging, last=RESULTS)
    return results
