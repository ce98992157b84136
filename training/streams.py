"""A token stream served as contiguous rows, segment by segment: the data order the memory needs.

Transformer-XL trains with recurrence (Sec. 3.2): segment t+1 of a row attends to the memory of segment t of the
same row, so every row must be one contiguous piece of text read front to back, and a batch row must stay the same
row from step to step. `TextStream` does what the original `LMOrderedIterator` does (cut the stream into
`num_rows` rows, a step takes the next `seq_len` tokens of every row, each predicting the token after it; `varlen`
draws the segment length per step like the original `--varlen`) as a map-style dataset, so Trainer's ordinary
dataloader and accelerate's sharding serve it:

    item i = segment i // num_rows of row i % num_rows   ("step-major")

A sequential sampler with batch size B then yields batch g = segment g // (num_rows / B) of a fixed block of B
rows. With N processes, `num_rows = N * B` and accelerate's `BatchSamplerShard` hands global batch g to rank g % N,
so rank r always gets rows r*B ... r*B + B - 1: disjoint, contiguous, and the same rows every step.
"""

import itertools
import math

import torch


class TextStream(torch.utils.data.Dataset):
    """`token_ids` (a 1-D sequence) cut into `num_rows` contiguous rows, served segment by segment.

    Each item is `{"input_ids": row[s:e], "shift_labels": row[s + 1:e + 1]}`: every position predicts the next
    token, the last one the first token of the next segment, as the original's `LMOrderedIterator` does (`data =
    x[i:i+L]`, `target = x[i+1:i+1+L]`). So every token of a row but its first is predicted exactly once, and the
    last segment of a row is one token shorter than the rest of the row. Consecutive segments of a row are adjacent
    in the text: segment t ends where segment t+1 starts. The tail that does not fill every row is dropped, as in
    the original.

    `varlen=True` draws each step's length like the original `--varlen`: around `seq_len` (half of it 5% of the
    time) with a standard deviation of 5, clipped to [5, seq_len + 15]; all rows share the step's length, and the
    draw is fixed by `seed` (the same lengths every epoch and after a resume).
    """

    def __init__(self, token_ids, num_rows: int, seq_len: int, varlen: bool = False, seed: int = 0):
        token_ids = torch.as_tensor(token_ids)
        if token_ids.dim() != 1 or token_ids.is_floating_point() or token_ids.is_complex():
            raise ValueError(
                f"TextStream: `token_ids` must be a 1-D sequence of integer ids, got {token_ids.dtype} of shape "
                f"{tuple(token_ids.shape)}."
            )
        for name, value in (("num_rows", num_rows), ("seq_len", seq_len)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TextStream: `{name}` must be a positive integer, got {value!r}.")
        row_length = len(token_ids) // num_rows
        if row_length < 2:
            raise ValueError(
                f"TextStream: {len(token_ids)} tokens cannot fill {num_rows} rows of at least 2 tokens each."
            )
        self.num_rows = num_rows
        self.seq_len = seq_len
        self.rows = token_ids[: num_rows * row_length].long().view(num_rows, row_length)
        predicted = row_length - 1  # positions 0 .. row_length - 2 predict tokens 1 .. row_length - 1
        lengths = _varlen_lengths(predicted, seq_len, seed) if varlen else [seq_len] * math.ceil(predicted / seq_len)
        self.starts = [0, *itertools.accumulate(lengths[:-1])]
        self.ends = [min(start + length, predicted) for start, length in zip(self.starts, lengths)]

    @property
    def num_segments(self) -> int:
        """Segments per row, i.e. steps per pass over the stream."""
        return len(self.starts)

    def __len__(self) -> int:
        return self.num_segments * self.num_rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"TextStream: index {index} out of range for {len(self)} items.")
        segment, row = divmod(index % len(self), self.num_rows)
        start, end = self.starts[segment], self.ends[segment]
        return {"input_ids": self.rows[row, start:end], "shift_labels": self.rows[row, start + 1 : end + 1]}


def _varlen_lengths(positions: int, seq_len: int, seed: int) -> list[int]:
    """Segment lengths covering `positions` positions, drawn as the original `get_varlen_iter` draws them."""
    generator = torch.Generator().manual_seed(seed)
    lengths, total = [], 0
    while total < positions:
        bptt = seq_len if torch.rand((), generator=generator) < 0.95 else seq_len / 2
        length = int(torch.normal(float(bptt), 5.0, (), generator=generator))
        lengths.append(min(max(5, length), seq_len + 15))
        total += lengths[-1]
    return lengths
