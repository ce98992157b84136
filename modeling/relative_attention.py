"""What Transformer-XL and XLNet share. Dai et al. (2019), Sec. 3.3, for query i and key j:

    A_ij = (E_xi W_q + u)^T W_k E_xj   [(a) content + (c) global content bias u]
         + (E_xi W_q + v)^T W_kR R_i-j [(b) content-dependent position + (d) global position bias v]

(a)+(c) is `q + u` against the keys; (b)+(d) per distance, shifted to (query, key) pairs (App. B)."""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from transformers.modeling_utils import AttentionInterface


def sinusoid_inverse_frequencies(dim: int, device=None) -> torch.Tensor:
    """1 / 10000^(2k/dim), k < dim/2 (Vaswani et al. 2017), made on `device` (no host copy)."""
    return 1.0 / (10000 ** (torch.arange(0.0, dim, 2.0, device=device) / dim))


def sinusoid_encoding(positions: torch.Tensor, inverse_frequencies: torch.Tensor) -> torch.Tensor:
    """[..., len] -> [..., len, dim] `cat(sin(p f), cos(p f))` in fp32 (bf16 has no integers above 256)."""
    angles = positions.float()[..., None] * inverse_frequencies.float()
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_shift(position_scores: torch.Tensor, key_length: int, offset: int) -> torch.Tensor:
    """`out[..., i, j] = position_scores[..., i, j + offset - i]` (distances decreasing), a view: rows of R - 1 from
    `offset` on (App. B). Entries outside 0 ... R-1 are masked keys'; none shares an element (write masks in place)."""
    *batch, length, distances = position_scores.shape
    if key_length >= distances or not 0 <= offset <= length:
        raise ValueError(f"relative_shift: {key_length} keys, {distances} distances, offset {offset}, {length} queries; "
                         "expected key_length < distances and 0 <= offset <= queries.")  # fmt: skip
    flat = position_scores.flatten(-2)  # [..., q R] (a view where each [q, R] block is contiguous)
    rows = flat[..., offset : offset + length * (distances - 1)].unflatten(-1, (length, distances - 1))
    return rows[..., :key_length]  # row i starts at offset + i (R - 1) = i R + (offset - i)


