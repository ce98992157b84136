"""Transformer-XL's word-level tokenizer on the `tokenizers` library, with the legacy ids and no pickle.

The whole pipeline (Moses normalisation and tokenisation, number splitting, WordLevel vocabulary, Moses
detokenisation) is a `tokenizers.Tokenizer` saved as `tokenizer.json` (see `moses_pipeline`). A folder holding
only a legacy `vocab.pkl` / `vocab.bin` / `vocab.txt` loads too: the vocabulary is read without running the pickle
(see `legacy_vocab`), and `save_pretrained` then writes `tokenizer.json` + `tokenizer_config.json`.
"""

import os
from os import PathLike

from tokenizers import Tokenizer, processors
from tokenizers.models import WordLevel
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from .legacy_vocab import build_vocab, read_legacy_vocab, split_symbols, text_lines, unknown_symbol
from .moses_pipeline import moses_decoder, moses_normalizer, moses_pre_tokenizer

VOCAB_FILES_NAMES = {
    "tokenizer_file": "tokenizer.json",
    "pretrained_vocab_file": "vocab.pkl",
    "pretrained_vocab_file_torch": "vocab.bin",
    "vocab_file": "vocab.txt",
}


class TransfoXLTokenizer(TokenizersBackend):
    """Transformer-XL tokenizer: words as the legacy transformers 4.x tokenizer split them, one id per word.

    Args:
        vocab (`dict[str, int]` or `list[str]`, *optional*): the symbols and their ids (a list: ids in order).
            Otherwise the vocabulary comes from `tokenizer_file`, or else from the first legacy file given.
        tokenizer_file (`str`, *optional*): a `tokenizer.json` written by this class. It holds the whole pipeline,
            so with it `lower_case` and `never_split` only record what the file does.
        pretrained_vocab_file, pretrained_vocab_file_torch, vocab_file (`str`, *optional*): a legacy `vocab.pkl`,
            `vocab.bin` or original-code `vocab.txt`.
        lower_case (`bool`, defaults to `False`): lower-case the text first.
        add_eos (`bool`, defaults to `False`): every line break becomes `<eos>`, the corpora's line end (as the
            legacy `add_eos=True` ended each line of a file); a text that does not end with one, a prompt, is not
            ended (text generation continues the line).
        add_double_eos (`bool`, defaults to `False`): wrap every sequence in `<S>` ... `<S>` (lm1b style).
        never_split (`list[str]`, *optional*): `<word>` tokens kept whole in any letter case (the special tokens by
            default); the special tokens themselves are never split in their exact spelling.
        unk_token, eos_token, additional_special_tokens: by default the legacy tokenizer's (`<unk>` or `<UNK>`, `<eos>`,
            `["<formula>"]`), those the vocabulary has (see `_default_special_tokens`).
        delimiter, language: accepted for legacy configs; only `None` and `"en"` are supported.
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab: dict[str, int] | list[str] | None = None,
        tokenizer_file: str | None = None,
        pretrained_vocab_file: str | None = None,
        pretrained_vocab_file_torch: str | None = None,
        vocab_file: str | None = None,
        lower_case: bool = False,
        add_eos: bool = False,
        add_double_eos: bool = False,
        never_split: list[str] | None = None,
        unk_token: str | None = None,
        eos_token: str | None = None,
        additional_special_tokens: list[str] | None = None,
        delimiter: str | None = None,
        language: str = "en",
        **kwargs,
    ):
        if delimiter == "":
            raise ValueError("TransfoXLTokenizer: character-level vocabularies (`delimiter=''`) are not supported.")
        if language != "en":
            raise ValueError(f"TransfoXLTokenizer: only the English Moses rules exist here, not {language!r}.")
        self._add_eos, self._add_double_eos = add_eos, add_double_eos
        kwargs.pop("clean_up_tokenization_spaces", None)  # legacy configs say True: the decoder does the clean-up
        if tokenizer_file is None and vocab is None:
            legacy_file = pretrained_vocab_file or pretrained_vocab_file_torch or vocab_file
            if legacy_file is None:
                raise ValueError("TransfoXLTokenizer needs a `vocab`, a `tokenizer_file` or a legacy vocab file.")
            vocab = read_legacy_vocab(legacy_file)
        from_4x = tokenizer_file or pretrained_vocab_file or pretrained_vocab_file_torch
        unk_token, eos_token, additional_special_tokens = _default_special_tokens(
            None if from_4x else vocab, unk_token, eos_token, additional_special_tokens, add_eos, kwargs
        )
        kwargs.setdefault("pad_token", eos_token)  # (batches pad with it; the attention mask hides it from the model)
        if tokenizer_file is None:
            specials = [unk_token, eos_token, *(additional_special_tokens or kwargs.get("extra_special_tokens", []))]
            protected = [str(t) for t in never_split or specials if t is not None]
            self._tokenizer = self._build_pipeline(vocab, lower_case, protected)
        super().__init__(
            tokenizer_file=tokenizer_file,
            lower_case=lower_case,
            add_eos=add_eos,
            add_double_eos=add_double_eos,
            never_split=never_split,
            unk_token=unk_token,
            eos_token=eos_token,
            additional_special_tokens=additional_special_tokens,
            clean_up_tokenization_spaces=False,
            **kwargs,
        )
        self.update_post_processor()

    @staticmethod
    def _build_pipeline(vocab, lower_case, protected_tokens) -> Tokenizer:
        if not isinstance(vocab, dict):
            vocab = {symbol: index for index, symbol in enumerate(vocab)}
        tokenizer = Tokenizer(WordLevel(vocab, unk_token=unknown_symbol(vocab)))
        tokenizer.normalizer = moses_normalizer(lower_case, protected_tokens)
        tokenizer.pre_tokenizer = moses_pre_tokenizer()
        tokenizer.decoder = moses_decoder()
        return tokenizer

    @classmethod
    def convert_to_native_format(cls, **kwargs):
        """`tokenizer.json` is our complete pipeline: load it as it is, rather than re-deriving it from its vocab."""
        return kwargs

    @classmethod
    def from_corpus(
        cls,
        paths: str | PathLike | list[str | PathLike],
        special=("<eos>", "<unk>"),
        min_freq: int = 0,
        max_size: int | None = None,
        lower_case: bool = False,
        add_eos: bool = False,
        tokenized: bool = False,
        **kwargs,
    ) -> "TransfoXLTokenizer":
        """A tokenizer whose vocabulary is built from text files as the original `Vocab` builds it: `special` first
        (so `<eos>` is 0, as in wt103), then the most common words seen at least `min_freq` times, at most `max_size`
        of them. `add_eos` counts an `<eos>` per line and makes the tokenizer end lines with it.

        The words are those encoding will look up: each line goes through this tokenizer's own normaliser and
        pre-tokeniser (Moses punctuation and tokenisation, number splitting, `lower_case`), so a file of the corpus
        encodes without `<unk>` (but for words cut by `min_freq` / `max_size`). `tokenized=True` reads already
        tokenised text (WikiText) as the original code does, splitting lines on spaces only; wt103's own vocabulary
        is `from_corpus(wiki.train.tokens, special=["<eos>"], tokenized=True)` (its `<unk>` comes from the text).
        """
        paths = [paths] if isinstance(paths, (str, PathLike)) else paths
        lines = (line for path in paths for line in text_lines(path))
        if tokenized:
            symbol_lines = (split_symbols(line, lower_case, add_eos) for line in lines)
        else:
            # The pipeline of a tokenizer with the same settings splits the text (its placeholder vocabulary is unused).
            splitter = cls(vocab=[*special, "<unk>"], lower_case=lower_case, **kwargs)._tokenizer
            symbol_lines = (pipeline_words(splitter, line, add_eos) for line in lines)
        vocab = build_vocab(symbol_lines, special, min_freq, max_size)
        return cls(vocab=vocab, lower_case=lower_case, add_eos=add_eos, **kwargs)

    def _encode_plus(self, text, text_pair=None, add_special_tokens=True, **kwargs):
        """transformers' encoding, with `add_eos`'s line ends; a `str` that is not valid Unicode (a lone surrogate,
        as `errors="surrogateescape"` leaves for an undecodable byte) is a ValueError saying where, instead of the
        `tokenizers` library's TypeError about input types. Looked for only once that error came."""
        if self._add_eos and not self._add_double_eos and add_special_tokens and not kwargs.get("is_split_into_words"):
            text, text_pair = self._end_lines(text, kwargs), self._end_lines(text_pair, kwargs)
        try:
            return super()._encode_plus(text, text_pair, add_special_tokens, **kwargs)
        except TypeError:
            problem = _invalid_unicode(text, "text") or _invalid_unicode(text_pair, "text_pair")
            if problem is None:
                raise
            raise ValueError(f"{type(self).__name__}: {problem}") from None

    def _end_lines(self, text, kwargs):
        """`add_eos`: each line break becomes the `<eos>` special token, so lines read from a file end with it and
        a prompt does not."""
        if isinstance(text, (list, tuple)):
            return [self._end_lines(item, kwargs) for item in text]
        if not isinstance(text, str) or "\n" not in text:
            return text
        if kwargs.get("return_offsets_mapping"):
            raise ValueError(f"{type(self).__name__}: no offsets for a text whose line breaks `add_eos` turns into "
                             "<eos>; encode it with add_special_tokens=False.")  # fmt: skip
        return text.replace("\n", f" {self.eos_token} ")

    @property
    def lower_case(self) -> bool:
        return self.init_kwargs.get("lower_case", False)

    do_lower_case = lower_case  # the legacy name

    @property
    def add_eos(self) -> bool:
        return self._add_eos

    @add_eos.setter
    def add_eos(self, value: bool):
        self._add_eos = value
        self.update_post_processor()

    @property
    def add_double_eos(self) -> bool:
        return self._add_double_eos

    @add_double_eos.setter
    def add_double_eos(self, value: bool):
        self._add_double_eos = value
        self.update_post_processor()

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        """The symbols in id order, one per line: the original code's `vocab.txt`, never a pickle."""
        path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "vocab.txt")
        vocab = self._tokenizer.get_vocab(with_added_tokens=False)
        with open(path, "w", encoding="utf-8") as lines:
            lines.writelines(f"{symbol}\n" for symbol in sorted(vocab, key=vocab.get))
        return (path,)

    def update_post_processor(self):
        """`<S> text <S>` with `add_double_eos`, as legacy, else the text alone (`add_eos` ends lines in
        `_encode_plus`)."""
        if not self._add_double_eos:
            self._tokenizer.post_processor = None  # (a "$A" template would cost a tenth of the encoding time)
            return
        marker_id = self._tokenizer.token_to_id("<S>")
        if marker_id is None:  # the legacy tokenizer encoded a missing `<S>` as unknown
            marker_id = self._tokenizer.token_to_id(self._tokenizer.model.unk_token)
        self._tokenizer.post_processor = processors.TemplateProcessing(
            single="<S> $A <S>", pair="<S> $A <S> <S>:1 $B:1 <S>:1", special_tokens=[("<S>", marker_id)]
        )


