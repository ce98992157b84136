"""The released checkpoints' configs (hub_configs/) load unchanged and build models of the released shapes."""

from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoConfig

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel

HUB_CONFIGS = Path(__file__).parent.parent / "hub_configs"


def test_transfo_xl_wt103_builds_the_released_model():
    config = AutoConfig.from_pretrained(HUB_CONFIGS / "transfo-xl-wt103")
    assert isinstance(config, TransfoXLConfig) and config.tie_projs == [False, True, True, True]
    with torch.device("meta"):
        model = TransfoXLLMHeadModel(config)
    state = model.state_dict()
    # The legacy file's key count and sizes (shared/reference/legacy-formats.md, section 1).
    assert sum(t.numel() for t in state.values()) == 322_473_658
    assert sum(p.numel() for p in model.parameters()) == 285_205_322  # tied tensors counted once
    shapes = {
        "transformer.word_emb.emb_layers.3.weight": (67735, 16),
        "transformer.word_emb.emb_projs.2": (1024, 64),
        "transformer.layers.17.dec_attn.qkv_net.weight": (3072, 1024),
        "transformer.layers.0.dec_attn.r_w_bias": (16, 64),
        "transformer.pos_emb.inv_freq": (512,),
        "crit.cluster_weight": (3, 1024),
        "crit.out_projs.0": (1024, 1024),
    }
    assert {name: tuple(state[name].shape) for name in shapes} == shapes
    assert model.crit.out_projs[0] is not model.transformer.word_emb.emb_projs[0]
    assert model.crit.out_projs[3] is model.transformer.word_emb.emb_projs[3]


@pytest.mark.parametrize("name", ["xlnet-base-cased", "xlnet-large-cased"])
def test_xlnet_configs_build_the_same_parameters_as_transformers(name):
    folder = HUB_CONFIGS / name
    ours, theirs = XLNetConfig.from_pretrained(folder), transformers.XLNetConfig.from_pretrained(folder)
    assert ours.mem_len is None and ours.d_head == 64
    with torch.device("meta"):
        our_shapes = {k: v.shape for k, v in XLNetLMHeadModel(ours).state_dict().items()}
        their_shapes = {k: v.shape for k, v in transformers.XLNetLMHeadModel(theirs).state_dict().items()}
    assert our_shapes == their_shapes
