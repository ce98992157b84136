"""Transformer-XL configuration: every field of the legacy `config.json` files, validated."""

from transformers import PreTrainedConfig


ATTENTION_TYPES = {
    0: "Transformer-XL relative attention (Dai et al. 2019, Sec. 3.3)",
    1: "Shaw et al. (2018) learned relative embeddings",
    2: "vanilla Transformer with absolute sinusoidal positions",
    3: "Al-Rfou et al. (2018) learned absolute positions in every layer",
}


class TransfoXLConfig(PreTrainedConfig):
    """Field names and defaults of transformers 4.x's `TransfoXLConfig` (defaults: `transfo-xl-wt103`), so the Hub's
    `config.json` files load unchanged. Notable fields:

    - `cutoffs`, `div_val`: the adaptive clusters; cluster i holds ids `[cutoff_ends[i], cutoff_ends[i+1])` in
      `d_embed // div_val**i` dimensions. `tie_weight`: softmax layers tied to the embeddings; `tie_projs[i]`: the
      i-th softmax projection to the i-th embedding projection (`proj_share_all_but_first`: `[False, True, ...]`).
    - `mem_len`: the memory's length (0: none); `clamp_len`: longer distances share its encoding (<= 0: none).
    - `attn_type`: see ATTENTION_TYPES; `sample_softmax` > 0: trained with that many log-uniform negatives.
    - `zero_initial_mems`: start from `mem_len` attended zero vectors, as legacy HF code did (to reproduce its
      numbers); by default the memory starts empty, as in the original PyTorch code.
    - `same_length_span`: with `same_length` (every query sees as many keys), query i may not attend j <= i - span.
      None: the PyTorch rule, at most `mem_len` keys; 1: the TF code's, exactly memory length + 1 keys."""

    model_type = "transfo-xl"
    keys_to_ignore_at_inference = ["mems"]
    attribute_map = {
        "n_token": "vocab_size",
        "hidden_size": "d_model",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }

    def __init__(
        self,
        vocab_size=267735,
        cutoffs=(20000, 40000, 200000),
        d_model=1024,
        d_embed=1024,
        n_head=16,
        d_head=64,
        d_inner=4096,
        div_val=4,
        pre_lnorm=False,
        n_layer=18,
        mem_len=1600,
        clamp_len=1000,
        same_length=True,
        proj_share_all_but_first=True,
        tie_projs=None,
        tie_weight=True,
        attn_type=0,
        sample_softmax=-1,
        adaptive=True,
        dropout=0.1,
        dropatt=0.0,
        untie_r=True,
        init="normal",
        init_range=0.01,
        proj_init_std=0.01,
        init_std=0.02,
        layer_norm_epsilon=1e-5,
        tgt_len=128,
        ext_len=0,
        zero_initial_mems=False,
        same_length_span=None,
        eos_token_id=0,
        pad_token_id=None,
        bos_token_id=None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.cutoffs = list(cutoffs)
        self.d_model = d_model
        self.d_embed = d_embed
        self.d_head = d_head
        self.d_inner = d_inner
        self.div_val = div_val
        self.pre_lnorm = pre_lnorm
        self.n_layer = n_layer
        self.n_head = n_head
        self.mem_len = mem_len
        self.clamp_len = clamp_len
        self.same_length = same_length
        self.proj_share_all_but_first = proj_share_all_but_first
        if tie_projs is None:
            tie_projs = [False] + [proj_share_all_but_first] * len(self.cutoffs)
        self.tie_projs = list(tie_projs)
        self.attn_type = attn_type
        self.sample_softmax = sample_softmax
        self.adaptive = adaptive
        self.dropout = dropout
        self.dropatt = dropatt
        self.untie_r = untie_r
        self.init = init
        self.init_range = init_range
        self.proj_init_std = proj_init_std
        self.init_std = init_std
        self.layer_norm_epsilon = layer_norm_epsilon
        self.tgt_len = tgt_len
        self.ext_len = ext_len
        self.zero_initial_mems = zero_initial_mems
        self.same_length_span = same_length_span
        # The text-generation pipeline's fixed "XL prefix" paragraph is opt-in (`pipeline(..., prefix=...)`).
        self.prefix = kwargs.pop("prefix", "")
        self.use_cache = kwargs.pop("use_cache", True)  # generate()'s default: the memory is a cache
        # transformers v5 ties weights only when `tie_word_embeddings` is true; which pairs are tied is decided per
        # model from `tie_weight` and `tie_projs` (see TransfoXLPreTrainedModel), so this is just the master switch.
        # (4.x files may say `tie_word_embeddings: false` instead of `tie_weight`; either one unties the softmax.)
        self.tie_weight = bool(tie_weight and kwargs.pop("tie_word_embeddings", True))
        self.tie_word_embeddings = self.tie_weight or any(self.tie_projs)
        # transformers 4.x defaulted both to None (v5's base config no longer defines them): the classifier pools on
        # pad_token_id, generate() without input_ids starts from bos_token_id.
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        super().__init__(eos_token_id=eos_token_id, **kwargs)
        self._check_fields()

    @property
    def max_position_embeddings(self):
        """Relative positions put no limit on the length (the legacy config said -1, which `generate` misreads)."""
        return None

    @property
    def cutoff_ends(self):
        """Cluster boundaries `[0, *cutoffs, vocab_size]`: cluster i holds ids `[ends[i], ends[i + 1])`."""
        return [0] + self.cutoffs + [self.vocab_size]

    def _check_fields(self):
        def fail(field, value, allowed):
            raise ValueError(f"TransfoXLConfig: invalid `{field}`={value!r}; expected {allowed}.")

        for field in ("vocab_size", "d_model", "d_embed", "n_head", "d_head", "d_inner", "n_layer"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                fail(field, value, "a positive integer")
        for field in ("mem_len", "tgt_len", "ext_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                fail(field, value, "a non-negative integer")
        if not all(isinstance(c, int) for c in self.cutoffs) or any(
            a >= b for a, b in zip([0] + self.cutoffs, self.cutoffs + [self.vocab_size])
        ):
            fail("cutoffs", self.cutoffs, f"strictly increasing integers in (0, vocab_size={self.vocab_size})")
        if len(self.tie_projs) != len(self.cutoffs) + 1:
            fail("tie_projs", self.tie_projs, f"one boolean per cluster ({len(self.cutoffs) + 1})")
        span = self.same_length_span
        if span is not None and (not isinstance(span, int) or span < 1):
            fail("same_length_span", self.same_length_span, "null or a positive integer")
        if not isinstance(self.div_val, int) or self.div_val < 1:
            fail("div_val", self.div_val, "an integer >= 1")
        narrowest = self.d_embed // self.div_val ** len(self.cutoffs)  # the last cluster's embedding width
        if narrowest == 0:
            n = len(self.cutoffs)
            fail("d_embed", self.d_embed, f"at least div_val**{n} = {self.div_val**n}: cluster i embeds its ids in "
                 f"d_embed // div_val**i dimensions, 0 for the last of the {n + 1} clusters")  # fmt: skip
        if self.attn_type not in ATTENTION_TYPES:
            fail("attn_type", self.attn_type, f"one of {sorted(ATTENTION_TYPES)}: {ATTENTION_TYPES}")
        if self.attn_type == 3 and self.n_head * self.d_head != self.d_model:
            # Al-Rfou et al. add a learned [n_head, d_head] embedding to the d_model-wide input of every layer.
            fail("d_model", self.d_model, f"n_head * d_head = {self.n_head * self.d_head} for attn_type 3")
        if self.sample_softmax > 0 and not self.tie_weight:
            fail("sample_softmax", self.sample_softmax, "<= 0 unless tie_weight=True (samples score tied embeddings)")
        if self.init not in ("normal", "uniform"):
            fail("init", self.init, "'normal' or 'uniform'")
        for field in ("dropout", "dropatt"):
            value = getattr(self, field)
            if not 0.0 <= value < 1.0:
                fail(field, value, "a probability in [0, 1)")


__all__ = ["TransfoXLConfig"]
