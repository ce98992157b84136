"""MemoryTrainer: the memory a step is fed is the one the previous step of the same stream returned (values, not
just presence), with and without gradient accumulation; evaluation has its own memory and token-weighted metrics;
a resume continues the same streams with the same memory; the loss falls."""

import copy
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainingArguments
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers_xl.training import MemoryTrainer, TextStream

VOCAB = 40


def tiny_lm(seed=0, mem_len=8):
    torch.manual_seed(seed)
    config = TransfoXLConfig(
        vocab_size=VOCAB, cutoffs=[], adaptive=False, div_val=1, d_model=32, d_embed=32, n_head=2, d_head=16,
        d_inner=64, n_layer=2, mem_len=mem_len, tgt_len=6, clamp_len=-1, same_length=False, dropout=0.0,
        dropatt=0.0,
    )  # fmt: skip
    return TransfoXLLMHeadModel(config)


def training_args(output_dir, **overrides):
    values = dict(
        output_dir=str(output_dir), per_device_train_batch_size=2, per_device_eval_batch_size=2, learning_rate=1e-2,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
    )  # fmt: skip
    values.update(overrides)
    return TrainingArguments(**values)


def stream(length=2 * 18, seq_len=6, seed=0, **kwargs):
    """Two rows of random tokens (3 segments of 6 per row by default)."""
    ids = torch.randint(VOCAB, (length,), generator=torch.Generator().manual_seed(seed))
    return TextStream(ids, num_rows=2, seq_len=seq_len, **kwargs)


class Recorder:
    """Every forward of `model`: mode, input ids, the mems it was fed (copied before it runs) and returned."""

    def __init__(self, model):
        self.calls = []
        model.register_forward_pre_hook(self.before, with_kwargs=True)
        model.register_forward_hook(self.after, with_kwargs=True)

    def before(self, module, args, kwargs):
        mems = kwargs.get("mems")
        self.calls.append(
            {
                "training": module.training,
                "input_ids": kwargs["input_ids"].clone(),
                "mems_in": None if mems is None else [m.clone() for m in mems],
                "mems_in_grad": mems is not None and any(m.requires_grad for m in mems),
            }
        )

    def after(self, module, args, kwargs, output):
        self.calls[-1]["mems_out"] = [m.clone() for m in output.mems]


def assert_chained(calls):
    """Call k is fed exactly what call k-1 returned (detached), and reads the next tokens of the same rows."""
    assert calls[0]["mems_in"] is None
    for previous, call in zip(calls, calls[1:]):
        assert call["mems_in"] is not None and not call["mems_in_grad"]
        for fed, returned in zip(call["mems_in"], previous["mems_out"], strict=True):
            assert torch.equal(fed, returned)


@pytest.mark.parametrize("accumulation", [1, 3])
def test_each_step_is_fed_the_previous_steps_memory(tmp_path, accumulation):
    """Two epochs of 3 segments: within an epoch the memory chains through every (micro-)batch, whether one
    optimizer step takes one segment or all three; each epoch starts empty."""
    data = stream()
    model = tiny_lm()
    initial = copy.deepcopy(model)
    recorder = Recorder(model)
    args = training_args(tmp_path, num_train_epochs=2, gradient_accumulation_steps=accumulation)
    MemoryTrainer(model=model, args=args, train_dataset=data).train()
    calls = recorder.calls
    assert len(calls) == 6 and all(call["training"] for call in calls)
    for epoch in (calls[:3], calls[3:]):
        assert_chained(epoch)
        for segment, call in enumerate(epoch):  # segment t of rows 0 and 1
            assert torch.equal(call["input_ids"], torch.stack([data[2 * segment + row]["input_ids"] for row in (0, 1)]))
    # What is carried is the previous segment: layer 0's memory is the first segment's embedding (first step's
    # weights), time-major.
    embedded = initial.transformer.word_emb(calls[0]["input_ids"]).transpose(0, 1)
    assert torch.allclose(calls[1]["mems_in"][0], embedded, atol=1e-6)


