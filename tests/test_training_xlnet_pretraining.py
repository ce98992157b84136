"""XLNet pretraining data (the original data_utils recipe): layout, ordered rows, spans, permutations, Trainer.

Most tests read a corpus of distinct words `▁w0 ▁w1 ...` (one piece each), so a token's id says where it stands
in the text: id - FIRST_WORD is its position in the stream.
Run: HF_HUB_OFFLINE=1 python -m pytest tests/test_training_xlnet_pretraining.py
"""

import numpy as np
import pytest
import torch
from transformers import TrainingArguments, XLNetTokenizer

from transformers_xl import XLNetConfig, XLNetLMHeadModel
from transformers_xl.training import MemoryTrainer
from transformers_xl.training.xlnet_pretraining import XLNetPretrainingDataset, sample_spans

SPECIALS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]  # XLNet's ids 0..8
CLS, SEP = 3, 4
FIRST_WORD = len(SPECIALS)
NUM_WORDS = 1200
SEQ_LEN, REUSE_LEN, NUM_PREDICT = 32, 16, 8


def tokenizer_with(pieces):
    return XLNetTokenizer(vocab=[(symbol, 0.0) for symbol in SPECIALS] + [(piece, -1.0) for piece in pieces])


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_with([f"▁w{i}" for i in range(NUM_WORDS)])


def sentences(num_words=NUM_WORDS, seed=0):
    """`▁w0 ... ▁w{num_words-1}` cut into sentences of 2 to 9 words."""
    rng = np.random.default_rng(seed)
    cuts = np.cumsum(rng.integers(2, 10, num_words))
    ids = np.arange(FIRST_WORD, FIRST_WORD + num_words)
    return [part.tolist() for part in np.split(ids, cuts[cuts < num_words]) if len(part)]


def dataset(tokenizer, **settings):
    settings = {"seq_len": SEQ_LEN, "reuse_len": REUSE_LEN, "batch_size": 4, "num_predict": NUM_PREDICT, **settings}
    return XLNetPretrainingDataset(sentences(), tokenizer, **settings)


def batches(data):
    """The batches a sequential sampler gives with `batch_size` rows per device (all processes in turn)."""
    loader = torch.utils.data.DataLoader(data, batch_size=data.batch_size, shuffle=False)
    return list(loader)


def positions(ids):
    return (ids - FIRST_WORD).numpy()


# ---------------------------------------------------------------------------------------------------------------
# Layout and ordered rows
# ---------------------------------------------------------------------------------------------------------------


def test_every_row_is_reused_part_then_a_sep_b_sep_cls(tokenizer):
    data = dataset(tokenizer)
    for index in range(0, len(data), 7):
        item = data[index]
        ids, types = item["input_ids"], item["token_type_ids"]
        assert ids.shape == types.shape == (SEQ_LEN,)
        assert item["perm_mask"].shape == (SEQ_LEN, SEQ_LEN)
        assert item["target_mapping"].shape == (NUM_PREDICT, SEQ_LEN) and item["labels"].shape == (NUM_PREDICT,)
        # segment ids 0 (reused part, A, <sep>), 1 (B, <sep>), 2 (<cls>), in that order
        assert (types[:REUSE_LEN] == 0).all() and torch.equal(types, types.sort().values)
        first_sep, second_sep = (ids == SEP).nonzero().flatten().tolist()
        assert types[first_sep] == 0 and types[first_sep + 1] == 1 and types[second_sep] == 1
        assert second_sep == SEQ_LEN - 2 and ids[-1] == CLS and types[-1] == 2 and (types == 2).sum() == 1
        assert first_sep > REUSE_LEN and second_sep > first_sep + 1  # A and B are not empty
        # the reused part is contiguous text; A continues it
        reused_and_a = positions(ids[:first_sep])
        assert (np.diff(reused_and_a) == 1).all()


def test_step_t_row_b_continues_step_t_minus_1_row_b_by_reuse_len(tokenizer):
    data = dataset(tokenizer, batch_size=3)
    steps = batches(data)
    assert len(steps) == data.num_steps > 3
    starts = np.stack([positions(batch["input_ids"][:, 0]) for batch in steps])  # [step, row]
    assert (np.diff(starts, axis=0) == REUSE_LEN).all()
    # rows are disjoint slices of the stream: row b starts where its share of the text starts
    row_length = NUM_WORDS // 3
    assert starts[0].tolist() == [0, row_length, 2 * row_length]


