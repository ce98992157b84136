"""XLNet (Yang et al. 2019): Transformer-XL's recurrence and relative attention trained with permutation language
modeling. Two streams share every layer's weights (Sec. 2.3): the content stream h (token embeddings; z_t sees
x_{z<=t}) and the query stream g (from `mask_emb`; z_t sees x_{z<t}, not its own token), p(X_{z_t} = x | x_{z<t}) =
softmax_x(e(x)^T g). `perm_mask[b, i, j] = 1`: i may not see j; `target_mapping[b, m, j] = 1`: prediction m is token
j (none: no query stream). Names, inputs and outputs (`mems`: [mem_len, batch, d_model] per layer) are transformers'
`XLNet*`'s; inside, tensors are batch-first."""

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN, get_activation
from transformers.generation.configuration_utils import GenerationMode
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import slice_logits_to_keep
from transformers.models.xlnet.modeling_xlnet import (  # the heads' outputs: transformers' own classes
    XLNetForMultipleChoiceOutput,
    XLNetForQuestionAnsweringOutput,
    XLNetForQuestionAnsweringSimpleOutput,
    XLNetForSequenceClassificationOutput,
    XLNetForTokenClassificationOutput,
)
from transformers.utils import ModelOutput, can_return_tuple

from .configuration_xlnet import XLNetConfig
from .input_checks import (
    IGNORE_INDEX, check_class_ids, check_inputs, check_integer, check_one_per_sequence, check_sequence_labels,
    check_shape, check_span_positions, check_token_labels, check_values_in, inputs_shape, problem_type,
)
from .memory_cache import MemoryCache, MemoryLayer, StaticMemoryCache, key_values_over
from .relative_attention import (
    ALL_ATTENTION_FUNCTIONS, attention_implementation, causal_memory_mask, cross_entropy, distance_scores,
    eager_attention_forward, mask_scores_, flex_mask, pad_to_block, relative_shift, sinusoid_encoding,
    sinusoid_inverse_frequencies,
)


# Segment ids of the original code: A, B, CLS, SEP, PAD. Only "same segment or not" enters the model (Sec. 2.5).
MAX_TOKEN_TYPE_ID = 4


# ----- Outputs (transformers' XLNet's, with the generation cache) -----


@dataclass
class XLNetModelOutput(ModelOutput):
    """`last_hidden_state`: [batch, num_predict or seq_len, d_model]."""

    last_hidden_state: torch.Tensor | None = None
    mems: tuple[torch.Tensor, ...] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cache: MemoryCache | None = None


