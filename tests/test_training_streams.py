"""TextStream: contiguous rows, segment after segment, and the rows each process gets under accelerate's sharding."""

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler, SequentialSampler

from transformers_xl.training import TextStream


def rows_read_by(stream, rank, processes, batch_size, split_batches=False):
    """{first token of the row: the row's tokens in the order read} as rank `rank` of `processes` reads `stream`
    with Trainer's sequential sampler sharded by accelerate's own `BatchSamplerShard`. With `split_batches` the
    loader's batch is the global one and each rank takes its slice."""
    loader_batch = batch_size * processes if split_batches else batch_size
    sampler = BatchSamplerShard(
        BatchSampler(SequentialSampler(stream), loader_batch, drop_last=False), processes, rank, split_batches
    )
    read = {}
    for batch in sampler:
        items = [stream[i]["input_ids"] for i in batch]
        assert len(items) == batch_size and len({len(item) for item in items}) == 1  # a rectangular batch
        for position, item in enumerate(items):
            read.setdefault(position, []).append(item)
    return {int(parts[0][0]): torch.cat(parts) for parts in read.values()}


def test_rows_are_contiguous_and_each_segment_predicts_across_its_end():
    """The original `LMOrderedIterator`: data x[i:i+L], target x[i+1:i+1+L]; every token of a row but its first is
    a target exactly once, the last segment one token shorter."""
    ids = torch.arange(103)
    stream = TextStream(ids, num_rows=4, seq_len=7)
    assert stream.rows.shape == (4, 25)  # the 3 tokens that do not fill every row are dropped
    for row in range(4):
        items = [stream[s * 4 + row] for s in range(stream.num_segments)]
        assert [len(item["input_ids"]) for item in items] == [7, 7, 7, 3]
        assert all(set(item) == {"input_ids", "shift_labels"} for item in items)
        row_ids = ids[row * 25 : (row + 1) * 25]
        assert torch.equal(torch.cat([item["input_ids"] for item in items]), row_ids[:-1])
        assert torch.equal(torch.cat([item["shift_labels"] for item in items]), row_ids[1:])
        for item in items:
            assert torch.equal(item["shift_labels"], item["input_ids"] + 1)  # position t predicts the next token


@pytest.mark.parametrize("split_batches", [False, True])
def test_two_ranks_read_disjoint_contiguous_rows(split_batches):
    """Rank r owns rows r*B .. r*B+B-1 for the whole pass: every row is read front to back by one rank only."""
    ids = torch.arange(600)
    batch_size = 3
    stream = TextStream(ids, num_rows=2 * batch_size, seq_len=8)
    read = [rows_read_by(stream, rank, 2, batch_size, split_batches) for rank in range(2)]
    assert sorted(read[0]) == [0, 100, 200] and sorted(read[1]) == [300, 400, 500]
    for rank_rows in read:
        for first, tokens in rank_rows.items():
            assert torch.equal(tokens, torch.arange(first, first + 99))  # (the row's last token is only a target)


def segment_lengths(stream):
    return [len(stream[s * stream.num_rows]["input_ids"]) for s in range(stream.num_segments)]


def test_varlen_lengths_vary_are_reproducible_and_cover_the_rows():
    ids = torch.arange(4000)
    stream = TextStream(ids, num_rows=2, seq_len=20, varlen=True, seed=3)
    lengths = segment_lengths(stream)
    assert len(set(lengths)) > 3 and all(5 <= n <= 35 for n in lengths[:-1])
    assert lengths == segment_lengths(TextStream(ids, 2, 20, varlen=True, seed=3))
    assert lengths != segment_lengths(TextStream(ids, 2, 20, varlen=True, seed=4))
    for row in range(2):
        tokens = torch.cat([stream[s * 2 + row]["input_ids"] for s in range(stream.num_segments)])
        targets = torch.cat([stream[s * 2 + row]["shift_labels"] for s in range(stream.num_segments)])
        assert torch.equal(tokens, ids[row * 2000 : (row + 1) * 2000 - 1])
        assert torch.equal(targets, ids[row * 2000 + 1 : (row + 1) * 2000])


def test_a_last_segment_of_one_token_predicts_the_rows_last_token():
    stream = TextStream(torch.arange(24), num_rows=2, seq_len=5)  # rows of 12: 11 predictions, 5 + 5 + 1
    assert stream.num_segments == 3 and len(stream) == 6
    assert stream[5]["input_ids"].tolist() == [22] and stream[5]["shift_labels"].tolist() == [23]
    with pytest.raises(IndexError):
        stream[6]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(token_ids=torch.zeros(2, 5, dtype=torch.long), num_rows=1, seq_len=2), "1-D sequence of integer ids"),
        (dict(token_ids=torch.zeros(10), num_rows=1, seq_len=2), "integer ids"),
        (dict(token_ids=torch.arange(10), num_rows=0, seq_len=2), "`num_rows` must be a positive integer"),
        (dict(token_ids=torch.arange(10), num_rows=2, seq_len=2.5), "`seq_len` must be a positive integer"),
        (dict(token_ids=torch.arange(10), num_rows=6, seq_len=2), "cannot fill 6 rows"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TextStream(**kwargs)
