"""XLNet pretraining data, as the original recipe makes it (zihangdai/xlnet `data_utils.py`, `train_gpu.py`).

Permutation language modeling with span-based partial prediction (Yang et al. 2019, Sec. 2.3 and App. A.2), over an
ordered corpus so that the memory carries context from one step to the next:

- the token stream is cut into one contiguous row per batch slot; step t takes `reuse_len` new tokens of every row
  (the "reused" part, whose hidden states enter the memory for step t + 1) and appends two segments A and B,
  `[reused | A <sep> B <sep> <cls>]`, segment ids 0 (reused, A, first <sep>), 1 (B, second <sep>), 2 (<cls>);
  step t's row b continues step t - 1's row b;
- `num_predict` positions per row are predicted, chosen as spans (`mask_alpha`, `mask_beta`, spans of at most
  `max_span` pieces starting at a word start), split between the reused part and the rest in proportion to their
  lengths (half and half at the recipe's `reuse_len = seq_len / 2`);
- the factorisation order is a random permutation shared by blocks of `perm_size` positions, drawn separately for
  the reused part and the rest; the reused part never sees the rest, so the memory it leaves holds nothing of the
  tokens after it; `<sep>` / `<cls>` are never predicted;
- `bi_data`: every device's batch is `[forward rows; the same rows reversed]` (the model's `bi_data` encodes the
  second half with backward relative positions).

`XLNetPretrainingDataset` is map-style: item `index` is one row of one step, laid out so that a sequential sampler
with `batch_size` rows per device gives each step's rows in order (and, over `num_processes` processes, gives each
process its own rows with accelerate's round-robin batch sharding). Each item is a complete model input
(`input_ids`, `token_type_ids`, `perm_mask`, `target_mapping`, `labels`), so transformers' default collator stacks
them. As in the original, A / B and the predicted spans are drawn once per item (the records of `create_tfrecords`),
and the factorisation order is drawn anew every epoch (the online parser); both are seeded by `seed`, the item and
the epoch (`set_epoch`, which `Trainer` calls through accelerate), so a run is reproducible and resumable.
"""

import string
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

# A piece that starts a word (the original `_is_start_piece`): SentencePiece's "▁" prefix, a special symbol, or one
# punctuation mark.
PUNCTUATION = set(string.punctuation)


