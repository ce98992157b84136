"""Text files read as the original corpus readers read them (`pytorch/utils/vocabulary.py`, `data_utils.Corpus`).

Each line is stripped and split on whitespace (the files are already tokenised: WikiText's words, enwik8's bytes
and text8's characters written as space-separated symbols), lower-cased if the vocabulary is, and ended the
original way (`LINE_ENDS`); all lines make one id stream. The vocabulary is built as `Vocab.build_vocab` builds it
(see `tokenization.legacy_vocab.build_vocab`).

Encoding runs through `tokenizers` (a WordLevel model behind a whitespace split) in batches of lines, so a
WikiText-103-size file (540 MB, 103 M words) encodes at millions of words per second in bounded memory, with a
progress bar. Symbols the vocabulary lacks become its `<unk>` and are counted apart from the text's own `<unk>`s.
"""

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from tqdm.auto import tqdm

from ..tokenization.legacy_vocab import build_vocab

# How a line ends in the id stream: wt103 / PTB / WikiText append <eos>; lm1b wraps it in <S> ... <S>; enwik8 and
# text8 add nothing (their lines are pieces of one character stream).
LINE_ENDS = {"eos": ("", "<eos>"), "double-eos": ("<S>", "<S>"), "none": ("", "")}
BATCH_CHARACTERS = 1 << 22  # lines are read and encoded in batches of about this many characters (bounded memory)
_NOT_IN_VOCABULARY = "\x00not in the vocabulary\x00"  # the word every unknown symbol maps to while encoding
UNKNOWN_RATE_LIMIT = 0.5  # above it, a loss or perplexity measures mostly how well the model predicts <unk>


class CorpusError(ValueError):
    """A text file that cannot be used: unreadable, empty, with symbols the vocabulary cannot encode, or a text and
    vocabulary that would give a meaningless loss (no symbols, only special symbols, mostly unknown symbols)."""


@dataclass
class EncodedFile:
    ids: np.ndarray  # int32, one id per symbol (line ends included)
    unknown: int  # symbols the vocabulary lacks, encoded as its unknown symbol
    words: int  # symbols read from the text (line ends not counted)


def check_readable(path) -> Path:
    """The file as a Path; a clear error when it is missing, a folder, unreadable or empty."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file" + (" (it is a folder)" if path.is_dir() else "") + ".")
    if not os.access(path, os.R_OK):
        raise CorpusError(f"{path}: not readable (check its permissions).")
    if path.stat().st_size == 0:
        raise CorpusError(f"{path}: the file is empty; expected text, one or more lines.")
    return path


def _line_batches(path: Path, description: str) -> Iterator[list[str]]:
    """The file's lines, split as Python's text files (and so the original reader) split them, in batches of about
    BATCH_CHARACTERS, with a progress bar; a clear error when it is not UTF-8 text."""
    with open(path, encoding="utf-8") as stream, tqdm(
        total=path.stat().st_size, desc=description, unit="B", unit_scale=True, dynamic_ncols=True
    ) as bar:
        try:
            while lines := stream.readlines(BATCH_CHARACTERS):
                yield lines
                bar.update(sum(map(len, lines)))  # (characters: bytes for ASCII text)
        except UnicodeDecodeError as error:
            raise CorpusError(f"{path}, line {_first_undecodable_line(path)}: not UTF-8 text ({error.reason}).") from None
        bar.update(max(0, bar.total - bar.n))


def _first_undecodable_line(path: Path) -> int:
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def count_vocabulary(paths, special=(), min_freq: int = 0, max_size: int | None = None,
                     lower_case: bool = False) -> list[str]:  # fmt: skip
    """The original `Vocab.count_file` + `build_vocab`: `special` first, then the symbols of `paths` by decreasing
    count, ties in order of first appearance, while the count reaches `min_freq`, at most `max_size` of them (the
    original counts no line ends: `<eos>` is among the specials of the corpora that use it). A batch of lines is
    counted as one whitespace split of its text: the same symbols in the same order as line by line."""
    paths = [check_readable(path) for path in paths]

    def symbol_batches():
        for path in paths:
            for lines in _line_batches(path, f"counting {path.name}"):
                text = "".join(lines)
                yield (text.lower() if lower_case else text).split()

    return build_vocab(symbol_batches(), special, min_freq, max_size)


def word_tokenizer(vocab: dict[str, int], line_end: str, lower_case: bool = False) -> Tokenizer:
    """A `tokenizers` pipeline that encodes a stripped line as the original `Vocab.encode_file` does: split on
    whitespace, look each symbol up, add the line end. Unknown symbols get an id of their own (len(vocab)), so that
    they can be counted apart from the text's literal `<unk>`, and are then mapped to the unknown symbol."""
    tokenizer = Tokenizer(models.WordLevel({**vocab, _NOT_IN_VOCABULARY: len(vocab)}, unk_token=_NOT_IN_VOCABULARY))
    if lower_case:
        tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    first, last = LINE_ENDS[line_end]
    if last:
        for marker in {first, last} - {""}:
            if marker not in vocab:
                raise CorpusError(f"the vocabulary has no {marker!r} to end lines with (line end {line_end}).")
        template = f"{first} $A {last}" if first else f"$A {last}"
        markers = [(marker, vocab[marker]) for marker in dict.fromkeys(m for m in (first, last) if m)]
        tokenizer.post_processor = processors.TemplateProcessing(single=template, special_tokens=markers)
    return tokenizer


