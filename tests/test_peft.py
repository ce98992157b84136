"""LoRA (peft) on both models: adapters reach every projection, train alone, save / load and merge; each layer's
weights are used only inside that layer's forward (what hooks on a layer, FSDP's unsharding or an adapter, need);
Transformer-XL's tied adaptive softmax stays out of `all-linear` and intact under merging."""

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import Trainer, TrainingArguments

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel
from transformers_xl.training import MemoryTrainer, TextStream

TRANSFO_XL_TARGETS = ["qkv_net", "o_net", "r_net", "CoreNet.0", "CoreNet.3"]


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
