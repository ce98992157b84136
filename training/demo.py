"""`transformers-xl demo`: train a small character-level Transformer-XL on the standard library's source and show
what the memory buys.

What it measures and writes, the command's options and its help are in transformers_xl_cli/demo.py.
"""

import json
import math
import platform
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import torch
from matplotlib.figure import Figure
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast, TrainingArguments, set_seed
from transformers.trainer_callback import ProgressCallback
from transformers_xl_cli.demo import DEFAULTS, QUICK

from ..conversion.publish import umask_permissions
from ..conversion.remote_code import full_auto_map
from ..modeling.configuration_transfo_xl import TransfoXLConfig
from ..modeling.modeling_transfo_xl import TransfoXLLMHeadModel
from . import memory_curve
from .evaluate import evaluate_memory_lengths
from .memory_trainer import MemoryTrainer
from .streams import TextStream

HELD_OUT_ONE_IN = 10
SKIPPED_FOLDERS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
# The vocabulary: one token per printable ASCII character, newline and tab; anything else is <unk>; <eos> ends a file.
CHARACTERS = ["\n", "\t", *map(chr, range(32, 127))]
UNK, EOS = "<unk>", "<eos>"
SAMPLE_PROMPT = "import os\n\n\ndef "
SAMPLE_LENGTH = 300


def settings_from(args) -> dict:
    """The run's settings: the preset, overridden by the options given; checks what the options cannot alone."""
    settings = dict(QUICK if args.quick else DEFAULTS)
    settings.update({name: getattr(args, name) for name in DEFAULTS if getattr(args, name) is not None})
    settings.update(quick=args.quick, seed=args.seed, threads=args.threads)
    if settings["d_model"] % settings["n_head"]:
        raise ValueError(
            f"--n-head {settings['n_head']} must divide --d-model {settings['d_model']} (each head gets d_model / n_head)."
        )
    if settings["eval_chars"] < 2 * settings["batch_size"]:
        raise ValueError(
            f"--eval-chars {settings['eval_chars']} cannot fill --batch-size {settings['batch_size']} rows of at "
            "least 2 characters each."
        )
    if Path(args.output_dir).exists() and not Path(args.output_dir).is_dir():
        raise ValueError(f"--output-dir {args.output_dir} is a file; expected a folder (it is created if missing).")
    return settings