def encode_file(path, vocab: dict[str, int], line_end: str, unk_token: str | None, lower_case: bool = False,
                description: str | None = None) -> EncodedFile:  # fmt: skip
    """The id stream of a text file: every line encoded as the original reader does, a batch of lines at a time."""
    path = check_readable(path)
    tokenizer = word_tokenizer(vocab, line_end, lower_case)
    unknown_id, line_end_ids = len(vocab), len([m for m in LINE_ENDS[line_end] if m])
    pieces, unknown, words = [], 0, 0
    for lines in _line_batches(path, description or f"encoding {path.name}"):
        encodings = tokenizer.encode_batch_fast([line.strip() for line in lines])
        ids = np.fromiter(itertools.chain.from_iterable(encoding.ids for encoding in encodings), dtype=np.int32)
        words += len(ids) - line_end_ids * len(lines)
        unknown += int(np.count_nonzero(ids == unknown_id))
        pieces.append(ids)
    ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    if unknown:
        if unk_token is None or unk_token not in vocab:
            raise CorpusError(
                f"{path}: {unknown} symbol(s) are not in the vocabulary, which has no unknown symbol to encode them "
                "with (a character vocabulary must hold every character of the text)."
            )
        ids[ids == unknown_id] = vocab[unk_token]
    return EncodedFile(ids=ids, unknown=unknown, words=words)


def check_vocabulary(symbols, special, source: str):
    """Refuse a vocabulary of special symbols only (line ends, the unknown symbol): every word of a text would be
    encoded as `<unk>`, and a model predicting only those reports a low perplexity that means nothing. `source`
    names the vocabulary in the message (e.g. "the vocabulary counted from train.txt with --min-freq 50")."""
    if all(symbol in special for symbol in symbols):
        raise CorpusError(f"{source} holds only special symbols ({', '.join(symbols) or 'none'}), no word of the text.")


def check_encoded(path, encoded: EncodedFile, unk_token: str | None, allow_unknown: bool = False):
    """Refuse an encoded text that would give a meaningless loss: one without symbols (blank lines only), or one
    with more than UNKNOWN_RATE_LIMIT of its symbols unknown to the vocabulary (encoded as `unk_token`), unless
    `allow_unknown` (the `--allow-unknown` option of `train` and `evaluate`)."""
    if encoded.words == 0:
        raise CorpusError(f"{path}: no symbols in it (only blank lines or whitespace); expected text.")
    rate = encoded.unknown / encoded.words
    if rate > UNKNOWN_RATE_LIMIT and not allow_unknown:
        raise CorpusError(
            f"{path}: {rate:.1%} of its symbols ({encoded.unknown} of {encoded.words}) are not in the vocabulary and "
            f"would be read as {unk_token}, so the loss would measure mostly {unk_token}; check that the text and the "
            "vocabulary are of the same kind (words / characters), or pass --allow-unknown."
        )
