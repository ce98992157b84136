"""The Hub folders: remote code from any save, loading where transformers_xl is not installed, atomic writes, the
model card, and pushing (against a local endpoint that records the requests)."""

import base64
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import huggingface_hub
import pytest
import safetensors
import torch
import transformers
from safetensors.torch import save_file

import transformers_xl
from transformers_xl import TransfoXLConfig, XLNetConfig
from transformers_xl.cli import main
from transformers_xl.conversion import cli as convert_command
from transformers_xl.conversion import hub_export
from transformers_xl.conversion.publish import MARKER
from transformers_xl.conversion.remote_code import OWN_AUTO_CLASS

LEGACY = Path(__file__).parent / "fixtures" / "hf_legacy"
TINY_TXL = dict(vocab_size=30, cutoffs=[10, 20], d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32, n_layer=2,
                div_val=2, mem_len=4)  # fmt: skip
TINY_XLNET = dict(vocab_size=30, d_model=16, n_head=2, d_head=8, d_inner=32, n_layer=2, mem_len=4)


def tiny(class_name):
    config = TransfoXLConfig(**TINY_TXL, pad_token_id=0) if class_name.startswith("TransfoXL") else XLNetConfig(**TINY_XLNET)
    torch.manual_seed(0)
    return getattr(transformers_xl, class_name)(config).eval()


@pytest.mark.parametrize("class_name", OWN_AUTO_CLASS)
def test_save_pretrained_writes_remote_code_for_every_head(class_name, tmp_path):
    tiny(class_name).save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    modeling = "modeling_transfo_xl" if class_name.startswith("TransfoXL") else "modeling_xlnet"
    assert auto_map[OWN_AUTO_CLASS[class_name]] == f"{modeling}.{class_name}"
    assert auto_map["AutoConfig"].startswith("configuration_")
    shipped = {path.name for path in tmp_path.glob("*.py")}
    assert shipped == {f"{modeling}.py", configuration_file(modeling), "relative_attention.py", "memory_cache.py",
                       "input_checks.py"}  # fmt: skip
    assert sum((tmp_path / name).stat().st_size for name in shipped) <= 120_000


def configuration_file(modeling: str) -> str:
    return modeling.replace("modeling_", "configuration_") + ".py"


def test_a_subclass_does_not_ship_its_own_file(tmp_path):
    class MyHead(transformers_xl.TransfoXLLMHeadModel):  # e.g. defined in a training script
        pass

    MyHead(TransfoXLConfig(**TINY_TXL)).save_pretrained(tmp_path)
    assert not (tmp_path / "modeling_transfo_xl.py").exists() and not (tmp_path / Path(__file__).name).exists()
    assert "TransfoXLLMHeadModel" not in json.dumps(json.loads((tmp_path / "config.json").read_text()).get("auto_map"))


# --- loading where transformers_xl is not installed -------------------------------------------------------------

NO_PLUGIN = r"""
import importlib.abc, importlib.util, json, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers_xl":
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Blocker())
import torch, transformers
from safetensors.torch import load_file
for folder, auto_class, head, expected_file in json.loads(sys.argv[1]):
    model = getattr(transformers, auto_class).from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model)
    assert type(model).__name__ == head, (auto_class, type(model))  # the head the folder holds, no other
    expected, mems = load_file(expected_file), None
    with torch.no_grad():
        for k in range(2):
            out = model(expected[f"ids{k}"], mems=mems)
            torch.testing.assert_close(out[0], expected[f"out{k}"], atol=1e-5, rtol=0)
            mems = out.mems
    if auto_class == "AutoModelForCausalLM" and "transfo" in model.config.model_type:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        assert tokenizer("the a of")["input_ids"] == expected["tokens"].tolist(), tokenizer("the a of")
assert "transformers_xl" not in sys.modules
print("loaded", len(json.loads(sys.argv[1])), "folders without transformers_xl")
"""