def test_each_process_owns_its_rows_under_round_robin_batches(tokenizer):
    """accelerate gives process p the global batches p, p + N, ...: every process sees its own rows continue."""
    data = dataset(tokenizer, batch_size=2, num_processes=2)
    steps = batches(data)
    per_process = [steps[p :: 2] for p in range(2)]
    starts = [np.stack([positions(b["input_ids"][:, 0]) for b in process]) for process in per_process]
    for process_starts in starts:
        assert (np.diff(process_starts, axis=0) == REUSE_LEN).all()
    row_length = NUM_WORDS // 4
    assert starts[0][0].tolist() == [0, row_length] and starts[1][0].tolist() == [2 * row_length, 3 * row_length]


def test_bi_data_batches_are_forward_rows_then_the_same_rows_reversed(tokenizer):
    data = dataset(tokenizer, batch_size=4, bi_data=True, num_processes=2)
    steps = batches(data)
    row_length = NUM_WORDS // 4  # 2 processes x 2 forward rows
    for k, batch in enumerate(steps):
        step, process = divmod(k, 2)
        reused = np.stack([positions(row) for row in batch["input_ids"][:, :REUSE_LEN]])
        for slot in range(2):
            begin = (2 * process + slot) * row_length  # this process's forward row `slot`
            forward = np.arange(begin, begin + row_length)
            assert (reused[slot] == forward[step * REUSE_LEN : (step + 1) * REUSE_LEN]).all()
            assert (reused[2 + slot] == forward[::-1][step * REUSE_LEN : (step + 1) * REUSE_LEN]).all()


# ---------------------------------------------------------------------------------------------------------------
# Predicted positions
# ---------------------------------------------------------------------------------------------------------------


def test_num_predict_targets_per_row_split_between_reused_part_and_rest(tokenizer):
    data = dataset(tokenizer, bi_data=True)
    counts = []
    for index in range(len(data)):
        item = data[index]
        mapping, labels, ids = item["target_mapping"], item["labels"], item["input_ids"]
        real = labels != -100
        count = int(real.sum())
        counts.append(count)
        assert (mapping[real].sum(-1) == 1).all() and (mapping[~real] == 0).all()
        assert real[:count].all()  # padding rows come last
        where = mapping[real].argmax(-1)
        assert torch.equal(labels[real], ids[where])  # labels are the tokens themselves
        assert (where[1:] > where[:-1]).all()  # in text order
        assert not torch.isin(ids[where], torch.tensor([SEP, CLS])).any()  # <sep> / <cls> never predicted
        assert (where < REUSE_LEN).sum() == NUM_PREDICT // 2  # the reused part holds no <sep> / <cls>
    # the rest loses a target only when its spans chose <sep> / <cls> (at most 3 of them)
    assert NUM_PREDICT - 3 <= min(counts) and max(counts) == NUM_PREDICT and np.mean(counts) > NUM_PREDICT - 1


def test_the_memory_s_tokens_are_never_predicted_again(tokenizer):
    """The memory at step t holds steps < t's reused parts; the reused part and A of step t are the text after
    them, so no token the memory carries is a target again. (B is drawn from anywhere in the row, as in the
    original, so it is left out.)"""
    data = dataset(tokenizer)
    for batch in batches(data):
        for ids, types, mapping, labels in zip(
            batch["input_ids"], batch["token_type_ids"], batch["target_mapping"], batch["labels"]
        ):
            where = mapping[labels != -100].argmax(-1)
            first_new = positions(ids[0])
            assert (positions(ids[where[types[where] == 0]]) >= first_new).all()


def test_spans_have_at_most_max_span_pieces_and_start_at_word_starts():
    rng = np.random.default_rng(0)
    word_start = rng.random(4000) < 0.6  # words of 1 to several pieces
    word_start[0] = True
    lengths = []
    for trial in range(20):
        mask = sample_spans(word_start, 120, mask_alpha=6, mask_beta=1, max_span=5, rng=rng)
        assert mask.sum() == 120
        edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
        begins, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        assert word_start[begins].all()
        lengths.extend((ends - begins).tolist())
    lengths = np.bincount(lengths, minlength=6)[1:]
    assert lengths.sum() and len(lengths) == 5  # no span longer than max_span
    # P(n) is proportional to 1 / n: single pieces the most frequent, five the least
    assert lengths[0] > lengths[1] > lengths[4] > 0


