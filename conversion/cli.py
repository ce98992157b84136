"""Convert a checkpoint (original TF, original PyTorch or legacy transformers) into a Hub folder, and push it.

    transformers-xl convert SOURCE OUTPUT --from {tf,original-pytorch,hf-legacy} [options]

OUTPUT gets safetensors weights, config.json with the model code beside it (loads with trust_remote_code=True
where transformers-xl is not installed), generation config, tokenizer and model card; it is reloaded and compared
with the source before it appears.
"""

import argparse
import shlex
import signal
from pathlib import Path

from .. import hub_configs
from .hub_export import DEFAULT_MAX_SHARD_SIZE, DEFAULT_TOLERANCE, log, write_folder
from .publish import OutputError, OutputExists, check_apart, check_output
from .push import add_visibility_arguments, push_with_options


def read_source(args):
    """The reader for `--from`, imported on use (the TF reader pulls in its own dependencies)."""
    config = hub_configs.config_path(args.config) if args.config else None
    if args.source_format == "tf":
        from .tf_checkpoint import read_tf_checkpoint

        return read_tf_checkpoint(args.source, config=config, corpus_info=args.corpus_info, task=args.task)
    if args.source_format == "original-pytorch":
        from .original_pytorch import read_original_pytorch

        return read_original_pytorch(args.source, config=config)
    from .hf_legacy import read_hf_legacy

    return read_hf_legacy(args.source, config=config)


def command_line(args) -> str:
    """The command as the model card records it (from the parsed options, so it is the same however it was run)."""
    words = ["transformers-xl", "convert", args.source, args.output, "--from", args.source_format]
    for option in ("config", "corpus_info", "task", "vocab", "max_shard_size"):
        value = getattr(args, option)
        if value is not None and not (option == "max_shard_size" and value == DEFAULT_MAX_SHARD_SIZE):
            words += ["--" + option.replace("_", "-"), str(value)]
    return shlex.join(words + ["--no-tokenizer"] * args.no_tokenizer)


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("source", metavar="SOURCE", help="checkpoint: TF prefix or folder, model.pt, or 4.x folder")
    parser.add_argument("output", metavar="OUTPUT", help="the folder to write (refused if it exists, see --force)")
    parser.add_argument("--from", dest="source_format", required=True, choices=["tf", "original-pytorch", "hf-legacy"])
    parser.add_argument(
        "--config",
        help=f"a config.json, a JSON of the original training flags (tf), or a released config: {hub_configs.names()}",
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
    hub = parser.add_argument_group("Hub")
    hub.add_argument("--push-to", metavar="ORG/NAME", help="upload OUTPUT to this model repo in one commit")
    add_visibility_arguments(hub)
    hub.add_argument("--revision", help="branch to commit to (created if missing)")
    hub.add_argument("--dry-run", action="store_true", help="list what would be uploaded where, send nothing")


def run(args) -> int:
    if (args.public or args.private or args.revision or args.dry_run) and not args.push_to:
        log("--public, --private, --revision and --dry-run need --push-to")
        return 2
    output = Path(args.output).absolute()
    try:
        check_apart(output, Path(args.source))
    except OutputError as error:
        log(str(error))
        return 2
    previous_handler = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _convert_and_push(args, output)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)


def _convert_and_push(args, output: Path) -> int:
    try:
        check_output(output, args.force, say=log, command="convert")  # (before reading the source: it can take minutes)
        converted = read_source(args)
        write_folder(
            converted, output, force=args.force, vocab=args.vocab, with_tokenizer=not args.no_tokenizer,
            command=command_line(args), max_shard_size=args.max_shard_size, tolerance=args.tolerance,
        )  # fmt: skip
    except (ValueError, TypeError, FileExistsError, FileNotFoundError, OutputError) as error:
        log(f"error: {error}")
        if isinstance(error, OutputExists) and args.push_to:
            log(f"to push it as it is, without converting again: transformers-xl push {args.output} {args.push_to}")
        return 1
    if args.push_to:
        failure = f"{args.output} is written, but pushing it to {args.push_to} failed"
        return push_with_options(output, args.push_to, args, log, failure)
    return 0


def _terminated(signum, frame):
    """SIGTERM (`kill`, a job scheduler's time limit) unwinds like Ctrl-C, so the temporary folder is removed."""
    log("terminated")
    raise SystemExit(128 + signum)