def test_folders_load_with_trust_remote_code_where_the_plugin_is_absent(tmp_path):
    """Converted folders (Transformer-XL with its tokenizer, the XLNet SQuAD head, a RACE head from TF) and folders
    saved from user code load through the code copied into them, each as its own head class through the Auto class
    of that head, in a python that cannot import transformers_xl."""
    assert main(["convert", str(LEGACY / "transfo_xl_lm"), str(tmp_path / "txl"), "--from", "hf-legacy"]) == 0
    assert main(["convert", str(LEGACY / "xlnet_squad"), str(tmp_path / "squad"), "--from", "hf-legacy"]) == 0
    race = LEGACY.parent / "tf" / "xlnet_race"
    race_config = str(race / "xlnet_config.json")
    assert main(["convert", str(race), str(tmp_path / "race"), "--from", "tf", "--config", race_config]) == 0
    tiny("TransfoXLForSequenceClassification").save_pretrained(tmp_path / "classifier")
    tiny("XLNetForTokenClassification").save_pretrained(tmp_path / "tagger")
    jobs = []
    for name, auto_class in [("txl", "AutoModelForCausalLM"), ("squad", "AutoModelForQuestionAnswering"),
                             ("race", "AutoModelForMultipleChoice"),
                             ("classifier", "AutoModelForSequenceClassification"),
                             ("tagger", "AutoModelForTokenClassification")]:  # fmt: skip
        head = json.loads((tmp_path / name / "config.json").read_text())["architectures"][0]
        model = getattr(transformers_xl, head).from_pretrained(tmp_path / name).eval()
        shape = (2, 2, 5) if name == "race" else (2, 5)
        expected, mems = {}, None
        with torch.no_grad():
            for k in range(2):
                expected[f"ids{k}"] = torch.randint(0, 28, shape, generator=torch.Generator().manual_seed(k))
                out = model(expected[f"ids{k}"], mems=mems)
                expected[f"out{k}"], mems = out[0].contiguous(), out.mems
        if name == "txl":
            tokenizer = transformers_xl.TransfoXLTokenizer.from_pretrained(tmp_path / name)
            expected["tokens"] = torch.tensor(tokenizer("the a of")["input_ids"])
        save_file(expected, tmp_path / f"{name}.safetensors")
        jobs.append((str(tmp_path / name), auto_class, head, str(tmp_path / f"{name}.safetensors")))
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-I", "-c", NO_PLUGIN, json.dumps(jobs)], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loaded 5 folders" in result.stdout


# --- atomic writes ----------------------------------------------------------------------------------------------


def convert(source, output, *extra):
    return main(["convert", str(source), str(output), "--from", "hf-legacy", *map(str, extra)])


def test_existing_output_needs_force_which_replaces_only_a_converted_folder(tmp_path, capsys):
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("data")
    assert convert(LEGACY / "xlnet_lm", output) == 1
    assert "exists; pass --force" in capsys.readouterr().err
    assert convert(LEGACY / "xlnet_lm", output, "--force") == 1
    assert "is not a folder written by transformers-xl" in capsys.readouterr().err
    assert {p.name for p in output.iterdir()} == {"notes.txt"}
    output = tmp_path / "converted"
    assert convert(LEGACY / "xlnet_lm", output) == 0
    (output / "notes.txt").write_text("the user's")  # (a file convert did not write: --force keeps it)
    assert convert(LEGACY / "xlnet_lm", output, "--force") == 1
    assert "(it holds files convert did not write: notes.txt)" in capsys.readouterr().err
    assert (output / "notes.txt").read_text() == "the user's"
    (output / "notes.txt").unlink()
    assert convert(LEGACY / "xlnet_lm", output, "--force") == 0
    assert f"replaced {output} (a folder written by transformers-xl convert)" in capsys.readouterr().err
    assert (output / "model.safetensors").is_file()
    assert {p.name for p in tmp_path.iterdir()} == {"out", "converted"}  # nothing left beside them


def test_output_that_appears_during_the_conversion_is_kept(tmp_path, monkeypatch, capsys):
    """Another command (here a whole conversion to the same OUTPUT) creates OUTPUT while this one writes: this one
    fails and keeps it; the first to finish wins."""
    output, save_tokenizer = tmp_path / "out", hub_export.save_tokenizer

    def meanwhile(tokenizer, model_type, folder):
        monkeypatch.setattr(hub_export, "save_tokenizer", save_tokenizer)
        assert convert(LEGACY / "xlnet_lm", output) == 0
        (output / "notes.txt").write_text("data")
        save_tokenizer(tokenizer, model_type, folder)

    monkeypatch.setattr(hub_export, "save_tokenizer", meanwhile)
    assert convert(LEGACY / "xlnet_lm", output) == 1
    assert f"error: {output} appeared while this run was writing; it is left as it is" in capsys.readouterr().err
    assert (output / "notes.txt").read_text() == "data" and (output / "model.safetensors").is_file()
    assert {p.name for p in tmp_path.iterdir()} == {"out"}