@dataclass
class XLNetLMHeadModelOutput(ModelOutput):
    """`logits` [batch, num_predict or seq_len, vocab_size]; `loss` against the unshifted `labels`."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    mems: tuple[torch.Tensor, ...] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cache: MemoryCache | None = None


# ----- Layers -----


class XLNetRelativeAttention(nn.Module):
    """Two-stream relative attention, output projection, residual and layer norm. For query i and key j (Dai et al.
    Sec. 3.3; segment term: Yang et al. Sec. 2.5):

        score_ij = (q_i + u)^T k_j            (a) + (c): content; u = `r_w_bias`
                 + (q_i + v)^T W_r R_{i-j}    (b) + (d): relative position; v = `r_r_bias`, W_r = `r`
                 + (q_i + b)^T s_ij           segment; b = `r_s_bias`, s_ij = `seg_embed`[0 if same segment else 1]

    Both streams attend to the content keys and values over [memory; segment]. q, k, v, o, r are `nn.Linear`
    layers; saved files hold them in transformers' [d_model, n_head, d_head] layout (`checkpoint_state_dict`)."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.config = config  # read at every call: `set_attn_implementation` takes effect
        self.n_head, self.d_head = config.n_head, config.d_head
        self.bi_data = config.bi_data
        self.scale = config.d_head**-0.5
        self.attention_dropout = config.dropout
        inner = config.n_head * config.d_head
        self.q, self.k, self.v = (nn.Linear(config.d_model, inner, bias=False) for _ in range(3))
        self.o = nn.Linear(inner, config.d_model, bias=False)
        self.r = nn.Linear(config.d_model, inner, bias=False)
        biases = (nn.Parameter(torch.empty(config.n_head, config.d_head)) for _ in range(3))
        self.r_r_bias, self.r_s_bias, self.r_w_bias = biases
        self.seg_embed = nn.Parameter(torch.empty(2, config.n_head, config.d_head))
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.register_load_state_dict_pre_hook(_load_layout)

    def _heads(self, x: torch.Tensor, projection) -> torch.Tensor:
        """[B, L, d] -> [B, H, L, D]."""
        return projection(x).unflatten(-1, (self.n_head, self.d_head)).transpose(1, 2)

    def checkpoint_layout(self, held: bool):
        """q, k, v, o, r as parameters in transformers' layout (held) or as layers."""
        for name in PROJECTIONS:
            old = getattr(self, name)
            delattr(self, name)
            if held:
                weight = _checkpoint_tensor(name, old.weight, self.n_head)
                setattr(self, name, nn.Parameter(weight, old.weight.requires_grad))
                continue
            weight = _linear_tensor(name, old)
            layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
            layer.weight = nn.Parameter(weight, old.requires_grad)
            layer.weight._is_hf_initialized = getattr(old, "_is_hf_initialized", False)
            setattr(self, name, layer)

    def project_keys_values(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [B, H, k, D] of [memory; segment]."""
        return self._heads(context, self.k), self._heads(context, self.v)

    def project_positions(self, position_embeddings: torch.Tensor) -> torch.Tensor:
        """W_r R once for the batch: [R, d] -> [H, R, D]; `bi_data`'s [2, R, d] -> [2, 1, H, R, D] (batch halves)."""
        keys = self.r(position_embeddings.to(self.r_r_bias))  # (the layer's dtype and device)
        keys = keys.unflatten(-1, (self.n_head, self.d_head)).transpose(-2, -3)
        return keys[:, None] if self.bi_data else keys

    def _attend(self, query, key, value, position_keys, mask, segment_mismatch, output_attentions, offset=None,
                slot_columns=None):
        """One stream: query [B, H, q, D] -> ([B, q, H, D], probabilities | None). Position keys k ... -q+1 (bi) or
        k ... 0 (uni): shift offset q (0: one query after the keys); `slot_columns`: a static step."""
        dtype, offset = query.dtype, query.shape[2] if offset is None else offset
        dropout = self.attention_dropout if self.training else 0.0
        implementation = attention_implementation(self.config, output_attentions, dropout, query.device)
        flex = implementation == "flex_attention"
        pad = pad_to_block if flex and slot_columns is None else lambda x: x  # (flex's rounded lengths)
        # (b) + (d) per distance, scaled
        position_query, position_keys = pad((query + self.r_r_bias[:, None].to(dtype)) * self.scale), pad(position_keys)
        if position_keys.dim() == 5:  # bi_data: forward distances for the batch's first half, then backward
            scores = torch.matmul(position_query.unflatten(0, (2, -1)), position_keys.transpose(-1, -2)).flatten(0, 1)
        else:
            scores = distance_scores(position_query, position_keys)
        segment = None
        if segment_mismatch is not None:  # (q_i + b)^T s_ij: s_ij = seg_embed[0] within a segment, [1] across
            segment_query = (query + self.r_s_bias[:, None].to(dtype)) * self.scale
            segment = torch.matmul(segment_query, self.seg_embed.to(dtype).permute(1, 2, 0))  # [B, H, q, 2]
        if slot_columns is not None:  # (ring order: a gather, not the shift)
            scores, offset = scores.gather(-1, slot_columns.expand(*scores.shape[:-1], -1)).add_(mask), None
            scores, mask = pad_to_block(scores, -2, -1) if flex else scores, None
        if flex:  # every term read in the score_mod
            bias = dict(position_scores=scores, shift_offset=offset, segment_scores=segment,
                        segment_mismatch=segment_mismatch)  # fmt: skip
        else:  # every term but (a) + (c), in the shifted scores (a view, in distance_scores' [H, B] order: no copy)
            swap = (lambda x: x.transpose(0, 1)) if position_keys.dim() == 3 else (lambda x: x)
            position_bias = scores if offset is None else swap(relative_shift(swap(scores), key.shape[2], offset))
            if segment is not None:
                position_bias.add_(torch.where(segment_mismatch[:, None], segment[..., 1:], segment[..., :1]))
            if mask is not None:  # True where query i may not see key j
                mask_scores_(position_bias, mask)
            bias, mask = {}, position_bias
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        # ((q + u) @ key: (a) + (c); mask: the other terms, flex's FlexMask, None)
        return attention_interface(self, query + self.r_w_bias[:, None].to(dtype), key, value, mask, dropout=dropout,
                                   scaling=self.scale, is_causal=False, **bias)  # fmt: skip

    def _post_attention(self, residual: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """o ([B, L, H * D] -> [B, L, d]), dropout, residual, post layer norm."""
        return self.layer_norm(self.dropout(self.o(attention)) + residual)

    def forward(
        self, content: torch.Tensor, query_stream: torch.Tensor | None, positions: Callable,
        content_mask: torch.Tensor | None = None, query_mask: torch.Tensor | None = None,
        segment_mismatch: torch.Tensor | None = None, memory: torch.Tensor | None = None,
        cached_memory: MemoryLayer | None = None, target_mapping: torch.Tensor | None = None,
        output_attentions: bool = False, update_content: bool = True, query_after_content: bool = False,
        slot_columns: torch.Tensor | None = None,
    ):  # fmt: skip
        """-> (content | None, query | None, probabilities, (keys, values)). `cached_memory`: reused memory keys and
        values; `update_content=False`: no content stream; `query_after_content`: one query row after the segment;
        `slot_columns`: a static step (`query_mask` covers every row); `positions`: see `XLNetModel._positions`."""
        position_keys = positions(self.project_positions)
        if cached_memory is not None:
            key, value = cached_memory.key_values_with(*self.project_keys_values(content))
        else:
            memory = None if memory is None else memory.to(content.dtype)
            key, value = key_values_over(memory, *self.project_keys_values(content), self.project_keys_values)

        # (h and g: one q, one o product)
        update_content = update_content or query_stream is None
        streams = [stream for stream in (content if update_content else None, query_stream) if stream is not None]
        rows = torch.cat(streams, dim=1) if len(streams) > 1 else streams[0]
        queries = self._heads(rows, self.q)
        attentions, content_probs, query_probs = [], None, None
        length = content.shape[1] if update_content else 0

        if query_after_content and (
            slot_columns is not None or content_mask is None and query_mask is None and segment_mismatch is None
        ):
            # Next-token prediction, one mask or none: one call, the query row as a content row after (offset `length`).
            if slot_columns is not None:  # (the last layer may update the query row only)
                slot_columns, query_mask = slot_columns[-queries.shape[2] :], query_mask[:, :, -queries.shape[2] :]
            attention, probs = self._attend(queries, key, value, position_keys, query_mask, None, output_attentions,
                                            offset=length, slot_columns=slot_columns)  # fmt: skip
            attentions.append(attention)
            if output_attentions:
                content_probs, query_probs = probs[:, :, :length] if update_content else None, probs[:, :, length:]
        else:
            if update_content:
                # Content stream: h_{z_t} <- Attention(Q = h_{z_t}, KV = [memory, h_{z<=t}]).
                attention, content_probs = self._attend(
                    queries[:, :, :length], key, value, position_keys, content_mask, segment_mismatch,
                    output_attentions,
                )
                attentions.append(attention)
            if query_stream is not None:
                # Query stream: g_{z_t} <- Attention(Q = g_{z_t}, KV = [memory, h_{z<t}]), the predictions scattered to
                # their positions (target_mapping^T), attended there, and gathered back.
                query = queries[:, :, length:]
                if target_mapping is not None:
                    query = torch.matmul(target_mapping.transpose(1, 2)[:, None].to(query.dtype), query)
                attention, query_probs = self._attend(
                    query, key, value, position_keys, query_mask, segment_mismatch, output_attentions,
                    offset=0 if query_after_content else None,
                )
                if target_mapping is not None:  # [B, M, L] x [B, L, H, D]
                    attention = torch.einsum("bml,blhd->bmhd", target_mapping.to(attention.dtype), attention)
                attentions.append(attention)

        attentions = [attention.flatten(2) for attention in attentions]  # [B, rows, H * D]
        outputs = self._post_attention(rows, torch.cat(attentions, dim=1) if len(attentions) > 1 else attentions[0])
        content_out = outputs[:, :length] if update_content else None
        query_out = outputs[:, length:] if query_stream is not None else None
        if not output_attentions:
            probs = None
        else:
            probs = content_probs if query_stream is None else (content_probs, query_probs)
        return content_out, query_out, probs, (key, value)


PROJECTIONS = ("q", "k", "v", "o", "r")


def _checkpoint_tensor(name: str, weight: torch.Tensor, heads: int) -> torch.Tensor:
    """[out, in] -> [d_model, H, D] (x W; o as einsum("...hd,mhd->...m"))."""
    return (weight if name == "o" else weight.t()).unflatten(1, (heads, -1)).contiguous()


def _linear_tensor(name: str, tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.flatten(1) if name == "o" else tensor.flatten(1).t()).contiguous()


def _load_layout(module, state_dict, prefix, *args):
    for name in PROJECTIONS:
        if (key := prefix + name) in state_dict and isinstance(getattr(module, name), nn.Linear):
            state_dict[key + ".weight"] = _linear_tensor(name, state_dict.pop(key))


class RecomputedActivation(torch.autograd.Function):
    """`F.linear(dropout(activation(inner)), weight, bias)` saving `inner` (and dropout's mask), not the activation."""

    @staticmethod
    def forward(ctx, inner, weight, bias, activation, p: float):
        dropped, kept = torch.native_dropout(activation(inner), p, True) if p else (activation(inner), None)
        ctx.activation, ctx.scale = activation, 1 / (1 - p)
        ctx.save_for_backward(inner, weight, kept)
        return F.linear(dropped, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        inner, weight, kept = ctx.saved_tensors
        with torch.enable_grad():
            inner = inner.detach().requires_grad_()
            activated = ctx.activation(inner)
        grad_dropped, dropped = grad @ weight.to(grad.dtype), activated.detach()
        if kept is not None:  # (the forward's dropout: x * kept * scale)
            dropout = torch.ops.aten.native_dropout_backward
            grad_dropped, dropped = dropout(grad_dropped, kept, ctx.scale), dropout(dropped, kept, ctx.scale)
        rows = grad.flatten(0, -2)
        grad_inner = torch.autograd.grad(activated, inner, grad_dropped)[0]
        return grad_inner, rows.t() @ dropped.flatten(0, -2).to(rows.dtype), rows.sum(0), None, None


class XLNetFeedForward(nn.Module):
    """Position-wise feed-forward, residual and post layer norm, for both streams."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.layer_1 = nn.Linear(config.d_model, config.d_inner)
        self.layer_2 = nn.Linear(config.d_inner, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        activation = config.ff_activation
        self.activation_function = ACT2FN[activation] if isinstance(activation, str) else activation

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        inner = self.layer_1(hidden)
        if inner.requires_grad and type(self.layer_2) is nn.Linear and not torch.compiler.is_compiling():
            p = self.dropout.p if self.training else 0.0
            layer = self.layer_2
            output = RecomputedActivation.apply(inner, layer.weight, layer.bias, self.activation_function, p)
        else:
            output = self.layer_2(self.dropout(self.activation_function(inner)))
        return self.layer_norm(self.dropout(output) + hidden)


class XLNetLayer(GradientCheckpointingLayer):
    """Two-stream relative attention followed by the feed-forward block (both streams)."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.rel_attn = XLNetRelativeAttention(config)
        self.ff = XLNetFeedForward(config)
        self.chunk_size_feed_forward = config.chunk_size_feed_forward

    def _feed_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.chunk_size_feed_forward:  # (position-wise: chunks bound the d_inner activations)
            return torch.cat([self.ff(chunk) for chunk in hidden.split(self.chunk_size_feed_forward, dim=1)], dim=1)
        return self.ff(hidden)

    def forward(self, content: torch.Tensor, query_stream: torch.Tensor | None, positions: Callable, **kwargs):
        """As XLNetRelativeAttention.forward."""
        content, query_stream, probs, key_values = self.rel_attn(content, query_stream, positions, **kwargs)
        if content is None or query_stream is None:  # a single stream to update
            content, query_stream = (None if x is None else self._feed_forward(x) for x in (content, query_stream))
            return content, query_stream, probs, key_values
        length = content.shape[1]
        outputs = self._feed_forward(torch.cat([content, query_stream], dim=1))  # shared weights: one pass
        return outputs[:, :length], outputs[:, length:], probs, key_values


# ----- Head building blocks (transformers' names, so head weights load) -----


def _mask_positions(logits: torch.Tensor, p_mask: torch.Tensor | None) -> torch.Tensor:
    """Positions with p_mask = 1 pushed to -1e30 (-65500 in fp16), as the original."""
    if p_mask is None:
        return logits
    p_mask = p_mask.to(logits.dtype)
    fill = 65500.0 if logits.dtype == torch.float16 else 1e30
    return logits * (1 - p_mask) - fill * p_mask


def _state_at(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B, L, d], [B] -> [B, d]: each sequence's hidden state at its position."""
    return hidden.gather(-2, positions[:, None, None].expand(-1, 1, hidden.shape[-1])).squeeze(-2)


class XLNetPoolerStartLogits(nn.Module):
    """Span-start logits [B, L] from the final hidden states."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.dense = nn.Linear(config.d_model, 1)

    def forward(self, hidden_states: torch.Tensor, p_mask: torch.Tensor | None = None) -> torch.Tensor:
        return _mask_positions(self.dense(hidden_states).squeeze(-1), p_mask)


class XLNetPoolerEndLogits(nn.Module):
    """Span-end logits given the start: dense(layer_norm(tanh(dense([h_j; h_start]))))."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.dense_0 = nn.Linear(config.d_model * 2, config.d_model)
        self.activation = nn.Tanh()
        self.LayerNorm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dense_1 = nn.Linear(config.d_model, 1)

    def forward(self, hidden_states, start_states=None, start_positions=None, p_mask=None) -> torch.Tensor:
        if start_positions is not None:
            start_states = _state_at(hidden_states, start_positions)[:, None].expand(-1, hidden_states.shape[-2], -1)
        elif start_states is None:
            raise ValueError("XLNetPoolerEndLogits: pass `start_states` or `start_positions`.")
        x = self.dense_1(self.LayerNorm(self.activation(self.dense_0(torch.cat([hidden_states, start_states], -1)))))
        return _mask_positions(x.squeeze(-1), p_mask)


class XLNetPoolerAnswerClass(nn.Module):
    """SQuAD 2.0 answerability logit from the start representation and the CLS token (last token by default)."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.dense_0 = nn.Linear(config.d_model * 2, config.d_model)
        self.activation = nn.Tanh()
        self.dense_1 = nn.Linear(config.d_model, 1, bias=False)

    def forward(self, hidden_states, start_states=None, start_positions=None, cls_index=None) -> torch.Tensor:
        if start_positions is not None:
            start_states = _state_at(hidden_states, start_positions)
        elif start_states is None:
            raise ValueError("XLNetPoolerAnswerClass: pass `start_states` or `start_positions`.")
        cls_state = hidden_states[:, -1, :] if cls_index is None else _state_at(hidden_states, cls_index)
        x = self.activation(self.dense_0(torch.cat([start_states, cls_state], dim=-1)))
        return self.dense_1(x).squeeze(-1)


class XLNetSequenceSummary(nn.Module):
    """One vector per sequence (`summary_type`: last / first / mean / cls_index), projected and activated (CLS is
    last: pad on the left)."""

    def __init__(self, config: XLNetConfig):
        super().__init__()
        self.summary_type = config.summary_type
        self.summary = nn.Identity()
        if config.summary_use_proj:
            proj_to_labels = getattr(config, "summary_proj_to_labels", False) and config.num_labels > 0
            self.summary = nn.Linear(config.d_model, config.num_labels if proj_to_labels else config.d_model)
        activation = config.summary_activation
        self.activation: Callable = get_activation(activation) if activation else nn.Identity()
        first_dropout = getattr(config, "summary_first_dropout", 0.0) or 0.0
        self.first_dropout = nn.Dropout(first_dropout) if first_dropout > 0 else nn.Identity()
        last_dropout = config.summary_last_dropout
        self.last_dropout = nn.Dropout(last_dropout) if last_dropout > 0 else nn.Identity()

    def forward(self, hidden_states: torch.Tensor, cls_index: torch.LongTensor | None = None) -> torch.Tensor:
        if self.summary_type == "last":
            output = hidden_states[:, -1]
        elif self.summary_type == "first":
            output = hidden_states[:, 0]
        elif self.summary_type == "mean":
            output = hidden_states.mean(dim=1)
        else:  # cls_index
            if cls_index is None:
                index = torch.full_like(hidden_states[..., :1, :], hidden_states.shape[-2] - 1, dtype=torch.long)
            else:
                index = cls_index[..., None, None].expand(*cls_index.shape, 1, hidden_states.shape[-1])
            output = hidden_states.gather(-2, index).squeeze(-2)
        return self.last_dropout(self.activation(self.summary(self.first_dropout(output))))


# ----- Models -----


class XLNetPreTrainedModel(PreTrainedModel):
    config: XLNetConfig
    config_class = XLNetConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["XLNetLayer"]
    # Attention through transformers' interface (see XLNetRelativeAttention); `attn_implementation=None` is "sdpa".
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # The memory is the legacy `mems` tuple, not a transformers Cache: never DynamicCache.
        return False

    def checkpoint_state_dict(self, state_dict: dict | None = None) -> dict:
        """`state_dict` (default: the model's) with q, k, v, o, r under transformers' names, in its XLNet's [d_model,
        H, D] layout: what `save_pretrained` writes. The model's own state dict matches its parameters (FSDP, DCP)."""
        held = {}
        for key, tensor in (self.state_dict() if state_dict is None else state_dict).items():
            if projection := re.fullmatch(r"(.*\brel_attn\.([qkvor]))\.weight", key):
                key, tensor = projection[1], _checkpoint_tensor(projection[2], tensor, self.config.n_head)
            held[key] = tensor
        return held

    def save_pretrained(self, *args, state_dict: dict | None = None, **kwargs):
        """transformers' saving, with `checkpoint_state_dict`'s names and layout."""
        return super().save_pretrained(*args, state_dict=self.checkpoint_state_dict(state_dict), **kwargs)

    @staticmethod
    def _load_pretrained_model(model, *args, **kwargs):
        """transformers' loading with q, k, v, o, r held as the files' [d_model, H, D] parameters: it converts layouts
        only by mappings registered process-wide (its XLNet's too)."""
        layers = {n: m for n, m in model.named_modules() if isinstance(m, XLNetRelativeAttention)}
        for layer in layers.values():
            layer.checkpoint_layout(True)
        try:
            info, *rest = PreTrainedModel._load_pretrained_model(model, *args, **kwargs)
        finally:
            for layer in layers.values():
                layer.checkpoint_layout(False)
        held = {f"{n}.{p}" for n in layers for p in PROJECTIONS}
        info.missing_keys = {k + ".weight" if k in held else k for k in info.missing_keys}
        info.mismatched_keys = {(k + ".weight" if k in held else k, *x) for k, *x in info.mismatched_keys}
        return info, *rest

    def _init_weights(self, module):
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, XLNetRelativeAttention):  # (q, k, v, o, r: as nn.Linear)
            for param in (module.r_r_bias, module.r_s_bias, module.r_w_bias, module.seg_embed):
                init.normal_(param, mean=0.0, std=std)
        elif isinstance(module, XLNetModel):
            init.normal_(module.mask_emb, mean=0.0, std=std)


def _loss_sum_or_mean(loss_fn, inputs, targets, num_items_in_batch):
    """The loss averaged over the targets (not -100), or summed over Trainer's `num_items_in_batch`; no target: 0."""
    if num_items_in_batch is None:
        if targets.is_floating_point():  # regression, multi-label: every value is a target
            return loss_fn(inputs, targets, reduction="mean")
        num_items_in_batch = (targets != IGNORE_INDEX).sum()
    total = loss_fn(inputs, targets, reduction="sum")
    if torch.is_tensor(num_items_in_batch):
        return total / num_items_in_batch.to(total.device).clamp(min=1)
    return total / max(num_items_in_batch, 1)


def _output_positions(input_ids, inputs_embeds, target_mapping):
    """(batch_size, positions, described, origin) of the base model's output: one position per prediction with
    `target_mapping`, else per token; None for inputs of the wrong rank."""
    shape = inputs_shape(input_ids, inputs_embeds)
    if shape is None or (target_mapping is not None and target_mapping.dim() != 3):
        return None
    if target_mapping is None:
        return shape[0], shape[1], "[batch_size, seq_len]", " (the inputs' shape)"
    return shape[0], target_mapping.shape[1], "[batch_size, num_predict]", " (the predictions of `target_mapping`)"


def _check_token_labels(model, labels, input_ids, inputs_embeds, target_mapping, num_classes, what, note,
                        argument="labels"):
    """Per-token labels: one per output position (see `_output_positions`), checked before the forward pass."""
    positions = None if labels is None else _output_positions(input_ids, inputs_embeds, target_mapping)
    if positions is not None:
        batch_size, length, described, origin = positions
        check_token_labels(model, labels, (batch_size, length), described, origin, num_classes, what, note, argument)


def _passed_on(outputs: XLNetModelOutput) -> dict:
    """What every head returns of the base model's outputs."""
    return {"mems": outputs.mems, "hidden_states": outputs.hidden_states, "attentions": outputs.attentions}


class XLNetModel(XLNetPreTrainedModel):
    """The XLNet encoder: embeddings, relative positional / segment encodings, masks, memory, n_layer layers."""

    def __init__(self, config: XLNetConfig):
        super().__init__(config)
        self.word_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, config.d_model))
        self.layer = nn.ModuleList([XLNetLayer(config) for _ in range(config.n_layer)])
        self.dropout = nn.Dropout(config.dropout)
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embedding

    def set_input_embeddings(self, new_embeddings):
        self.word_embedding = new_embeddings

    def _check_inputs(self, input_ids, inputs_embeds, attention_mask, input_mask, perm_mask, target_mapping,
                      token_type_ids):
        """Shapes and values of the inputs, with errors that say what was expected. Returns (batch, seq_len)."""
        name = type(self).__name__
        batch, length = check_inputs(name, input_ids, inputs_embeds, self.config.vocab_size, self.config.d_model)

        origin = " (batch_size, seq_len from the inputs)"
        for field, tensor in (("attention_mask", attention_mask), ("input_mask", input_mask),
                              ("token_type_ids", token_type_ids)):  # fmt: skip
            check_shape(name, field, tensor, (batch, length), "[batch_size, seq_len]", origin)
        check_shape(name, "perm_mask", perm_mask, (batch, length, length), "[batch_size, seq_len, seq_len]", origin)
        if target_mapping is not None and (
            target_mapping.dim() != 3 or target_mapping.shape[1] == 0
            or (target_mapping.shape[0], target_mapping.shape[2]) != (batch, length)
        ):  # fmt: skip
            raise ValueError(
                f"{name}: `target_mapping` has shape {tuple(target_mapping.shape)}; expected "
                f"[batch_size, num_predict, seq_len] = ({batch}, num_predict >= 1, {length}){origin}."
            )
        if attention_mask is not None and input_mask is not None:
            raise ValueError(
                f"{name}: pass only one of `attention_mask` (1 = keep) and `input_mask` (1 = padding, its negation)."
            )
        if token_type_ids is not None:
            check_integer(name, "token_type_ids", token_type_ids, "segment ids")
            check_values_in(name, "token_type_ids", token_type_ids, 0, MAX_TOKEN_TYPE_ID + 1, "segment ids")
        if self.config.bi_data and batch % 2:
            raise ValueError(
                f"{name}: `bi_data=True` splits the batch into forward and backward halves; expected an even "
                f"batch_size, got {batch}."
            )
        return batch, length

    def _positions(self, layer_idx, query_length, key_length, position_embeddings, cache, reuse, ring):
        """Layer `layer_idx`'s position keys as a function of its `project_positions`, called in its forward (hooks
        see all uses of its weights); `reuse`: from the cache. `ring`: a static cache prompt's (encodings, tables)."""
        if isinstance(cache, StaticMemoryCache) and cache.ring:
            return lambda project: cache.layers[layer_idx].position_keys
        if not reuse:
            return lambda project: project(position_embeddings)
        lowest = -query_length + 1 if self.config.attn_type == "bi" else 0
        device = self.layer[layer_idx].rel_attn.r_r_bias.device

        def encodings(n):  # (distances lowest + n - 1 ... lowest)
            if not position_embeddings or position_embeddings[-1].shape[-2] != n:
                position_embeddings.append(self._relative_position_embeddings(lowest + n - 1, lowest, device))
            return position_embeddings[-1]

        def position_keys(project):
            if ring is not None:
                ring[1].append(project(ring[0]))
            return cache.position_keys(layer_idx, key_length - lowest + 1, lowest, lambda n: project(encodings(n)))

        return position_keys

    def _relative_position_embeddings(self, highest: int, lowest: int, device) -> torch.Tensor:
        """fp32 encodings [R, d] of distances highest ... lowest, clamped to +-clamp_len (> 0); `bi_data`: [2, R, d],
        the second negated."""
        positions = torch.arange(highest, lowest - 1, -1, dtype=torch.float32, device=device)
        if self.config.bi_data:
            positions = torch.stack([positions, -positions])
        if self.config.clamp_len > 0:
            positions = positions.clamp(-self.config.clamp_len, self.config.clamp_len)
        inverse_frequencies = sinusoid_inverse_frequencies(self.config.d_model, device)
        return sinusoid_encoding(positions, inverse_frequencies)

    def _attention_masks(self, query_length, memory_length, attention_mask, input_mask, perm_mask, device):
        """Boolean [B|1, 1, q, m + q] masks (True: may not attend) of the query and content streams, the union of
        perm_mask, padding, "uni"'s causality (the memory is visible); the content stream also sees itself."""
        mask = None
        if self.config.attn_type == "uni":
            # same_length: every query sees exactly memory_length + 1 keys.
            mask = causal_memory_mask(
                query_length, memory_length, self.config.same_length, same_length_span=1, device=device
            ).float()
        if input_mask is None and attention_mask is not None:
            input_mask = 1.0 - attention_mask.float()
        data_mask = None
        if input_mask is not None:
            data_mask = input_mask.float()[:, None, :]
        if perm_mask is not None:
            data_mask = perm_mask.float() if data_mask is None else data_mask + perm_mask.float()
        if data_mask is not None:
            if memory_length:
                data_mask = F.pad(data_mask, (memory_length, 0))
            mask = data_mask if mask is None else mask + data_mask
        if mask is None:
            return None, None
        query_mask = mask > 0
        if query_mask.dim() == 2:
            query_mask = query_mask[None]
        itself = F.pad(torch.eye(query_length, dtype=torch.bool, device=device), (memory_length, 0))
        content_mask = query_mask & ~itself
        return query_mask[:, None], content_mask[:, None]

    @can_return_tuple
    def forward(
        self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
        mems: tuple[torch.Tensor, ...] | list[torch.Tensor] | None = None, perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None, token_type_ids: torch.LongTensor | None = None,
        input_mask: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None, use_mems: bool | None = None,
        cache: MemoryCache | None = None, predict_next_token: bool = False, output_attentions: bool | None = None,
        output_hidden_states: bool | None = None, **kwargs,
    ) -> XLNetModelOutput:  # fmt: skip
        """Inputs as transformers' `XLNetModel`'s. Ours: `cache`, a MemoryCache updated in place (for `mems`);
        `predict_next_token`: the query stream of one position after the input ([B, 1, d]), without a dummy token."""
        kwargs.pop("use_cache", None)  # transformers' XLNet accepted and ignored it
        if kwargs:
            raise TypeError(f"{type(self).__name__}.forward() got unexpected keyword arguments {sorted(kwargs)}.")
        if predict_next_token and (perm_mask is not None or target_mapping is not None or token_type_ids is not None):
            raise ValueError(
                f"{type(self).__name__}: `predict_next_token` places its own query after the input; expected no "
                "`perm_mask`, `target_mapping` or `token_type_ids` with it."
            )
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if use_mems is None:
            use_mems = self.config.use_mems_train if self.training else self.config.use_mems_eval

        batch, query_length = self._check_inputs(
            input_ids, inputs_embeds, attention_mask, input_mask, perm_mask, target_mapping, token_type_ids
        )
        cache_given = cache is not None
        hidden_like = self.word_embedding.weight if inputs_embeds is None else inputs_embeds
        remember = use_mems or cache_given
        # The memory's keys / values and the position keys: reusable while the weights are frozen.
        reuse_projections = remember and not self.training and not torch.is_grad_enabled()
        static = isinstance(cache, StaticMemoryCache)
        if static:
            unsupported = (mems, perm_mask, target_mapping, token_type_ids, attention_mask, input_mask, inputs_embeds)
            self._check_static_cache(cache, reuse_projections, batch, query_length, hidden_like.dtype,
                                     predict_next_token, any(x is not None for x in unsupported))  # fmt: skip
        stepping = static and cache.ring  # (a static cache's step: see `_slot_masks`)
        if not stepping:  # (`mem_len` None or 0 keeps every past position)
            cache = MemoryCache.for_forward(
                cache, mems, self.config.n_layer, self.config.mem_len or None, batch, self.config.d_model,
                type(self).__name__, hidden_like.dtype, hidden_like.device,
            )
        memory_length = 0 if cache.memory(0) is None else cache.memory(0).shape[1]
        key_length = memory_length + query_length
        kept = self.config.reuse_len or query_length  # pretraining remembers only the first reuse_len positions

        embeddings = self.word_embedding(input_ids) if inputs_embeds is None else inputs_embeds
        device, dtype = embeddings.device, embeddings.dtype
        content = self.dropout(embeddings)
        query_stream = None
        if target_mapping is not None or predict_next_token:
            # g^(0) = w, the trainable mask embedding.
            predictions = 1 if predict_next_token else target_mapping.shape[1]
            query_stream = self.dropout(self.mask_emb.to(dtype).expand(batch, predictions, -1))
        if target_mapping is not None:
            target_mapping = target_mapping.to(dtype)

        slot_columns = None
        if stepping:
            slot_columns, query_mask = self._slot_masks(cache, dtype)
            content_mask = None
        else:
            query_mask, content_mask = self._attention_masks(
                query_length, memory_length, attention_mask, input_mask, perm_mask, device
            )
        if predict_next_token and not stepping:  # the next position sees every key but padding
            padding = input_mask if input_mask is not None else None if attention_mask is None else 1 - attention_mask
            query_mask = None if padding is None else F.pad(padding.bool(), (memory_length, 0))[:, None, None, :]
            if self.config.attn_type == "uni" and self.config.same_length:
                # ... but, as every uni query under same_length, the newest memory_length only
                too_old = (torch.arange(key_length, device=device) < query_length)[None, None, None, :]
                query_mask = too_old if query_mask is None else query_mask | too_old
        segment_mismatch = None
        if token_type_ids is not None:
            # Relative segment encoding (Sec. 2.5): whether i and j share a segment; the memory is segment 0.
            key_types = F.pad(token_type_ids, (memory_length, 0)) if memory_length else token_type_ids
            segment_mismatch = token_type_ids[:, :, None] != key_types[:, None, :]
        flex = attention_implementation(self.config, output_attentions, self.dropout.p * self.training, device)
        if flex == "flex_attention" and not stepping:  # (for every layer)
            if not predict_next_token:
                content_mask = flex_mask(content_mask, query_length, key_length, device)
            if target_mapping is not None:
                query_mask = flex_mask(query_mask, query_length, key_length, device)
        position_embeddings = []  # (filled by `_positions` when reused)
        if not reuse_projections:
            lowest = -query_length + 1 if self.config.attn_type == "bi" else 0
            position_embeddings = self.dropout(self._relative_position_embeddings(key_length, lowest, device)).to(dtype)
        ring = None  # (a static cache's prompt: distances R ... -1)
        if static and not stepping:
            ring = self._relative_position_embeddings(cache.slot_count, -1, device), []

        hidden_states = [] if output_hidden_states else None
        attentions = [] if output_attentions else None
        last_layer = len(self.layer) - 1
        for i, layer in enumerate(self.layer):
            if output_hidden_states:
                hidden_states.extend([content] if query_stream is None else [content, query_stream])
            positions = self._positions(i, query_length, key_length, position_embeddings, cache, reuse_projections,
                                        ring)
            next_content, query_stream, probs, (key, value) = layer(
                content, query_stream, positions, content_mask=content_mask, query_mask=query_mask,
                segment_mismatch=segment_mismatch, memory=cache.memory(i), target_mapping=target_mapping,
                cached_memory=cache.known_key_values(i) if reuse_projections else None,
                output_attentions=output_attentions, query_after_content=predict_next_token, slot_columns=slot_columns,
                # (with a query stream, the last layer's content is read only as a hidden state / attention)
                update_content=i < last_layer or output_hidden_states or output_attentions,
            )  # fmt: skip
            if reuse_projections:  # keys / values stay aligned with the remembered positions
                end = memory_length + kept
                cache.store(i, content[:, :kept], key[:, :, :end], value[:, :, :end])
            elif remember:
                cache.store(i, content[:, :kept])
            content = next_content
            if output_attentions:
                attentions.append(probs)
        if output_hidden_states:
            hidden_states.extend([content] if query_stream is None else [content, query_stream])
        if stepping:
            cache.advance()
        elif static:  # (after the prompt: into the slots; the first step rewrites 1 position, 2 if it filled reuse_len)
            reuse_len = self.config.reuse_len
            cache.start_ring(ring[1], rewritten=2 if reuse_len and cache.last_stored >= reuse_len else 1)

        output = self.dropout(content if query_stream is None else query_stream)
        return XLNetModelOutput(  # (a static cache's `mems`: `cache.mems`, on demand)
            last_hidden_state=output, mems=cache.mems if use_mems and not static else None,
            cache=cache if cache_given else None, hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )  # fmt: skip

    # ----- a static cache's decoding step (`cache_implementation="static"`) -----

    def _check_static_cache(self, cache, reuse_projections, batch, query_length, dtype, predict_next_token, extra):
        """What a StaticMemoryCache needs (shapes and flags only: no host sync)."""
        problem = None
        if cache.step_length != 2 or (self.config.reuse_len or 3) < 3:
            problem = "is generate()'s (two tokens a step), with reuse_len None or >= 3"
        elif not reuse_projections:
            problem = "decodes in eval mode under torch.no_grad(), as generate() does"
        elif cache.ring and (query_length != 2 or not predict_next_token or extra):
            problem = f"takes the last two tokens with predict_next_token, nothing else; got {query_length} tokens"
        elif cache.ring and (cache.batch_size, cache.layers[0].hidden.dtype) != (batch, dtype):
            problem = f"holds batch {cache.batch_size} in {cache.layers[0].hidden.dtype}; got {batch} in {dtype}"
        if problem:
            raise ValueError(f"XLNetModel: the static cache {problem}; else use the default cache (MemoryCache).")

    def _slot_masks(self, cache, dtype):
        """A static step's rows (tokens n-2, n-1 fed again, the query of n): each (row, slot)'s column in the position
        keys (distances R ... -1) [3, R], the additive mask [1, 1, 3, R] ("uni"'s future, same_length's beyond the
        memory; -inf: unwritten slots)."""
        newest_distance = cache.slot_distances()  # [R] from position n-1 to each slot's
        distances = newest_distance + torch.arange(-1, 2, device=newest_distance.device)[:, None]  # i - j
        masked = (distances < 0) & (self.config.attn_type == "uni")
        if self.config.attn_type == "uni" and self.config.same_length:  # (the memory: positions n-2-m ... n-3)
            memory_length = (cache.newest - 1 - cache.oldest).clamp(max=cache.slot_count - 2)
            masked = masked | (distances > memory_length)
        mask = torch.zeros(distances.shape, dtype=dtype, device=distances.device)
        mask.masked_fill_(masked, torch.finfo(dtype).min)
        mask.masked_fill_(newest_distance > cache.newest - cache.oldest, -torch.inf)
        return cache.slot_count - distances, mask[None, None]


