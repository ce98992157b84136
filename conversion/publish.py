"""Publishing a folder at OUTPUT without ever deleting what this program did not create.

A command that writes a folder (`convert`, `export`) works in a staging folder beside OUTPUT (same filesystem) and
publishes it at the end with one rename:

- without `force`, the rename cannot replace anything: if OUTPUT appeared meanwhile (another run, a user), it is
  kept as it is and the command fails (`OutputExists`). Two runs to one OUTPUT: the first to finish wins.
- with `force`, only a folder the same command published is replaced: our marker file names the command and the
  files it wrote, and the folder holds nothing else. It is moved aside, the new folder put in its place, then the old
  one deleted. Anything else at OUTPUT (another command's folder, one a user added files to, a user's folder) is
  refused, as is an OUTPUT that is, holds or lies inside the command's source (`check_apart`).

The staging folder's name records its owner, `.OUTPUT.<host>-<pid>-<start time>.<random>.partial`, so a run that
was killed (kill -9, a crash, a power cut) leaves a folder that a later run recognises: the process no longer exists
(or the pid now belongs to a process started later), so the later run removes it and says so.
"""

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = ".transformers-xl.json"
"""Left in every published folder: which command wrote it and the files it wrote, what recognises a folder `force`
may replace (not uploaded to the Hub)."""
STAGING, REPLACED = ".partial", ".replaced"


class OutputError(Exception):
    """OUTPUT cannot be written, or is there and may not be replaced: the message says which path and why."""


class OutputExists(OutputError, FileExistsError):
    pass


def _say(message: str):
    print(message, file=sys.stderr, flush=True)


# --- who owns a staging folder ----------------------------------------------------------------------------------


def _start_time(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22): with the pid, names a process
    even after its pid is reused. "0" where there is no /proc (then the pid alone is used)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rpartition(")")[2].split()[19]


def host_name() -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())


def owner_name() -> str:
    return f"{host_name()}-{os.getpid()}-{_start_time(os.getpid())}"


def is_running(owner: str) -> bool:
    """Whether the process named by `owner` may still run (True for another host's: it cannot be checked here)."""
    host, pid, started = owner.rsplit("-", 2)
    if host != host_name():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (someone else's process: it exists)
        pass
    return started == "0" or _start_time(int(pid)) in (started, "0")


def remove_stale(output: Path, say: Callable[[str], None] = _say):
    """Remove the staging folders of runs to `output` that were killed; put back a folder `force` had moved aside
    when the run was killed before the new one was in place."""
    pattern = re.compile(re.escape(f".{output.name}.") + r"(\w+-\d+-\d+)\.\w+(\.partial|\.replaced)", re.ASCII)
    for path in sorted(output.parent.glob(f".{output.name}.*")):
        found = pattern.fullmatch(path.name)
        if found is None or is_running(found.group(1)):
            continue
        pid = found.group(1).rsplit("-", 2)[1]
        if found.group(2) == REPLACED and not os.path.lexists(output):
            with contextlib.suppress(OSError):  # (another run may have put it back first)
                rename_no_replace(path, output)
                say(f"put back {output}, which process {pid} (no longer running) had moved aside to replace it")
        else:
            shutil.rmtree(path, ignore_errors=True)
            say(f"removed {path}, left by process {pid}, which no longer runs")


# --- the renames ------------------------------------------------------------------------------------------------

_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


def _renameat2():
    """glibc's renameat2 (Linux 3.15+, glibc 2.28+), or None."""
    if not sys.platform.startswith("linux"):
        return None
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return function


def rename_no_replace(source: Path, target: Path):
    """Rename `source` to `target` atomically if nothing is at `target`, else raise FileExistsError.

    On Linux this is `renameat2(RENAME_NOREPLACE)`: the kernel checks and renames in one step. On Windows
    `os.rename` never replaces. Elsewhere (or on a filesystem without RENAME_NOREPLACE) `mkdir(target)` claims the
    name, which fails if anything is there, and the rename then replaces only that empty folder of ours (a rename
    onto a non-empty folder fails, so something put into it meanwhile is kept too)."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS):  # (those: the filesystem or kernel lacks the flag)
            raise OSError(code, os.strerror(code), str(source), None, str(target))
    if os.name == "nt":
        os.rename(source, target)
        return
    os.mkdir(target)
    try:
        os.rename(source, target)
    except OSError as error:
        with contextlib.suppress(OSError):
            os.rmdir(target)  # (fails, keeping it, if something was put into it meanwhile)
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(error.errno, os.strerror(error.errno), str(target)) from None
        raise


# --- the folder -------------------------------------------------------------------------------------------------


def _marker(folder: Path) -> dict:
    """The marker of a published folder, {} where there is none (or it is not ours)."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return marker if isinstance(marker, dict) and marker.get("written_by") == "transformers-xl" else {}


def not_replaceable(folder: Path, command: str) -> str | None:
    """Why `command` with `force` may not replace `folder`, or None where it may: the folder must hold our marker
    naming `command` and nothing but the files that marker lists (not a link to such a folder)."""
    if folder.is_symlink() or not folder.is_dir():
        return "it is a link" if folder.is_symlink() else "it is not a folder"
    marker = _marker(folder)
    if not isinstance(marker.get("subcommand"), str) or not isinstance(marker.get("files"), list):
        return f"no {MARKER} listing what it wrote"
    if marker["subcommand"] != command:
        return f"transformers-xl {marker['subcommand']} wrote it"
    written = {Path(name) for name in marker["files"]} | {Path(MARKER)}
    allowed = written | {parent for name in written for parent in name.parents}
    others = sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*")
                    if path.relative_to(folder) not in allowed)  # fmt: skip
    if others:
        return f"it holds files {command} did not write: {', '.join(others[:5])}" + (" ..." if others[5:] else "")
    return None


