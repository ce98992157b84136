"""The configs of the released checkpoints, one folder per checkpoint (`config.json`, and where relevant
`generation_config.json` / `tokenizer_config.json`). `transformers-xl convert --config NAME` takes these names."""

from pathlib import Path

FOLDER = Path(__file__).parent


def names() -> list[str]:
    return sorted(path.parent.name for path in FOLDER.glob("*/config.json"))


def config_path(name_or_path: str) -> str:
    """A released checkpoint's name ("enwik8") -> its config.json; an existing file is returned as it is."""
    if Path(name_or_path).is_file():
        return name_or_path
    if (FOLDER / name_or_path / "config.json").is_file():
        return str(FOLDER / name_or_path / "config.json")
    raise ValueError(f"--config {name_or_path}: neither a file nor a released config ({', '.join(names())})")
