"""XLNet configuration: the fields of transformers' `XLNetConfig` (and of the Hub's `config.json` files), validated."""

from collections.abc import Callable

from transformers import PreTrainedConfig


# Feed-forward activations: "gelu" is the exact GELU (the Hub configs, transformers' XLNet), "gelu_new" the original
# TF code's tanh approximation (converted TF checkpoints).
FF_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")
SUMMARY_TYPES = ("last", "first", "mean", "cls_index")
SUMMARY_ACTIVATIONS = (None, "tanh", "relu", "gelu", "gelu_new", "silu", "linear")
ATTENTION_TYPES = ("bi", "uni")


class XLNetConfig(PreTrainedConfig):
    """Configuration of an XLNet model (Yang et al. 2019), with the field names and defaults of transformers'
    `XLNetConfig` (model type `xlnet`), so `config.json` files move between the two unchanged; legacy spellings
    (`n_token`, `mem_len: null`, the original code's run-time fields) are accepted. Notable fields:

    - `attn_type`: "bi" (XLNet) or "uni" (causal, Transformer-XL style); `same_length`: "uni" queries see as many keys;
    - `mem_len`: past positions each layer remembers (None or 0: all); `reuse_len`: only a segment's first
      `reuse_len` positions enter the memory (pretraining: 256 of 512); `use_mems_eval` / `use_mems_train`;
    - `bi_data`: the batch's second half uses backward relative positions (pretraining; even batch sizes);
    - `clamp_len`: distances beyond it share one encoding (<= 0: none); `ff_activation`: "gelu" or "gelu_new";
    - `summary_*`: the classification heads' sequence summary; `start_n_top` / `end_n_top`: the QA head's beams."""

    model_type = "xlnet"
    keys_to_ignore_at_inference = ["mems"]
    attribute_map = {
        "n_token": "vocab_size",
        "hidden_size": "d_model",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }

    vocab_size: int = 32000
    d_model: int = 1024
    n_layer: int = 24
    n_head: int = 16
    d_inner: int = 4096
    d_head: int | None = None
    ff_activation: str | Callable = "gelu"
    attn_type: str = "bi"
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dropout: float | int = 0.1
    mem_len: int | None = 512
    reuse_len: int | None = None
    use_mems_eval: bool = True
    use_mems_train: bool = False
    bi_data: bool = False
    clamp_len: int = -1
    same_length: bool = False
    summary_type: str = "last"
    summary_use_proj: bool = True
    summary_activation: str | None = "tanh"
    summary_last_dropout: float | int = 0.1
    start_n_top: int = 5
    end_n_top: int = 5
    pad_token_id: int | None = 5
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = True
    # (the text-generation pipeline's fixed "XL prefix" paragraph is opt-in: `pipeline(..., prefix=...)`)
    prefix: str = ""

    def __post_init__(self, **kwargs):
        # The first Hub configs (2019) carried `max_position_embeddings: 512`, which never limited XLNet: drop it.
        kwargs.pop("max_position_embeddings", None)
        super().__post_init__(**kwargs)
        if self.d_head is None and isinstance(self.d_model, int) and isinstance(self.n_head, int) and self.n_head > 0:
            self.d_head = self.d_model // self.n_head
        self._check_fields()

    @property
    def max_position_embeddings(self):
        """Relative positions put no limit on the length (transformers' XLNetConfig says -1, which `generate`
        misreads as a limit)."""
        return None

    def _check_fields(self):
        def fail(field, value, allowed):
            raise ValueError(f"XLNetConfig: invalid `{field}`={value!r}; expected {allowed}.")

        def is_int(value):
            return isinstance(value, int) and not isinstance(value, bool)

        for field in ("vocab_size", "d_model", "n_layer", "n_head", "d_inner", "d_head", "start_n_top", "end_n_top"):
            value = getattr(self, field)
            if not is_int(value) or value <= 0:
                fail(field, value, "a positive integer")
        if self.d_model % self.n_head != 0:
            fail("n_head", self.n_head, f"a divisor of d_model={self.d_model}")
        if self.d_head != self.d_model // self.n_head:
            fail("d_head", self.d_head, f"d_model // n_head = {self.d_model // self.n_head} (or null)")
        for field in ("mem_len", "reuse_len"):
            value = getattr(self, field)
            if value is not None and (not is_int(value) or value < 0):
                fail(field, value, "null or a non-negative integer (null / 0 for mem_len: keep every past state)")
        if not is_int(self.clamp_len):
            fail("clamp_len", self.clamp_len, "an integer (<= 0: no clamping)")
        if self.attn_type not in ATTENTION_TYPES:
            fail("attn_type", self.attn_type, f"one of {ATTENTION_TYPES} ('bi' for XLNet, 'uni' for causal)")
        if not callable(self.ff_activation) and self.ff_activation not in FF_ACTIVATIONS:
            fail("ff_activation", self.ff_activation, f"one of {FF_ACTIVATIONS} or a callable")
        if self.summary_type not in SUMMARY_TYPES:
            fail("summary_type", self.summary_type, f"one of {SUMMARY_TYPES} ('attn' is not implemented)")
        if self.summary_activation not in SUMMARY_ACTIVATIONS:
            fail("summary_activation", self.summary_activation, f"one of {SUMMARY_ACTIVATIONS}")
        for field in ("dropout", "summary_last_dropout"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                fail(field, value, "a probability in [0, 1)")
        if not isinstance(self.layer_norm_eps, (int, float)) or self.layer_norm_eps <= 0:
            fail("layer_norm_eps", self.layer_norm_eps, "a positive number")
        for field in ("use_mems_eval", "use_mems_train", "bi_data", "same_length", "summary_use_proj"):
            value = getattr(self, field)
            if not isinstance(value, bool):
                fail(field, value, "true or false")


__all__ = ["XLNetConfig"]
