"""Train a Transformer-XL on your corpus with one of the paper's recipes (the original `run_*.sh` scripts).

    transformers-xl train --recipe {wt103,enwik8,text8,lm1b,tiny} --train-file F --valid-file F --output-dir D
                          [--test-file F] [--vocab FILE] [--scale S] [--max-steps N] [--batch-size B]
                          [--tgt-len L] [--mem-len M] [--eval-tgt-len L] [--learning-rate LR] [--warmup-steps N]
                          [--cutoffs A,B,C | none] [--min-freq N] [--max-size N] [--varlen] [--bf16]
                          [--save-steps N] [--eval-steps N] [--logging-steps N] [--report-to ...] [--seed N]
                          [--threads N] [--allow-unknown] [--resume | --overwrite]

The files are read as the original corpus readers read them (training/corpus.py: already tokenised text, one
sentence or paragraph per line, `<eos>` per line for the word recipes; space-separated characters for enwik8 /
text8); the vocabulary is built as the original builds it (word counts over the training file with `--min-freq` /
`--max-size`, or every symbol of every split for the character recipes), or read from `--vocab` (one symbol per
line, the first column). Vocabulary and id streams are cached in OUTPUT_DIR/corpus/ and reused by a rerun on the
same files and settings. One run at a time writes into OUTPUT_DIR and removes only what it wrote
(training/run_folder.py). Training is `MemoryTrainer` over `TextStream`s (every token predicted, the memory
carried from step to step, checkpoints complete or absent, `--resume` from the last complete one); `accelerate
launch` runs it on several processes or GPUs (the recipe's batch is the global one). At the end the model is
evaluated with the paper's protocol (docs/evaluation.md) on the validation (and test) file, and OUTPUT_DIR holds
the model and its tokenizer, ready for `AutoModelForCausalLM` / `AutoTokenizer`, `transformers-xl evaluate` and
`push_to_hub`. Example (a minute on 2 CPU cores):

    transformers-xl train --recipe tiny --train-file train.txt --valid-file valid.txt --output-dir tiny-run
"""

import argparse

from .arguments import non_negative_int, positive_float, positive_int

# The recipes of transformers_xl.training.recipes, written out so that `--help` needs no import of them
# (tests/test_cli.py checks that they agree).
RECIPES = ["wt103", "enwik8", "text8", "lm1b", "tiny"]


def _cutoffs(text):
    if text == "none":
        return []
    try:
        values = [int(value) for value in text.split(",")]
    except ValueError:
        values = []
    if not values or values != sorted(set(values)) or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected increasing positive integers like 1000,5000 (or none), got {text!r}")
    return values


def add_arguments(parser):
    parser.add_argument("--recipe", required=True, choices=RECIPES, help="the original script to follow")
    parser.add_argument("--train-file", required=True, help="training text")
    parser.add_argument("--valid-file", required=True, help="validation text (evaluated during and after training)")
    parser.add_argument("--test-file", help="test text, evaluated at the end")
    parser.add_argument("--output-dir", required=True, help="where the checkpoints, the corpus cache and the model go")
    parser.add_argument("--vocab", help="a vocabulary file (one symbol per line, first column) instead of counting")
    parser.add_argument("--scale", type=positive_float, default=1.0,
                        help="shrink the model (layers, heads, width) and the batch by this factor (default: 1)")
    parser.add_argument("--max-steps", type=positive_int, help="optimizer steps (default: the recipe's)")
    parser.add_argument("--batch-size", type=positive_int, help="global batch: rows of text (default: the recipe's)")
    parser.add_argument("--tgt-len", type=positive_int, help="segment length = memory length in training")
    parser.add_argument("--mem-len", type=non_negative_int, help="memory length in training (default: --tgt-len)")
    parser.add_argument("--eval-tgt-len", type=positive_int, help="segment length of the evaluations during training")
    parser.add_argument("--learning-rate", type=positive_float, help="peak learning rate (default: 2.5e-4)")
    parser.add_argument("--warmup-steps", type=non_negative_int, help="linear warm-up steps (default: the recipe's)")
    parser.add_argument("--cutoffs", type=_cutoffs, help="adaptive softmax cutoffs, e.g. 1000,5000, or none")
    parser.add_argument("--min-freq", type=non_negative_int, default=0, help="drop words seen fewer times (default: 0)")
    parser.add_argument("--max-size", type=positive_int, help="keep at most this many counted words")
    parser.add_argument("--allow-unknown", action="store_true",
                        help="train even when more than half of the symbols of a file are not in the vocabulary")  # fmt: skip
    parser.add_argument("--varlen", action="store_true", help="segment lengths drawn like the original --varlen")
    parser.add_argument("--bf16", action="store_true", help="train and evaluate under bfloat16 autocast")
    parser.add_argument("--save-steps", type=positive_int, default=1000, help="checkpoint every N steps (default: 1000)")
    parser.add_argument("--eval-steps", type=positive_int, help="evaluate on the validation file every N steps")
    parser.add_argument("--logging-steps", type=positive_int, default=50, help="log every N steps (default: 50)")
    parser.add_argument("--report-to", nargs="+", default=["none"], help="Trainer's loggers: tensorboard, wandb, ...")
    parser.add_argument("--seed", type=int, default=1111, help="seed (default: train.py's 1111)")
    parser.add_argument(
        "--threads", type=positive_int,
        help="CPU threads for torch (default: torch's choice); on a machine busy with other work, 1 avoids threads "
        "spinning while they wait for a core",
    )  # fmt: skip
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="continue from the last complete checkpoint of the run in --output-dir")  # fmt: skip
    existing.add_argument("--overwrite", action="store_true",
                          help="start the run in --output-dir again (removes only what train wrote there)")  # fmt: skip


def run(args) -> int:
    from transformers_xl.training import train

    return train.run(args)
