"""Publishing a written folder at OUTPUT (conversion/publish.py): a rename that replaces nothing, `force` that
replaces only a folder we wrote, and the staging folders of killed runs removed by the next run."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from transformers_xl.conversion import publish
from transformers_xl.conversion.publish import MARKER, OutputError, OutputExists, StagingFolder, rename_no_replace


@pytest.fixture(params=["renameat2", "mkdir-then-rename"])
def no_replace_mode(request, monkeypatch):
    """Both ways `rename_no_replace` works: Linux's renameat2, and the fallback used where it is missing."""
    if request.param == "renameat2":
        if publish._renameat2() is None:
            pytest.skip("no renameat2 here")
    else:
        monkeypatch.setattr(publish, "_renameat2", lambda: None)
    return request.param


def write_model(folder):
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_text("weights")


def names(folder):
    return sorted(path.name for path in folder.iterdir())


@pytest.mark.parametrize("existing", ["empty folder", "folder", "file"])
def test_rename_no_replace_keeps_what_is_there(existing, no_replace_mode, tmp_path):
    source, target = tmp_path / "new", tmp_path / "out"
    source.mkdir()
    (source / "weights").write_text("new")
    if existing == "file":
        target.write_text("theirs")
    else:
        target.mkdir()
        if existing == "folder":
            (target / "notes.txt").write_text("theirs")
    with pytest.raises(FileExistsError):
        rename_no_replace(source, target)
    assert (target.read_text() if existing == "file" else names(target)) == {
        "file": "theirs", "folder": ["notes.txt"], "empty folder": []
    }[existing]  # fmt: skip
    assert names(source) == ["weights"]


def test_output_that_appears_while_writing_is_kept(no_replace_mode, tmp_path):
    output = tmp_path / "out"
    with pytest.raises(OutputExists, match="appeared while this run was writing; it is left as it is"):
        with StagingFolder(output, command="convert") as staging:
            write_model(staging.path)
            output.mkdir()
            (output / "notes.txt").write_text("data")  # (someone, or another run, made OUTPUT meanwhile)
            staging.publish()
    assert names(tmp_path) == ["out"] and names(output) == ["notes.txt"]


def test_of_two_runs_to_one_output_the_first_to_publish_wins(no_replace_mode, tmp_path):
    output = tmp_path / "out"
    with pytest.raises(OutputExists):
        with StagingFolder(output, command="convert") as first:
            write_model(first.path)
            (first.path / "run").write_text("first")
            with StagingFolder(output, command="convert") as second:  # (started while the first writes)
                write_model(second.path)
                (second.path / "run").write_text("second")
                second.publish()
            first.publish()
    assert (output / "run").read_text() == "second" and (output / MARKER).is_file()
    assert names(tmp_path) == ["out"]


def test_a_published_folder_gets_a_marker_and_the_umask_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        with StagingFolder(tmp_path / "out", marker={"command": "convert x"}, command="convert") as staging:
            (staging.path / "sub").mkdir()
            (staging.path / "sub" / "file").write_text("x")
            os.chmod(staging.path / "sub" / "file", 0o600)
            staging.publish()
    finally:
        os.umask(umask)
    output = tmp_path / "out"
    assert json.loads((output / MARKER).read_text()) == {
        "written_by": "transformers-xl", "subcommand": "convert", "command": "convert x", "files": ["sub/file"]
    }  # fmt: skip
    modes = {path.relative_to(output).as_posix(): path.stat().st_mode & 0o777 for path in output.rglob("*")}
    assert modes == {MARKER: 0o644, "sub": 0o755, "sub/file": 0o644} and output.stat().st_mode & 0o777 == 0o755


def test_force_replaces_only_a_folder_we_wrote_and_says_so(tmp_path):
    output, said = tmp_path / "out", []
    with StagingFolder(output, command="convert") as staging:
        write_model(staging.path)
        staging.publish()
    with StagingFolder(output, force=True, say=said.append, command="convert") as staging:
        write_model(staging.path)
        (staging.path / "run").write_text("second")
        staging.publish()
    assert (output / "run").read_text() == "second" and names(tmp_path) == ["out"]
    assert said == [f"replaced {output} (a folder written by transformers-xl convert)"]

    for not_ours in ("no marker", "no weights", "a file", "a link to ours"):
        theirs = tmp_path / not_ours
        if not_ours == "a file":
            theirs.write_text("data")
        elif not_ours == "a link to ours":
            theirs.symlink_to(output)
        else:
            theirs.mkdir()
            (theirs / ("config.json" if not_ours == "no weights" else "model.safetensors")).write_text("data")
            (theirs / (MARKER if not_ours == "no weights" else "config.json")).write_text("{}")
        before = theirs.read_text() if theirs.is_file() else names(theirs)
        with pytest.raises(OutputError, match="is not a folder written by transformers-xl"):
            StagingFolder(theirs, force=True, command="convert").__enter__()
        assert (theirs.read_text() if theirs.is_file() else names(theirs)) == before
    assert (tmp_path / "a link to ours").is_symlink()


