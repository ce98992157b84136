"""Train a small character-level Transformer-XL on the standard library's source and show what the memory buys.

`transformers-xl demo` needs no download: its text is the Python standard library's own source files, found from
the running interpreter (one file in ten, chosen by a hash of its path, is held out for evaluation). It trains with
the public training API (`TextStream` + `MemoryTrainer`), then measures, on the held-out files:

- bits per character of the trained model evaluated with memories of 0 to 4 times its own (`mem_len` 0: without
  memory, a character sees only the earlier characters of its own segment), the same weights and segments at each:
  `transformers-xl evaluate --memory-lengths`'s evaluation;
- the evaluation speed-up of Transformer-XL's state reuse (Sec. 3.2): to predict each character with an attention
  length of A characters, a model without memory re-runs a sliding window of A characters, while Transformer-XL
  runs each character once and attends to the A - 1 before it through the memory.

It writes `metrics.json`, `demo.png` (the learning curve, bits per character against the memory length, the speed
comparison) and `model/` (loads with `AutoModelForCausalLM` + `AutoTokenizer`, with `import transformers_xl` or with
`trust_remote_code=True`), and prints a generated sample.
"""

import argparse

from .arguments import positive_float, positive_int

# The numbers of the two settings; `--quick` is for tests and CI (well under a minute), the default takes about
# 5 minutes on one thread.
DEFAULTS = dict(
    steps=2500, d_model=128, n_layer=4, n_head=4, segment_len=32, mem_len=128, batch_size=16, learning_rate=2e-3,
    eval_chars=65536, speed_chars=512,
)  # fmt: skip
QUICK = dict(
    steps=30, d_model=32, n_layer=2, n_head=2, segment_len=16, mem_len=32, batch_size=4, learning_rate=5e-3,
    eval_chars=2048, speed_chars=64,
)  # fmt: skip
# One thread unless --threads says otherwise: a fixed rule, so that the seeded numbers are the same on every run of a
# machine (another thread count sums the products in another order); the demo's model is too small for more threads
# to gain much, and on a machine busy with other work they wait for each other.
THREADS = 1


def add_arguments(parser):
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--quick", action="store_true", help="a tiny run that finishes in well under a minute")
    parser.add_argument("--output-dir", default="transformers-xl-demo", help="where to write (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the training (default: 0)")
    parser.add_argument(
        "--threads", type=positive_int, default=THREADS,
        help="CPU threads for torch (default: %(default)s; the numbers README gives are measured with it: another "
        "count sums the products in another order and moves them a little)",
    )  # fmt: skip
    numbers = parser.add_argument_group("sizes (defaults: the full run / --quick)")
    help_text = {
        "steps": "training steps",
        "d_model": "model width",
        "n_layer": "layers",
        "n_head": "attention heads (they split d_model)",
        "segment_len": "characters per segment (tgt_len), in training and evaluation",
        "mem_len": "characters of memory; also the attention length of the speed comparison",
        "batch_size": "rows of text trained side by side",
        "learning_rate": "peak learning rate (AdamW, cosine decay)",
        "eval_chars": "held-out characters evaluated with and without memory",
        "speed_chars": "held-out characters predicted by each side of the speed comparison",
    }
    for name, text in help_text.items():
        kind = positive_float if isinstance(DEFAULTS[name], float) else positive_int
        numbers.add_argument(
            f"--{name.replace('_', '-')}", type=kind, default=None, help=f"{text} ({DEFAULTS[name]} / {QUICK[name]})"
        )


def run(args) -> int:
    from transformers_xl.training import demo

    return demo.run(args)