def test_evaluation_has_its_own_memory_and_leaves_trainings_alone(tmp_path):
    data, held_out = stream(length=2 * 30), stream(seed=1)
    model = tiny_lm()
    recorder = Recorder(model)
    args = training_args(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=2)
    MemoryTrainer(model=model, args=args, train_dataset=data, eval_dataset=held_out).train()
    modes = "".join("t" if call["training"] else "e" for call in recorder.calls)
    assert modes == "tt" + "eee" + "tt" + "eee"
    train = [call for call in recorder.calls if call["training"]]
    assert_chained(train)  # training step 3 continues step 2 across the evaluation
    assert_chained(recorder.calls[2:5]) and assert_chained(recorder.calls[7:10])  # each evaluation starts empty


def original_eval_loss(model, token_ids, num_rows, lengths):
    """The original `eval.py` loop written out on the same weights: `LMOrderedIterator` cuts the ids into
    `num_rows` rows (tail dropped) and serves `data = x[i:i+L]`, `target = x[i+1:i+1+L]` with L = min(bptt,
    n_step - 1 - i); the memory is carried; loss = sum(seq_len x segment mean NLL) / sum(seq_len). The NLL is read
    from the model's log-probabilities (no labels passed: not the loss code under test)."""
    model.eval()
    n_step = len(token_ids) // num_rows
    rows = torch.as_tensor(token_ids)[: n_step * num_rows].view(num_rows, n_step)
    total_loss, total_len, mems, i = 0.0, 0, None, 0
    with torch.no_grad():
        for bptt in lengths:
            if i >= n_step - 1:
                break
            seq_len = min(bptt, n_step - 1 - i)
            data, target = rows[:, i : i + seq_len], rows[:, i + 1 : i + 1 + seq_len]
            out = model(input_ids=data, mems=mems)
            segment_mean = -out.logits.gather(2, target[..., None]).mean().item()
            total_loss, total_len, mems, i = total_loss + seq_len * segment_mean, total_len + seq_len, out.mems, i + seq_len
    assert i == n_step - 1  # every token of a row but its first was a target
    return total_loss / total_len


@pytest.mark.parametrize("varlen", [False, True])
def test_evaluation_reports_the_original_protocols_loss_perplexity_and_bits(tmp_path, varlen):
    """`eval_loss` is eval.py's loss on the same weights; with varlen the segments have different lengths (the
    original's loop given the same lengths)."""
    ids = torch.randint(VOCAB, (2 * 100 + 1,), generator=torch.Generator().manual_seed(2))
    held_out = TextStream(ids, num_rows=2, seq_len=6, varlen=varlen, seed=2)
    model = tiny_lm()
    metrics = MemoryTrainer(model=model, args=training_args(tmp_path), eval_dataset=held_out).evaluate()
    lengths = [end - start for start, end in zip(held_out.starts, held_out.ends)]
    assert varlen == (len(set(lengths[:-1])) > 1)
    expected = original_eval_loss(model, ids, 2, lengths if varlen else [6] * 100)
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-6)
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(expected), rel=1e-6)
    assert metrics["eval_bits_per_token"] == pytest.approx(expected / math.log(2), rel=1e-6)


def test_loss_falls_on_tiny_data(tmp_path):
    """A 20-token phrase repeated: a segment of 6 sees at most 6 of it, the memory shows the rest."""
    phrase = torch.randint(VOCAB, (20,), generator=torch.Generator().manual_seed(5))
    ids = phrase.repeat(40)
    train, held_out = TextStream(ids[:600], 2, 6), TextStream(ids[600:], 2, 6)
    trainer = MemoryTrainer(
        model=tiny_lm(), args=training_args(tmp_path, max_steps=80, learning_rate=1e-2, warmup_steps=5),
        train_dataset=train, eval_dataset=held_out,
    )  # fmt: skip
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert before > math.log(VOCAB) - 0.5 and after < 0.3 * before


def test_resume_continues_the_same_streams_with_the_same_memory(tmp_path):
    """Stop after step 4 (one step into epoch 2) and resume: steps 5 and 6 read the same segments and are fed the
    same memory as in the uninterrupted run. The end-of-epoch checkpoint holds no memory: epochs start empty."""
    data = stream()

    def run(resume=None):
        model = tiny_lm(seed=1 if resume else 0)  # a resume takes the checkpoint's weights
        recorder = Recorder(model)
        args = training_args(tmp_path, max_steps=6, save_strategy="steps", save_steps=2)
        MemoryTrainer(model=model, args=args, train_dataset=data).train(resume_from_checkpoint=resume)
        return recorder.calls

    full = run()
    saved = [(tmp_path / f"checkpoint-{step}" / "memory-rank0.safetensors").is_file() for step in (2, 4, 6)]
    assert saved == [True, True, False]
    resumed = run(resume=str(tmp_path / "checkpoint-4"))
    assert len(resumed) == 2
    for again, original in zip(resumed, full[4:], strict=True):
        assert torch.equal(again["input_ids"], original["input_ids"])
        for name in ("mems_in", "mems_out"):
            for a, b in zip(again[name], original[name], strict=True):
                assert torch.allclose(a, b, atol=1e-6)


