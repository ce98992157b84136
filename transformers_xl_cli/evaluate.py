"""Evaluate a Transformer-XL language model on text files with the paper's protocol (the original `eval.py`).

    transformers-xl evaluate MODEL TEXT_FILE [TEXT_FILE ...] [--batch-size 10] [--tgt-len L]
                             [--mem-len M | --memory-lengths M1,M2,...] [--clamp-len C]
                             [--same-length | --no-same-length] [--line-end eos|double-eos|none]
                             [--bf16] [--device DEVICE] [--json PATH] [--allow-unknown]

MODEL is a folder (converted, transformers 4.x, or saved by this package) or a Hub id; its tokenizer's vocabulary
encodes the text as the original corpus readers do (each line stripped and split on whitespace, then `<eos>`, or
`<S>` ... `<S>` for lm1b, or nothing for enwik8 / text8, whose files are space-separated characters). The id stream
is cut into `--batch-size` rows (the tail that does not fill every row is dropped) and read in segments of
`--tgt-len` with the memory carried from segment to segment; every token of a row but its first is predicted once,
the last position of a segment predicting the first token of the next. The loss is eval.py's: sum(seq_len x segment
mean NLL) / sum(seq_len), i.e. the mean NLL over every predicted token; a loss that is not finite is an error, not
a result, as are non-finite weights, a vocabulary of special tokens only, a text without symbols and one of which
more than half are not in the vocabulary (unless --allow-unknown). Defaults come from the model's config
(`tgt_len`, `mem_len`, `clamp_len`, `same_length`); the paper's settings for the released checkpoints are in
docs/evaluation.md.

`--memory-lengths 0,64,128` evaluates at each of these memory lengths in turn (the same protocol, segments and
text; only the memory changes; lengths beyond the model's training memory are allowed) and prints a table of the
results; with `--json PATH` it also writes the table as CSV and markdown and a plot of the loss (bits per character,
or perplexity) and evaluation time against the memory length, beside PATH (the same name ending .csv, .md, .png).
Examples:

    transformers-xl evaluate ./transfo-xl-wt103 wikitext-103/wiki.test.tokens --json test.json
    transformers-xl evaluate ./enwik8 enwik8/test.txt --memory-lengths 0,100,400,1600,3800 --json curve.json
"""

import argparse

from .arguments import memory_lengths, non_negative_int, positive_int

# The line ends of transformers_xl.training.corpus, written out so that `--help` needs no import of it
# (tests/test_cli.py checks that they agree).
LINE_ENDS = ["double-eos", "eos", "none"]


def add_arguments(parser):
    parser.add_argument("model", help="a model folder (converted, transformers 4.x or our own) or a Hub id")
    parser.add_argument("text_files", nargs="+", metavar="TEXT_FILE", help="text to evaluate; each file apart")
    parser.add_argument("--batch-size", type=positive_int, default=10, help="rows read side by side (default: 10)")
    parser.add_argument("--tgt-len", type=positive_int, help="tokens per segment (default: the config's tgt_len)")
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument("--mem-len", type=non_negative_int, help="memory length (default: the config's mem_len)")
    memory.add_argument(
        "--memory-lengths", type=memory_lengths, metavar="M1,M2,...",
        help="evaluate at each of these memory lengths and report a table (and, with --json, CSV, markdown and a plot)",
    )  # fmt: skip
    parser.add_argument(
        "--clamp-len", type=int, help="relative distances beyond it use its encoding; <= 0: none (default: config)"
    )
    parser.add_argument(
        "--same-length", action=argparse.BooleanOptionalAction, default=None,
        help="every query attends to the same number of positions (default: the config's same_length)",
    )  # fmt: skip
    parser.add_argument(
        "--line-end", choices=LINE_ENDS, default=None,
        help="what ends each line: eos (wt103, PTB, WikiText), double-eos (lm1b's <S> ... <S>), none (enwik8, "
        "text8: space-separated characters) (default: double-eos if the tokenizer adds it, eos if the vocabulary "
        "has <eos>, else none)",
    )  # fmt: skip
    parser.add_argument("--bf16", action="store_true", help="run the model in bfloat16 autocast")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--json", metavar="PATH", help="also write the settings and results to this JSON file (with "
                        "--memory-lengths also PATH's .csv, .md and .png)")  # fmt: skip
    parser.add_argument("--allow-unknown", action="store_true",
                        help="evaluate a text of which over half of the symbols are <unk>")  # fmt: skip


def run(args) -> int:
    from transformers_xl.training import evaluate

    return evaluate.run(args)
