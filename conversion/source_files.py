"""Source files are not trusted: each is checked as it is read, and a damaged or unsafe one is refused by name.

- JSON files (config.json, tokenizer_config.json, index files, ...): an error names the file, not just a line.
- torch zip files (`pytorch_model.bin`, `model.pt`): `torch.load` does not check the CRC-32 the zip stores for each
  entry, so a flipped bit would load as a wrong weight (and the verification would compare against the same damaged
  source); every entry is checked first.
- pickles: torch's weights-only loader refuses a global that could run code, but its message suggests retrying with
  `weights_only=False`, which would run it. The refusal is said plainly instead, naming the global.
"""

import json
import pickle
import re
import zipfile
from pathlib import Path


def read_json(path) -> dict:
    """The JSON object in `path`; a ValueError naming the file if it is not one (or cannot be read)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}; expected an object")
    return data


def check_zip_entries(path):
    """Refuse a zip file (torch's checkpoint format) with an entry whose data does not match its stored CRC-32."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, EOFError) as error:
        raise ValueError(f"{path}: cannot read it (a truncated or damaged zip file: {error})") from None
    if damaged is not None:
        raise ValueError(f"{path}: the entry {damaged} is damaged (its data does not match its CRC-32); refused")


def refused_pickle(path, error: pickle.UnpicklingError, allowed: str) -> ValueError:
    """The error for a pickle that the restricted unpickler refused (`allowed` says what it lets in)."""
    found = re.search(r"GLOBAL (\S+)", str(error))
    if found is None:
        return ValueError(
            f"{path}: cannot read the pickle: it is damaged or holds something other than {allowed} "
            "(nothing from it was run)"
        )
    return ValueError(
        f"{path}: refused: loading it would run code (the pickle refers to {found.group(1)}); only {allowed} are "
        "loaded, and nothing from the file was run"
    )
