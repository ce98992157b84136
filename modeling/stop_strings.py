"""Stop strings (`generate(..., stop_strings=[...], tokenizer=tokenizer)`) for word-level vocabularies.

transformers' `StopStringCriteria` learns the text each vocabulary token adds to a generation by decoding the token
after a probe word, "abcdef", that it encodes with the tokenizer itself, then cutting everything up to the probe
off the decoded text. A closed word-level vocabulary (Transformer-XL's) has no such word: the probe encodes as
`<unk>`, the decoded text `<unk> word` holds no "abcdef", and the criteria fail with "substring not found". Here the
probe is a word of the vocabulary that the tokenizer encodes and decodes back to itself.
"""

from transformers import StopStringCriteria


def probe_word(tokenizer, default: str = "abcdef") -> str:
    """`default` if the tokenizer gives it back after encoding and decoding it, else the most frequent (lowest-id)
    alphabetic word of the vocabulary that it gives back."""

    def round_trips(word):
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        return word in tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(ids))

    if round_trips(default):
        return default
    vocab = tokenizer.get_vocab()
    for word in sorted(vocab, key=vocab.get):
        if word.isalpha() and round_trips(word):
            return word
    raise ValueError(
        f"stop strings: the tokenizer gives back neither {default!r} nor any alphabetic word of its vocabulary "
        "after encoding and decoding it, so the text of its tokens cannot be learned."
    )


class WordLevelStopStringCriteria(StopStringCriteria):
    """`StopStringCriteria` whose vocabulary cleaning probes with a word the tokenizer knows (see `probe_word`)."""

    @staticmethod
    def clean_tokenizer_vocab(tokenizer, static_prefix="abcdef", stop_string_matching_mode=None):
        return StopStringCriteria.clean_tokenizer_vocab(
            tokenizer, probe_word(tokenizer, static_prefix), stop_string_matching_mode
        )
