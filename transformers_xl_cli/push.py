"""Push a model to the Hub: the model's own files, not the folder it lies in.

    transformers-xl push FOLDER ORG/NAME [--public] [--revision BRANCH] [--include PATTERN ...] [--dry-run]

FOLDER holds a model of this package (what `transformers-xl convert` or `export` wrote, a `save_pretrained` folder,
a training run's output). Only the model's own files go up, in one commit: config.json, the safetensors weights
(each checked first), tokenizer files, generation_config.json, README.md, the remote code config.json's `auto_map`
names with the files it imports, ONNX graphs. Anything else only when named with --include; dotfiles, keys and
training state never. A repository the push creates is private unless --public.
"""


def add_visibility_arguments(parser):
    """--public / --private: the visibility of a repository the push creates (an existing one keeps its own)."""
    visibility = parser.add_mutually_exclusive_group()
    visibility.add_argument("--public", action="store_true", help="create the repo public (default: private)")
    visibility.add_argument("--private", action="store_true", help="create the repo private (the default)")


def add_arguments(parser):
    parser.add_argument("folder", metavar="FOLDER", help="a model folder (what `transformers-xl convert` wrote)")
    parser.add_argument("repo", metavar="ORG/NAME", help="the model repo to upload to (created if missing)")
    add_visibility_arguments(parser)
    parser.add_argument("--revision", help="branch to commit to (created if missing)")
    parser.add_argument("--include", action="append", default=[], metavar="PATTERN",
                        help="also upload the files matching PATTERN (fnmatch, relative to FOLDER; repeatable); "
                        "dotfiles, keys and training state are never uploaded")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="list what would be uploaded where, send nothing")


def run(args) -> int:
    from transformers_xl.conversion import push

    return push.run(args)