def _drop_newest(cache: MemoryCache, count: int):
    """transformers' `mem[:-count]`: forget the newest `count` positions (all if fewer)."""
    held = 0 if cache.memory(0) is None else cache.memory(0).shape[1]
    cache.crop(-min(count, held))


class XLNetLMHeadModel(XLNetPreTrainedModel, GenerationMixin):
    """XLNet with the LM head (tied to the input embeddings, own bias). Labels are NOT shifted: `labels[:, m]` is
    prediction m's token (`shift_labels`, the same, replace them)."""

    _tied_weights_keys = {"lm_loss.weight": "transformer.word_embedding.weight"}
    accepts_loss_kwargs = True

    def __init__(self, config: XLNetConfig):
        super().__init__(config)
        self.transformer = XLNetModel(config)
        self.lm_loss = nn.Linear(config.d_model, config.vocab_size, bias=True)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_loss

    def set_output_embeddings(self, new_embeddings):
        self.lm_loss = new_embeddings

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, mems=None, perm_mask=None, target_mapping=None, token_type_ids=None,
        input_mask=None, inputs_embeds=None, labels=None, use_mems=None, cache=None, output_attentions=None,
        output_hidden_states=None, logits_to_keep: int | torch.Tensor = 0, **kwargs,
    ) -> XLNetLMHeadModelOutput:  # fmt: skip
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        shift_labels = kwargs.pop("shift_labels", None)
        # transformers' contract: `shift_labels` replace `labels` (Trainer's context parallelism passes both)
        target_name = "labels" if shift_labels is None else "shift_labels"
        labels = labels if shift_labels is None else shift_labels
        vocab_size = self.config.vocab_size
        if isinstance(logits_to_keep, int) and logits_to_keep == 0 and not kwargs.get("predict_next_token"):
            _check_token_labels(
                type(self).__name__, labels, input_ids, inputs_embeds, target_mapping, vocab_size, "token ids",
                f" (vocab_size={vocab_size})", target_name,
            )
        outputs = self.transformer(
            input_ids, attention_mask=attention_mask, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
            token_type_ids=token_type_ids, input_mask=input_mask, inputs_embeds=inputs_embeds, use_mems=use_mems,
            cache=cache, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            return_dict=True, **kwargs,
        )  # fmt: skip
        hidden = slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep)
        logits = self.lm_loss(hidden)
        loss = None
        if labels is not None:  # (in fp32 at least, as transformers' causal-LM losses)
            upcast = logits.reshape(-1, logits.shape[-1]).to(torch.promote_types(logits.dtype, torch.float32))
            loss = _loss_sum_or_mean(cross_entropy, upcast, labels.reshape(-1), num_items_in_batch)
        return XLNetLMHeadModelOutput(loss=loss, logits=logits, cache=outputs.cache, **_passed_on(outputs))

    # ----- generation -----

    # Tokens of the previous step recomputed at every step with memory (transformers' choice).
    generation_offset = 2

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        if generation_mode == GenerationMode.ASSISTED_GENERATION:
            raise ValueError(
                "XLNetLMHeadModel.generate: assisted decoding and prompt lookup are not supported: each XLNet step "
                "recomputes the last two tokens, which one pass over k drafts cannot reproduce. Use greedy search, "
                "sampling or beam search."
            )
        super()._validate_generation_mode(generation_mode, generation_config, generation_mode_kwargs)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, batch_size, max_length):
        """transformers' (no cache), but `cache_implementation="static"` gives a StaticMemoryCache of `max_length`
        slots, at most mem_len, at least 2, never fewer than the last call's."""
        if generation_config.cache_implementation != "static":
            return super()._prepare_cache_for_generation(
                generation_config, model_kwargs, generation_mode, batch_size, max_length
            )
        use_mems = model_kwargs.get("use_mems", self.config.use_mems_eval) is not False
        if self.training or not use_mems or any(model_kwargs.get(name) is not None for name in ("cache", "mems")):
            raise ValueError(
                "XLNetLMHeadModel.generate: the static cache starts from the prompt with `use_mems` in eval mode; "
                "pass no `cache` or `mems` with it, or use the default cache."
            )
        mem_len = self.config.mem_len or None
        longest = max(max_length, generation_config.max_cache_len or 0, getattr(self, "_previous_max_cache_length", 0))
        self._previous_max_cache_length = longest
        slot_count = max(min(mem_len or longest, longest), self.generation_offset)
        model_kwargs["cache"] = StaticMemoryCache(self.config.n_layer, mem_len, slot_count, self.generation_offset)

    def prepare_inputs_for_generation(
        self, input_ids, cache=None, mems=None, use_mems=None, is_first_iteration=False, **kwargs
    ):
        """transformers' XLNet scheme without its dummy token (`predict_next_token`); `use_mems`: each step feeds the
        last two tokens again."""
        for unused in (
            "next_sequence_length", "attention_mask", "use_cache", "cache_position", "position_ids",
            "tokenizer",  # (generate()'s, for stop strings)
        ):  # fmt: skip
            kwargs.pop(unused, None)
        if kwargs.pop("inputs_embeds", None) is not None:
            raise ValueError("XLNetLMHeadModel.generate: `inputs_embeds` is not supported; pass `input_ids`.")
        if use_mems is None:
            use_mems = self.config.use_mems_train if self.training else self.config.use_mems_eval
        if use_mems and isinstance(cache, StaticMemoryCache) and cache.ring:  # (its step rewrites the newest position)
            # (a copy: a view's strides would change with the length, and recompile the step)
            input_ids = input_ids[:, -self.generation_offset :].clone(memory_format=torch.contiguous_format)
        elif use_mems:
            reuse_len, mem_len = self.config.reuse_len, self.config.mem_len
            if cache is None and mems is not None:
                cache = MemoryCache.from_mems(mems, mem_len, batch_size=input_ids.shape[0])
                forget = self.generation_offset
            elif cache is None or cache.memory(0) is None:  # the first step: the whole prompt
                cache = MemoryCache(self.config.n_layer, mem_len) if cache is None else cache
                forget = None
            else:
                # The last step remembered transformers' dummy iff it remembered all its tokens, i.e. fewer than
                # reuse_len (ours remembers tokens only).
                remembered_dummy = not reuse_len or cache.last_stored < reuse_len
                forget = self.generation_offset - remembered_dummy
            if forget is not None:
                _drop_newest(cache, forget)
                input_ids = input_ids[:, -self.generation_offset :]
            remembers_dummy = not reuse_len or reuse_len > input_ids.shape[1]  # this step, [tokens; dummy][:reuse_len]
            cache.mem_len = mem_len - remembers_dummy if mem_len else None
        elif mems is not None:  # transformers never updates them: every step attends to the same memory
            memory = MemoryCache.from_mems(mems, None, batch_size=input_ids.shape[0])
            _drop_newest(memory, self.generation_offset)
            mems, input_ids = memory.mems, input_ids[:, -self.generation_offset :]
        model_inputs = {
            "input_ids": input_ids,
            "predict_next_token": True,
            "use_mems": use_mems,
            "cache": cache if use_mems else None,
            "mems": None if use_mems else mems,
        }
        for key, value in kwargs.items():
            model_inputs.setdefault(key, value)
        return model_inputs