@pytest.mark.parametrize("mask_alpha, mask_beta", [(6, 1), (2, 1), (6, 2)])
def test_each_span_lies_in_a_context_of_mask_alpha_over_mask_beta_times_its_length(mask_alpha, mask_beta):
    """A span of n pieces uses n * (1 + alpha / beta) pieces of text: predicting 200 pieces reaches that far."""
    rng = np.random.default_rng(1)
    reach = []
    for trial in range(10):
        mask = sample_spans(np.ones(5000, dtype=bool), 200, mask_alpha, mask_beta, max_span=5, rng=rng)
        reach.append(np.flatnonzero(mask)[-1] + 1)
    assert np.mean(reach) / 200 == pytest.approx(1 + mask_alpha / mask_beta, rel=0.15)


# ---------------------------------------------------------------------------------------------------------------
# Factorisation order (perm_mask)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("perm_size", [16, 8])
def test_perm_mask_is_a_factorisation_order_within_each_part(tokenizer, perm_size):
    data = dataset(tokenizer, perm_size=perm_size, num_predict=14)
    for index in range(0, len(data), 5):
        item = data[index]
        blocked = item["perm_mask"].bool()
        real = item["labels"] != -100
        targets = item["target_mapping"][real].argmax(-1)
        is_target = torch.zeros(SEQ_LEN, dtype=torch.bool)
        is_target[targets] = True
        functional = torch.isin(item["input_ids"], torch.tensor([SEP, CLS]))
        context = ~is_target & ~functional
        assert blocked[targets, targets].all()  # a target never sees itself
        reused, rest = slice(0, REUSE_LEN), slice(REUSE_LEN, SEQ_LEN)
        assert blocked[reused, rest].all()  # the reused part (the memory to be) sees nothing after it
        assert not blocked[rest, reused].any()  # the rest sees the whole reused part
        for part in (reused, rest):
            in_part = torch.zeros(SEQ_LEN, dtype=torch.bool)
            in_part[part] = True
            part_targets = (is_target & in_part).nonzero().flatten()
            part_context = (context & in_part).nonzero().flatten()
            # unpredicted tokens are seen by all and see no target of their part
            assert not blocked[in_part][:, part_context].any()
            assert blocked[part_context][:, part_targets].all()
            # targets see each other in a strict order: k-th in the order sees k - 1 earlier targets
            sees = ~blocked[part_targets][:, part_targets]
            assert sorted(sees.sum(-1).tolist()) == list(range(len(part_targets)))
            assert not (sees & sees.T).any()
            # blocks of perm_size come in text order: a target sees every target of earlier blocks
            block = (part_targets - part.start) // perm_size
            assert sees[block[:, None] > block[None, :]].all()


def test_orders_change_with_the_epoch_and_records_do_not(tokenizer):
    data = dataset(tokenizer, num_predict=14)
    first = [data[i] for i in range(8)]
    assert all(torch.equal(a["perm_mask"], b["perm_mask"]) for a, b in zip(first, [data[i] for i in range(8)]))
    data.set_epoch(1)
    second = [data[i] for i in range(8)]
    for a, b in zip(first, second):
        for key in ("input_ids", "token_type_ids", "target_mapping", "labels"):
            assert torch.equal(a[key], b[key])
    assert any(not torch.equal(a["perm_mask"], b["perm_mask"]) for a, b in zip(first, second))


def test_bad_settings_raise_clear_errors(tokenizer):
    with pytest.raises(ValueError, match="reuse_len"):
        dataset(tokenizer, reuse_len=SEQ_LEN - 3)
    with pytest.raises(ValueError, match="perm_size"):
        dataset(tokenizer, perm_size=5)
    with pytest.raises(ValueError, match="batch_size"):
        dataset(tokenizer, batch_size=3, bi_data=True)
    with pytest.raises(ValueError, match="num_predict"):
        dataset(tokenizer, num_predict=SEQ_LEN)
    with pytest.raises(ValueError, match="at least seq_len"):
        XLNetPretrainingDataset(sentences(100), tokenizer, seq_len=32, reuse_len=16, batch_size=4, num_predict=8)
    with pytest.raises(ValueError, match="vocabulary"):
        XLNetPretrainingDataset([[NUM_WORDS + 100] * 40], tokenizer, seq_len=32, reuse_len=16, batch_size=1,
                                num_predict=8)  # fmt: skip
    with pytest.raises(TypeError, match="token-id lists"):
        XLNetPretrainingDataset("some text", tokenizer, seq_len=32, reuse_len=16, batch_size=1, num_predict=8)


