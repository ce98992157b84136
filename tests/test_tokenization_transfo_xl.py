"""TransfoXLTokenizer: legacy parity on the committed corpus, decoding, legacy vocab files, pickle safety, batches.

The expected outputs come from transformers 4.37.2 + sacremoses (tests/fixtures/tokenizer/make_tokenizer_fixtures.py).
"""

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from transformers_xl import TransfoXLTokenizer
from transformers_xl.tokenization.legacy_vocab import (
    UnsafePickleError,
    build_vocab,
    read_legacy_vocab,
    read_pickled_vocab,
)

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"
LINES = (FIXTURES / "corpus.txt").read_text(encoding="utf-8").split("\n")[:-1]
EXPECTED = json.loads((FIXTURES / "expected.json").read_text(encoding="utf-8"))
TINY = FIXTURES / "tiny"


def as_ids(text):
    return [int(i) for i in text.split()]


@pytest.fixture(scope="module")
def tokenizer():
    """The legacy Hub-style folder (config.json + vocab.pkl), through AutoTokenizer."""
    return AutoTokenizer.from_pretrained(FIXTURES / "legacy")


@pytest.fixture(scope="module")
def converted(tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("converted")
    tokenizer.save_pretrained(folder)
    return folder


def first_mismatches(got, expected, inputs=LINES, limit=5):
    return [(inputs[i], g, e) for i, (g, e) in enumerate(zip(got, expected)) if g != e][:limit]


# --------------------------------------------------------------------------------------------------------------
# Parity with the legacy tokenizer
# --------------------------------------------------------------------------------------------------------------


def test_corpus_is_large_and_varied():
    assert len(LINES) >= 1000
    assert "" in LINES and any(line.strip() == "" and line for line in LINES)
    for sample in ["https://", "@example.", "€", "—", "“", "'s", "(", "1,000", "<unk>", "東京", "\u00a0"]:
        assert any(sample in line for line in LINES), sample


def test_ids_match_legacy_on_every_corpus_line(tokenizer):
    assert type(tokenizer) is TransfoXLTokenizer
    ids = tokenizer(LINES)["input_ids"]
    expected = [as_ids(line_ids) for line_ids in EXPECTED["ids"]]
    assert first_mismatches(ids, expected) == []
    assert len(tokenizer) == EXPECTED["vocab_size"]
    assert tokenizer.convert_tokens_to_ids("<formula>") == EXPECTED["formula_id"]  # added after the vocabulary


def test_words_match_legacy_on_every_corpus_line():
    """With every legacy word in the vocabulary, no difference can hide behind `<unk>`."""
    vocab = {word for line in EXPECTED["tokens"] for word in line.split()}
    every_word = TransfoXLTokenizer(vocab=["<unk>", "<eos>", *sorted(vocab - {"<unk>", "<eos>"})])
    tokens = [" ".join(every_word.tokenize(line)) for line in LINES]
    assert first_mismatches(tokens, EXPECTED["tokens"]) == []


def test_stress_strings_match_legacy_words_and_decoding():
    """Random strings dense in rule-triggering characters reach the corners of the regex translation."""
    stress = EXPECTED["stress"]
    vocab = {word for line in stress["tokens"] for word in line.split()}
    every_word = TransfoXLTokenizer(vocab=["<unk>", "<eos>", *sorted(vocab - {"<unk>", "<eos>"})])
    ids = every_word(stress["lines"])["input_ids"]
    words = [" ".join(every_word.convert_ids_to_tokens(line_ids)) for line_ids in ids]
    assert first_mismatches(words, stress["tokens"], stress["lines"]) == []
    assert first_mismatches([every_word.decode(line_ids) for line_ids in ids], stress["decoded"], stress["lines"]) == []


def test_examples_from_the_issue():
    every = TransfoXLTokenizer(vocab=["<unk>"])
    assert every.tokenize("well-known") == ["<unk>"] * 3  # three words, none known
    words = TransfoXLTokenizer(vocab=["<unk>", "well", "@-@", "known", "5", "@,@", "000", "@.@", "50", "$", "!"])
    expected = ["well", "@-@", "known", "$", "5", "@,@", "000", "@.@", "50", "!"]
    assert words.tokenize("well-known $5,000.50!") == expected
    assert words.decode(words.encode("well-known $5,000.50!")) == "well-known $5,000.50!"


def test_decode_matches_legacy_decode_of_every_corpus_line(tokenizer):
    """The round trip decode(encode(x)) gives what the legacy tokenizer gave (Moses detokenisation, @-@ / @,@ /
    @.@ rejoined, transformers' clean-up), unknown words included."""
    decoded = [tokenizer.decode(ids) for ids in tokenizer(LINES)["input_ids"]]
    assert first_mismatches(decoded, EXPECTED["decoded"]) == []
    assert sum(text == line for text, line in zip(decoded, LINES)) > 300  # plain prose comes back unchanged


def test_lower_case_matches_legacy():
    lower = AutoTokenizer.from_pretrained(FIXTURES / "legacy", lower_case=True)
    lines = LINES[: len(EXPECTED["lower_case_ids"])]
    ids = lower(lines)["input_ids"]
    expected = [as_ids(line_ids) for line_ids in EXPECTED["lower_case_ids"]]
    # A known difference (docs/tokenizers.md): legacy lower-cased before finding special tokens, so split `x<UNK>y`.
    [glued] = [i for i, line in enumerate(lines) if "x<UNK>y" in line]
    assert first_mismatches(ids, expected) == [(LINES[glued], ids[glued], expected[glued])]


@pytest.mark.parametrize("flag", ["add_eos", "add_double_eos"])
def test_add_eos_and_add_double_eos_match_legacy(tokenizer, flag):
    marked = AutoTokenizer.from_pretrained(FIXTURES / "legacy", **{flag: True})
    lines = LINES[: len(EXPECTED[f"{flag}_tokens"])]
    if flag == "add_eos":  # <eos> is the line break: the lines as read from a file (legacy strips, then ends them)
        lines = [line + "\n" for line in lines]
    expected = [tokenizer.convert_tokens_to_ids(tokens.split()) for tokens in EXPECTED[f"{flag}_tokens"]]
    assert first_mismatches(marked(lines)["input_ids"], expected) == []
    assert tokenizer(lines[0])["input_ids"] == marked(lines[0], add_special_tokens=False)["input_ids"]


def test_add_eos_ends_lines_not_texts(tokenizer):
    """<eos> is the line break: a text of several lines encodes as its lines one after the other; a text without a
    final line break (a prompt) is not ended; offsets, which the line ends would shift, are refused for them."""
    marked = AutoTokenizer.from_pretrained(FIXTURES / "legacy", add_eos=True)
    ids = [marked(line + "\n")["input_ids"] for line in LINES[:3]]
    assert marked("\n".join(LINES[:3]) + "\n")["input_ids"] == ids[0] + ids[1] + ids[2]
    assert marked(LINES[0])["input_ids"] == tokenizer(LINES[0])["input_ids"] == ids[0][:-1]
    with pytest.raises(ValueError, match="no offsets for a text whose line breaks `add_eos` turns into <eos>"):
        marked("two\nlines", return_offsets_mapping=True)


def test_special_tokens_are_never_split(tokenizer):
    ids = tokenizer("a<eos>b <unk> <UNK>")["input_ids"]
    words = tokenizer.convert_ids_to_tokens(ids)
    assert words[1] == "<eos>" and ids[1] == tokenizer.eos_token_id == 0
    assert ids[3] == tokenizer.unk_token_id
    assert len(words) == 5  # <UNK> stays one (unknown) word


# --------------------------------------------------------------------------------------------------------------
# Folders: legacy vocab.pkl vs converted tokenizer.json
# --------------------------------------------------------------------------------------------------------------


def test_converted_folder_holds_json_only_and_gives_identical_ids(tokenizer, converted):
    assert sorted(os.listdir(converted)) == ["tokenizer.json", "tokenizer_config.json"]
    reloaded = AutoTokenizer.from_pretrained(converted)
    assert type(reloaded) is TransfoXLTokenizer
    assert reloaded(LINES)["input_ids"] == tokenizer(LINES)["input_ids"]
    assert json.loads((converted / "tokenizer_config.json").read_text())["tokenizer_class"] == "TransfoXLTokenizer"


def test_save_vocabulary_writes_an_original_vocab_txt(tokenizer, tmp_path):
    [path] = tokenizer.save_vocabulary(str(tmp_path))
    assert path.endswith("vocab.txt")
    assert read_legacy_vocab(path) == read_legacy_vocab(FIXTURES / "legacy" / "vocab.pkl")
    assert TransfoXLTokenizer(vocab_file=path)(LINES[:50])["input_ids"] == tokenizer(LINES[:50])["input_ids"]


def test_tokenizer_json_alone_reproduces_the_ids(tokenizer, converted):
    """The pipeline lives in tokenizer.json: the `tokenizers` library alone, without this package, gives the ids."""
    plain = Tokenizer.from_file(str(converted / "tokenizer.json"))
    assert [encoding.ids for encoding in plain.encode_batch(LINES)] == tokenizer(LINES)["input_ids"]


def test_save_pretrained_round_trips_the_settings(tmp_path):
    original = AutoTokenizer.from_pretrained(FIXTURES / "legacy", lower_case=True, add_eos=True)
    original.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert (reloaded.lower_case, reloaded.add_eos, reloaded.add_double_eos) == (True, True, False)
    assert reloaded(LINES[:50])["input_ids"] == original(LINES[:50])["input_ids"]
    assert not list(tmp_path.glob("*.pkl")) and not list(tmp_path.glob("*.bin"))


# --------------------------------------------------------------------------------------------------------------
# Legacy vocabulary formats
# --------------------------------------------------------------------------------------------------------------

TINY_SYMBOLS = ["<eos>", "the", ",", ".", "<unk>", "of", "and", "@-@", "@,@", "@.@", "1", "000", "'s", "<S>"]


@pytest.mark.parametrize(
    "path",
    ["hub/vocab.pkl", "vocab_zip.bin", "vocab_legacy_format.bin", "hf_saved/vocab.pkl", "vocab.txt"],
)
def test_every_legacy_vocab_format_reads_the_same_symbols(path):
    assert read_legacy_vocab(TINY / path) == TINY_SYMBOLS


def test_vocab_file_arguments_give_the_legacy_ids():
    tiny = EXPECTED["tiny"]
    for arguments in [
        {"pretrained_vocab_file": str(TINY / "hub" / "vocab.pkl")},
        {"pretrained_vocab_file_torch": str(TINY / "vocab_zip.bin")},
        {"pretrained_vocab_file": str(TINY / "vocab_legacy_format.bin")},  # legacy vocab.pkl could be torch-saved
    ]:
        assert [TransfoXLTokenizer(**arguments).encode(line) for line in tiny["lines"]] == tiny["pickle_ids"]
    from_text = TransfoXLTokenizer(vocab_file=str(TINY / "vocab.txt"))
    assert [from_text.encode(line) for line in tiny["lines"]] == tiny["vocab_txt_ids"]
    from_hf_save = AutoTokenizer.from_pretrained(TINY / "hf_saved")
    assert [from_hf_save.encode(line) for line in tiny["lines"]] == tiny["pickle_ids"]


def test_reading_a_transformers_saved_pickle_imports_none_of_the_classes_it_names(tmp_path):
    """transformers 4.x pickled sacremoses, tokenizers and transformers objects along: a poisoned sacremoses
    package first on the path proves none of them is imported."""
    poisoned = tmp_path / "sacremoses"
    poisoned.mkdir()
    marker = tmp_path / "imported"
    (poisoned / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (poisoned / "tokenize.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    module = Path(__file__).parents[1] / "tokenization" / "legacy_vocab.py"  # stdlib only: load it on its own
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('legacy_vocab', {str(module)!r})\n"
        "legacy_vocab = importlib.util.module_from_spec(spec); spec.loader.exec_module(legacy_vocab)\n"
        f"print(legacy_vocab.read_legacy_vocab({str(TINY / 'hf_saved' / 'vocab.pkl')!r}))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sacremoses', 'tokenizers', 'transformers')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    symbols, modules = result.stdout.splitlines()
    assert symbols == repr(TINY_SYMBOLS)
    assert modules == "[]"
    assert not marker.exists()


def test_unknown_word_needs_an_unk_symbol():
    with pytest.raises(ValueError, match="neither `<unk>` nor `<UNK>`"):
        TransfoXLTokenizer(vocab=["<eos>", "the"])
    assert TransfoXLTokenizer(vocab=["<UNK>", "the"]).encode("the cat") == [1, 0]


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({}, "needs a `vocab`"),
        ({"vocab": ["<unk>"], "delimiter": ""}, "character-level"),
        ({"vocab": ["<unk>"], "language": "fr"}, "only the English"),
    ],
)
def test_unsupported_arguments_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        TransfoXLTokenizer(**arguments)


def test_blank_line_in_vocab_txt_is_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("<unk>\n\nthe\n")
    with pytest.raises(ValueError, match="line 2: empty line"):
        read_legacy_vocab(tmp_path / "vocab.txt")


# --------------------------------------------------------------------------------------------------------------
# Malicious pickles
# --------------------------------------------------------------------------------------------------------------


class WritesAFile:
    """Unpickling this with `pickle.load` calls `exec`, which writes a file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return exec, (f"open({str(self.path)!r}, 'w').write('pwned')",)


def malicious_vocab(marker):
    return {"idx2sym": ["<unk>", "the"], "sym2idx": {"<unk>": 0, "the": 1}, "counter": WritesAFile(marker)}


def test_code_running_pickle_is_refused_and_the_code_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(malicious_vocab(marker)))
    with pytest.raises(UnsafePickleError, match=r"`builtins\.exec`"):
        read_pickled_vocab(tmp_path / "vocab.pkl")
    assert not marker.exists()
    pickle.loads((tmp_path / "vocab.pkl").read_bytes())  # the same file, unpickled the legacy way, does run code
    assert marker.read_text() == "pwned"


def test_malicious_legacy_folder_is_refused_through_auto_tokenizer(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "config.json").write_text('{"model_type": "transfo-xl"}')
    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(malicious_vocab(marker)))
    with pytest.raises(UnsafePickleError, match="builtins.exec"):
        AutoTokenizer.from_pretrained(tmp_path)
    assert not marker.exists()


def test_torch_saved_malicious_vocab_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save(malicious_vocab(marker), tmp_path / "vocab.bin")
    assert zipfile.is_zipfile(tmp_path / "vocab.bin")
    with pytest.raises(UnsafePickleError, match=r"`__builtin__\.exec`"):  # torch.save writes protocol 2 names
        read_legacy_vocab(tmp_path / "vocab.bin")
    assert not marker.exists()


def test_pickle_naming_an_unknown_module_is_refused_without_importing_it(tmp_path, monkeypatch):
    module = tmp_path / "vocab_helpers.py"
    marker = tmp_path / "imported"
    module.write_text(f"open({str(marker)!r}, 'w').close()\nclass Helper:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # protocol 2, GLOBAL opcode: `vocab_helpers.Helper`, called with no arguments
    payload = b"\x80\x02cvocab_helpers\nHelper\nq\x00)\x81q\x01."
    (tmp_path / "vocab.pkl").write_bytes(payload)
    with pytest.raises(UnsafePickleError, match=r"`vocab_helpers\.Helper`"):
        read_pickled_vocab(tmp_path / "vocab.pkl")
    assert not marker.exists() and "vocab_helpers" not in sys.modules


def test_files_that_are_no_vocabulary_are_refused(tmp_path):
    (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(["just", "a", "list"]))
    with pytest.raises(ValueError, match="not a Transformer-XL vocabulary"):
        read_pickled_vocab(tmp_path / "vocab.pkl")
    with zipfile.ZipFile(tmp_path / "vocab.bin", "w") as archive:
        archive.writestr("archive/readme.txt", "no pickle here")
    with pytest.raises(ValueError, match="no single data.pkl"):
        read_pickled_vocab(tmp_path / "vocab.bin")


# --------------------------------------------------------------------------------------------------------------
# Vocabulary from a corpus
# --------------------------------------------------------------------------------------------------------------


def test_build_vocab_reproduces_the_legacy_vocabulary():
    """The fixture vocabulary is legacy `build_vocab(special=["<eos>"], min_freq=2)` over the corpus words."""
    built = build_vocab((line.split() for line in EXPECTED["tokens"]), special=["<eos>"], min_freq=2)
    assert built == read_legacy_vocab(FIXTURES / "legacy" / "vocab.pkl")


def test_from_corpus_orders_special_then_frequency_with_min_freq_and_max_size(tmp_path):
    corpus = tmp_path / "train.txt"
    corpus.write_text(" b a c <unk> \n a b a d \n e c a \n")  # a:4, b:2, c:2, d:1, e:1, <unk>:1
    tokenizer = TransfoXLTokenizer.from_corpus(corpus, special=["<eos>", "<unk>"], min_freq=2)
    assert list(tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))) == ["<eos>", "<unk>", "a", "b", "c"]
    # two files, an <eos> counted per line: a 8, <eos> 6, b 4, ...; the top 2 after the special symbols
    capped = TransfoXLTokenizer.from_corpus([corpus, corpus], special=["<eos>", "<unk>"], max_size=2, add_eos=True)
    assert capped.convert_ids_to_tokens(range(capped.vocab_size)) == ["<eos>", "<unk>", "a"]
    assert capped("a b\n")["input_ids"] == [2, 1, 0] and capped("a b")["input_ids"] == [2, 1]


def test_a_corpus_that_is_not_utf8_is_refused_naming_the_file_and_the_byte(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("the first line\nthe café is open\n".encode("latin-1"))  # é is byte 0xe9, offset 22
    for read in (lambda: TransfoXLTokenizer.from_corpus(corpus), lambda: TransfoXLTokenizer(vocab_file=str(corpus))):
        with pytest.raises(ValueError, match=rf"{corpus} is not UTF-8 text: byte 0xe9 at byte offset 22 \(line 2\)"):
            read()


@pytest.mark.parametrize(
    "call, where",
    [
        (lambda t: t("caf\udce9 ok"), "text"),
        (lambda t: t(["fine", "caf\udce9 ok"]), r"text\[1\]"),
        (lambda t: t("fine", "caf\udce9 ok"), "text_pair"),
        (lambda t: t([["fine", "caf\udce9"]], is_split_into_words=True), r"text\[0\]\[1\]"),
        (lambda t: t.tokenize("caf\udce9 ok"), "text"),
        (lambda t: t.encode("caf\udce9 ok"), "text"),
    ],
)
def test_text_that_is_not_valid_unicode_is_a_value_error_saying_where(tokenizer, call, where):
    """A lone surrogate (what errors="surrogateescape" makes of the Latin-1 byte 0xe9) is named, with its index,
    rather than the `tokenizers` library's TypeError about input types."""
    with pytest.raises(ValueError, match=rf"{where} is not valid Unicode: .*U\+DCE9 \(the byte 0xe9 .*at index 3"):
        call(tokenizer)


# --------------------------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
def test_batch_encoding_pads_and_masks(side):
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "legacy", pad_token="<eos>", padding_side=side)
    lines = ["The city's population grew.", "", "He scored 3 goals... then another... and finally a fourth!"]
    batch = tokenizer(lines, padding=True, return_tensors="pt")
    assert set(batch) == {"input_ids", "attention_mask"}
    singles = [tokenizer(line)["input_ids"] for line in lines]
    width = max(map(len, singles))
    assert batch["input_ids"].shape == (3, width)
    for row, ids in enumerate(singles):
        mask = batch["attention_mask"][row]
        assert mask.sum() == len(ids)
        kept = batch["input_ids"][row][mask.bool()].tolist()
        assert kept == ids
        pad_positions = (mask == 0).nonzero().flatten().tolist()
        expected = list(range(len(ids), width)) if side == "right" else list(range(width - len(ids)))
        assert pad_positions == expected
        assert (batch["input_ids"][row][mask == 0] == tokenizer.pad_token_id).all()
