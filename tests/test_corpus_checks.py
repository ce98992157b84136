"""The checks shared by `train` and `evaluate` that refuse a text or vocabulary giving a meaningless loss."""

import numpy as np
import pytest

from transformers_xl.training.corpus import CorpusError, EncodedFile, check_encoded, check_vocabulary


def encoded(words, unknown):
    return EncodedFile(ids=np.zeros(words, dtype=np.int32), unknown=unknown, words=words)


def test_a_vocabulary_of_special_symbols_only_is_refused():
    with pytest.raises(CorpusError, match=r"the counted vocabulary holds only special symbols \(<eos>, <unk>\)"):
        check_vocabulary(["<eos>", "<unk>"], ("<eos>", "<unk>"), "the counted vocabulary")
    check_vocabulary(["<eos>", "the", "<unk>"], ("<eos>", "<unk>"), "the counted vocabulary")


def test_a_text_without_symbols_is_refused():
    with pytest.raises(CorpusError, match="blank.txt: no symbols in it"):
        check_encoded("blank.txt", encoded(0, 0), "<unk>")


def test_more_than_half_unknown_symbols_are_refused_unless_allowed():
    with pytest.raises(CorpusError, match=r"text.txt: 50.1% of its symbols \(501 of 1000\) .* --allow-unknown"):
        check_encoded("text.txt", encoded(1000, 501), "<unk>")
    check_encoded("text.txt", encoded(1000, 501), "<unk>", allow_unknown=True)
    check_encoded("text.txt", encoded(1000, 500), "<unk>")