# ---------------------------------------------------------------------------------------------------------------
# Training: memory across steps, Trainer
# ---------------------------------------------------------------------------------------------------------------


def tiny_model(tokenizer, **overrides):
    torch.manual_seed(0)
    config = XLNetConfig(
        vocab_size=len(tokenizer), d_model=32, n_head=4, d_inner=64, n_layer=2, dropout=0.0, mem_len=2 * REUSE_LEN,
        reuse_len=REUSE_LEN, pad_token_id=5, **overrides,
    )  # fmt: skip
    return XLNetLMHeadModel(config)


class Recorder:
    """Per forward: the input ids, the mems fed (copied) and the embeddings of the reused part at that moment
    (what layer 0 should remember, computed with the weights of that step)."""

    def __init__(self, model):
        self.calls = []
        model.register_forward_pre_hook(self.record, with_kwargs=True)

    def record(self, model, args, kwargs):
        ids, mems = kwargs["input_ids"], kwargs.get("mems")
        with torch.no_grad():
            reused = model.transformer.word_embedding(ids[:, :REUSE_LEN])
        self.calls.append({"input_ids": ids.clone(), "mems": None if mems is None else [m.clone() for m in mems],
                           "reused": reused})  # fmt: skip


@pytest.mark.parametrize("accumulation", [1, 2])
def test_memory_trainer_feeds_each_step_the_reused_part_of_the_step_before(tokenizer, tmp_path, accumulation):
    """Under MemoryTrainer, step t's memory ends with step t - 1's reused part (only `reuse_len` positions enter
    per step; layer 0 keeps their embeddings), step t's rows continue it, and each epoch starts empty."""
    data = XLNetPretrainingDataset(sentences(200), tokenizer, seq_len=SEQ_LEN, reuse_len=REUSE_LEN, batch_size=4,
                                   num_predict=NUM_PREDICT, bi_data=True)  # fmt: skip
    assert data.num_steps == 5
    model = tiny_model(tokenizer, bi_data=True, use_mems_train=True)
    recorder = Recorder(model)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=accumulation,
        num_train_epochs=2, learning_rate=1e-2, save_strategy="no", logging_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    MemoryTrainer(model=model, args=args, train_dataset=data).train()
    assert len(recorder.calls) == 2 * data.num_steps and data.epoch == 1  # Trainer moved the dataset's epoch on
    for epoch in range(2):
        calls = recorder.calls[epoch * data.num_steps : (epoch + 1) * data.num_steps]
        assert calls[0]["mems"] is None
        for step in range(1, data.num_steps):
            previous, current = calls[step - 1], calls[step]
            mems = current["mems"]
            assert len(mems) == 2 and mems[0].shape[0] == min(2, step) * REUSE_LEN  # mem_len = 2 * reuse_len
            assert not any(m.requires_grad for m in mems)
            assert torch.equal(mems[0][-REUSE_LEN:].transpose(0, 1), previous["reused"])
            continues = current["input_ids"][:, 0] - previous["input_ids"][:, REUSE_LEN - 1]
            assert continues.tolist() == [1, 1, -1, -1]  # forward rows, then the same rows read backwards


def repeated_text(period=12, num_words=1600, shift=0):
    """A text that repeats every `period` words: masked words are predictable from their neighbours."""
    ids = FIRST_WORD + (np.arange(num_words) + shift) % period
    return [part.tolist() for part in np.split(ids, np.arange(7, num_words, 7))]


def test_tiny_model_loss_falls_under_memory_trainer_and_evaluation_runs(tokenizer, tmp_path):
    settings = dict(seq_len=SEQ_LEN, reuse_len=REUSE_LEN, batch_size=4, num_predict=NUM_PREDICT, bi_data=True)
    train = XLNetPretrainingDataset(repeated_text(), tokenizer, **settings)
    evaluation = XLNetPretrainingDataset(repeated_text(num_words=400, shift=5), tokenizer, seed=1, **settings)
    model = tiny_model(tokenizer, bi_data=True, use_mems_train=True)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=4, num_train_epochs=4,
        learning_rate=3e-3, logging_steps=10, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
        seed=0,
    )  # fmt: skip
    trainer = MemoryTrainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation)
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) >= 4 and losses[-1] < 0.5 * losses[0], losses
    assert after["eval_loss"] < 0.5 * before["eval_loss"], (before, after)
    assert after["eval_perplexity"] == pytest.approx(np.exp(after["eval_loss"]), rel=1e-6)