def test_checkpoints_are_complete_or_absent_and_a_resume_skips_incomplete_ones(tmp_path):
    """Checkpoints are staged in .partial and renamed when complete; `resume_from_checkpoint=True` skips (and names)
    a later checkpoint that lost a file, and an incomplete checkpoint named explicitly is refused."""
    args = training_args(tmp_path, max_steps=6, save_strategy="steps", save_steps=2)
    MemoryTrainer(model=tiny_lm(), args=args, train_dataset=stream()).train()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("checkpoint", ".partial"))) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6",
    ]  # fmt: skip
    (tmp_path / "checkpoint-6" / "optimizer.pt").unlink()
    trainer = MemoryTrainer(model=tiny_lm(seed=1), args=args, train_dataset=stream())
    logger = logging.get_logger("transformers_xl.training.memory_trainer")
    with CaptureLogger(logger) as captured:
        trainer.train(resume_from_checkpoint=True)
    assert f"skipped the incomplete checkpoint {tmp_path / 'checkpoint-6'} (no optimizer.pt)" in captured.out
    assert trainer.state.global_step == 6 and (tmp_path / "checkpoint-6" / "optimizer.pt").is_file()  # (saved again)
    (tmp_path / "checkpoint-6" / "scheduler.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="checkpoint-6 is incomplete \\(scheduler.pt has 0 bytes"):
        MemoryTrainer(model=tiny_lm(), args=args, train_dataset=stream()).train(str(tmp_path / "checkpoint-6"))


@pytest.mark.parametrize("untied_before_resume", [False, True])
def test_resume_restores_the_tied_output_layer_without_a_missing_keys_warning(tmp_path, untied_before_resume):
    """save_pretrained leaves the output layer out of the checkpoint: it is the embedding table's own tensor. A
    resume restores it with the embedding, tied (again, if something untied it), and warns of no missing key."""
    data = stream()
    MemoryTrainer(model=tiny_lm(), args=training_args(tmp_path, max_steps=2, save_steps=2, save_strategy="steps"),
                  train_dataset=data).train()  # fmt: skip
    checkpoint = tmp_path / "checkpoint-2"
    saved = load_file(checkpoint / "model.safetensors")
    assert "crit.out_layers.0.weight" not in saved
    model = tiny_lm(seed=1)
    if untied_before_resume:
        model.crit.out_layers[0].weight = torch.nn.Parameter(model.crit.out_layers[0].weight.detach().clone())
    trainer = MemoryTrainer(model=model, args=training_args(tmp_path, max_steps=2), train_dataset=data)
    with CaptureLogger(logging.get_logger("transformers.trainer")) as log:
        trainer.train(resume_from_checkpoint=str(checkpoint))  # (no step left: the weights are the checkpoint's)
    assert "missing keys" not in log.out
    assert model.crit.out_layers[0].weight is model.transformer.word_emb.emb_layers[0].weight
    assert torch.equal(model.crit.out_layers[0].weight, saved["transformer.word_emb.emb_layers.0.weight"])


def test_a_stream_with_the_wrong_number_of_rows_is_refused(tmp_path):
    args = training_args(tmp_path, max_steps=1, per_device_train_batch_size=3)
    trainer = MemoryTrainer(model=tiny_lm(), args=args, train_dataset=stream())
    with pytest.raises(ValueError, match=r"TextStream has 2 rows but a step takes 3 .*num_rows=3"):
        trainer.train()


def test_fsdp_that_accelerate_would_not_shard_is_refused(tmp_path, monkeypatch):
    """`accelerate launch --use_fsdp` where accelerate does not shard (a CPU, or no launcher) would otherwise run DDP
    or a lone process, each holding the whole model, without a word."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match=r"FSDP was requested, but accelerate prepares this run as NO \(it shards"):
        MemoryTrainer(model=tiny_lm(), args=training_args(tmp_path), train_dataset=stream())
