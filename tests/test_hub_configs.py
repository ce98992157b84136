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
        our_shapes = {k: v.shape for k, v in XLNetLMHeadModel(ours).checkpoint_state_dict().items()}
        their_shapes = {k: v.shape for k, v in transformers.XLNetLMHeadModel(theirs).state_dict().items()}
    assert our_shapes == their_shapes


# Parameters of each released checkpoint as our model builds it (tied tensors counted once), and the published figure
# with the precision it was published at. Transformer-XL: the paper (Dai et al. 2019, Tables 1-4: enwik8 and text8
# 277M, WikiText-103 large 257M, One Billion Word large 0.8B). XLNet: transformers' pretrained-model table (110M,
# 340M). The WikiText-103 figure does not match the released checkpoint itself: its tensors (transformers' own
# transfo-xl-wt103 file, counted in the test above) hold 285.2M parameters; we check against the file.
RELEASED = {
    "enwik8": (277_231_820, 277e6, 0.005),
    "text8": (277_050_395, 277e6, 0.005),
    "wt103": (285_205_322, 285_205_322, 0),
    "transfo-xl-wt103": (285_205_322, 285_205_322, 0),
    "lm1b": (841_354_862, 0.8e9, 0.0625),  # "0.8B": one significant digit
    "xlnet-base-cased": (116_750_336, 110e6, 0.07),
    "xlnet-large-cased": (360_300_800, 340e6, 0.07),
}


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_every_released_config_builds_the_published_size(name):
    exact, published, tolerance = RELEASED[name]
    config = AutoConfig.from_pretrained(HUB_CONFIGS / name)
    model_class = TransfoXLLMHeadModel if config.model_type == "transfo-xl" else XLNetLMHeadModel
    with torch.device("meta"):
        model = model_class(config)
    count = sum(p.numel() for p in model.parameters())
    assert count == exact
    assert abs(count - published) <= tolerance * published


def test_the_original_transformer_xl_configs_follow_the_original_scripts():
    """kimiyoung/transformer-xl tf/scripts/*_large_tpu.sh (model) and tf/sota/*.sh (evaluation lengths)."""
    enwik8, wt103, lm1b = (AutoConfig.from_pretrained(HUB_CONFIGS / n) for n in ("enwik8", "wt103", "lm1b"))
    assert (enwik8.n_layer, enwik8.d_model, enwik8.n_head, enwik8.d_head, enwik8.d_inner) == (24, 1024, 8, 128, 3072)
    assert enwik8.cutoffs == [] and not enwik8.untie_r and (enwik8.mem_len, enwik8.clamp_len) == (3800, 1000)
    assert wt103.tie_projs == [False, True, True, True] and wt103.untie_r and wt103.div_val == 4
    assert lm1b.tie_projs == [False] * 4 and lm1b.cutoffs == [60000, 100000, 640000] and lm1b.d_head == 80
    assert {c.layer_norm_epsilon for c in (enwik8, wt103, lm1b)} == {1e-12}  # the TF code's layer norm


@pytest.mark.parametrize("name", ["enwik8", "wt103"])
def test_convert_takes_released_configs_by_name(name, tmp_path, monkeypatch):
    from transformers_xl import hub_configs

    assert hub_configs.config_path(name) == str(HUB_CONFIGS / name / "config.json")
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_text("{}")  # a file of that name wins
    assert hub_configs.config_path(name) == name
    with pytest.raises(ValueError, match=r"--config wt-103: neither a file nor a released config \(enwik8, lm1b"):
        hub_configs.config_path("wt-103")


@pytest.mark.parametrize("name", ["transfo-xl-wt103", "wt103", "xlnet-base-cased", "xlnet-large-cased"])
def test_generation_configs_agree_with_their_model_configs(name):
    """The word-level releases generate text: their generation config has the model config's special tokens."""
    generation = transformers.GenerationConfig.from_pretrained(HUB_CONFIGS / name)
    config = AutoConfig.from_pretrained(HUB_CONFIGS / name)
    for token in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(generation, token) == getattr(config, token, None), token
    assert generation.eos_token_id is not None
