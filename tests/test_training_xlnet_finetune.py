"""XLNet fine-tuning with `Trainer`, end to end on tiny synthetic data: sequence classification and extractive
question answering with the beam answer head (`XLNetForQuestionAnswering`), training then evaluation.
Run: HF_HUB_OFFLINE=1 python -m pytest tests/test_training_xlnet_finetune.py
"""

import numpy as np
import pytest
import torch
from transformers import Trainer, TrainingArguments, XLNetTokenizer

from transformers_xl import XLNetConfig, XLNetForQuestionAnswering, XLNetForSequenceClassification
from transformers_xl.training.xlnet_question_answering import best_spans

SPECIALS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]  # XLNet's ids 0..8
FILLERS = "the a sat on mat ran and saw big small over under near far old new".split()
ANIMALS = "cat dog fox owl".split()
COLORS = "red blue green black".split()


@pytest.fixture(scope="module")
def tokenizer():
    """A Unigram vocabulary with XLNet's special symbols (left padding, `<cls>` last), built offline."""
    words = FILLERS + ANIMALS + COLORS + ["good", "bad"]
    pieces = [(symbol, 0.0) for symbol in SPECIALS] + [("▁", -3.0)]
    pieces += [(letter, -5.0) for letter in "abcdefghijklmnopqrstuvwxyz"]
    pieces += [(f"▁{word}", -2.0) for word in words]
    return XLNetTokenizer(vocab=pieces)


class Features(torch.utils.data.Dataset):
    """Rows of a tokenizer's batch encoding (tensors) plus extra columns."""

    def __init__(self, encoding, **columns):
        self.columns = {**{key: torch.as_tensor(value) for key, value in encoding.items()}, **columns}

    def __len__(self):
        return len(next(iter(self.columns.values())))

    def __getitem__(self, index):
        return {key: value[index] for key, value in self.columns.items()}


def tiny_config(tokenizer, **overrides):
    return XLNetConfig(
        vocab_size=len(tokenizer), d_model=32, n_head=4, d_inner=64, n_layer=2, dropout=0.0,
        summary_last_dropout=0.0, pad_token_id=tokenizer.pad_token_id, **overrides,
    )  # fmt: skip


def arguments(tmp_path, **overrides):
    settings = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=16, per_device_eval_batch_size=32, learning_rate=3e-3,
        logging_steps=5, save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
    )  # fmt: skip
    return TrainingArguments(**{**settings, **overrides})


def logged_losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


# ---------------------------------------------------------------------------------------------------------------
# Sequence classification
# ---------------------------------------------------------------------------------------------------------------