def run(args) -> int:
    try:
        settings = settings_from(args)
    except ValueError as error:
        print(f"transformers-xl demo: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(settings["threads"])  # (the command's process: run_demo, a library function, does not)
    try:
        metrics = run_demo(settings, Path(args.output_dir))
    except FileNotFoundError as error:  # (no standard library sources to train on)
        print(f"transformers-xl demo: {error}", file=sys.stderr)
        return 1
    print(f"\nbits per character on held-out files: {metrics['bpc_with_memory']:.3f} with memory, "
          f"{metrics['bpc_without_memory']:.3f} without")  # fmt: skip
    print(f"evaluation speed-up of state reuse over a sliding window of {metrics['attention_length']} characters: "
          f"{metrics['eval_speedup']:.1f}x")  # fmt: skip
    print(f"wrote {args.output_dir}/metrics.json, demo.png and model/ in {metrics['wall_time_s']:.0f} s")
    return 0


def log(message: str):
    print(f"transformers-xl demo: {message}", file=sys.stderr, flush=True)


# --- the text: the standard library's own source --------------------------------------------------------------


def stdlib_files() -> tuple[Path, list[Path], list[Path]]:
    """(stdlib folder, training files, held-out files): every `.py` file of the running interpreter's standard
    library outside test folders (and installed packages), held out when the CRC32 of its path says so, each list
    in the order of that hash (a fixed mix of the library, the same on every machine with this Python)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = {}
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if path.is_file() and not SKIPPED_FOLDERS.intersection(relative.parts[:-1]):
            files[path] = zlib.crc32(relative.as_posix().encode())
    if not files:
        raise FileNotFoundError(
            f"found no .py files in the standard library folder {root} (this Python ships "
            "without its sources); the demo trains on them."
        )
    ordered = sorted(files, key=lambda path: (files[path], path))
    held_out = [path for path in ordered if files[path] % HELD_OUT_ONE_IN == 0]
    training = [path for path in ordered if files[path] % HELD_OUT_ONE_IN != 0]
    return root, training, held_out


def character_tokenizer():
    """A `tokenizers` character tokenizer (one token per character, no normalisation, decoding concatenates) as a
    transformers tokenizer: saved as `tokenizer.json`, it loads with `AutoTokenizer` anywhere."""
    vocabulary = {token: i for i, token in enumerate([UNK, EOS, *CHARACTERS])}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"(?m)."), behavior="isolated")  # (?m): `.` takes \n too
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token=UNK, eos_token=EOS, clean_up_tokenization_spaces=False
    )


def read_stream(tokenizer, files: list[Path], chars: int, description: str):
    """The first `chars` token ids of `files` read in order, each file followed by <eos> (fewer if they run out)."""
    pieces, total = [], 0
    with tqdm(total=chars, desc=description, unit="char", unit_scale=True, dynamic_ncols=True) as bar:
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace")
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            pieces.append(torch.tensor(ids[: chars - total]))
            bar.update(len(pieces[-1]))
            total += len(pieces[-1])
            if total >= chars:
                break
    return torch.cat(pieces), len(pieces)


# --- training -------------------------------------------------------------------------------------------------


def build_model(settings: dict, vocab_size: int) -> TransfoXLLMHeadModel:
    """The demo's Transformer-XL (plain softmax over the characters, no dropout: the data is seen once)."""
    set_seed(settings["seed"])
    d_model, n_head = settings["d_model"], settings["n_head"]
    config = TransfoXLConfig(
        vocab_size=vocab_size, cutoffs=[], adaptive=False, div_val=1, d_model=d_model, d_embed=d_model,
        n_head=n_head, d_head=d_model // n_head, d_inner=4 * d_model, n_layer=settings["n_layer"],
        mem_len=settings["mem_len"], tgt_len=settings["segment_len"], clamp_len=-1, same_length=False,
        dropout=0.0, dropatt=0.0, eos_token_id=1, pad_token_id=1,
    )  # fmt: skip
    return TransfoXLLMHeadModel(config)


class BitsPerCharacterProgress(ProgressCallback):
    """Trainer's own progress bar, showing the training bits per character instead of printing every log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.training_bar is not None and logs and "loss" in logs:
            self.training_bar.set_postfix(bpc=f"{logs['loss'] / math.log(2):.3f}")


def train(model, train_ids, settings: dict, output_dir: Path):
    """`MemoryTrainer` over a `TextStream` of `batch_size` rows; returns the trainer and the learning curve."""
    steps = settings["steps"]
    args = TrainingArguments(
        output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=settings["batch_size"],
        learning_rate=settings["learning_rate"], lr_scheduler_type="cosine", warmup_steps=0.05, weight_decay=0.01,
        max_grad_norm=0.25,
        logging_steps=max(1, steps // 100), save_strategy="no", report_to=[], seed=settings["seed"],
        disable_tqdm=False, dataloader_pin_memory=False,
    )  # fmt: skip
    trainer = MemoryTrainer(
        model=model, args=args, train_dataset=TextStream(train_ids, settings["batch_size"], settings["segment_len"])
    )
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(BitsPerCharacterProgress)
    trainer.train()
    curve = [(entry["step"], entry["loss"] / math.log(2)) for entry in trainer.state.log_history if "loss" in entry]
    return trainer, curve


# --- evaluation: bits per character against the memory length -------------------------------------------------

# The memory lengths of the held-out curve, as fractions of the trained `mem_len` (0, 32, 64, 128, 256, 512 by
# default): without memory, shorter and longer memories than trained (the relative encodings extend to any distance).
MEMORY_CURVE = (0, 0.25, 0.5, 1, 2, 4)


def held_out_curve(model, eval_ids, settings: dict) -> list[dict]:
    """`transformers-xl evaluate --memory-lengths`'s evaluation of the held-out stream (the paper's protocol: rows
    of `batch_size`, segments of `segment_len`, the memory from empty) at each of MEMORY_CURVE's lengths; each
    result also has its bits per character."""
    lengths = sorted({round(fraction * settings["mem_len"]) for fraction in MEMORY_CURVE})
    curve = evaluate_memory_lengths(
        model, eval_ids, lengths, batch_size=settings["batch_size"], tgt_len=settings["segment_len"],
        clamp_len=model.config.clamp_len, same_length=model.config.same_length, bf16=False,
    )  # fmt: skip
    return [{"file": "held-out", **result, "bits_per_character": result["loss"] / math.log(2)} for result in curve]


# --- evaluation speed: state reuse vs a sliding window -----------------------------------------------------------


def evaluation_speed(model, ids, attention_length: int, segment_len: int, chars: int) -> dict:
    """Time both ways of predicting the same `chars` characters, each from the `attention_length` characters up to
    and including the one before it (every layer of both attends to exactly that many positions):

    - sliding window (the vanilla model, Sec. 3.2): each prediction runs the model, without memory, over the window
      of the `attention_length` characters before it and keeps the last position's output; `segment_len` windows
      per forward;
    - state reuse (Transformer-XL): segments of `segment_len` characters, each attending to the memory of the
      `attention_length` positions before every query (`same_length`, so no query sees more); the memory is first
      filled from the characters before the timed ones, untimed.

    Same model, weights, threads and number of predictions per forward; returns the seconds per character and the
    bits per character of each side on those characters (close: the same context, but Transformer-XL's memory
    was itself computed with earlier context, Sec. 3.2)."""
    config, device = model.config, model.device
    saved = config.mem_len, config.same_length
    ids = ids[: attention_length + chars + 1].to(device)
    chars = len(ids) - attention_length - 1
    if chars < 1:
        raise ValueError(
            f"evaluation_speed: {len(ids)} ids leave nothing to predict after an attention length of {attention_length}."
        )
    targets = ids[attention_length + 1 :]
    results = {}
    model.eval()
    try:
        with torch.no_grad():
            config.mem_len, config.same_length = attention_length, True
            mems = model(input_ids=ids[None, :attention_length]).mems
            start = time.perf_counter()
            nll = 0.0
            for begin in tqdm(range(0, chars, segment_len), desc="eval speed: state reuse", dynamic_ncols=True):
                positions = slice(attention_length + begin, attention_length + min(begin + segment_len, chars))
                out = model(input_ids=ids[None, positions], mems=mems)
                mems = out.mems
                nll -= out.logits[0].gather(1, ids[positions.start + 1 : positions.stop + 1, None]).sum().item()
            results["memory"] = (time.perf_counter() - start, nll)

            config.mem_len, config.same_length = 0, False
            windows = ids.unfold(0, attention_length, 1)  # window k = ids[k : k + attention_length]
            start = time.perf_counter()
            nll = 0.0
            for begin in tqdm(range(0, chars, segment_len), desc="eval speed: sliding window", dynamic_ncols=True):
                batch = windows[1 + begin : 1 + min(begin + segment_len, chars)]
                log_probs = model(input_ids=batch).logits[:, -1]
                nll -= log_probs.gather(1, targets[begin : begin + len(batch), None]).sum().item()
            results["window"] = (time.perf_counter() - start, nll)
    finally:
        config.mem_len, config.same_length = saved
    return {
        "chars": chars,
        "seconds_per_char_memory": results["memory"][0] / chars,
        "seconds_per_char_window": results["window"][0] / chars,
        "speedup": results["window"][0] / results["memory"][0],
        "bpc_memory": results["memory"][1] / chars / math.log(2),
        "bpc_window": results["window"][1] / chars / math.log(2),
    }


# --- the outputs -----------------------------------------------------------------------------------------------


def generate_sample(model, tokenizer, seed: int) -> str:
    """A sampled continuation of SAMPLE_PROMPT (temperature 0.8, top-k 20), through `generate` and the memory cache."""
    torch.manual_seed(seed)
    prompt = tokenizer(SAMPLE_PROMPT, return_tensors="pt", add_special_tokens=False)["input_ids"].to(model.device)
    output = model.generate(prompt, max_new_tokens=SAMPLE_LENGTH, do_sample=True, temperature=0.8, top_k=20)
    return tokenizer.decode(output[0], skip_special_tokens=True)


def save_model(model, tokenizer, folder: Path):
    """`save_pretrained` of the model (with its code, as `transformers-xl convert` writes it: see
    `conversion/remote_code`) and of the tokenizer, with the permissions the umask gives (safetensors writes its
    files private)."""
    model.config.auto_map = full_auto_map(model)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    umask_permissions(Path(folder))


def plot(metrics: dict, path: Path) -> Figure:
    """Three panels: training loss in bits per character, held-out bpc (and evaluation time) against the memory
    length, evaluation time per character (with each side's bpc on the characters timed, which shows that both
    predict them equally well)."""
    figure = Figure(figsize=(17, 4.5))  # (no pyplot: no GUI backend, no global state)
    curve, bpc, speed = figure.subplots(1, 3, gridspec_kw={"width_ratios": [2, 1.4, 1]})
    steps, bits = zip(*metrics["learning_curve"]) if metrics["learning_curve"] else ((), ())
    curve.plot(steps, bits, color="tab:blue", label="training (with memory)")
    for value, color, label in ((metrics["bpc_with_memory"], "tab:green", "held-out, with memory"),
                                (metrics["bpc_without_memory"], "tab:red", "held-out, without memory")):  # fmt: skip
        curve.axhline(value, color=color, linestyle="--", label=f"{label}: {value:.3f}")
    curve.set(xlabel="training step", ylabel="bits per character", title="Learning curve")
    curve.legend()

    memory_curve.draw(bpc, metrics["memory_curve"], "character", metrics["settings"]["mem_len"])
    bpc.set_title(f"Held-out, against the memory length (segments of {metrics['settings']['segment_len']})")

    milliseconds = [1000 * metrics["eval_seconds_per_char_memory"], 1000 * metrics["eval_seconds_per_char_window"]]
    bars = speed.bar(["state reuse\n(memory)", "sliding window\n(recompute)"], milliseconds,
                     color=["tab:green", "tab:gray"])  # fmt: skip
    speed.bar_label(bars, labels=[f"{ms:.2f} ms\n{bits:.3f} bpc" for ms, bits in
                                  zip(milliseconds, (metrics["speed_bpc_memory"], metrics["speed_bpc_window"]))])
    speed.margins(y=0.2)  # (room above the bars for the two-line labels)
    speed.set(ylabel="ms per character",
              title=f"Evaluation, attention length {metrics['attention_length']}: {metrics['eval_speedup']:.0f}x")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return figure


# --- the whole run ---------------------------------------------------------------------------------------------


def run_demo(settings: dict, output_dir: Path) -> dict:
    """Read, train, evaluate, time, sample and write everything; returns the metrics (also in metrics.json)."""
    started, cpu_started = time.perf_counter(), time.process_time()
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = character_tokenizer()
    root, training_files, held_out_files = stdlib_files()
    log(f"text: {len(training_files)} training and {len(held_out_files)} held-out files of {root}")
    train_chars = settings["steps"] * settings["batch_size"] * settings["segment_len"] + settings["batch_size"]
    train_ids, train_files_read = read_stream(tokenizer, training_files, train_chars, "reading training files")
    eval_chars = settings["eval_chars"] + settings["speed_chars"] + settings["mem_len"] + 1
    eval_ids, eval_files_read = read_stream(tokenizer, held_out_files, eval_chars, "reading held-out files")
    speed_ids, eval_ids = eval_ids[-(settings["speed_chars"] + settings["mem_len"] + 1) :], eval_ids[: settings["eval_chars"]]

    model = build_model(settings, len(tokenizer))
    log(f"training a {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M-parameter Transformer-XL for "
        f"{settings['steps']} steps of {settings['batch_size']} x {settings['segment_len']} characters "
        f"(memory {settings['mem_len']})")  # fmt: skip
    train_started = time.perf_counter()
    trainer, curve = train(model, train_ids, settings, output_dir)
    train_seconds = time.perf_counter() - train_started
    model = trainer.model

    log("evaluating on the held-out files at several memory lengths, 0 (without memory) and the trained one included")
    held_out = held_out_curve(model.eval(), eval_ids, settings)
    bits = {result["mem_len"]: result["bits_per_character"] for result in held_out}
    speed = evaluation_speed(model, speed_ids, settings["mem_len"], settings["segment_len"], settings["speed_chars"])

    sample = generate_sample(model, tokenizer, settings["seed"])
    save_model(model, tokenizer, output_dir / "model")
    metrics = {
        "bpc_with_memory": bits[settings["mem_len"]],
        "bpc_without_memory": bits[0],
        "memory_curve": held_out,
        "eval_speedup": speed["speedup"],
        "attention_length": settings["mem_len"],
        "eval_seconds_per_char_memory": speed["seconds_per_char_memory"],
        "eval_seconds_per_char_window": speed["seconds_per_char_window"],
        "speed_bpc_memory": speed["bpc_memory"],
        "speed_bpc_window": speed["bpc_window"],
        "final_training_bpc": curve[-1][1] if curve else None,
        "learning_curve": curve,
        "train_time_s": train_seconds,
        "wall_time_s": None,
        "cpu_time_s": None,
        "sample": sample,
        "settings": {
            **settings,
            "parameters": sum(p.numel() for p in model.parameters()),
            "d_inner": model.config.d_inner,
            "vocab_size": len(tokenizer),
            "stdlib": str(root),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "device": str(model.device),
            "train_files": train_files_read,
            "train_chars": len(train_ids),
            "eval_files": eval_files_read,
            "eval_chars_used": len(eval_ids),
            "speed_chars_used": speed["chars"],
        },
    }
    plot(metrics, output_dir / "demo.png")
    metrics["wall_time_s"] = time.perf_counter() - started
    metrics["cpu_time_s"] = time.process_time() - cpu_started
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    print(f"\nsample (prompt {SAMPLE_PROMPT!r}):\n{'-' * 60}\n{sample}\n{'-' * 60}")
    return metrics
