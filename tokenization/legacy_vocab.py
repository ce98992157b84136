"""Transformer-XL vocabularies in their legacy formats, read without running a pickle, and built from a corpus.

transformers 4.x stored the vocabulary as a pickle (`vocab.pkl`, or `vocab.bin` written by `torch.save`);
`pickle.load` on such a file runs whatever the file asks for (CVE-2023-7018). We read it with an unpickler that
resolves only `collections.Counter` / `OrderedDict`, swaps the few classes that transformers' own `save_pretrained`
pickled along (sacremoses, transformers, tokenizers objects) for inert placeholders without importing them, and
refuses every other global, so no code of the file's choosing is imported or called. Only the symbol list is used:
the legacy tokenizer too ignored the pickled settings in favour of its constructor arguments.

The original Transformer-XL code instead kept one symbol per line (`vocab.txt`, first column), and built
vocabularies from a corpus: special symbols first, then the most common symbols, cut by `min_freq` / `max_size`.
"""

import io
import pickle
import zipfile
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path


class UnsafePickleError(pickle.UnpicklingError):
    """The file references a global that is neither plain data nor a known inert legacy class."""


_DATA_CLASSES = {("collections", "Counter"): Counter, ("collections", "OrderedDict"): OrderedDict}

# What transformers 4.x `save_pretrained` pickled besides data: the tokenizer's whole `__dict__`.
_INERT_LEGACY_GLOBALS = {
    ("re", "_compile"),
    ("sacremoses.normalize", "MosesPunctNormalizer"),
    ("sacremoses.tokenize", "MosesTokenizer"),
    ("sacremoses.tokenize", "MosesDetokenizer"),
    ("tokenizers", "AddedToken"),
    ("transformers.tokenization_utils", "Trie"),
    ("transformers.tokenization_utils_base", "AddedToken"),
}

# `torch.save`'s legacy (non-zip) format starts with this pickled magic number, a protocol number and a dict.
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class _Placeholder:
    """Stands in for an object of an inert legacy class: accepts any construction, keeps nothing, runs nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _DATA_CLASSES:
            return _DATA_CLASSES[module, name]
        if (module, name) in _INERT_LEGACY_GLOBALS:
            return _Placeholder
        raise UnsafePickleError(
            f"refusing to load the vocabulary: the pickle references `{module}.{name}`, which could run code. "
            "A Transformer-XL vocabulary only needs `collections.Counter` / `collections.OrderedDict`."
        )

    def persistent_load(self, pid):
        raise UnsafePickleError("refusing to load the vocabulary: it references tensor storage, not just symbols.")


def _load(stream):
    return _SafeUnpickler(stream).load()


def read_pickled_vocab(path) -> dict:
    """The dict stored in a legacy `vocab.pkl` / `vocab.bin`: a plain pickle, or either `torch.save` format."""
    path = Path(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            data = [name for name in archive.namelist() if name.endswith("/data.pkl") or name == "data.pkl"]
            if len(data) != 1:
                raise ValueError(f"{path} is a zip archive but not a `torch.save` file: no single data.pkl in it.")
            content = _load(io.BytesIO(archive.read(data[0])))
    else:
        with open(path, "rb") as stream:
            content = _load(stream)
            if content == _TORCH_LEGACY_MAGIC:
                _load(stream)  # protocol version
                _load(stream)  # system info
                content = _load(stream)
    if not isinstance(content, dict) or "idx2sym" not in content:
        raise ValueError(f"{path} is not a Transformer-XL vocabulary: expected a dict with an `idx2sym` list.")
    return content


def text_lines(path) -> Iterable[str]:
    """The lines of a UTF-8 text file. One that is not UTF-8 raises a ValueError naming the file and where its first
    undecodable byte lies (Python's own UnicodeDecodeError names neither the file nor a position in it)."""
    try:
        with open(path, encoding="utf-8") as lines:
            yield from lines
    except UnicodeDecodeError as error:
        raise ValueError(_not_utf8(path, error)) from None


def _not_utf8(path, error: UnicodeDecodeError) -> str:
    """Where `path` stops being UTF-8: read again as bytes, line by line (no UTF-8 sequence holds a newline byte)."""
    offset = 0
    with open(path, "rb") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as line_error:
                return (
                    f"{path} is not UTF-8 text: byte 0x{line[line_error.start]:02x} at byte offset "
                    f"{offset + line_error.start} (line {number}): {line_error.reason}. Convert the file to UTF-8 "
                    "first (for example with iconv)."
                )
            offset += len(line)
    return f"{path} is not UTF-8 text: {error}."


def read_symbol_file(path) -> list[str]:
    """An original-code `vocab.txt`: the first whitespace-separated column of every line, duplicates dropped."""
    symbols = {}
    for number, line in enumerate(text_lines(path), start=1):
        columns = line.split()
        if not columns:
            raise ValueError(f"{path}, line {number}: empty line in a vocabulary file.")
        symbols.setdefault(columns[0], None)
    return list(symbols)


def read_legacy_vocab(path) -> list[str]:
    """The symbols, in id order, of a legacy vocabulary file (`vocab.pkl`, `vocab.bin` or `vocab.txt`)."""
    if Path(path).suffix == ".txt":
        return read_symbol_file(path)
    return list(read_pickled_vocab(path)["idx2sym"])


def unknown_symbol(symbols) -> str:
    """The symbol unknown words map to, as the legacy tokenizer chose it: `<unk>`, else `<UNK>`."""
    for candidate in ("<unk>", "<UNK>"):
        if candidate in symbols:
            return candidate
    raise ValueError("The vocabulary has neither `<unk>` nor `<UNK>`, so unknown words could not be encoded.")


def split_symbols(line: str, lower_case: bool = False, add_eos: bool = False, add_double_eos: bool = False):
    """The original `Vocab.tokenize` for already tokenised text (WikiText): strip, maybe lower, split on spaces."""
    line = line.strip()
    symbols = (line.lower() if lower_case else line).split()
    if add_double_eos:
        return ["<S>", *symbols, "<S>"]
    return [*symbols, "<eos>"] if add_eos else symbols


def build_vocab(
    symbol_lines: Iterable[list[str]], special=(), min_freq: int = 0, max_size: int | None = None
) -> list[str]:
    """The original `Vocab.build_vocab`: the special symbols, then the symbols by decreasing count (ties in order of
    first appearance) while their count reaches `min_freq`, at most `max_size` of those."""
    counter = Counter()
    for symbols in symbol_lines:
        counter.update(symbols)
    vocab = dict.fromkeys(special)
    for symbol, count in counter.most_common(max_size):
        if count < min_freq:
            break
        vocab.setdefault(symbol, None)
    return list(vocab)