class XLNetForSequenceClassification(XLNetPreTrainedModel):
    """Sequence summary (the last token, XLNet's CLS, by default) and a linear classifier / regressor."""

    accepts_loss_kwargs = True

    def __init__(self, config: XLNetConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = XLNetModel(config)
        self.sequence_summary = XLNetSequenceSummary(config)
        self.logits_proj = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, mems=None, perm_mask=None, target_mapping=None, token_type_ids=None,
        input_mask=None, inputs_embeds=None, labels=None, use_mems=None, output_attentions=None,
        output_hidden_states=None, **kwargs,
    ) -> XLNetForSequenceClassificationOutput:  # fmt: skip
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        shape = inputs_shape(input_ids, inputs_embeds)
        if labels is not None and shape is not None:
            check_sequence_labels(type(self).__name__, self.config, labels, shape[0])
        outputs = self.transformer(
            input_ids, attention_mask=attention_mask, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
            token_type_ids=token_type_ids, input_mask=input_mask, inputs_embeds=inputs_embeds, use_mems=use_mems,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True, **kwargs,
        )  # fmt: skip
        logits = self.logits_proj(self.sequence_summary(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self._classification_loss(logits, labels, num_items_in_batch)
        return XLNetForSequenceClassificationOutput(loss=loss, logits=logits, **_passed_on(outputs))

    def _classification_loss(self, logits, labels, num_items_in_batch):
        if problem_type(self.config, labels) == "regression":
            if self.num_labels == 1:
                logits, labels = logits.squeeze(), labels.squeeze()
            return _loss_sum_or_mean(F.mse_loss, logits, labels.to(logits.dtype), num_items_in_batch)
        if self.config.problem_type == "single_label_classification":
            logits, labels = logits.view(-1, self.num_labels), labels.view(-1)
            return _loss_sum_or_mean(F.cross_entropy, logits, labels, num_items_in_batch)
        labels = labels.to(logits.dtype)
        return _loss_sum_or_mean(F.binary_cross_entropy_with_logits, logits, labels, num_items_in_batch)


class XLNetForTokenClassification(XLNetPreTrainedModel):
    """A linear classifier on every position (NER and the like)."""

    accepts_loss_kwargs = True

    def __init__(self, config: XLNetConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = XLNetModel(config)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, mems=None, perm_mask=None, target_mapping=None, token_type_ids=None,
        input_mask=None, inputs_embeds=None, labels=None, use_mems=None, output_attentions=None,
        output_hidden_states=None, **kwargs,
    ) -> XLNetForTokenClassificationOutput:  # fmt: skip
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        _check_token_labels(
            type(self).__name__, labels, input_ids, inputs_embeds, target_mapping, self.num_labels, "class ids",
            f" (num_labels={self.num_labels})",
        )
        outputs = self.transformer(
            input_ids, attention_mask=attention_mask, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
            token_type_ids=token_type_ids, input_mask=input_mask, inputs_embeds=inputs_embeds, use_mems=use_mems,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True, **kwargs,
        )  # fmt: skip
        logits = self.classifier(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = _loss_sum_or_mean(
                F.cross_entropy, logits.reshape(-1, self.num_labels), labels.reshape(-1), num_items_in_batch
            )
        return XLNetForTokenClassificationOutput(loss=loss, logits=logits, **_passed_on(outputs))


class XLNetForMultipleChoice(XLNetPreTrainedModel):
    """Scores each of the `num_choices` sequences ([B, C, L] inputs) with the sequence summary and one logit."""

    accepts_loss_kwargs = True

    def __init__(self, config: XLNetConfig):
        super().__init__(config)
        self.transformer = XLNetModel(config)
        self.sequence_summary = XLNetSequenceSummary(config)
        self.logits_proj = nn.Linear(config.d_model, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, token_type_ids=None, input_mask=None, attention_mask=None, mems=None, perm_mask=None,
        target_mapping=None, inputs_embeds=None, labels=None, use_mems=None, output_attentions=None,
        output_hidden_states=None, **kwargs,
    ) -> XLNetForMultipleChoiceOutput:  # fmt: skip
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        name = type(self).__name__
        reference = input_ids if input_ids is not None else inputs_embeds
        if reference is None or reference.dim() != (3 if input_ids is not None else 4):
            shape = None if reference is None else tuple(reference.shape)
            raise ValueError(f"{name}: expected `input_ids` [batch_size, num_choices, seq_len] (or `inputs_embeds` "
                             f"[batch_size, num_choices, seq_len, d_model]), got {shape}.")  # fmt: skip
        batch_size, num_choices, seq_len = reference.shape[:3]
        for field, tensor in (("attention_mask", attention_mask), ("input_mask", input_mask),
                              ("token_type_ids", token_type_ids)):  # fmt: skip
            check_shape(name, field, tensor, reference.shape[:3], "[batch_size, num_choices, seq_len]",
                        " (from the inputs)")  # fmt: skip
        if labels is not None:
            check_class_ids(name, labels, batch_size, num_choices, "choice indices", "")

        def flat(tensor):  # [batch_size, num_choices, ...] -> [batch_size * num_choices, ...]
            return None if tensor is None else tensor.flatten(0, 1)

        outputs = self.transformer(
            flat(input_ids), token_type_ids=flat(token_type_ids), input_mask=flat(input_mask),
            attention_mask=flat(attention_mask), mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
            inputs_embeds=flat(inputs_embeds), use_mems=use_mems, output_attentions=output_attentions,
            output_hidden_states=output_hidden_states, return_dict=True, **kwargs,
        )  # fmt: skip
        logits = self.logits_proj(self.sequence_summary(outputs.last_hidden_state)).view(-1, num_choices)
        loss = None
        if labels is not None:
            loss = _loss_sum_or_mean(F.cross_entropy, logits, labels.view(-1), num_items_in_batch)
        return XLNetForMultipleChoiceOutput(loss=loss, logits=logits, **_passed_on(outputs))


class XLNetForQuestionAnsweringSimple(XLNetPreTrainedModel):
    """Extractive QA with independent start / end logits (one linear layer, `num_labels` = 2)."""

    accepts_loss_kwargs = False  # span losses use start/end positions, never `labels`: Trainer scales them for GA

    def __init__(self, config: XLNetConfig):
        super().__init__(config)
        if config.num_labels != 2:
            raise ValueError(
                f"XLNetForQuestionAnsweringSimple: config.num_labels={config.num_labels}; expected 2 (one start and "
                "one end logit per token)."
            )
        self.num_labels = config.num_labels
        self.transformer = XLNetModel(config)
        self.qa_outputs = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, mems=None, perm_mask=None, target_mapping=None, token_type_ids=None,
        input_mask=None, inputs_embeds=None, start_positions=None, end_positions=None, use_mems=None,
        output_attentions=None, output_hidden_states=None, **kwargs,
    ) -> XLNetForQuestionAnsweringSimpleOutput:  # fmt: skip
        output = _output_positions(input_ids, inputs_embeds, target_mapping)
        if output is not None:  # (positions past the end pass: see the loss)
            for field, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
                check_span_positions(type(self).__name__, field, positions, *output[:2], ignore_beyond=True)
        outputs = self.transformer(
            input_ids, attention_mask=attention_mask, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
            token_type_ids=token_type_ids, input_mask=input_mask, inputs_embeds=inputs_embeds, use_mems=use_mems,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True, **kwargs,
        )  # fmt: skip
        logits = self.qa_outputs(outputs.last_hidden_state)
        start_logits, end_logits = logits[..., 0].contiguous(), logits[..., 1].contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            # Positions past the end are ignored, as in transformers: the answer lies outside this window.
            def span_loss(logits, positions):
                positions = positions.reshape(-1)
                targets = positions.where(positions < logits.shape[1], IGNORE_INDEX)
                return _loss_sum_or_mean(F.cross_entropy, logits, targets, None)

            loss = (span_loss(start_logits, start_positions) + span_loss(end_logits, end_positions)) / 2
        return XLNetForQuestionAnsweringSimpleOutput(
            loss=loss, start_logits=start_logits, end_logits=end_logits, **_passed_on(outputs)
        )


class XLNetForQuestionAnswering(XLNetPreTrainedModel):
    """The original's SQuAD head: start, end given the start, answerability. Training: the gold start; loss = (start
    + end) / 2 + 0.5 x answerability BCE. Inference: the `end_n_top` best ends of the `start_n_top` best starts."""

    accepts_loss_kwargs = False  # (as XLNetForQuestionAnsweringSimple)

    def __init__(self, config: XLNetConfig):
        super().__init__(config)
        self.start_n_top = config.start_n_top
        self.end_n_top = config.end_n_top
        self.transformer = XLNetModel(config)
        self.start_logits = XLNetPoolerStartLogits(config)
        self.end_logits = XLNetPoolerEndLogits(config)
        self.answer_class = XLNetPoolerAnswerClass(config)
        self.post_init()

    @can_return_tuple
    def forward(
        self, input_ids=None, attention_mask=None, mems=None, perm_mask=None, target_mapping=None, token_type_ids=None,
        input_mask=None, inputs_embeds=None, start_positions=None, end_positions=None, is_impossible=None,
        cls_index=None, p_mask=None, use_mems=None, output_attentions=None, output_hidden_states=None, **kwargs,
    ) -> XLNetForQuestionAnsweringOutput:  # fmt: skip
        output = _output_positions(input_ids, inputs_embeds, target_mapping)
        if output is not None:
            name = type(self).__name__
            for field, positions in (("start_positions", start_positions), ("end_positions", end_positions),
                                     ("cls_index", cls_index)):  # fmt: skip
                check_span_positions(name, field, positions, *output[:2], ignore_beyond=False)
            if is_impossible is not None:
                check_one_per_sequence(name, "is_impossible", is_impossible, output[0])
        outputs = self.transformer(
            input_ids, attention_mask=attention_mask, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
            token_type_ids=token_type_ids, input_mask=input_mask, inputs_embeds=inputs_embeds, use_mems=use_mems,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True, **kwargs,
        )  # fmt: skip
        hidden = outputs.last_hidden_state
        start_logits = self.start_logits(hidden, p_mask=p_mask)

        if start_positions is not None and end_positions is not None:
            start_positions, end_positions = start_positions.reshape(-1), end_positions.reshape(-1)
            end_logits = self.end_logits(hidden, start_positions=start_positions, p_mask=p_mask)
            loss = (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(end_logits, end_positions)) / 2
            if cls_index is not None and is_impossible is not None:
                cls_index, is_impossible = cls_index.reshape(-1), is_impossible.reshape(-1)
                cls_logits = self.answer_class(hidden, start_positions=start_positions, cls_index=cls_index)
                cls_loss = F.binary_cross_entropy_with_logits(cls_logits, is_impossible.to(cls_logits.dtype))
                loss = loss + 0.5 * cls_loss
            return XLNetForQuestionAnsweringOutput(loss=loss, **_passed_on(outputs))

        batch, length, width = hidden.shape
        start_probs = F.softmax(start_logits, dim=-1)  # [B, L]
        start_top_probs, start_top_index = torch.topk(start_probs, self.start_n_top, dim=-1)  # [B, k_s]
        start_states = hidden.gather(-2, start_top_index[..., None].expand(-1, -1, width))  # [B, k_s, d]
        start_states = start_states[:, None].expand(-1, length, -1, -1)  # [B, L, k_s, d]
        hidden_expanded = hidden[:, :, None].expand_as(start_states)
        end_p_mask = p_mask[..., None] if p_mask is not None else None
        end_logits = self.end_logits(hidden_expanded, start_states=start_states, p_mask=end_p_mask)  # [B, L, k_s]
        end_probs = F.softmax(end_logits, dim=1)
        end_top_probs, end_top_index = torch.topk(end_probs, self.end_n_top, dim=1)  # [B, k_e, k_s]
        end_top_probs, end_top_index = end_top_probs.flatten(1), end_top_index.flatten(1)  # [B, k_e k_s]
        expected_start = torch.einsum("blh,bl->bh", hidden, start_probs)
        cls_logits = self.answer_class(hidden, start_states=expected_start, cls_index=cls_index)
        return XLNetForQuestionAnsweringOutput(
            start_top_log_probs=start_top_probs, start_top_index=start_top_index, end_top_log_probs=end_top_probs,
            end_top_index=end_top_index, cls_logits=cls_logits, **_passed_on(outputs),
        )  # fmt: skip


__all__ = [
    "XLNetPreTrainedModel",
    "XLNetModel",
    "XLNetLMHeadModel",
    "XLNetForSequenceClassification",
    "XLNetForTokenClassification",
    "XLNetForMultipleChoice",
    "XLNetForQuestionAnsweringSimple",
    "XLNetForQuestionAnswering",
]
