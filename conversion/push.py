"""`transformers-xl push`: upload a model of this package to the Hub: the model's own files, not the folder.

FOLDER holds a model of this package (what `transformers-xl convert` or `export` wrote, a `save_pretrained` folder,
a training run's output). Only the model's own files go up, in one commit: config.json, the safetensors weights
(each checked first), tokenizer files, generation_config.json, README.md, the remote code config.json's `auto_map`
names with the files it imports, ONNX graphs. Anything else only when named with --include; dotfiles, keys and
training state never. A repository the push creates is private unless --public. The command's options and help
are in transformers_xl_cli/push.py.
"""

import fnmatch
import json
import sys
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.errors import HTTPError
from huggingface_hub.utils import filter_repo_objects, validate_repo_id
from safetensors import SafetensorError, safe_open
from transformers.dynamic_module_utils import get_relative_import_files

from .publish import MARKER

MODEL_TYPES = ("transfo-xl", "xlnet")
WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
MODEL_FILES = [
    "config.json", "generation_config.json", "README.md",
    WEIGHTS, WEIGHTS_INDEX, "model-*-of-*.safetensors",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "spiece.model",
    "chat_template.jinja",
    "model.onnx", "model.onnx.data", "model.onnx_data",
]  # fmt: skip
"""What a model is made of, at the top of its folder (the remote code is added from config.json's `auto_map`)."""
NEVER_UPLOADED_NAMES = [
    ".*",  # (dotfiles and dot-folders: .git, .env, .netrc, our marker, ...)
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "*.pem", "*.key", "*.p12", "*.pfx",
    "optimizer.pt", "scheduler.pt", "rng_state*.pth", "training_args.bin", "checkpoint-*", "corpus",
]  # fmt: skip
"""Never uploaded, not even with --include, at any depth: secrets and training state (a folder's name excludes
everything in it)."""
NEVER_UPLOADED = [pattern for name in NEVER_UPLOADED_NAMES
                  for pattern in (name, f"{name}/*", f"*/{name}", f"*/{name}/*")]  # fmt: skip


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
    missing = [name for name in index_shards(folder) if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{folder}: the weights index names shards that are missing: {', '.join(missing)}.")


def index_shards(folder: Path) -> list[str]:
    """The weight files FOLDER's index names (none without an index)."""
    if not (folder / WEIGHTS_INDEX).is_file():
        return []
    try:
        return sorted(set(json.loads((folder / WEIGHTS_INDEX).read_text(encoding="utf-8"))["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{folder / WEIGHTS_INDEX}: not a weights index ({error}).") from None


def remote_code_files(folder: Path) -> list[str]:
    """The code files config.json's `auto_map` names (in this folder, not "repo--module.Class" elsewhere) and every
    file they import relatively, found as transformers finds them when it loads the code."""
    auto_map = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("auto_map") or {}
    references = [value for values in auto_map.values() for value in (values if isinstance(values, list) else [values])]
    modules = {folder / f"{reference.rpartition('.')[0]}.py" for reference in references
               if isinstance(reference, str) and "--" not in reference}  # fmt: skip
    files = set()
    for module in modules:
        if not module.is_file():
            raise ValueError(f"{folder}: config.json's auto_map names {module.name}, which is missing.")
        files |= {module, *map(Path, get_relative_import_files(module))}
    return sorted(path.relative_to(folder).as_posix() for path in files)


def files_to_upload(folder: Path, include: list[str]) -> tuple[list[str], list[str]]:
    """(the files that go up, the files of FOLDER left out but our marker), as paths relative to FOLDER."""
    every = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())
    every = [path for path in every if path != MARKER]
    allowed = MODEL_FILES + index_shards(folder) + remote_code_files(folder) + list(include)
    uploaded = list(filter_repo_objects(every, allow_patterns=allowed, ignore_patterns=NEVER_UPLOADED))
    return uploaded, [path for path in every if path not in uploaded]


def check_weights(folder: Path, paths: list[str]):
    """Every safetensors file to upload opens: its header parses and the data it describes is all there (a truncated
    or damaged file is refused rather than published)."""
    for path in paths:
        if fnmatch.fnmatch(path, "*.safetensors"):
            try:
                with safe_open(folder / path, framework="pt"):
                    pass
            except (SafetensorError, OSError) as error:
                raise ValueError(f"{folder / path}: damaged weights ({error}); not uploaded.") from None


def push_folder(folder, repo_id: str, *, private: bool = True, revision: str | None = None, include=(),
                dry_run: bool = False, endpoint: str | None = None, token: str | None = None):  # fmt: skip
    """Upload the model files of `folder` (see the module docstring) to the model repo `repo_id` in ONE commit,
    creating the repo (private unless `private=False`) and the branch `revision` if needed. `dry_run` prints what
    would go where and sends nothing. Returns the commit URL."""
    folder = Path(folder)
    paths, left_out = files_to_upload(folder, list(include))
    check_weights(folder, paths)
    api = HfApi(endpoint=endpoint, token=token)
    branch = revision or "main"
    if left_out:
        log(f"not uploaded, {len(left_out)} file(s) not part of the model (--include PATTERN adds files): "
            f"{', '.join(left_out[:10])}{' ...' if left_out[10:] else ''}")  # fmt: skip
    if dry_run:
        print(f"dry run: would create {'private' if private else 'public'} model repo {repo_id} (if missing; an "
              f"existing repo keeps its visibility) on {api.endpoint} and commit to branch {branch}:")  # fmt: skip
        for path in paths:
            size = (folder / path).stat().st_size
            print(f"  {folder / path} -> {api.endpoint}/{repo_id}/blob/{branch}/{path} ({size} bytes)")
        return None
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=folder / path) for path in paths]
    commit = api.create_commit(
        repo_id, operations, commit_message="Upload model converted with transformers-xl", revision=revision
    )
    log(f"pushed {len(paths)} files to {commit.commit_url}")
    return commit.commit_url


def run(args) -> int:
    folder = Path(args.folder)
    try:
        validate_repo_id(args.repo)
        check_model_folder(folder)
    except ValueError as error:  # (HFValidationError is one)
        log(f"error: {error}")
        return 1
    failure = f"pushing {args.folder} to {args.repo} failed"
    return push_with_options(folder, args.repo, args, log, failure, include=args.include)


def push_with_options(folder, repo: str, args, say, failure: str, include=()) -> int:
    """`push_folder` with a command's --public, --revision and --dry-run; the exit status. A folder whose files
    cannot be uploaded, or a failed push (the Hub's answers, the network, no token, offline mode), is one line,
    through `say` (after `failure` for the latter)."""
    try:
        push_folder(folder, repo, private=not args.public, revision=args.revision, include=include,
                    dry_run=args.dry_run)  # fmt: skip
    except ValueError as error:
        say(f"error: {error}")
        return 1
    except (HTTPError, OSError) as error:
        say(f"error: {failure}: {error}")
        return 1
    return 0