def check_apart(output: Path, source: Path):
    """Refuse an OUTPUT that is the command's source, holds it or lies inside it: replacing it would delete the
    input, and writing into it would mix our files into it."""
    output, source = Path(output).resolve(), Path(source).resolve()
    if output == source or output in source.parents:
        raise OutputError(f"OUTPUT {output} would replace SOURCE {source}; write elsewhere.")
    if source in output.parents:
        raise OutputError(f"OUTPUT {output} lies inside SOURCE {source}; write elsewhere.")


def check_output(output: Path, force: bool, say: Callable[[str], None] = _say, *, command: str):
    """Before any work: OUTPUT may be written (absent, or with `force` a folder `command` published), and a folder
    can be created beside it. First removes the staging folders of killed runs (and puts back what they had moved
    aside)."""
    remove_stale(output, say)
    if os.path.lexists(output):
        if not force:
            raise OutputExists(f"{output} exists; pass --force to replace it.")
        reason = not_replaceable(output, command)
        if reason is not None:
            raise OutputError(
                f"{output} exists and is not a folder written by transformers-xl {command} ({reason}); --force "
                "replaces only such a folder. Remove it yourself or pick another OUTPUT."
            )
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=f".{output.name}.{owner_name()}.", suffix=STAGING, dir=output.parent))
    except OSError as error:
        raise OutputError(f"cannot write in {output.parent}: {error.strerror or error}") from error


class StagingFolder:
    """`with StagingFolder(output, force, command=...) as staging:` write into `staging.path`, then
    `staging.publish()`; on any exception (or without a publish) the staging folder is removed. `command`
    ("convert", "export"; keyword-only) is recorded in the marker: `force` replaces only a folder of the same
    command."""

    def __init__(self, output, force: bool = False, marker: dict | None = None, say: Callable[[str], None] = _say, *,
                 command: str):  # fmt: skip
        self.output, self.command, self.force, self.say = Path(output).absolute(), command, force, say
        self.marker = {"written_by": "transformers-xl", "subcommand": command, **(marker or {})}
        self.path: Path | None = None

    def __enter__(self) -> "StagingFolder":
        check_output(self.output, self.force, self.say, command=self.command)
        self.path = Path(tempfile.mkdtemp(prefix=f".{self.output.name}.{owner_name()}.", suffix=STAGING,
                                          dir=self.output.parent))  # fmt: skip
        return self

    def __exit__(self, *exception):
        if self.path is not None and self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)

    def publish(self):
        """Move the staging folder to OUTPUT (see the module docstring); OutputExists if OUTPUT appeared."""
        files = sorted(path.relative_to(self.path).as_posix() for path in self.path.rglob("*") if not path.is_dir())
        marker = {**self.marker, "files": files}
        (self.path / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        umask_permissions(self.path)
        if self.force and os.path.lexists(self.output):
            self._replace()
            return
        try:
            rename_no_replace(self.path, self.output)
        except FileExistsError:
            raise OutputExists(
                f"{self.output} appeared while this run was writing; it is left as it is and the new folder was not "
                "kept (run again with another OUTPUT, or with --force to replace a folder written by transformers-xl)."
            ) from None

    def _replace(self):
        aside = self.path.with_name(self.path.name[: -len(STAGING)] + REPLACED)
        os.rename(self.output, aside)
        if not_replaceable(aside, self.command) is not None:  # (it changed since check_output)
            rename_no_replace(aside, self.output)
            raise OutputError(f"{self.output} is no longer a folder written by transformers-xl; it is not replaced.")
        try:
            rename_no_replace(self.path, self.output)
        except FileExistsError:
            raise OutputExists(
                f"{self.output} appeared while replacing it; it is left as it is, the previous folder is at {aside}."
            ) from None
        shutil.rmtree(aside, ignore_errors=True)
        self.say(f"replaced {self.output} (a folder written by transformers-xl {self.command})")


def umask_permissions(folder: Path):
    """The permissions the umask gives (mkdtemp makes the folder private, and safetensors writes its files private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for root, folders, files in os.walk(folder):
        for name in folders:
            os.chmod(os.path.join(root, name), 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(root, name), 0o666 & ~umask)