def test_options_that_do_not_go_together_exit_with_status_2(tmp_path, capsys):
    assert convert(LEGACY / "xlnet_lm", tmp_path / "out", "--dry-run") == 2
    assert "--dry-run need --push-to" in capsys.readouterr().err
    source = tmp_path / "legacy" / "xlnet_lm"
    shutil.copytree(LEGACY / "xlnet_lm", source)
    for output in (source, source.parent):  # OUTPUT would replace SOURCE (with --force)
        assert convert(source, output, "--force") == 2
        assert "would replace SOURCE" in capsys.readouterr().err
    assert sorted(p.name for p in source.iterdir()) == sorted(p.name for p in (LEGACY / "xlnet_lm").iterdir())
    assert not (tmp_path / "out").exists()


def test_an_existing_output_is_refused_before_the_source_is_read(tmp_path, monkeypatch, capsys):
    (tmp_path / "out").mkdir()
    monkeypatch.setattr(convert_command, "read_source", lambda args: pytest.fail("the source was read"))
    assert convert(LEGACY / "xlnet_lm", tmp_path / "out") == 1
    assert "exists; pass --force" in capsys.readouterr().err


def test_an_unwritable_output_place_is_refused_before_the_source_is_read(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("data")
    monkeypatch.setattr(convert_command, "read_source", lambda args: pytest.fail("the source was read"))
    assert convert(LEGACY / "xlnet_lm", tmp_path / "file" / "out") == 1
    error = capsys.readouterr().err
    assert error.startswith(f"transformers-xl convert: error: cannot write in {tmp_path / 'file'}: ") and (
        error.count("\n") == 1
    ), error


def full_disk_for_the_tokenizer(monkeypatch):
    """tokenizers writes tokenizer.json into /dev/full: a real "No space left on device" from its Rust writer."""
    save_tokenizer = hub_export.save_tokenizer

    def save(tokenizer, model_type, folder):
        (folder / "tokenizer.json").symlink_to("/dev/full")
        save_tokenizer(tokenizer, model_type, folder)

    monkeypatch.setattr(hub_export, "save_tokenizer", save)


def read_only_disk_for_the_weights(monkeypatch):
    def save_file(tensors, filename, metadata=None):
        raise safetensors.SafetensorError(
            f"Error while serializing: I/O error: Read-only file system (os error 30) at path {filename}"
        )

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save_file)