def mask_scores_(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The dtype's lowest value where `mask`, unrecorded by autograd (a zero gradient; no copies of the scores)."""
    with torch.no_grad():
        return scores.masked_fill_(mask, torch.finfo(scores.dtype).min)


def distance_scores(position_query: torch.Tensor, position_keys: torch.Tensor) -> torch.Tensor:
    """[B, H, q, D] x [H, R, D] -> [B, H, q, R], one product per head (no per-row copy of the keys)."""
    batch, heads, length, dim = position_query.shape
    rows = position_query.transpose(0, 1).reshape(heads, batch * length, dim)  # (a view of the usual [B, q, H, D])
    return torch.matmul(rows, position_keys.transpose(1, 2)).unflatten(1, (batch, length)).transpose(0, 1)


def eager_attention_forward(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor,
    scaling: float, dropout: float = 0.0, **kwargs,
):  # fmt: skip
    """The reference: query [B, H, q, D] is `q + u` (`query @ key`: (a)+(c)), key / value [B, H, k, D], attention_mask
    [B|1, H|1, q, k] every other term, scaled, the dtype's lowest where masked -> ([B, q, H, D], probabilities)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling + attention_mask  # + (b) + (d) [+ segment], masked
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def attention_implementation(config, output_attentions: bool, dropout: float, device) -> str:
    """A call's implementation: "eager" for probabilities; "sdpa" for flex with attention dropout or, on CPU, with
    gradients on (no CPU flex backward)."""
    name = "eager" if output_attentions else config._attn_implementation
    if name == "flex_attention" and (dropout > 0 or device.type == "cpu" and torch.is_grad_enabled()):
        return "sdpa"
    return name


def pad_to_block(x: torch.Tensor, *dims: int) -> torch.Tensor:
    """`x` zero-padded along `dims` (-2, -1; default -2) to multiples of 128, flex's block: a compiled kernel per
    rounded shape (torch 2.13's CPU kernel fails to build with dynamic shapes)."""
    dims = dims or (-2,)
    pads = (0, -x.shape[-1] % 128 if -1 in dims else 0, 0, -x.shape[-2] % 128 if -2 in dims else 0)
    return F.pad(x, pads) if any(pads) else x


class FlexMask(NamedTuple):  # a BlockMask (fully masked blocks are skipped), [B|1, 1, q, 1] rows seeing no key
    block_mask: BlockMask
    empty_rows: torch.Tensor | None


def flex_mask(mask: torch.Tensor | None, query_length: int, key_length: int, device) -> FlexMask:
    """[B|1, 1, q, k] `mask` (True = may not attend; None: none) as a FlexMask, once per forward for all layers."""
    empty_rows = None if mask is None else mask.all(-1, keepdim=True)
    if mask is None:
        mask = torch.zeros(1, 1, query_length, key_length, dtype=torch.bool, device=device)
    allowed = pad_to_block(~mask[:, 0], -2, -1)  # (padding: masked)
    batch = allowed.shape[0] if allowed.shape[0] > 1 else None
    mask_mod = lambda b, h, i, j: allowed[b if batch else 0, i, j]  # noqa: E731
    return FlexMask(create_block_mask(mask_mod, batch, None, *allowed.shape[1:], device=device), empty_rows)


_compiled_flex_attention = None  # (compiled at first use)


def flex_attention_forward(module, query, key, value, attention_mask: FlexMask | torch.Tensor | None, scaling: float,
                           position_scores=None, shift_offset=None, segment_scores=None, segment_mismatch=None, **_):
    """Eager's attention by compiled flex_attention, no [B, H, q, k] tensor written: score_mod reads `position_scores`
    [B, H, q, R] (rounded: `pad_to_block`) at [i, j + shift_offset - i] (None: [i, j]) and `segment_scores` [B, H, q,
    2] at [i, `segment_mismatch`[b, i, j]]. Rows seeing no key get the values' mean, as in eager."""
    global _compiled_flex_attention
    length, key_length = query.shape[2], key.shape[2]
    if not isinstance(attention_mask, FlexMask):
        attention_mask = flex_mask(attention_mask, length, key_length, query.device)
    query, key, value = pad_to_block(query), pad_to_block(key), pad_to_block(value)
    if position_scores is not None:
        step = position_scores.shape[-1] - (shift_offset is not None)  # (row i: from offset + i step)
        flat, offset = position_scores.flatten(-2), torch.full((), shift_offset or 0, device=query.device)
    if segment_scores is not None:
        segment_mismatch = pad_to_block(segment_mismatch, -2, -1)
        segment_scores = pad_to_block(segment_scores)

    def score_mod(score, b, h, i, j):
        if position_scores is not None:  # (offset: a tensor, not recompiled)
            score = score + flat[b, h, (offset + i * step + j).clamp(max=flat.shape[-1] - 1)]
        if segment_scores is not None:
            score = score + segment_scores[b, h, i, segment_mismatch[b, i, j].long()]
        return score

    if _compiled_flex_attention is None and not torch.compiler.is_compiling():
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    attend = flex_attention if torch.compiler.is_compiling() else _compiled_flex_attention
    output = attend(query, key, value, score_mod, attention_mask.block_mask, scale=scaling)[:, :, :length]
    if attention_mask.empty_rows is not None:
        output = torch.where(attention_mask.empty_rows, value[:, :, :key_length].mean(-2, keepdim=True), output)
    return output.transpose(1, 2).contiguous(), None


# transformers' attention functions, with ours for "flex_attention" (in this instance only)
ALL_ATTENTION_FUNCTIONS = AttentionInterface()
ALL_ATTENTION_FUNCTIONS["flex_attention"] = flex_attention_forward


def causal_memory_mask(
    query_length: int, memory_length: int, same_length: bool = False, same_length_span: int | None = None, device=None,
) -> torch.Tensor:  # fmt: skip
    """[q, m + q], True where query i may not attend key j: j > m + i and, with `same_length` (Dai et al. App.),
    j <= i - s (s: `same_length_span`, default q), so every query sees as many keys."""
    key_length = memory_length + query_length
    ones = torch.ones(query_length, key_length, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + memory_length)
    if same_length:
        span = query_length if same_length_span is None else same_length_span
        mask = mask | torch.tril(ones, diagonal=-span)
    return mask


class CrossEntropy(torch.autograd.Function):
    """`F.cross_entropy(..., reduction="none")` (-100: 0) with fewer [N, V] tensors: the backward turns the saved
    log-probabilities into d(-log p_t)/dx = softmax(x) - onehot(t) in place; `overwrite`: over the logits."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, overwrite: bool) -> torch.Tensor:
        log_probs = torch.log_softmax(logits, dim=-1, out=logits if overwrite else None)
        kept = target != -100
        index = target.where(kept, 0)[:, None]
        ctx.save_for_backward(log_probs, index, kept)
        return -log_probs.gather(-1, index).squeeze(-1).where(kept, 0.0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        log_probs, index, kept = ctx.saved_tensors
        grad = grad.where(kept, 0.0)[:, None]
        return log_probs.exp_().mul_(grad).scatter_add_(-1, index, -grad), None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, reduction: str = "none", overwrite: bool = False):
    """[N, V], [N] -> [N] (`reduction="none"`) or their sum ("sum"): see `CrossEntropy`."""
    losses = CrossEntropy.apply(logits, target, overwrite)
    return losses.sum() if reduction == "sum" else losses