def _default_special_tokens(symbols, unk_token, eos_token, additional_special_tokens, add_eos, kwargs):
    """The legacy tokenizer's special tokens (`<unk>`, `<eos>`, `["<formula>"]`) for those not given. For 4.x files
    (`symbols` None) all of them, as 4.x added them, a missing `<formula>` after the vocabulary (so ids stay those
    4.x gave); for an original-code vocab.txt or a given vocabulary, only those it has (lm1b's has `<UNK>` and no
    `<eos>` or `<formula>`), so no id is added after its own symbols."""
    def has(token):
        return symbols is None or token in symbols

    if unk_token is None:
        unk_token = "<unk>" if symbols is None else unknown_symbol(symbols)
    if eos_token is None and (has("<eos>") or add_eos):
        eos_token = "<eos>"
    if additional_special_tokens is None and "extra_special_tokens" not in kwargs:
        additional_special_tokens = ["<formula>"] if has("<formula>") else []
    return unk_token, eos_token, additional_special_tokens


def pipeline_words(tokenizer: Tokenizer, line: str, add_eos: bool = False) -> list[str]:
    """The words `tokenizer`'s normaliser and pre-tokeniser make of `line` (then `<eos>` with `add_eos`)."""
    words = [word for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(line))]
    return [*words, "<eos>"] if add_eos else words


def _invalid_unicode(value, name: str) -> str | None:
    """What is wrong with the first string in `value` (a string or nested lists / tuples of them) that cannot be
    encoded as UTF-8, or None."""
    if isinstance(value, (list, tuple)):
        return next(filter(None, (_invalid_unicode(item, f"{name}[{i}]") for i, item in enumerate(value))), None)
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        character = ord(value[error.start])
        escaped = ""
        if 0xDC80 <= character <= 0xDCFF:  # what errors="surrogateescape" makes of an undecodable byte
            escaped = f" (the byte 0x{character - 0xDC00:02x} escaped by errors='surrogateescape')"
        return (
            f"{name} is not valid Unicode: it holds the lone surrogate U+{character:04X}{escaped} at index "
            f"{error.start} ({value[max(0, error.start - 10) : error.start]!r} precedes it). Decode the bytes with "
            "their real encoding, or with errors='replace'."
        )
    return None


__all__ = ["TransfoXLTokenizer"]