def word_start_table(tokenizer) -> np.ndarray:
    """`table[id]` is True when vocabulary piece `id` may begin a predicted span (starts a word)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return np.array([p.startswith("▁") or p.startswith("<") or p in PUNCTUATION for p in pieces], dtype=bool)


def split_a_and_b(tokens, sentence_ids, begin, length, rng):
    """Segments A and B, `length` tokens together, for the text from `begin` on (the original `_split_a_and_b`).

    A is whole sentences from `begin`. With probability 1/2 (and always when no sentence ends early enough) B is
    text from a random place of the row, widened to whole sentences; otherwise B is the text that follows A. The
    longer of the two is then cut on its right until both fit.
    """
    ends = begin + 1 + np.flatnonzero(sentence_ids[begin + 1 :] != sentence_ids[begin:-1])  # sentence boundaries
    cuts = ends[ends - begin < length]  # where A may stop with room left for B
    end = ends[len(cuts)] if len(cuts) < len(ends) else len(tokens)  # first boundary with A + B long enough
    if len(cuts) == 0 or rng.random() < 0.5:
        a_end = rng.choice(cuts) if len(cuts) else end
        b_length = max(1, length - (a_end - begin))
        b_begin = int(rng.integers(0, len(tokens) - b_length + 1))
        b_end = b_begin + b_length
        while b_begin > 0 and sentence_ids[b_begin - 1] == sentence_ids[b_begin]:
            b_begin -= 1
        while b_end < len(tokens) and sentence_ids[b_end - 1] == sentence_ids[b_end]:
            b_end += 1
    else:
        a_end = rng.choice(cuts)
        b_begin, b_end = a_end, end
    a_length, b_length = a_end - begin, b_end - b_begin
    while a_length + b_length > length:
        if a_length > b_length:
            a_length -= 1
        else:
            b_length -= 1
    return tokens[begin : begin + a_length], tokens[b_begin : b_begin + b_length]


def sample_spans(word_start, goal, mask_alpha, mask_beta, max_span, rng):
    """`goal` positions to predict, chosen as spans (the original `_sample_mask`).

    A span of n pieces (P(n) proportional to 1/n, n <= max_span) lies in a context of n * mask_alpha / mask_beta
    pieces: it starts at a random offset in the context, moved on to the next word start; the next context begins
    where this one ends. (The original counts n pieces, not n words: its end test reads the span's first piece.)
    Spans that would reach the end of the text are dropped; random single positions make up any shortfall.
    """
    length = len(word_start)
    starts = np.flatnonzero(word_start)
    lengths = np.arange(1, max_span + 1)
    probabilities = 1.0 / lengths
    probabilities /= probabilities.sum()
    mask = np.zeros(length, dtype=bool)
    count = cursor = 0
    while cursor < length and count < goal:
        n = min(int(rng.choice(lengths, p=probabilities)), goal - count)
        context = n * mask_alpha // mask_beta
        offset = int(rng.integers(context))
        following = np.searchsorted(starts, cursor + offset)
        if following == len(starts) or starts[following] + n >= length:
            break
        start = starts[following]
        mask[start : start + n] = True
        count += n
        cursor = start + n + context - offset
    if count < goal:
        mask[rng.choice(np.flatnonzero(~mask), goal - count, replace=False)] = True
    return mask


def permutation_mask(input_ids, is_masked, perm_size, functional_ids, rng):
    """`(perm_mask, is_target)` for one part of a row (the original `_local_perm`).

    The factorisation order is a random permutation of `perm_size` positions, the same for every block of
    `perm_size`. Tokens not chosen for prediction come first (rank -1): every position sees them, they see no
    target. `<sep>` / `<cls>` keep their rank but are not predicted. `perm_mask[i, j] = True`: i may not see j, that
    is j is a target or functional token not earlier than i in the order (a target does not see itself).
    """
    length = len(input_ids)
    order = np.arange(length).reshape(-1, perm_size)[:, rng.permutation(perm_size)].reshape(-1)
    functional = np.isin(input_ids, functional_ids)
    is_target = is_masked & ~functional
    context = ~is_masked & ~functional
    rank = np.where(context, -1, order)
    own_rank = np.where(is_target, rank, rank + 1)
    perm_mask = (own_rank[:, None] <= rank[None, :]) & ~context[None, :]
    return perm_mask, is_target


class XLNetPretrainingDataset(Dataset):
    """Ordered permutation-LM inputs for XLNet pretraining with memory (see the module docstring).

    Args:
        sentences: the corpus as token-id sequences, one per sentence (line), in reading order. Sentence boundaries
            are where segments A and B may be cut; mark a document's end with `<eod>` as the original did.
        tokenizer: gives the `<sep>` / `<cls>` ids and which pieces start a word (SentencePiece "▁").
        seq_len, reuse_len: tokens per row and step, and how many of them are new text the memory keeps
            (the recipe: 512 and 256; the model's `config.reuse_len` must be the same).
        batch_size: rows per device and step (`per_device_train_batch_size`); `num_processes`: devices.
        num_predict: predicted positions per row (the recipe: 85); `perm_size`: factorisation-order block
            (default `reuse_len`; it must divide `reuse_len` and `seq_len - reuse_len`).
        mask_alpha, mask_beta, max_span: span sampling (the recipe: 6, 1, 5).
        bi_data: the second half of each device's rows are its first half read backwards; needs an even
            `batch_size` and the model's `config.bi_data=True`.
        seed: seeds the segments, the spans and the factorisation orders.
    """

    def __init__(
        self,
        sentences: Sequence[Sequence[int]],
        tokenizer,
        *,
        seq_len: int,
        reuse_len: int,
        batch_size: int,
        num_predict: int,
        perm_size: int | None = None,
        mask_alpha: int = 6,
        mask_beta: int = 1,
        max_span: int = 5,
        bi_data: bool = False,
        num_processes: int = 1,
        seed: int = 0,
    ):
        perm_size = reuse_len if perm_size is None else perm_size
        self._check_settings(
            seq_len=seq_len, reuse_len=reuse_len, batch_size=batch_size, num_predict=num_predict,
            perm_size=perm_size, mask_alpha=mask_alpha, mask_beta=mask_beta, max_span=max_span,
            num_processes=num_processes, bi_data=bi_data,
        )  # fmt: skip
        self.seq_len, self.reuse_len, self.perm_size = seq_len, reuse_len, perm_size
        self.batch_size, self.num_processes, self.bi_data = batch_size, num_processes, bi_data
        self.mask_alpha, self.mask_beta, self.max_span = mask_alpha, mask_beta, max_span
        self.seed, self.epoch = seed, 0
        # num_predict split between the reused part and the rest in proportion to their lengths (the original:
        # half each, the odd one to the reused part, at reuse_len = seq_len / 2).
        self.num_predict = num_predict
        self.rest_predict = num_predict * (seq_len - reuse_len) // seq_len
        self.reused_predict = num_predict - self.rest_predict
        self.sep_id, self.cls_id = tokenizer.sep_token_id, tokenizer.cls_token_id
        if self.sep_id is None or self.cls_id is None:
            raise ValueError("XLNetPretrainingDataset: the tokenizer needs `sep_token` and `cls_token` (XLNet's).")
        self.word_start = word_start_table(tokenizer)

        tokens, sentence_ids = self._flatten(sentences)
        # One contiguous row per stream (the original `batchify`); with bi_data each stream is read both ways.
        streams = num_processes * (batch_size // 2 if bi_data else batch_size)
        row_length = len(tokens) // streams
        if row_length < seq_len:
            raise ValueError(
                f"XLNetPretrainingDataset: {len(tokens)} tokens give {streams} rows of {row_length} tokens; "
                f"expected at least seq_len={seq_len} tokens per row (more text, or fewer rows)."
            )
        self.rows = tokens[: streams * row_length].reshape(streams, row_length)
        self.row_sentence_ids = sentence_ids[: streams * row_length].reshape(streams, row_length)
        self.num_steps = (row_length - seq_len) // reuse_len + 1

    @staticmethod
    def _check_settings(*, seq_len, reuse_len, batch_size, num_predict, perm_size, mask_alpha, mask_beta, max_span,
                        num_processes, bi_data):  # fmt: skip
        def fail(name, value, expected):
            raise ValueError(f"XLNetPretrainingDataset: invalid `{name}`={value!r}; expected {expected}.")

        def positive_int(name, value):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail(name, value, "a positive integer")

        for name, value in [("seq_len", seq_len), ("reuse_len", reuse_len), ("batch_size", batch_size),
                            ("num_predict", num_predict), ("perm_size", perm_size), ("mask_alpha", mask_alpha),
                            ("mask_beta", mask_beta), ("max_span", max_span), ("num_processes", num_processes)]:  # fmt: skip
            positive_int(name, value)
        if reuse_len >= seq_len - 3:
            fail("reuse_len", reuse_len, f"less than seq_len - 3 = {seq_len - 3} (room for A, B, <sep> x 2, <cls>)")
        for part, length in [("reuse_len", reuse_len), ("seq_len - reuse_len", seq_len - reuse_len)]:
            if length % perm_size:
                fail("perm_size", perm_size, f"a divisor of {part} = {length}")
        if num_predict > seq_len // 2:
            fail("num_predict", num_predict, f"at most seq_len / 2 = {seq_len // 2} (the recipe predicts 85 of 512)")
        if mask_alpha < mask_beta:
            fail("mask_alpha", mask_alpha, f"at least mask_beta = {mask_beta} (a span lies inside its context)")
        if bi_data and batch_size % 2:
            fail("batch_size", batch_size, "an even number with bi_data (forward and backward halves)")

    def _flatten(self, sentences):
        """The token stream and, per token, a sentence id that flips at every sentence boundary."""
        if isinstance(sentences, (str, bytes)) or not len(sentences):
            raise TypeError("XLNetPretrainingDataset: `sentences` must be a non-empty list of token-id lists.")
        pieces = [np.asarray(sentence, dtype=np.int64) for sentence in sentences]
        if any(piece.ndim != 1 for piece in pieces):
            raise TypeError("XLNetPretrainingDataset: each sentence must be a flat list of token ids.")
        tokens = np.concatenate(pieces)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= len(self.word_start)):
            raise ValueError(
                f"XLNetPretrainingDataset: token ids must lie in [0, {len(self.word_start)}) (the tokenizer's "
                f"vocabulary); got ids from {tokens.min()} to {tokens.max()}."
            )
        sentence_ids = np.concatenate([np.full(len(p), i % 2, dtype=np.int8) for i, p in enumerate(pieces)])
        return tokens, sentence_ids

    def set_epoch(self, epoch: int):
        """New factorisation orders for `epoch` (segments and spans stay those of the item, as in the original)."""
        self.epoch = epoch

    def __len__(self):
        return self.num_steps * self.num_processes * self.batch_size

    def locate(self, index):
        """`(step, stream, reversed)` of item `index`: batch k = step * num_processes + process holds that
        process's rows, `[forward; backward]` with bi_data."""
        if not 0 <= index < len(self):
            raise IndexError(f"XLNetPretrainingDataset: index {index} out of range [0, {len(self)}).")
        batch, slot = divmod(index, self.batch_size)
        step, process = divmod(batch, self.num_processes)
        if not self.bi_data:
            return step, process * self.batch_size + slot, False
        half = self.batch_size // 2
        return step, process * half + slot % half, slot >= half

    def __getitem__(self, index):
        step, stream, backward = self.locate(index)
        tokens, sentence_ids = self.rows[stream], self.row_sentence_ids[stream]
        if backward:
            tokens, sentence_ids = tokens[::-1], sentence_ids[::-1]
        input_ids, token_type_ids, is_masked = self._record(
            tokens, sentence_ids, step * self.reuse_len, backward, np.random.default_rng([self.seed, 0, index])
        )
        order_rng = np.random.default_rng([self.seed, 1, index, self.epoch])
        perm_mask, is_target = self._perm_mask(input_ids, is_masked, order_rng)

        positions = np.flatnonzero(is_target)  # at most num_predict; rows past them are padding
        target_mapping = np.zeros((self.num_predict, self.seq_len), dtype=np.float32)
        target_mapping[np.arange(len(positions)), positions] = 1.0
        labels = np.full(self.num_predict, -100, dtype=np.int64)
        labels[: len(positions)] = input_ids[positions]
        return {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "perm_mask": torch.from_numpy(perm_mask.astype(np.float32)),
            "target_mapping": torch.from_numpy(target_mapping),
            "labels": torch.from_numpy(labels),
        }

    def _record(self, tokens, sentence_ids, begin, backward, rng):
        """`[reused | A <sep> B <sep> <cls>]`, its segment ids and the positions to predict (`create_tfrecords`)."""
        reuse_len = self.reuse_len
        reused = tokens[begin : begin + reuse_len]
        a, b = split_a_and_b(tokens, sentence_ids, begin + reuse_len, self.seq_len - reuse_len - 3, rng)
        sep, cls = [self.sep_id], [self.cls_id]
        input_ids = np.concatenate([reused, a, sep, b, sep, cls]).astype(np.int64)
        token_type_ids = np.array([0] * (reuse_len + len(a) + 1) + [1] * (len(b) + 1) + [2], dtype=np.int64)
        is_masked = np.concatenate([
            self._spans(input_ids[:reuse_len], self.reused_predict, backward, rng),
            self._spans(input_ids[reuse_len:], self.rest_predict, backward, rng),
        ])  # fmt: skip
        return input_ids, token_type_ids, is_masked

    def _spans(self, input_ids, goal, backward, rng):
        """Spans are drawn in reading order: on backward rows, over the text turned forward again."""
        word_start = self.word_start[input_ids[::-1] if backward else input_ids]
        mask = sample_spans(word_start, goal, self.mask_alpha, self.mask_beta, self.max_span, rng)
        return mask[::-1] if backward else mask

    def _perm_mask(self, input_ids, is_masked, rng):
        """Orders drawn separately for the reused part and the rest; the reused part sees nothing of the rest, the
        rest sees all of the reused part (which comes first in the factorisation order)."""
        reuse_len, functional = self.reuse_len, [self.sep_id, self.cls_id]
        reused_mask, reused_targets = permutation_mask(
            input_ids[:reuse_len], is_masked[:reuse_len], self.perm_size, functional, rng
        )
        rest_mask, rest_targets = permutation_mask(
            input_ids[reuse_len:], is_masked[reuse_len:], self.perm_size, functional, rng
        )
        perm_mask = np.ones((self.seq_len, self.seq_len), dtype=bool)
        perm_mask[:reuse_len, :reuse_len] = reused_mask
        perm_mask[reuse_len:, :reuse_len] = False
        perm_mask[reuse_len:, reuse_len:] = rest_mask
        return perm_mask, np.concatenate([reused_targets, rest_targets])


__all__ = ["XLNetPretrainingDataset", "permutation_mask", "sample_spans", "split_a_and_b", "word_start_table"]
