"""Tokenizers: Transformer-XL's word-level tokenizer (XLNet uses transformers' own `XLNetTokenizer`)."""

from .tokenization_transfo_xl import TransfoXLTokenizer

__all__ = ["TransfoXLTokenizer"]
