"""Both LM heads take transformers v5's `shift_labels` (targets already shifted, -100 ignored) beside `labels`,
whose meaning is unchanged; given both, `shift_labels` win; Trainer counts and keeps them."""

import pytest
import torch
from transformers import TrainingArguments

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel
from transformers_xl.training import MemoryTrainer, TextStream

TXL = dict(
    vocab_size=90, cutoffs=[20, 50], d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=48, div_val=2, n_layer=2,
    mem_len=16, dropout=0.0,
)  # fmt: skip
XLNET = dict(vocab_size=90, d_model=32, n_head=4, d_inner=37, n_layer=2, dropout=0.0)


def transfo_xl():
    torch.manual_seed(0)
    return TransfoXLLMHeadModel(TransfoXLConfig(**TXL)).eval()


def ids(shape=(2, 7), seed=0):
    return torch.randint(90, shape, generator=torch.Generator().manual_seed(seed))


def test_transfo_xl_shift_labels_score_every_position_against_its_target():
    """Position t is scored against `shift_labels[:, t]` (the last one too), read from the log-probabilities."""
    model = transfo_xl()
    inputs, targets = ids(), ids(seed=1)
    targets[0, 2] = -100
    with torch.no_grad():
        log_probs = model(inputs).logits
        out = model(inputs, shift_labels=targets)
    expected = -log_probs.gather(2, targets.clamp(min=0)[..., None])[..., 0].where(targets != -100, 0.0)
    torch.testing.assert_close(out.losses, expected)
    torch.testing.assert_close(out.loss, expected.sum() / 13)
    assert out.logits is None and len(out.mems) == 2


def test_transfo_xl_labels_keep_their_meaning():
    """`labels` = the inputs, shifted inside: the same as `shift_labels` = labels[:, 1:] with the last position
    ignored (transformers' ForCausalLMLoss convention)."""
    model = transfo_xl()
    inputs = ids()
    shifted = torch.nn.functional.pad(inputs[:, 1:], (0, 1), value=-100)
    with torch.no_grad():
        by_labels, by_shift = model(inputs, labels=inputs), model(inputs, shift_labels=shifted)
    torch.testing.assert_close(by_labels.loss, by_shift.loss)
    torch.testing.assert_close(by_labels.losses, by_shift.losses[:, :-1])


def test_transfo_xl_legacy_tuple_with_shift_labels():
    model = transfo_xl()
    losses, empty, mems, loss = model(ids(), shift_labels=ids(seed=1), return_dict=False)
    assert losses.shape == (2, 7) and empty == () and len(mems) == 2 and loss.dim() == 0


@pytest.mark.parametrize("model_fn", [transfo_xl, lambda: XLNetLMHeadModel(XLNetConfig(**XLNET)).eval()])
def test_shift_labels_replace_labels_given_with_them(model_fn):
    """transformers' contract (its Trainer passes both under context parallelism): the loss is taken against
    `shift_labels`, whatever `labels` say."""
    model = model_fn()
    with torch.no_grad():
        alone = model(ids(), shift_labels=ids(seed=1)).loss
        with_labels = [model(ids(), labels=ids(seed=seed), shift_labels=ids(seed=1)).loss for seed in (2, 3)]
    assert torch.equal(with_labels[0], alone) and torch.equal(with_labels[1], alone)


def test_bad_shift_labels_are_named():
    model = transfo_xl()
    with pytest.raises(ValueError, match=r"`shift_labels` has shape \(2, 6\); expected \[batch_size, seq_len\]"):
        model(ids(), shift_labels=ids((2, 6)))
    with pytest.raises(ValueError, match="`shift_labels`.*vocab_size=90"):
        model(ids(), shift_labels=torch.full((2, 7), 95))
    with pytest.raises(TypeError, match="unexpected keyword argument 'shift_label'"):
        model(ids(), shift_label=ids())


def test_xlnet_shift_labels_are_its_unshifted_labels():
    """XLNet's labels are already one per output position: `shift_labels` are the same targets."""
    torch.manual_seed(0)
    model = XLNetLMHeadModel(XLNetConfig(**XLNET)).eval()
    inputs, targets = ids(), ids(seed=1)
    targets[1, 3] = -100
    with torch.no_grad():
        by_labels, by_shift = model(inputs, labels=targets), model(inputs, shift_labels=targets)
    torch.testing.assert_close(by_shift.loss, by_labels.loss)
    with pytest.raises(ValueError, match=r"`shift_labels` has shape \(2, 5\)"):
        model(inputs, shift_labels=ids((2, 5)))


def test_trainer_keeps_shift_labels_and_counts_them_under_accumulation(tmp_path):
    """With `remove_unused_columns` (the default) Trainer would drop `shift_labels` (not a named argument): the
    MemoryTrainer keeps them; `num_items_in_batch` is their count, so one optimizer step over 2 accumulated
    segments of different lengths gets the gradient of the mean over both segments' targets (not the mean of their
    means)."""
    stream = TextStream(ids((1, 19), seed=3)[0], num_rows=1, seq_len=12)  # one row: segments of 12 and 6
    model = transfo_xl()
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(dict(kwargs)), with_kwargs=True)
    args = TrainingArguments(
        str(tmp_path), per_device_train_batch_size=1, gradient_accumulation_steps=2, max_steps=1, learning_rate=1.0,
        optim="sgd", lr_scheduler_type="constant", max_grad_norm=0, report_to=[], use_cpu=True, save_strategy="no",
        disable_tqdm=True,
    )  # fmt: skip
    reference = transfo_xl()
    MemoryTrainer(model=model, args=args, train_dataset=stream).train()
    assert [set(call) >= {"input_ids", "shift_labels"} for call in seen] == [True, True]
    assert [int(call["num_items_in_batch"]) for call in seen] == [18, 18]
    # The same SGD step by hand: the summed NLL of both segments (memory carried, detached) over 18 targets.
    reference.train()
    first = reference(stream[0]["input_ids"][None], shift_labels=stream[0]["shift_labels"][None])
    second = reference(
        stream[1]["input_ids"][None], shift_labels=stream[1]["shift_labels"][None],
        mems=tuple(m.detach() for m in first.mems),
    )  # fmt: skip
    ((first.losses.sum() + second.losses.sum()) / 18).backward()
    with torch.no_grad():
        for parameter in reference.parameters():
            if parameter.grad is not None:
                parameter -= parameter.grad
    for ours, expected in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)
