"""Convert a checkpoint (original TF, original PyTorch, legacy transformers) into a Hub folder.

Placeholder while issue #9 is built: it only declares the subcommand.
"""


def add_arguments(parser):
    parser.add_argument("source")
    parser.add_argument("output")


def run(args) -> int:
    raise SystemExit("transformers-xl convert: not built yet (issue #9)")
