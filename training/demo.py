"""Train a small character-level Transformer-XL on the standard library's source and show what the memory buys.

Placeholder while issue #10 is built: it only declares the subcommand.
"""


def add_arguments(parser):
    parser.add_argument("--quick", action="store_true")


def run(args) -> int:
    raise SystemExit("transformers-xl demo: not built yet (issue #10)")
