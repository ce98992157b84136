"""XLNet tokenisation is transformers' own `XLNetTokenizer`: AutoTokenizer finds it for our XLNet folders, and its
left padding keeps the classification token last, where our classification head reads it."""

import pytest
import torch
import transformers
from transformers import AutoTokenizer, XLNetTokenizer

from transformers_xl import XLNetConfig, XLNetForSequenceClassification, use_builtin_auto_classes, use_for_auto_classes

SPECIALS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]  # XLNet's ids 0..8
WORDS = "the cat sat on a mat dog ran quickly and slowly".split()
TEXTS = ["the cat sat on the mat", "a dog", "the dog ran quickly and the cat slowly"]


def tiny_tokenizer():
    """A Unigram vocabulary with XLNet's special symbols, built offline (no sentencepiece model needed)."""
    pieces = [(symbol, 0.0) for symbol in SPECIALS] + [("▁", -3.0)]
    pieces += [(letter, -5.0) for letter in "abcdefghijklmnopqrstuvwxyz.,"]
    pieces += [(f"▁{word}", -2.0) for word in WORDS]
    return XLNetTokenizer(vocab=pieces)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """What our XLNet folders hold: config.json from our XLNetConfig, tokenizer files from XLNetTokenizer."""
    path = tmp_path_factory.mktemp("xlnet")
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(path)
    config = XLNetConfig(vocab_size=len(tokenizer), d_model=32, n_head=4, d_inner=37, n_layer=2, pad_token_id=5)
    config.save_pretrained(path)
    return path


@pytest.mark.parametrize("our_auto_classes", [False, True])
def test_auto_tokenizer_resolves_transformers_xlnet_tokenizer(folder, our_auto_classes):
    if our_auto_classes:
        use_for_auto_classes()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    finally:
        use_builtin_auto_classes()
    assert type(tokenizer) is transformers.XLNetTokenizer  # reused, not re-implemented
    assert tokenizer(TEXTS)["input_ids"] == tiny_tokenizer()(TEXTS)["input_ids"]


def test_auto_tokenizer_resolves_from_the_model_type_alone(folder, tmp_path):
    for name in ["config.json", "tokenizer.json"]:  # no tokenizer_config.json naming the class
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    assert type(AutoTokenizer.from_pretrained(tmp_path)) is transformers.XLNetTokenizer


def test_batches_are_padded_on_the_left_with_the_classification_token_last(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.padding_side == "left"
    batch = tokenizer(TEXTS, padding=True, return_token_type_ids=True, return_tensors="pt")
    assert (batch["input_ids"][:, -2:] == torch.tensor([tokenizer.sep_token_id, tokenizer.cls_token_id])).all()
    for row, text in enumerate(TEXTS):
        length = len(tokenizer(text)["input_ids"])
        padding = batch["input_ids"].shape[1] - length
        assert batch["attention_mask"][row].tolist() == [0] * padding + [1] * length
        assert batch["input_ids"][row, :padding].eq(tokenizer.pad_token_id).all()
        # the <cls> segment is 2; padding gets type 0 from transformers 5 (4.x: 3), which masked positions ignore
        assert batch["token_type_ids"][row, padding:].tolist() == [0] * (length - 1) + [2]


def test_left_padded_batch_classifies_each_text_as_if_alone(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    model = XLNetForSequenceClassification(XLNetConfig.from_pretrained(folder, num_labels=3)).eval()
    batch = tokenizer(TEXTS, padding=True, return_token_type_ids=True, return_tensors="pt")
    with torch.no_grad():
        together = model(**batch).logits
        alone = [model(**tokenizer(text, return_token_type_ids=True, return_tensors="pt")).logits for text in TEXTS]
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-4, atol=1e-5)
    # the same batch padded on the right would summarise a pad for the shorter texts
    tokenizer.padding_side = "right"
    with torch.no_grad():
        right = model(**tokenizer(TEXTS, padding=True, return_token_type_ids=True, return_tensors="pt")).logits
    assert not torch.allclose(right[1], together[1], atol=1e-3)
