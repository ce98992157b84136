"""Transformer-XL: parity with transformers 4.37.2 on committed fixtures, recurrence, loading machinery, bad input."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from transformers_xl import (
    TransfoXLConfig,
    TransfoXLForSequenceClassification,
    TransfoXLLMHeadModel,
    TransfoXLModel,
)
from weights import perturbed

FIXTURES = Path(__file__).parent / "fixtures" / "transfo_xl"
CASES = json.loads((FIXTURES / "cases.json").read_text())["cases"]
SEGMENT = 5


def tiny_config(**overrides):
    values = dict(
        vocab_size=90,
        cutoffs=[20, 50],
        d_model=32,
        d_embed=32,
        n_head=4,
        d_head=8,
        d_inner=48,
        div_val=2,
        n_layer=2,
        mem_len=6,
        tgt_len=6,
        clamp_len=-1,
        same_length=False,
        dropout=0.0,
        dropatt=0.0,
    )
    values.update(overrides)
    return TransfoXLConfig(**values)


def tiny_lm(seed=0, **overrides):
    torch.manual_seed(seed)
    return TransfoXLLMHeadModel(tiny_config(**overrides)).eval()


def scrambled(model, std=0.3):
    """Large random weights, so that position terms visibly change the outputs (fresh init makes them tiny)."""
    return perturbed(model, std)


def random_ids(batch, length, vocab=90, seed=1):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- parity with the legacy implementation ---------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_legacy_parity_over_three_segments(case):
    folder = FIXTURES / case["name"]
    expected_folder = FIXTURES / case["name"].replace("_safetensors", "")
    expected = load_file(expected_folder / "expected.safetensors")
    # zero_initial_mems reproduces the legacy start from mem_len zero vectors.
    model, info = AutoModelForCausalLM.from_pretrained(folder, zero_initial_mems=True, output_loading_info=True)
    assert isinstance(model, TransfoXLLMHeadModel)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    model.eval()
    ids, mems = expected["input_ids"], None
    with torch.no_grad():
        for k in range(3):
            segment = ids[:, k * SEGMENT : (k + 1) * SEGMENT]
            out = model(segment, mems=mems)
            torch.testing.assert_close(out.logits, expected[f"seg{k}.logprobs"], atol=1e-5, rtol=0)
            for i, mem in enumerate(out.mems):
                torch.testing.assert_close(mem, expected[f"seg{k}.mems.{i}"], atol=1e-5, rtol=0)
            base = model.transformer(segment, mems=mems)
            torch.testing.assert_close(base.last_hidden_state, expected[f"seg{k}.hidden"], atol=1e-5, rtol=0)
            with_labels = model(segment, mems=mems, labels=segment)
            torch.testing.assert_close(with_labels.loss, expected[f"seg{k}.loss"], atol=1e-5, rtol=0)
            torch.testing.assert_close(with_labels.losses.sum(), expected[f"seg{k}.losses_sum"], atol=1e-4, rtol=0)
            assert with_labels.losses.shape == (2, SEGMENT - 1)
            mems = out.mems


def test_deduplicated_safetensors_are_retied():
    model = AutoModelForCausalLM.from_pretrained(FIXTURES / "div2_clusters_safetensors")
    word_emb, crit = model.transformer.word_emb, model.crit
    for i in range(4):
        assert crit.out_layers[i].weight is word_emb.emb_layers[i].weight
    assert crit.out_projs[1] is word_emb.emb_projs[1] and crit.out_projs[3] is word_emb.emb_projs[3]
    assert crit.out_projs[0] is not word_emb.emb_projs[0] and crit.out_projs[2] is not word_emb.emb_projs[2]


def test_log_prob_matches_nll_for_every_cluster():
    model = tiny_lm(cutoffs=[20, 40, 70], div_val=2)
    hidden = torch.randn(40, 32)
    targets = torch.arange(0, 90, 90 // 40)[:40]
    log_probs = model.crit.log_prob(hidden)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(40), atol=1e-5, rtol=0)
    torch.testing.assert_close(model.crit.nll(hidden, targets), -log_probs.gather(1, targets[:, None])[:, 0])


# --- recurrence ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attn_type", [0, 1])
def test_segments_with_memory_equal_one_pass(attn_type):
    model = tiny_lm(mem_len=12, tgt_len=12, attn_type=attn_type, pre_lnorm=attn_type == 1)
    ids = random_ids(2, 12)
    with torch.no_grad():
        full = model(ids)
        mems, pieces = None, []
        for start in range(0, 12, 4):
            out = model(ids[:, start : start + 4], mems=mems)
            pieces.append(out.logits)
            mems = out.mems
    torch.testing.assert_close(torch.cat(pieces, 1), full.logits, atol=1e-5, rtol=0)
    assert mems[0].shape == (12, 2, 32)


def test_memory_is_bounded_and_starts_empty():
    model = tiny_lm(mem_len=3)
    out = model(random_ids(2, 2))
    assert out.mems[0].shape == (2, 2, 32)  # grows from empty
    out = model(random_ids(2, 5), mems=out.mems)
    assert len(out.mems) == 2 and out.mems[1].shape == (3, 2, 32)
    assert model(random_ids(2, 4), mems=None).mems[0].shape[0] == 3
    assert tiny_lm(mem_len=0)(random_ids(2, 4)).mems is None


@pytest.mark.parametrize("attn_type", [0, 1, 2, 3])
def test_every_attention_type_is_causal_and_trains(attn_type):
    model = tiny_lm(attn_type=attn_type).train()
    ids = random_ids(2, 6)
    changed = ids.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 90
    model.eval()
    with torch.no_grad():
        first = model(ids[:, :3])
        a, b = model(ids, mems=first.mems).logits, model(changed, mems=first.mems).logits
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for n, p in model.named_parameters() if "out_projs.0" not in n)


def test_no_gradient_flows_into_memory():
    model = tiny_lm().train()
    out = model(random_ids(2, 4), labels=random_ids(2, 4))
    assert all(not m.requires_grad for m in out.mems)
    second = model(random_ids(2, 4, seed=3), mems=out.mems, labels=random_ids(2, 4, seed=3))
    second.loss.backward()
    assert all(m.grad is None for m in out.mems)


def test_same_length_and_clamp_len_change_attention_span():
    plain = scrambled(tiny_lm(mem_len=4))
    ids = random_ids(1, 8)
    mems = plain(ids[:, :4]).mems
    reference = plain(ids[:, 4:], mems=mems).logits
    plain.config.same_length = True
    assert not torch.allclose(plain(ids[:, 4:], mems=mems).logits, reference)
    plain.config.same_length, plain.config.clamp_len = False, 2
    assert not torch.allclose(plain(ids[:, 4:], mems=mems).logits, reference)


# --- attention paths, precision, checkpointing -----------------------------------------------------------------


def test_fused_and_eager_attention_agree():
    model = scrambled(tiny_lm(pre_lnorm=True, same_length=True, clamp_len=3))
    ids = random_ids(2, 5)
    mems = model(ids).mems
    fused = model(ids, mems=mems)
    eager = model(ids, mems=mems, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(fused.logits, eager.logits, atol=1e-5, rtol=1e-5)
    assert len(eager.attentions) == 2 and eager.attentions[0].shape == (2, 4, 5, 10)
    assert len(eager.hidden_states) == 3
    torch.testing.assert_close(eager.attentions[0].sum(-1), torch.ones(2, 4, 5))


def test_gradient_checkpointing_gives_the_same_gradients():
    ids = random_ids(2, 6)
    grads = []
    for checkpointing in (False, True):
        model = tiny_lm(seed=4).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_with_div_val_is_finite(dtype):
    model = tiny_lm(div_val=2).to(dtype)
    ids = random_ids(2, 6)
    out = model(ids)
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
    assert all(torch.isfinite(m).all() and m.dtype == dtype for m in out.mems)
    assert torch.isfinite(model(ids, labels=ids, mems=out.mems).loss)


# --- loss conventions ------------------------------------------------------------------------------------------


def test_loss_ignores_minus_100_and_honours_num_items_in_batch():
    model = tiny_lm()
    ids = random_ids(2, 6)
    labels = ids.clone()
    labels[0, 3:] = -100
    out = model(ids, labels=labels)
    assert out.loss.dim() == 0 and out.logits is None
    assert (out.losses[0, 2:] == 0).all() and (out.losses[1] > 0).all()
    torch.testing.assert_close(out.loss, out.losses.sum() / 7)
    torch.testing.assert_close(model(ids, labels=labels, num_items_in_batch=14).loss, out.losses.sum() / 14)
    log_probs = model(ids).logits
    gathered = -log_probs[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(model(ids, labels=ids).losses, gathered, atol=1e-5, rtol=0)


@pytest.mark.parametrize("head", ["lm", "sequence classification"])
def test_a_batch_with_nothing_to_predict_has_zero_loss_and_zero_gradients(head):
    """Every label -100 (also when Trainer counts 0 labels in the whole step): a loss of 0, not 0 / 0 = NaN, which
    an optimizer step would write into every weight."""
    torch.manual_seed(0)
    if head == "lm":
        model, labels = TransfoXLLMHeadModel(tiny_config()), torch.full((2, 6), -100)
        counts = [None, 0, torch.tensor(0)]  # (the classification head takes no num_items_in_batch)
    else:
        model, labels = TransfoXLForSequenceClassification(tiny_config(num_labels=3)), torch.full((2,), -100)
        counts = [None]
    for count in counts:
        model.zero_grad()
        extra = {} if count is None else {"num_items_in_batch": count}
        loss = model(random_ids(2, 6), labels=labels, **extra).loss
        loss.backward()
        assert loss.item() == 0.0
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        assert gradients and all(not g.any() for g in gradients)


def test_sampled_softmax_trains_and_evaluates_with_the_full_softmax():
    model = tiny_lm(sample_softmax=16, div_val=1, cutoffs=[]).train()
    ids = random_ids(2, 6)
    torch.manual_seed(0)
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and model.out_bias.grad is not None
    model.eval()
    full = model(ids, labels=ids).loss
    gathered = -model(ids).logits[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    torch.testing.assert_close(full, gathered, atol=1e-5, rtol=0)
    torch.testing.assert_close(model.sampler.dist.sum(), torch.tensor(1.0))


# --- loading machinery -----------------------------------------------------------------------------------------


def test_save_then_load_is_bit_exact(tmp_path):
    model = tiny_lm(tie_projs=[False, True, False])
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / "pytorch_model.bin").exists()
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values())
    original, reloaded = model.state_dict(), loaded.state_dict()
    assert original.keys() == reloaded.keys()
    for name in original:
        assert torch.equal(original[name], reloaded[name]), name
    assert loaded.crit.out_projs[1] is loaded.transformer.word_emb.emb_projs[1]
    assert loaded.crit.out_projs[2] is not loaded.transformer.word_emb.emb_projs[2]


def test_fresh_model_is_initialised_like_the_original():
    model = tiny_lm(init_std=0.02, proj_init_std=0.01)
    attn = model.transformer.layers[0].dec_attn
    assert abs(attn.layer_norm.weight.mean().item() - 1) < 0.05 and attn.layer_norm.weight.std() > 0
    assert abs(attn.qkv_net.weight.std().item() - 0.02) < 0.005
    assert abs(model.transformer.word_emb.emb_projs[0].std().item() - 0.01) < 0.003
    assert (model.crit.cluster_bias == 0).all() and attn.r_w_bias.std() > 0
    assert torch.isfinite(torch.cat([p.flatten() for p in model.parameters()])).all()


def test_loading_options_dtype_device_map_and_base_model(tmp_path):
    folder = FIXTURES / "div2_clusters"
    bf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    assert bf16.transformer.word_emb.emb_layers[0].weight.dtype == torch.bfloat16
    mapped = AutoModelForCausalLM.from_pretrained(folder, device_map="auto")
    assert mapped.transformer.word_emb.emb_layers[0].weight.device.type == "cpu"
    base, info = AutoModel.from_pretrained(folder, output_loading_info=True)
    assert isinstance(base, TransfoXLModel) and not info["missing_keys"]
    config = AutoConfig.from_pretrained(folder)
    assert isinstance(config, TransfoXLConfig) and config.tie_projs == [False, True, False, True]


def test_sequence_classification_pools_the_last_real_token():
    torch.manual_seed(0)
    model = TransfoXLForSequenceClassification(tiny_config(num_labels=3, pad_token_id=0)).eval()
    ids = torch.randint(1, 90, (1, 5))
    reference = model(ids).logits
    pad = torch.zeros(1, 2, dtype=torch.long)
    right = model(torch.cat([ids, pad], 1), attention_mask=torch.tensor([[1] * 5 + [0] * 2])).logits
    left = model(torch.cat([pad, ids], 1), attention_mask=torch.tensor([[0] * 2 + [1] * 5])).logits
    torch.testing.assert_close(right, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(left, reference, atol=1e-5, rtol=0)
    by_pad_id = model(torch.cat([ids, pad], 1)).logits
    torch.testing.assert_close(by_pad_id, reference, atol=1e-5, rtol=0)
    out = model(ids, labels=torch.tensor([2]))
    assert out.loss.dim() == 0 and out.logits.shape == (1, 3)
    assert isinstance(AutoModelForSequenceClassification.from_config(model.config), TransfoXLForSequenceClassification)


def test_log_probabilities_are_differentiable():
    """Gradients flow through `logits` (distillation, custom losses; torch.compile traces this backward whenever
    gradients are enabled): the adaptive softmax normalises in place only without autograd."""
    model = tiny_lm()
    model(random_ids(2, 4)).logits.logsumexp(-1).sum().backward()
    assert model.transformer.word_emb.emb_projs[0].grad.abs().sum() > 0


# --- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", [90, 1000, -1])
def test_out_of_range_ids_are_refused(bad_id):
    ids = random_ids(1, 4)
    ids[0, 2] = bad_id
    with pytest.raises(ValueError, match=rf"`input_ids` has 1 value\(s\) out of range, in \[{bad_id}, {bad_id}\]; expected token ids in \[0, 89\]"):
        tiny_lm()(ids)


def test_mems_of_the_wrong_shape_are_refused():
    model = tiny_lm()
    mems = model(random_ids(2, 4)).mems
    with pytest.raises(ValueError, match="one per layer"):
        model(random_ids(2, 4), mems=mems[:1])
    with pytest.raises(ValueError, match="batch_size=3"):
        model(random_ids(3, 4), mems=mems)
    with pytest.raises(ValueError, match="d_model=32"):
        model(random_ids(2, 4), mems=tuple(m[..., :8] for m in mems))


@pytest.mark.parametrize(
    "field, value",
    [
        ("cutoffs", [50, 20]),
        ("cutoffs", [20, 90]),
        ("div_val", 0),
        ("attn_type", 7),
        ("mem_len", -1),
        ("d_model", 30),
        ("tie_projs", [True]),
    ],
)
def test_invalid_config_values_name_the_field(field, value):
    overrides = {field: value}
    if field == "d_model":
        overrides["attn_type"] = 3
    with pytest.raises(ValueError, match=f"`{field}`"):
        tiny_config(**overrides)


def test_a_fresh_model_learns_with_memory():
    """Training over consecutive segments with the memory carried (stop-gradient) lowers the loss."""
    model = tiny_lm(seed=3, dropout=0.1).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    stream = torch.arange(60).remainder(17).add(3).view(2, 30)  # a periodic sequence, learnable only across segments
    losses = []
    for _ in range(25):
        mems, total = None, 0.0
        for start in range(0, 30, 6):
            segment = stream[:, start : start + 6]
            out = model(segment, labels=segment, mems=mems)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            mems, total = out.mems, total + out.loss.item()
        losses.append(total)
    assert losses[-1] < 0.5 * losses[0]


def test_trainer_gradient_accumulation_equals_full_batch(trainer_step_update):
    """One SGD step with 2 accumulated half batches == one step on the full batch, with halves holding different
    numbers of labelled tokens (Trainer passes num_items_in_batch, counted over the shifted labels)."""
    generator = torch.Generator().manual_seed(7)
    rows = []
    for ignored in (0, 1, 3, 4):
        labels = torch.randint(0, 90, (6,), generator=generator)
        labels[1 : 1 + ignored] = -100
        rows.append({"input_ids": torch.randint(0, 90, (6,), generator=generator), "labels": labels})

    def one_step(batch_size, accumulation):
        return trainer_step_update(lambda: tiny_lm(seed=0).train(), rows, batch_size, accumulation)

    full, accumulated = one_step(4, 1), one_step(2, 2)
    model = tiny_lm(seed=0).train()  # the plain mean loss over every predicted token of the full batch
    model(torch.stack([r["input_ids"] for r in rows]), labels=torch.stack([r["labels"] for r in rows])).loss.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(full[name], param.grad, atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(full[name], accumulated[name], atol=1e-6, rtol=1e-4)
