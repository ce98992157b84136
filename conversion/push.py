"""`transformers-xl push`: check that a folder holds a model of this package, then upload it in one commit.

The command's options and help are in transformers_xl_cli/push.py.
"""

import json
import sys
from pathlib import Path

from huggingface_hub.errors import HTTPError
from huggingface_hub.utils import validate_repo_id

from .hub_export import push_folder

MODEL_TYPES = ("transfo-xl", "xlnet")
WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"


def log(message: str):
    print(f"transformers-xl push: {message}", file=sys.stderr, flush=True)


def check_model_folder(folder: Path):
    """Refuse, with what is missing, a folder that does not hold a model of this package ready to load."""
    if not folder.is_dir():
        raise ValueError(f"{folder}: expected a folder written by `transformers-xl convert`.")
    config_file = folder / "config.json"
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError) as error:
        raise ValueError(f"{folder}: no readable config.json ({error}); expected a converted model folder.") from None
    if model_type not in MODEL_TYPES:
        raise ValueError(f"{folder}: config.json says model_type {model_type!r}; expected one of {list(MODEL_TYPES)}.")
    if (folder / WEIGHTS).is_file():
        return
    if not (folder / WEIGHTS_INDEX).is_file():
        raise ValueError(f"{folder}: no weights; expected {WEIGHTS} or {WEIGHTS_INDEX} with its shards.")
    try:
        shards = set(json.loads((folder / WEIGHTS_INDEX).read_text(encoding="utf-8"))["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{folder / WEIGHTS_INDEX}: not a weights index ({error}).") from None
    missing = sorted(name for name in shards if not (folder / name).is_file())
    if missing:
        raise ValueError(f"{folder}: the weights index names shards that are missing: {', '.join(missing)}.")


def run(args) -> int:
    folder = Path(args.folder)
    try:
        validate_repo_id(args.repo)
        check_model_folder(folder)
    except ValueError as error:  # (HFValidationError is one)
        log(f"error: {error}")
        return 1
    return push_with_options(folder, args.repo, args, log, failure=f"pushing {args.folder} to {args.repo} failed")


def push_with_options(folder, repo: str, args, say, failure: str) -> int:
    """`push_folder` with a command's --private, --revision and --dry-run; the exit status. A failed push (the Hub's
    answers, the network, no token, offline mode) is one line, `failure` and the cause, through `say`."""
    try:
        push_folder(folder, repo, private=args.private, revision=args.revision, dry_run=args.dry_run)
    except (HTTPError, OSError) as error:
        say(f"error: {failure}: {error}")
        return 1
    return 0
