"""The output folder of `transformers-xl train`: one run at a time in it, and only the run's own files deleted.

- A lock file (`LOCK`) holds its owner, `host-pid-start time` as conversion/publish.py names its staging folders:
  a second run into the folder stops with one line; the lock of a process that no longer runs is reported and
  cleared.
- A marker file (`MARKER`) says that a `train` run writes here, with the run's settings (a resume with other ones
  is refused) and the manifest of the names it wrote at the top of the folder, each added before it is written.
  `--overwrite` removes only those (the corpus cache is kept: it is checked against the files before any reuse);
  files the run did not write are never removed, and a folder that is not a run is refused.
- Checkpoints and the final model are written under `STAGING` and moved into place when complete.
"""

import contextlib
import json
import os
import shutil
from pathlib import Path

from ..conversion.publish import host_name, is_running, owner_name, rename_no_replace
from .memory_trainer import STAGING

MARKER = ".transformers-xl-train.json"
LOCK = ".transformers-xl-train.lock"
CORPUS = "corpus"


class OutputFolderError(ValueError):
    """The output folder cannot be used by this run: the message says which path and why."""


def is_corpus_cache(folder: Path) -> bool:
    """A corpus cache `train` wrote: a key.json holding the key `train` writes (recipe and files)."""
    try:
        key = json.loads((folder / "key.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(key, dict) and {"recipe", "files"} <= key.keys()


class RunFolder:
    """The output folder of one run. `with folder.locked():` holds the lock; `open(...)` then checks and prepares
    the folder for a fresh run, an overwrite or a resume."""

    def __init__(self, path, say):
        self.path = Path(path)
        self.say = say
        self.created = False  # whether this run created the folder (then a run that fails removes it)
        self.marker: dict | None = None

    # --- the lock --------------------------------------------------------------------------------------------

    def locked(self):
        return _Lock(self)

    # --- the marker and its manifest ---------------------------------------------------------------------------

    def read_marker(self) -> dict | None:
        path = self.path / MARKER
        if not path.is_file():
            return None
        try:
            marker = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            marker = None
        if not isinstance(marker, dict) or not isinstance(marker.get("files"), list):
            raise OutputFolderError(
                f"{path}: damaged (not the JSON list of the files a train run wrote here), so train cannot tell its "
                "files from yours: pick another --output-dir."
            )
        return marker

    def _write_marker(self):
        temporary = self.path / f"{MARKER}.{owner_name()}.tmp"
        temporary.write_text(json.dumps(self.marker, indent=2) + "\n", encoding="utf-8")
        os.replace(temporary, self.path / MARKER)

    def claim(self, *names: str):
        """Add top-level names to the manifest, before they are written (so a killed run's files are known)."""
        new = [name for name in names if name not in self.marker["files"]]
        if new:
            self.marker["files"] += new
            self._write_marker()

    def owns(self, name: str) -> bool:
        return self.marker is not None and name in self.marker["files"]

    # --- opening the folder for a run --------------------------------------------------------------------------

    def open(self, settings: dict, resume: bool, overwrite: bool):
        """Check the folder (a fresh one, or an earlier run's with `overwrite` or `resume`) and write the marker."""
        marker = self.read_marker()
        contents = sorted(p.name for p in self.path.iterdir() if not p.name.startswith((MARKER, LOCK)))
        if marker is None:
            self._open_fresh(contents, settings, resume)
            return
        self.marker = marker
        corpus = self.path / CORPUS
        if corpus.exists() and not self.owns(CORPUS):
            raise OutputFolderError(f"{corpus} was not written by this train run; it is left as it is: move it or "
                                    "pick another --output-dir.")  # fmt: skip
        if resume:
            changed = changed_settings(marker.get("settings") or {}, settings)
            if changed:
                raise OutputFolderError(
                    f"--resume: {self.path} was trained with other settings: {'; '.join(changed)}. Resume with the "
                    "run's settings, or start again with --overwrite."
                )
            _remove(self.path / STAGING)  # (what a killed run was writing: never complete)
            return
        if not overwrite:
            ours = [name for name in contents if self.owns(name) and name not in (CORPUS, STAGING)]
            raise OutputFolderError(
                f"--output-dir {self.path} already holds a train run ({_listed(ours) or 'started, no files yet'}); "
                "pass --resume to continue it or --overwrite to start again."
            )
        for name in [*marker["files"], STAGING]:
            if name != CORPUS:
                _remove(self.path / name)
        self.marker = {**marker, "settings": settings, "files": [name for name in marker["files"] if name == CORPUS]}
        self._write_marker()

    def _open_fresh(self, contents: list[str], settings: dict, resume: bool):
        """A folder without a run: empty, or holding only a corpus cache of train's (kept and checked for reuse)."""
        if resume:
            raise OutputFolderError(f"--resume: {self.path} holds no train run to resume ({MARKER} is missing).")
        foreign = [name for name in contents if name != CORPUS or not is_corpus_cache(self.path / CORPUS)]
        if foreign:
            what = f"files that transformers-xl train did not write ({_listed(foreign)})"
            if foreign == [CORPUS]:
                what = f"a {CORPUS}/ folder that is not a corpus cache written by train (no valid {CORPUS}/key.json)"
            raise OutputFolderError(f"--output-dir {self.path} holds {what}; train writes only into a new or empty "
                                    "folder or one of its own runs: pick another --output-dir.")  # fmt: skip
        self.marker = {"written_by": "transformers-xl train", "settings": settings, "files": contents}  # (none, or the cache)
        self._write_marker()

    def discard(self):
        """After a failure before training: remove the folder if this run created it (all in it is the run's)."""
        if self.created:
            for name in [*(self.marker or {}).get("files", []), STAGING, MARKER]:
                _remove(self.path / name)

    # --- staged writes ---------------------------------------------------------------------------------------

    def staging(self, name: str) -> Path:
        """An empty folder STAGING/name to write into (what a killed run left there is removed)."""
        self.claim(STAGING)
        folder = self.path / STAGING / name
        _remove(folder)
        folder.mkdir(parents=True)
        return folder

    def move_in(self, staging: Path, last: str):
        """Move the files of a complete staging folder to the top of the folder, `last` last (its presence says
        that the others are there). A name the run did not write is never replaced."""
        names = sorted((p.name for p in staging.iterdir()), key=lambda name: name == last)
        foreign = [name for name in names if (self.path / name).exists() and not self.owns(name)]
        if foreign:
            raise OutputFolderError(
                f"{self.path / foreign[0]} exists and was not written by this run; it is left as it is, and the "
                f"model is in {staging}."
            )
        self.claim(*names)
        for name in names:
            os.replace(staging / name, self.path / name)
        staging.rmdir()
        with contextlib.suppress(OSError):
            staging.parent.rmdir()  # (when no other staging folder is in it)


def changed_settings(before: dict, now: dict) -> list[str]:
    """What differs, as `--option old (now new)`; a corpus file as `the train file (another size or content)`."""
    changes = []
    for key in sorted(before.keys() | now.keys()):
        old, new = before.get(key), now.get(key)
        if old == new:
            continue
        if key in ("files", "vocab"):
            splits = sorted((old or {}).keys() | (new or {}).keys()) if key == "files" else ["vocab"]
            pairs = [((old or {}).get(s), (new or {}).get(s)) for s in splits] if key == "files" else [(old, new)]
            changes += [f"the {s} file (another size or content)" for s, (a, b) in zip(splits, pairs) if a != b]
        else:
            changes.append(f"--{key.replace('_', '-')} {old} (now {new})")
    return changes


def _listed(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _remove(path: Path):
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


class _Lock:
    """The run's lock on the folder (see the module docstring); creates the folder if missing."""

    def __init__(self, folder: RunFolder):
        self.folder = folder
        self.path = folder.path / LOCK

    def __enter__(self) -> RunFolder:
        folder = self.folder
        try:
            folder.path.mkdir(parents=True)
            folder.created = True
        except FileExistsError:
            pass
        for _ in range(3):  # (a stale lock cleared, then taken: another run may take it first)
            try:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                self._clear_stale()
                continue
            with os.fdopen(descriptor, "w") as file:
                file.write(owner_name())
            return folder
        raise OutputFolderError(f"{self.path}: cannot take the lock of {folder.path}.")

    def _clear_stale(self):
        try:
            owner = self.path.read_text().strip()
            host, pid, _ = owner.rsplit("-", 2)
        except (OSError, ValueError):
            owner = None  # (being written by its owner, or unreadable: taken to be held)
        if owner is None or is_running(owner):
            who = f"process {pid} on {host}" if owner else "another process"
            unsure = " (on another host, which cannot be checked from here: remove the lock if it no longer runs)"
            raise OutputFolderError(
                f"--output-dir {self.folder.path} is in use by another transformers-xl train ({who}, lock "
                f"{self.path}); one run per folder: wait for it or pick another --output-dir"
                + (unsure if owner and host != host_name() else "") + "."
            )
        aside = self.path.with_name(f"{LOCK}.{owner_name()}.stale")
        try:
            os.rename(self.path, aside)  # (then only this process removes it)
        except FileNotFoundError:
            return
        if aside.read_text().strip() != owner:  # (another run cleared it and took the lock meanwhile)
            with contextlib.suppress(OSError):
                rename_no_replace(aside, self.path)
            return
        aside.unlink()
        self.folder.say(f"removed the lock {self.path} of process {pid}, which no longer runs")

    def __exit__(self, *exception):
        folder = self.folder
        self.path.unlink(missing_ok=True)
        if folder.created and not any(folder.path.iterdir()):
            folder.path.rmdir()  # (a refused run leaves no folder it created)
