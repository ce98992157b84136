"""Damaged or unsafe source files are refused by name, whatever the reader: a torch zip whose data does not match its
CRC-32, a JSON file that does not parse. Exit status 1, one error line, nothing written. (Pickles that would run
code: test_convert_hf_legacy.py, test_convert_original_pytorch.py.)"""

import shutil
import struct
import zipfile
from pathlib import Path

import pytest

from transformers_xl.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def convert(*args) -> int:
    return main(["convert", *map(str, args)])


def flip_a_bit(path: Path) -> str:
    """Flip one bit in the middle of the largest entry's data (torch stores its entries uncompressed); its name."""
    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    name_length, extra_length = struct.unpack("<HH", data[entry.header_offset + 26 : entry.header_offset + 30])
    data[entry.header_offset + 30 + name_length + extra_length + entry.file_size // 2] ^= 0x10
    path.write_bytes(data)
    return entry.filename


def the_error(capsys) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert lines and lines[-1].startswith("transformers-xl convert: error: "), lines[-3:]
    return lines[-1]


@pytest.mark.parametrize("source_format, fixture, weights", [
    ("hf-legacy", "hf_legacy/transfo_xl_lm", "pytorch_model.bin"),
    ("original-pytorch", "original_pytorch/div2_tied", "model.pt"),
])  # fmt: skip
def test_a_bit_flip_in_a_torch_zip_is_refused_naming_the_entry(source_format, fixture, weights, tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(FIXTURES / fixture, source)
    entry = flip_a_bit(source / weights)
    with zipfile.ZipFile(source / weights) as archive:
        assert archive.testzip() == entry  # (torch.load does not check this: it would load a wrong weight)
    path = source if source_format == "hf-legacy" else source / weights
    assert convert(path, tmp_path / "out", "--from", source_format) == 1
    assert f"{source / weights}: the entry {entry} is damaged" in the_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]


def broken_json(path: Path):
    path.write_text(path.read_text() + "\n}")


@pytest.mark.parametrize("case", ["config.json", "tokenizer_config.json", "--config", "--vocab tokenizer.json",
                                  "tf --config"])  # fmt: skip
def test_invalid_json_is_named(case, tmp_path, capsys):
    source = tmp_path / "source"
    if case == "--config":
        shutil.copytree(FIXTURES / "original_pytorch" / "div2_tied_state_dict", source)
        broken = source / "config.json"
        arguments = [source / "model.pt", "--from", "original-pytorch", "--config", broken]
    elif case == "tf --config":
        shutil.copytree(FIXTURES / "tf" / "xlnet_lm", source)
        broken = source / "xlnet_config.json"
        arguments = [source, "--from", "tf", "--config", broken]
    elif case == "--vocab tokenizer.json":
        shutil.copytree(FIXTURES / "hf_legacy" / "transfo_xl_lm", source)
        broken = tmp_path / "tokenizer.json"
        broken.write_text('{"version": "1.0"}')
        arguments = [source, "--from", "hf-legacy", "--vocab", broken]
    else:
        shutil.copytree(FIXTURES / "hf_legacy" / "transfo_xl_lm", source)
        broken = source / case
        arguments = [source, "--from", "hf-legacy"]
    broken_json(broken)
    assert convert(arguments[0], tmp_path / "out", *arguments[1:]) == 1
    assert f"{broken} is not valid JSON: Extra data: line " in the_error(capsys)
    assert not (tmp_path / "out").exists()
