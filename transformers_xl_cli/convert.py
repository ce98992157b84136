"""Convert a checkpoint (original TF, original PyTorch or legacy transformers) into a Hub folder, and push it.

    transformers-xl convert SOURCE OUTPUT --from {tf,original-pytorch,hf-legacy} [options]

OUTPUT gets safetensors weights, config.json with the model code beside it (loads with trust_remote_code=True
where transformers-xl is not installed), generation config, tokenizer and model card; it is reloaded and compared
with the source before it appears.
"""

import argparse

from .push import add_visibility_arguments

# The defaults of transformers_xl.conversion.hub_export and the names of transformers_xl.hub_configs, written out so
# that `--help` needs no import of them (tests/test_cli.py checks that they agree).
DEFAULT_MAX_SHARD_SIZE = "5GB"
DEFAULT_TOLERANCE = 1e-4
RELEASED_CONFIGS = ["enwik8", "lm1b", "text8", "transfo-xl-wt103", "wt103", "xlnet-base-cased", "xlnet-large-cased"]


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("source", metavar="SOURCE", help="checkpoint: TF prefix or folder, model.pt, or 4.x folder")
    parser.add_argument("output", metavar="OUTPUT", help="the folder to write (refused if it exists, see --force)")
    parser.add_argument("--from", dest="source_format", required=True, choices=["tf", "original-pytorch", "hf-legacy"])
    parser.add_argument(
        "--config",
        help=f"a config.json, a JSON of the original training flags (tf), or a released config: {RELEASED_CONFIGS}",
    )
    parser.add_argument("--corpus-info", help="tf: the corpus-info.json of the original data script")
    parser.add_argument("--task", help="tf (XLNet): the fine-tuning task whose head to convert")
    vocabulary = parser.add_mutually_exclusive_group()
    vocabulary.add_argument(
        "--vocab", help="vocabulary for the tokenizer: tokenizer.json, vocab.pkl/.bin/.txt, spiece.model"
    )
    vocabulary.add_argument("--no-tokenizer", action="store_true", help="write no tokenizer (even if one is found)")
    parser.add_argument("--force", action="store_true", help="replace an OUTPUT that transformers-xl wrote")
    parser.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE, help="split weights above this size")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="verification: largest difference")
    parser.add_argument(
        "--license", metavar="ID",
        help="the model card's license, a Hub identifier such as apache-2.0 (default: the source folder's model "
        "card's, else unknown)",
    )  # fmt: skip
    hub = parser.add_argument_group("Hub")
    hub.add_argument("--push-to", metavar="ORG/NAME", help="upload OUTPUT to this model repo in one commit")
    add_visibility_arguments(hub)
    hub.add_argument("--revision", help="branch to commit to (created if missing)")
    hub.add_argument("--dry-run", action="store_true", help="list what would be uploaded where, send nothing")


def run(args) -> int:
    from transformers_xl.conversion import cli

    return cli.run(args)