def test_force_replaces_only_what_the_same_command_wrote(tmp_path):
    """Another command's folder (an `export` folder is not a converted model), or one the user added a file to, is
    refused with its reason, and kept as it is."""
    exported, converted = tmp_path / "onnx", tmp_path / "converted"
    for output, command in ((exported, "export"), (converted, "convert")):
        with StagingFolder(output, command=command) as staging:
            write_model(staging.path)
            staging.publish()
    (exported / "notes").mkdir()
    (exported / "notes" / "mine.txt").write_text("the user's")
    for output, command, reason in (
        (converted, "export", "transformers-xl convert wrote it"),
        (exported, "export", "it holds files export did not write: notes, notes/mine.txt"),
    ):
        before = sorted(path.relative_to(output) for path in output.rglob("*"))
        with pytest.raises(OutputError, match=f"is not a folder written by transformers-xl {command} \\({reason}\\)"):
            StagingFolder(output, force=True, command=command).__enter__()
        assert sorted(path.relative_to(output) for path in output.rglob("*")) == before


@pytest.mark.parametrize("where", ["the source", "holding the source", "inside the source"])
def test_an_output_that_is_holds_or_lies_inside_the_source_is_refused(tmp_path, where):
    source = tmp_path / "model"
    output = {"the source": source, "holding the source": tmp_path, "inside the source": source / "onnx"}[where]
    message = "lies inside SOURCE" if where == "inside the source" else "would replace SOURCE"
    with pytest.raises(OutputError, match=message):
        publish.check_apart(output, tmp_path / "link" / ".." / "model")


def test_output_that_changes_before_force_replaces_it_is_kept(tmp_path):
    output = tmp_path / "out"
    with StagingFolder(output, command="convert") as staging:
        write_model(staging.path)
        staging.publish()
    with pytest.raises(OutputError, match="no longer a folder written by transformers-xl"):
        with StagingFolder(output, force=True, command="convert") as staging:
            write_model(staging.path)
            (output / MARKER).unlink()  # (replaced by something else meanwhile)
            staging.publish()
    assert names(output) == ["config.json", "model.safetensors"] and names(tmp_path) == ["out"]


def test_an_unwritable_place_is_refused_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("data")
    with pytest.raises(OutputError, match=f"cannot write in {tmp_path / 'file'}: "):
        publish.check_output(tmp_path / "file" / "out", force=False, command="convert")

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(publish.tempfile, "mkdtemp", read_only)
    with pytest.raises(OutputError, match=f"cannot write in {tmp_path}: Read-only file system"):
        publish.check_output(tmp_path / "out", force=False, command="convert")


# --- staging folders of killed runs -----------------------------------------------------------------------------

STAGE_AND_WAIT = textwrap.dedent("""
    import importlib.util, sys, time
    spec = importlib.util.spec_from_file_location("publish", sys.argv[1])
    publish = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(publish)
    staging = publish.StagingFolder(sys.argv[2], command="convert").__enter__()
    (staging.path / "model.safetensors").write_bytes(bytes(1000))
    print(staging.path, flush=True)
    time.sleep(120)
""")


def test_the_staging_folder_of_a_killed_run_is_removed_by_the_next_run(tmp_path):
    output = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-c", STAGE_AND_WAIT, publish.__file__, str(output)],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        staging = run.stdout.readline().strip()
        assert staging.startswith(str(tmp_path / ".out.")) and staging.endswith(".partial")
        said = []
        publish.check_output(output, force=False, say=said.append, command="convert")
        assert said == [] and names(tmp_path) == [os.path.basename(staging)]  # (its process still runs)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    publish.check_output(output, force=False, say=said.append, command="convert")
    assert said == [f"removed {staging}, left by process {run.pid}, which no longer runs"]
    assert names(tmp_path) == []


@pytest.mark.skipif(publish._start_time(os.getpid()) == "0", reason="no /proc: a pid alone names a process")
def test_a_staging_folder_whose_pid_was_reused_is_stale(tmp_path):
    """The recorded pid is running (it is ours), but it started at another time: another process had that pid."""
    stale = tmp_path / f".out.{publish.host_name()}-{os.getpid()}-1.abc123.partial"
    stale.mkdir()
    mine = tmp_path / f".out.{publish.owner_name()}.def456.partial"
    mine.mkdir()
    other_output = tmp_path / f".out.v2.{publish.host_name()}-{os.getpid()}-1.abc123.partial"  # (OUTPUT out.v2's)
    other_output.mkdir()
    said = []
    publish.check_output(tmp_path / "out", force=False, say=said.append, command="convert")
    assert names(tmp_path) == sorted([mine.name, other_output.name])
    assert said == [f"removed {stale}, left by process {os.getpid()}, which no longer runs"]


def test_a_folder_moved_aside_by_a_killed_force_run_is_put_back(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # (its pid is free now)
    aside = tmp_path / f".out.{publish.host_name()}-{dead.pid}-1.abc123.replaced"
    aside.mkdir()
    write_model(aside)
    marker = {"written_by": "transformers-xl", "subcommand": "convert", "files": ["config.json", "model.safetensors"]}
    (aside / MARKER).write_text(json.dumps(marker))
    said = []
    publish.check_output(tmp_path / "out", force=True, say=said.append, command="convert")  # (the same command again)
    assert names(tmp_path) == ["out"] and names(tmp_path / "out") == [MARKER, "config.json", "model.safetensors"]
    assert said == [f"put back {tmp_path / 'out'}, which process {dead.pid} (no longer running) had moved aside to "
                    "replace it"]  # fmt: skip
