"""LoRA (peft) on both models: adapters reach every projection, train alone, save / load and merge; each layer's
weights are used only inside that layer's forward (what hooks on a layer, FSDP's unsharding or an adapter, need);
Transformer-XL's tied adaptive softmax stays out of `all-linear` and intact under merging."""

import pytest
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import Trainer, TrainingArguments

from transformers_xl import (
    TransfoXLConfig,
    TransfoXLLMHeadModel,
    XLNetConfig,
    XLNetForSequenceClassification,
    XLNetLMHeadModel,
)
from transformers_xl.training import MemoryTrainer, TextStream


def tiny_transfo_xl(**overrides):
    torch.manual_seed(0)
    config = TransfoXLConfig(
        vocab_size=40, cutoffs=[20], d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=24, n_layer=2, mem_len=4,
        eos_token_id=None, pad_token_id=0, **overrides,
    )  # fmt: skip
    return TransfoXLLMHeadModel(config).eval()


def tiny_xlnet(**overrides):
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=40, d_model=16, n_head=2, d_inner=24, n_layer=2, mem_len=4, pad_token_id=0,
                         **overrides)  # fmt: skip
    return XLNetLMHeadModel(config).eval()


def ids(length=6, seed=0):
    return torch.randint(1, 40, (2, length), generator=torch.Generator().manual_seed(seed))


# ----- each layer's weights are used inside its forward only -----


def projections_used_outside_their_layer(model, run):
    """Indices of the layers whose position projection (`project_positions`) ran outside the layer's forward."""
    layers = model.transformer.layers if isinstance(model, TransfoXLLMHeadModel) else model.transformer.layer
    outside, running = [], set()
    for index, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda module, args, i=index: running.add(i))
        layer.register_forward_hook(lambda module, args, output, i=index: running.discard(i))
        attention = layer.dec_attn if isinstance(model, TransfoXLLMHeadModel) else layer.rel_attn
        project = attention.project_positions

        def recorded(encodings, i=index, project=project):
            if i not in running:
                outside.append(i)
            return project(encodings)

        attention.project_positions = recorded
    run(model)
    return outside


def forward_then_decode(model, static):
    model(ids(), **({"use_mems": True} if isinstance(model, XLNetLMHeadModel) else {}))  # projected per forward
    cache = {"cache_implementation": "static"} if static else {}
    model.generate(ids(3), max_new_tokens=3, do_sample=False, **cache)  # memoised: the prompt, the ring, the steps


@pytest.mark.parametrize("make_model", [tiny_transfo_xl, tiny_xlnet])
@pytest.mark.parametrize("static", [False, True])
def test_position_projections_run_inside_their_layers_forward(make_model, static):
    """The sinusoid encodings are made once per forward, but each layer projects them itself (also where the projection
    is memoised: the default cache's table, the static cache's ring), so hooks on a layer see all its weights' uses."""
    model = make_model()
    with torch.no_grad():
        assert projections_used_outside_their_layer(model, lambda m: forward_then_decode(m, static)) == []


# ----- LoRA on both models -----


def tiny_classifier():
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=40, d_model=16, n_head=2, d_inner=24, n_layer=2, mem_len=4, num_labels=3)
    return XLNetForSequenceClassification(config).eval()


# Each model family: its language model, its layers, the modules named as targets and the submodules they reach.
FAMILIES = {
    "transfo-xl": (tiny_transfo_xl, "transformer.layers", ["qkv_net", "o_net", "r_net", "CoreNet.0", "CoreNet.3"],
                   ["dec_attn.qkv_net", "dec_attn.o_net", "dec_attn.r_net", "pos_ff.CoreNet.0", "pos_ff.CoreNet.3"]),
    "xlnet": (tiny_xlnet, "transformer.layer", ["q", "k", "v", "o", "r", "layer_1", "layer_2"],
              ["rel_attn.q", "rel_attn.k", "rel_attn.v", "rel_attn.o", "rel_attn.r", "ff.layer_1", "ff.layer_2"]),
}  # fmt: skip


def lora(model, targets, **kwargs):
    """`model` with rank-2 adapters that start away from zero (so that they change the outputs)."""
    return get_peft_model(model, LoraConfig(target_modules=targets, r=2, init_lora_weights=False, **kwargs))


def adapted_modules(model):
    return {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}


def train_args(tmp_path):
    return TrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=2, max_steps=3, learning_rate=0.1,
        report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no", seed=0, disable_tqdm=True,
        dataloader_num_workers=0,
    )  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("trainer_class", [Trainer, MemoryTrainer])
