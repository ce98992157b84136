"""`transformers-xl push FOLDER REPO`: an already-converted folder goes to the Hub without converting it again
(offline: `--dry-run`, and a local endpoint that records the requests); only the model's own files, into a private
repo unless --public; folders that hold no model, and damaged weights, are refused."""

import json
import shutil

import pytest
from test_hub_export import LEGACY, hub  # noqa: F401  (the recording endpoint, a pytest fixture)

from transformers_xl.cli import main
from transformers_xl.conversion.publish import MARKER


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("converted") / "xlnet"
    assert main(["convert", str(LEGACY / "xlnet_lm"), str(folder), "--from", "hf-legacy"]) == 0
    return folder


def uploaded(folder):
    """Every file of the folder but the converter's own marker (which stays local)."""
    files = [path for path in folder.iterdir() if path.name != MARKER]
    assert {"model.safetensors", "config.json", "modeling_xlnet.py", "tokenizer.json"} <= {p.name for p in files}
    return files


def test_dry_run_lists_every_file_and_sends_nothing(converted, hub, capsys):  # noqa: F811
    assert main(["push", str(converted), "org/tiny", "--revision", "v1", "--dry-run"]) == 0
    assert hub == []
    listing = capsys.readouterr().out
    assert "commit to branch v1" in listing
    for path in uploaded(converted):
        assert f"org/tiny/blob/v1/{path.name} ({path.stat().st_size} bytes)" in listing


def test_push_uploads_the_converted_folder_in_one_commit(converted, hub, capsys):  # noqa: F811
    assert main(["push", str(converted), "org/tiny", "--private", "--revision", "v1"]) == 0
    assert "not uploaded" not in capsys.readouterr().err  # (our marker stays local without a word)
    assert hub[0][:2] == ("POST", "/api/repos/create") and json.loads(hub[0][2])["visibility"] == "private"
    assert ("POST", "/api/models/org/tiny/branch/v1") in [(method, path) for method, path, _ in hub]
    commits = [body for _, path, body in hub if "/commit/" in path]
    assert len(commits) == 1
    lines = [json.loads(line) for line in commits[0].decode().splitlines()]
    assert {line["value"]["path"] for line in lines if line["key"] == "file"} == {p.name for p in uploaded(converted)}


def broken(folder, tmp_path, damage):
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    damage(copy)
    return copy


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: (f / "config.json").unlink(), "no readable config.json"),
        (lambda f: (f / "config.json").write_text('{"model_type": "bert"}'), "model_type 'bert'; expected one of"),
        (lambda f: (f / "model.safetensors").unlink(), "no weights; expected model.safetensors"),
        (lambda f: ((f / "model.safetensors").rename(f / "model-00001-of-00002.safetensors"),
                    (f / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
                        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))),
         "shards that are missing: model-00002-of-00002.safetensors"),
    ],
    ids=["no config", "another model", "no weights", "missing shard"],
)  # fmt: skip
def test_a_folder_without_a_model_is_refused(converted, tmp_path, hub, capsys, damage, message):  # noqa: F811
    assert main(["push", str(broken(converted, tmp_path, damage)), "org/tiny"]) == 1
    assert message in capsys.readouterr().err
    assert hub == []


def test_a_missing_folder_and_a_bad_repo_id_are_refused(converted, tmp_path, capsys):
    assert main(["push", str(tmp_path / "nothing"), "org/tiny", "--dry-run"]) == 1
    assert "expected a folder written by `transformers-xl convert`" in capsys.readouterr().err
    assert main(["push", str(converted), "org/tiny/extra", "--dry-run"]) == 1
    assert "org/tiny/extra" in capsys.readouterr().err


def test_a_failed_push_says_so(converted, monkeypatch, capsys):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # (nothing listens there)
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    assert main(["push", str(converted), "org/tiny"]) == 1
    assert f"pushing {converted} to org/tiny failed" in capsys.readouterr().err


def test_convert_onto_an_existing_folder_with_push_to_points_at_push(converted, capsys):
    command = ["convert", str(LEGACY / "xlnet_lm"), str(converted), "--from", "hf-legacy", "--push-to", "org/tiny"]
    assert main(command) == 1
    assert f"without converting again: transformers-xl push {converted} org/tiny" in capsys.readouterr().err


def committed_files(hub) -> set[str]:
    commits = [body for _, path, body in hub if "/commit/" in path]
    assert len(commits) == 1
    lines = [json.loads(line) for line in commits[0].decode().splitlines()]
    return {line["value"]["path"] for line in lines if line["key"] == "file"}


def test_only_the_models_files_go_up_never_secrets_or_training_state(converted, tmp_path, hub, capsys):  # noqa: F811
    """A training run's folder with the user's secrets in it: only the model goes up; --include adds a file of the
    user's, and cannot add a key or training state."""
    folder = tmp_path / "run"
    shutil.copytree(converted, folder)
    model_files = {p.name for p in uploaded(folder)}
    extras = [".env", "id_rsa", "id_rsa.pub", "server.pem", ".git/config", "optimizer.pt", "rng_state_0.pth",
              "training_args.bin", "checkpoint-10/model.safetensors", "checkpoint-10/optimizer.pt", "corpus/train.ids",
              "notes/.env", "notes/id_ed25519", "notes.txt", "train_script.py"]  # fmt: skip
    for name in extras:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("secret")
    assert main(["push", str(folder), "org/tiny"]) == 0
    assert committed_files(hub) == model_files
    assert "not uploaded, 15 file(s) not part of the model" in capsys.readouterr().err
    hub.clear()
    include = ["notes.txt", ".env", "checkpoint-*", "id_rsa", "notes/*", "*optimizer.pt", "corpus/*"]
    assert main(["push", str(folder), "org/tiny", *[f"--include={pattern}" for pattern in include]]) == 0
    assert committed_files(hub) == model_files | {"notes.txt"}


@pytest.mark.parametrize("options, visibility", [([], "private"), (["--private"], "private"), (["--public"], "public")])
def test_a_new_repo_is_private_unless_public(converted, hub, capsys, options, visibility):  # noqa: F811
    assert main(["push", str(converted), "org/tiny", "--dry-run", *options]) == 0
    assert f"would create {visibility} model repo org/tiny" in capsys.readouterr().out
    assert main(["push", str(converted), "org/tiny", *options]) == 0
    assert hub[0][:2] == ("POST", "/api/repos/create") and json.loads(hub[0][2])["visibility"] == visibility


def test_truncated_weights_are_refused_in_one_line(converted, tmp_path, hub, capsys):  # noqa: F811
    folder = broken(converted, tmp_path, lambda f: (f / "model.safetensors").write_bytes(
        (f / "model.safetensors").read_bytes()[:1000]))  # fmt: skip
    assert main(["push", str(folder), "org/tiny"]) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert error[-1].startswith(f"transformers-xl push: error: {folder / 'model.safetensors'}: damaged weights (")
    assert error[-1].endswith("); not uploaded.")
    assert hub == []


def test_the_shards_an_index_names_go_up(converted, tmp_path, hub):  # noqa: F811
    def shard(folder):
        (folder / "model.safetensors").rename(folder / "weights-part-a.safetensors")
        index = {"metadata": {}, "weight_map": {"a": "weights-part-a.safetensors"}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))

    folder = broken(converted, tmp_path, shard)
    assert main(["push", str(folder), "org/tiny"]) == 0
    assert {"weights-part-a.safetensors", "model.safetensors.index.json"} <= committed_files(hub)