def full_disk_for_the_model_card(monkeypatch):
    def save(card, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(huggingface_hub.ModelCard, "save", save)


@pytest.mark.parametrize("failure, cause", [
    (full_disk_for_the_tokenizer, "No space left on device"),
    (read_only_disk_for_the_weights, "Read-only file system"),
    (full_disk_for_the_model_card, "No space left on device"),
])  # fmt: skip
def test_a_full_or_read_only_disk_gives_one_line_and_leaves_nothing(failure, cause, tmp_path, monkeypatch, capsys):
    failure(monkeypatch)
    assert convert(LEGACY / "transfo_xl_lm", tmp_path / "out") == 1
    last = capsys.readouterr().err.splitlines()[-1]
    written = rf"{tmp_path}/\.out\.\S+\.partial\S*"
    expected = rf"transformers-xl convert: error: cannot write {tmp_path}/out: {cause} \(writing {written}\)"
    assert re.fullmatch(expected, last), last
    assert list(tmp_path.iterdir()) == []


def test_the_partial_folder_of_a_killed_conversion_is_removed_by_the_next_one(tmp_path, capsys):
    """kill -9 while the folder is written: the next conversion to the same OUTPUT removes what it left, says so."""
    output = tmp_path / "out"
    command = [sys.executable, "-m", "transformers_xl", "convert", str(LEGACY / "xlnet_lm"), str(output)]
    run = subprocess.Popen([*command, "--from", "hf-legacy"], stderr=subprocess.PIPE, text=True)
    try:
        for line in run.stderr:
            if "convert: writing " in line:
                break
    finally:
        run.kill()
        run.wait()
    left = [path.name for path in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".out.") and left[0].endswith(".partial"), left
    assert convert(LEGACY / "xlnet_lm", output) == 0
    assert f"removed {tmp_path / left[0]}, left by process {run.pid}, which no longer runs" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["out"]


def test_the_folder_gets_the_permissions_the_umask_gives(tmp_path):
    """Not those of the private temporary folder (nor safetensors' private weights file)."""
    umask = os.umask(0o022)
    try:
        assert convert(LEGACY / "xlnet_lm", tmp_path / "out") == 0
    finally:
        os.umask(umask)
    output = tmp_path / "out"
    assert output.stat().st_mode & 0o777 == 0o755
    assert {path.name: path.stat().st_mode & 0o777 for path in output.iterdir()} == {
        path.name: 0o644 for path in output.iterdir()
    }


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_conversion_leaves_nothing(failure, tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise failure("stopped while writing the tokenizer")

    monkeypatch.setattr(hub_export, "save_tokenizer", interrupted)
    with pytest.raises(failure):
        convert(LEGACY / "xlnet_lm", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_terminated_conversion_leaves_nothing(tmp_path, monkeypatch):
    """SIGTERM (kill, a scheduler's time limit) arriving while the folder is written."""

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # (the handler runs before this ends)
        pytest.fail("SIGTERM did not stop the conversion")

    monkeypatch.setattr(hub_export, "save_tokenizer", terminated)
    with pytest.raises(SystemExit) as stopped:
        convert(LEGACY / "xlnet_lm", tmp_path / "out")
    assert stopped.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # (the handler lasts as long as the command)


def test_failed_verification_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(hub_export, "max_difference", lambda source, converted: 0.5)
    from transformers_xl.conversion import hf_legacy

    monkeypatch.setattr(hf_legacy, "max_difference", lambda source, converted: 0.5)
    assert convert(LEGACY / "xlnet_lm", tmp_path / "out") == 1
    assert "Verification failed" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_command_runs_as_a_module_and_as_a_script():
    for command in ([sys.executable, "-m", "transformers_xl"], [str(Path(sys.executable).parent / "transformers-xl")]):
        result = subprocess.run([*command, "convert", "--help"], capture_output=True, text=True)
        assert result.returncode == 0 and "--from {tf,original-pytorch,hf-legacy}" in result.stdout, result.stderr


def test_model_card_records_source_command_and_verification(tmp_path, capsys):
    """The card names files, never local folders; its license is unknown where the source states none."""
    source = tmp_path / "sources" / "transfo_xl_lm"
    shutil.copytree(LEGACY / "transfo_xl_lm", source)
    assert convert(source, tmp_path / "out", "--vocab", source / "vocab.pkl") == 0
    err = capsys.readouterr().err
    assert re.search(r"verification \(.*\): max abs difference [0-9.e+-]+ \(tolerance 0.0001\)", err)
    assert "license: unknown (the source states none; --license ID sets the model card's)" in err
    card = huggingface_hub.ModelCard.load(tmp_path / "out" / "README.md")
    assert card.data.library_name == "transformers" and "transformers-xl" in card.data.tags
    assert "transfo_xl_lm" in card.data.converted_from
    command = "transformers-xl convert transfo_xl_lm out --from hf-legacy --vocab vocab.pkl"
    assert card.data.conversion_command == command  # (--vocab: a path option, by its file name too)
    assert str(tmp_path) not in card.content and card.data.license == "unknown"
    assert card.data.pipeline_tag == "text-generation"
    assert card.data.verification["passed"] and card.data.verification["max_abs_diff"] <= 1e-4


def test_model_card_license_from_the_source_card_or_the_option(tmp_path):
    source = tmp_path / "xlnet_classifier"
    shutil.copytree(LEGACY / "xlnet_classifier", source)
    (source / "README.md").write_text("---\nlicense: mit\nlanguage: en\n---\n\n# A classifier\n")
    assert convert(source, tmp_path / "out") == 0
    card = huggingface_hub.ModelCard.load(tmp_path / "out" / "README.md")
    assert (card.data.license, card.data.pipeline_tag) == ("mit", "text-classification")
    assert convert(source, tmp_path / "out", "--force", "--license", "apache-2.0") == 0
    card = huggingface_hub.ModelCard.load(tmp_path / "out" / "README.md")
    assert card.data.license == "apache-2.0" and card.data.conversion_command.endswith("--license apache-2.0")


@pytest.mark.parametrize("class_name", OWN_AUTO_CLASS)
def test_every_head_has_a_pipeline_tag(class_name):
    """A task transformers knows: a pipeline's (feature-extraction, ...) or a model card's (multiple-choice)."""
    tag = hub_export.pipeline_tag(class_name)
    assert tag in transformers.pipelines.SUPPORTED_TASKS or tag in transformers.modelcard.TASK_TAG_TO_NAME_MAPPING


# --- pushing ----------------------------------------------------------------------------------------------------


class RecordingHub(BaseHTTPRequestHandler):
    """Answers the Hub API calls of a one-commit upload (huggingface_hub 2.x) and records them."""

    requests: list = []

    def log_message(self, *args):
        pass

    def _answer(self, status, body=None, headers=()):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_HEAD(self):
        self.requests.append(("HEAD", self.path, b""))
        self._answer(404, headers=[("X-Error-Code", "EntryNotFound")])

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.requests.append(("POST", self.path, body))
        endpoint = f"http://127.0.0.1:{self.server.server_port}"
        if self.path == "/api/repos/create":
            request = json.loads(body)
            repo_id = f"{request['organization']}/{request['name']}"
            self._answer(200, {"url": f"{endpoint}/{repo_id}", "name": repo_id})
        elif "/preupload/" in self.path:
            files = json.loads(body)["files"]
            self._answer(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                         for f in files]})  # fmt: skip
        elif "/commit/" in self.path:
            self._answer(200, {"commitUrl": f"{endpoint}/org/tiny/commit/abc123", "commitOid": "abc123"})
        elif "/branch/" in self.path or self.path == "/api/validate-yaml":
            self._answer(200, {})
        else:
            self._answer(404, {"error": "unexpected"})


@pytest.fixture
def hub(monkeypatch):
    RecordingHub.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), RecordingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    resolve = endpoint + "/{repo_id}/resolve/{revision}/{filename}"  # (ModelCard.load reads files through it)
    monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", resolve)
    monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)  # (transformers keeps the HfApi of its first push)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    yield RecordingHub.requests
    server.shutdown()