def test_training_with_adapters_changes_only_the_adapters(family, trainer_class, tmp_path):
    """Every attention projection (the position projection too) and feed-forward layer takes an adapter by name; a
    few steps of Trainer, or of MemoryTrainer (which carries the memory), change the adapters and nothing else."""
    make_model, layers, targets, reached = FAMILIES[family]
    model = lora(make_model(), targets)
    expected = {f"base_model.model.{layers}.{i}.{part}" for i in range(2) for part in reached}
    assert adapted_modules(model) == expected
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    if trainer_class is Trainer:
        rows = [{"input_ids": row, "labels": row} for row in ids(6, seed=1).repeat(3, 1)]
        trainer = Trainer(model=model, args=train_args(tmp_path), train_dataset=rows)
    else:
        stream = TextStream(torch.randint(1, 40, (2 * 4 * 6,), generator=torch.Generator().manual_seed(0)), 2, 6)
        trainer = MemoryTrainer(model=model, args=train_args(tmp_path), train_dataset=stream)
    trainer.train()
    touched = {name for name, p in model.named_parameters() if not torch.equal(before[name], p.detach())}
    assert {name.rsplit(".lora_", 1)[0] for name in touched} == expected
    assert all(".lora_" in name for name in touched)


@pytest.mark.parametrize("family", FAMILIES)
def test_adapters_save_load_and_merge(family, tmp_path):
    """An adapter saved alone reloads onto a fresh base model with the same logits; merged, the model equals the
    adapted one."""
    make_model, layers, targets, reached = FAMILIES[family]
    model = lora(make_model(), targets)
    assert adapted_modules(model) == {f"base_model.model.{layers}.{i}.{part}" for i in range(2) for part in reached}
    inputs = ids()
    with torch.no_grad():
        adapted = model(inputs).logits
        assert not torch.allclose(adapted, make_model()(inputs).logits)
    model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(make_model(), tmp_path / "adapter").eval()
    merged = model.merge_and_unload()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(inputs).logits, adapted)
        torch.testing.assert_close(merged(inputs).logits, adapted, atol=1e-5, rtol=1e-5)


def test_a_merged_xlnet_loads_in_transformers_xlnet(tmp_path):
    """A merged classifier saves transformers' names and layout (`rel_attn.q` [d_model, n_head, d_head]: its
    `checkpoint_state_dict()`; its `state_dict()` names its parameters, as FSDP and DCP need) and loads in transformers' own XLNetForSequenceClassification, and in ours, with its logits."""
    model = lora(tiny_classifier(), FAMILIES["xlnet"][2], task_type="SEQ_CLS")
    assert {name.rsplit(".", 1)[-1] for name in adapted_modules(model)} == set(FAMILIES["xlnet"][2])
    inputs = ids()
    with torch.no_grad():
        adapted = model(inputs).logits
    merged = model.merge_and_unload()
    assert merged.checkpoint_state_dict()["transformer.layer.0.rel_attn.q"].shape == (16, 2, 8)
    assert merged.state_dict().keys() == dict(merged.named_parameters()).keys() | dict(merged.named_buffers()).keys()
    merged.save_pretrained(tmp_path)
    theirs = transformers.XLNetForSequenceClassification.from_pretrained(tmp_path).eval()
    ours = XLNetForSequenceClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        for loaded in (merged, theirs, ours):
            torch.testing.assert_close(loaded(inputs).logits, adapted, atol=1e-5, rtol=1e-5)


def test_xlnet_target_parameters_reach_the_projection_weights():
    """peft's `target_parameters` adapt the projections' weights too (before, it wrapped the attention module
    itself, whose other methods the model calls); merged, the model equals the adapted one."""
    model = get_peft_model(tiny_classifier(), LoraConfig(
        target_parameters=[f"rel_attn.{p}.weight" for p in "qkvor"], r=2, init_lora_weights=False))  # fmt: skip
    inputs = ids()
    with torch.no_grad():
        adapted = model(inputs).logits
        assert not torch.allclose(adapted, tiny_classifier()(inputs).logits)
        torch.testing.assert_close(model.merge_and_unload()(inputs).logits, adapted, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("div_val, tie_weight, tie_projs", [(1, True, [False, False]), (2, True, [False, True]),
                                                          (2, False, [False, False])])  # fmt: skip
def test_all_linear_leaves_the_softmax_out_and_merging_keeps_the_embedding(div_val, tie_weight, tie_projs):
    """`target_modules="all-linear"` adapts every linear layer but the adaptive softmax's, every cluster's (tied to
    the input embedding, as peft leaves out GPT-2's lm_head; with div_val > 1 the tail clusters' too): merging then
    changes no embedding, ties stay, and the merged model equals the adapted one. Naming one is refused."""
    base = tiny_transfo_xl(div_val=div_val, tie_weight=tie_weight, tie_projs=tie_projs)
    embedding = {k: v.clone() for k, v in base.transformer.word_emb.state_dict().items()}
    model = lora(base, "all-linear")
    assert adapted_modules(model) and not any(".crit." in name for name in adapted_modules(model))
    inputs = ids()
    with torch.no_grad():
        adapted = model(inputs).logits
        merged = model.merge_and_unload()
        torch.testing.assert_close(merged(inputs).logits, adapted, atol=1e-5, rtol=1e-5)
    for name, tensor in merged.transformer.word_emb.state_dict().items():
        assert torch.equal(tensor, embedding[name]), name
    for i, layer in enumerate(merged.crit.out_layers):
        assert (layer.weight is merged.transformer.word_emb.emb_layers[i].weight) == tie_weight
    with pytest.raises(ValueError, match="SoftmaxLayer"):
        lora(tiny_transfo_xl(div_val=div_val), ["crit.out_layers.0"])
