"""`transformers-xl convert`: read the source, write the folder and verify it, push it if asked.

The command's options and help are in transformers_xl_cli/convert.py.
"""

import shlex
import signal
from pathlib import Path

from .. import hub_configs
from .hub_export import DEFAULT_MAX_SHARD_SIZE, log, write_folder
from .publish import OutputError, OutputExists, check_apart, check_output
from .push import push_with_options


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
    """The command as the model card records it (from the parsed options, so it is the same however it was run),
    each path by its file name only: a published card shows no local folders."""
    words = ["transformers-xl", "convert", _name(args.source), _name(args.output), "--from", args.source_format]
    for option in ("config", "corpus_info", "task", "vocab", "max_shard_size", "license"):
        value = getattr(args, option)
        if value is not None and not (option == "max_shard_size" and value == DEFAULT_MAX_SHARD_SIZE):
            value = _name(value) if option in ("config", "corpus_info", "vocab") else str(value)
            words += ["--" + option.replace("_", "-"), value]
    return shlex.join(words + ["--no-tokenizer"] * args.no_tokenizer)


def _name(path: str) -> str:
    """A path's last part ("ckpt/model.pt" -> "model.pt"; a released config's name stays as it is)."""
    return Path(path).name or str(path)


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
            license=args.license,
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