def test_push_uploads_the_folder_in_one_commit(tmp_path, hub):
    assert convert(LEGACY / "xlnet_lm", tmp_path / "out", "--push-to", "org/tiny", "--private", "--revision", "v1") == 0
    posts = [(method, path) for method, path, _ in hub]
    assert posts[0] == ("POST", "/api/repos/create") and json.loads(hub[0][2])["visibility"] == "private"
    assert ("POST", "/api/models/org/tiny/branch/v1") in posts
    commits = [body for method, path, body in hub if "/commit/" in path]
    assert len(commits) == 1 and "/commit/v1" in [p for _, p, b in hub if b is commits[0]][0]
    lines = [json.loads(line) for line in commits[0].decode().splitlines()]
    pushed = {line["value"]["path"] for line in lines if line["key"] == "file"}
    assert pushed == {p.name for p in (tmp_path / "out").iterdir()} - {MARKER}  # (a local mark of our folders)
    assert {"model.safetensors", "config.json", "modeling_xlnet.py", "README.md", "tokenizer.json"} <= pushed


def test_a_failed_push_says_so_and_keeps_the_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # (nothing listens there)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    assert convert(LEGACY / "xlnet_lm", tmp_path / "out", "--push-to", "org/tiny") == 1
    assert "is written, but pushing it to org/tiny failed" in capsys.readouterr().err
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_dry_run_sends_nothing(tmp_path, hub, capsys):
    assert convert(LEGACY / "xlnet_lm", tmp_path / "out", "--push-to", "org/tiny", "--dry-run") == 0
    assert hub == []
    listing = capsys.readouterr().out
    assert "org/tiny/blob/main/model.safetensors" in listing and "modeling_xlnet.py" in listing


@pytest.mark.parametrize("class_name", OWN_AUTO_CLASS)
def test_push_to_hub_from_user_code_sends_the_model_code(class_name, hub):
    """A model pushed from a training script (transformers' own push_to_hub) carries its code and auto_map."""
    tiny(class_name).push_to_hub("org/tiny")
    commits = [body for method, path, body in hub if method == "POST" and "/commit/" in path]
    assert len(commits) == 1
    files = {}
    for line in map(json.loads, commits[0].decode().splitlines()):
        if line["key"] == "file":
            files[line["value"]["path"]] = line["value"]["content"]
    modeling = "modeling_transfo_xl" if class_name.startswith("TransfoXL") else "modeling_xlnet"
    assert {f"{modeling}.py", "relative_attention.py", "model.safetensors"} <= files.keys()
    config = json.loads(base64.b64decode(files["config.json"]))
    assert config["auto_map"][OWN_AUTO_CLASS[class_name]] == f"{modeling}.{class_name}"