def sentiment(tokenizer, count, seed):
    """Filler sentences with one "good" (label 1) or "bad" (label 0) somewhere in them."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for _ in range(count):
        words = list(rng.choice(FILLERS, rng.integers(3, 10)))
        label = int(rng.integers(2))
        words.insert(int(rng.integers(len(words) + 1)), "good" if label else "bad")
        texts.append(" ".join(words))
        labels.append(label)
    encoding = tokenizer(texts, padding=True, return_token_type_ids=True, return_tensors="pt")
    return Features(encoding, labels=torch.tensor(labels))


def accuracy(prediction):
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((logits.argmax(-1) == labels).mean())}


def test_sequence_classification_trains_and_evaluates(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = XLNetForSequenceClassification(tiny_config(tokenizer, num_labels=2))
    trainer = Trainer(
        model=model, args=arguments(tmp_path, num_train_epochs=6), train_dataset=sentiment(tokenizer, 160, seed=0),
        eval_dataset=sentiment(tokenizer, 64, seed=1), compute_metrics=accuracy,
    )  # fmt: skip
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    losses = logged_losses(trainer)
    assert losses[-1] < 0.5 * losses[0], losses
    assert after["eval_loss"] < 0.5 * before["eval_loss"], (before, after)
    assert after["eval_accuracy"] >= 0.9, after
    # the memory the model returns in eval mode is not gathered as a prediction
    assert trainer.predict(sentiment(tokenizer, 8, seed=2)).predictions.shape == (8, 2)


# ---------------------------------------------------------------------------------------------------------------
# Question answering with the beam answer head
# ---------------------------------------------------------------------------------------------------------------


def animal_questions(tokenizer, count, seed):
    """Context: fillers with two "animal color" pairs; question: one of the two animals; answer: its pair.

    Returns `(labelled, unlabelled, answers)`: features with start / end positions (for the loss), the same without
    them (so that the head returns its beam), and the gold (start, end) token positions.
    """
    rng = np.random.default_rng(seed)
    questions, contexts, answer_chars = [], [], []
    for _ in range(count):
        words = list(rng.choice(FILLERS, rng.integers(4, 10)))
        animals, colors = rng.choice(ANIMALS, 2, replace=False), rng.choice(COLORS, 2, replace=False)
        slots = sorted(rng.integers(len(words) + 1, size=2), reverse=True)  # the later first: pairs stay whole
        for at, animal, color in zip(slots, animals, colors):
            words[at:at] = [animal, color]
        asked = int(rng.integers(2))
        context = " ".join(words)
        answer = f"{animals[asked]} {colors[asked]}"
        questions.append(str(animals[asked]))
        contexts.append(context)
        answer_chars.append((context.index(answer), context.index(answer) + len(answer)))

    encoding = tokenizer(
        questions, contexts, padding=True, return_token_type_ids=True, return_offsets_mapping=True,
        return_tensors="pt",
    )  # fmt: skip
    offsets = encoding.pop("offset_mapping")
    starts, ends, p_mask = [], [], []
    for row, (first, last) in enumerate(answer_chars):
        in_context = torch.tensor([sequence == 1 for sequence in encoding.sequence_ids(row)])
        starts.append(int((in_context & (offsets[row, :, 0] == first)).nonzero()[0]))
        ends.append(int((in_context & (offsets[row, :, 1] == last)).nonzero()[0]))
        # answers may only lie in the context (the classification token stays allowed, for "no answer")
        p_mask.append((~in_context & (encoding["input_ids"][row] != tokenizer.cls_token_id)).float())
    p_mask = torch.stack(p_mask)
    answers = torch.tensor([starts, ends]).T
    labelled = Features(encoding, p_mask=p_mask, start_positions=answers[:, 0], end_positions=answers[:, 1])
    return labelled, Features(encoding, p_mask=p_mask), answers


def exact_match(trainer, unlabelled, answers):
    """Share of examples whose best beam span is exactly the gold span."""
    start_top_probs, start_top_index, end_top_probs, end_top_index, _ = trainer.predict(unlabelled).predictions
    starts, ends, _ = best_spans(start_top_probs, start_top_index, end_top_probs, end_top_index, max_answer_length=5)
    return float(((starts == answers[:, 0]) & (ends == answers[:, 1])).float().mean())


def test_question_answering_with_the_beam_head_trains_and_evaluates(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = XLNetForQuestionAnswering(tiny_config(tokenizer, start_n_top=3, end_n_top=3))
    train, _, _ = animal_questions(tokenizer, 192, seed=0)
    evaluation, unlabelled, answers = animal_questions(tokenizer, 64, seed=1)
    args = arguments(tmp_path, num_train_epochs=12, per_device_train_batch_size=8, learning_rate=5e-3)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation)
    before = trainer.evaluate()["eval_loss"], exact_match(trainer, unlabelled, answers)
    trainer.train()
    after = trainer.evaluate()["eval_loss"], exact_match(trainer, unlabelled, answers)
    losses = logged_losses(trainer)
    assert losses[-1] < 0.5 * losses[0], losses
    assert after[0] < 0.5 * before[0], (before, after)
    assert after[1] >= 0.8 and after[1] > before[1] + 0.5, (before, after)


def test_best_spans_equal_the_exhaustive_search_over_the_beam():
    """The best (start, end) read from the head's beam layout equals a search over the same candidates computed
    from the head's own start / end logits."""
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=50, d_model=16, n_head=2, d_inner=32, n_layer=1, start_n_top=4, end_n_top=3)
    model = XLNetForQuestionAnswering(config).eval()
    input_ids = torch.randint(9, 50, (6, 12))
    with torch.no_grad():
        out = model(input_ids)
        hidden = model.transformer(input_ids).last_hidden_state
        start_probs = model.start_logits(hidden).softmax(-1)
    starts, ends, scores = best_spans(
        out.start_top_log_probs, out.start_top_index, out.end_top_log_probs, out.end_top_index, max_answer_length=4
    )
    for row in range(6):
        best = (-1.0, -1, -1)
        for start in out.start_top_index[row].tolist():
            start_state = hidden[row : row + 1, start : start + 1].expand(1, 12, -1)
            with torch.no_grad():
                end_probs = model.end_logits(hidden[row : row + 1], start_states=start_state).softmax(-1)[0]
            for end in end_probs.topk(3).indices.tolist():
                if start <= end < start + 4:
                    best = max(best, (float(start_probs[row, start] * end_probs[end]), start, end))
        assert (starts[row].item(), ends[row].item()) == best[1:]
        assert scores[row].item() == pytest.approx(max(best[0], 0.0), rel=1e-5)


def test_best_spans_reports_no_span_and_bad_layouts():
    starts = torch.tensor([[5, 3]])
    ends = torch.tensor([[1, 2, 0, 1]])  # every end before its start
    probs = torch.full((1, 4), 0.5)
    found_starts, found_ends, scores = best_spans(torch.tensor([[0.6, 0.4]]), starts, probs, ends)
    assert found_starts.tolist() == [-1] and found_ends.tolist() == [-1] and scores.tolist() == [0.0]
    with pytest.raises(ValueError, match="multiple of start_n_top"):
        best_spans(torch.tensor([[0.6, 0.4]]), starts, torch.full((1, 3), 0.5), torch.tensor([[1, 2, 3]]))
