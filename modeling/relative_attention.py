"""What Transformer-XL and XLNet share: sinusoidal relative encodings, the relative shift, relative attention in
transformers' attention-interface convention, the causal mask over [memory; segment], and the language-model loss.

Dai et al. (2019), Sec. 3.3: for a query i and a key j the attention score is

    A_ij = (E_xi W_q + u)^T W_k E_xj   [(a) content + (c) global content bias u]
         + (E_xi W_q + v)^T W_kR R_i-j [(b) content-dependent position + (d) global position bias v]

(a)+(c) is `q + u` against the keys; (b)+(d), per distance, shifted to (query, key) pairs (App. B), and the mask
are one additive score bias for every attention implementation (`score_bias_arguments`)."""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from transformers.modeling_utils import AttentionInterface


def sinusoid_inverse_frequencies(dim: int, device=None) -> torch.Tensor:
    """1 / 10000^(2k/dim) for k < dim/2: the frequencies of the sinusoid encoding (Vaswani et al. 2017), made on
    `device` (a copy from the host would make the host wait for a GPU)."""
    return 1.0 / (10000 ** (torch.arange(0.0, dim, 2.0, device=device) / dim))


def sinusoid_encoding(positions: torch.Tensor, inverse_frequencies: torch.Tensor) -> torch.Tensor:
    """[..., len] positions -> [..., len, dim] encodings `cat(sin(p f), cos(p f))`, computed in fp32.

    Positions stay fp32 even in half-precision models: bf16 cannot represent integers above 256 exactly.
    """
    angles = positions.float()[..., None] * inverse_frequencies.float()
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_shift(position_scores: torch.Tensor, key_length: int, offset: int) -> torch.Tensor:
    """Re-index per-distance scores to (query, key) pairs: `out[..., i, j] = position_scores[..., i, j + offset - i]`.
    Rows list R distances in decreasing order (Transformer-XL k-1 ... -1, offset q - 1; XLNet k ... -q+1, offset q).
    Rows of R - 1 read from `offset` on are the original's pad-and-reshape (App. B) as views; entries outside 0 ...
    R-1 are masked keys', and no two share an element: the mask may be written in place."""
    *batch, length, distances = position_scores.shape
    if key_length >= distances or not 0 <= offset <= length:
        raise ValueError(
            f"relative_shift: {distances} distances cannot be shifted to {key_length} keys with offset {offset} for "
            f"{length} queries; expected key_length < distances and 0 <= offset <= queries."
        )
    flat = position_scores.flatten(-2)  # [..., q R] (a view where each [q, R] block is contiguous)
    rows = flat[..., offset : offset + length * (distances - 1)].unflatten(-1, (length, distances - 1))
    return rows[..., :key_length]  # row i starts at offset + i (R - 1) = i R + (offset - i)


def mask_scores_(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The dtype's lowest value where `mask` is True, unrecorded by autograd: those probabilities are 0, so is their
    gradient (not in a fully masked row, as in transformers' XLNet); a recorded write would copy the scores twice."""
    with torch.no_grad():
        return scores.masked_fill_(mask, torch.finfo(scores.dtype).min)


def distance_scores(position_query: torch.Tensor, position_keys: torch.Tensor) -> torch.Tensor:
    """[B, H, q, D] x [H, R, D] position keys -> [B, H, q, R], one product per head over all batch rows (broadcast
    over the batch, the product would copy the keys per row and keep the copy for the backward)."""
    batch, heads, length, dim = position_query.shape
    rows = position_query.transpose(0, 1).reshape(heads, batch * length, dim)  # (a view of the usual [B, q, H, D])
    return torch.matmul(rows, position_keys.transpose(1, 2)).unflatten(1, (batch, length)).transpose(0, 1)


def eager_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    """Relative attention written out, the reference, in transformers' attention interface convention: query
    [B, H, q, D] holds the content bias (`q + u`, so `query @ key` is (a)+(c)); key, value [B, H, k, D];
    attention_mask [B|1, H|1, q, k]: every other term, scaled, with the dtype's lowest value where query i may not
    attend key j. Returns (output [B, q, H, D], probabilities [B, H, q, k])."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling + attention_mask  # + (b) + (d) [+ segment], masked
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def attention_implementation(config, output_attentions: bool, dropout: float, device) -> str:
    """The implementation a call uses: "eager" when it returns the probabilities; "sdpa" for "flex_attention" with
    attention dropout or, on CPU, with gradients on (torch has no CPU flex backward)."""
    name = "eager" if output_attentions else config._attn_implementation
    if name == "flex_attention" and (dropout > 0 or device.type == "cpu" and torch.is_grad_enabled()):
        return "sdpa"
    return name


FLEX_BLOCK = 128  # flex_attention's block: its lengths are rounded up to it, one compiled kernel per rounded shape


def pad_to_block(x: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """`x` with zeros after its last index along `dim` (-2 or -1) up to a multiple of FLEX_BLOCK."""
    extra = -x.shape[dim] % FLEX_BLOCK
    return F.pad(x, (0, 0) * (-1 - dim) + (0, extra)) if extra else x


class FlexMask(NamedTuple):
    """A [B|1, 1, q, k] boolean mask for flex_attention: `block_mask` over lengths rounded up to FLEX_BLOCK (fully
    masked blocks are skipped), `empty_rows` [B|1, 1, q, 1] the queries that may attend no key (None: none)."""

    block_mask: BlockMask
    empty_rows: torch.Tensor | None


def flex_mask(mask: torch.Tensor | None, query_length: int, key_length: int, device) -> FlexMask:
    """`mask` (True = may not attend; None: nothing masked) as a FlexMask, built once per forward for all layers."""
    if mask is None:
        mask = torch.zeros(1, 1, query_length, key_length, dtype=torch.bool, device=device)
    allowed = pad_to_block(pad_to_block(~mask[:, 0], -1))  # (padding: masked)
    batch = allowed.shape[0]
    block_mask = create_block_mask(
        lambda b, h, i, j: allowed[b if batch > 1 else 0, i, j], batch if batch > 1 else None, None,
        allowed.shape[1], allowed.shape[2], device=device, BLOCK_SIZE=FLEX_BLOCK,
    )
    return FlexMask(block_mask, mask.all(-1, keepdim=True) if mask.shape[-2] else None)


_compiled_flex_attention = None  # (compiled at its first use, for every model of the process)


def flex_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: FlexMask | torch.Tensor | None,
    scaling: float,
    position_scores: torch.Tensor | None = None,
    shift_offset: int | None = None,
    segment_scores: torch.Tensor | None = None,
    segment_mismatch: torch.Tensor | None = None,
    **kwargs,
):
    """`eager_attention_forward` fused by torch's compiled flex_attention: the score_mod reads the position scores
    per distance, `position_scores` [B, H, q', R'] (q and R rounded up, `pad_to_block`), at `out[i, j] = scores[i,
    j + shift_offset - i]` (`relative_shift`; None: unshifted), plus (q_i + b)^T s_ij from `segment_scores` [B, H,
    q, 2] and `segment_mismatch` [B, q, k]; the mask is a FlexMask. No [B, H, q, k] tensor is
    written; a query that may attend no key gets the values' mean, as eager's lowest-value fill gives it."""
    global _compiled_flex_attention
    length, key_length = query.shape[2], key.shape[2]
    if not isinstance(attention_mask, FlexMask):
        attention_mask = flex_mask(attention_mask, length, key_length, query.device)
    query, key, value = pad_to_block(query), pad_to_block(key), pad_to_block(value)
    if position_scores is not None:
        step = position_scores.shape[-1] - (shift_offset is not None)  # (row i starts at offset + i step)
        flat = position_scores.flatten(-2)
        offset = torch.full((), shift_offset or 0, device=query.device)  # (a tensor: lengths do not recompile)
    if segment_scores is not None:
        segment_scores, segment_mismatch = pad_to_block(segment_scores), pad_to_block(pad_to_block(segment_mismatch), -1)

    def score_mod(score, b, h, i, j):
        if position_scores is not None:
            score = score + flat[b, h, (offset + i * step + j).clamp(max=flat.shape[-1] - 1)]
        if segment_scores is not None:  # (the padded keys' reads are masked)
            score = score + segment_scores[b, h, i, segment_mismatch[b, i, j].long()]
        return score

    if _compiled_flex_attention is None and not torch.compiler.is_compiling():
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    attend = flex_attention if torch.compiler.is_compiling() else _compiled_flex_attention
    output = attend(query, key, value, score_mod, attention_mask.block_mask, scale=scaling)[:, :, :length]
    if attention_mask.empty_rows is not None:
        output = torch.where(attention_mask.empty_rows, value[:, :, :key_length].mean(-2, keepdim=True), output)
    return output.transpose(1, 2).contiguous(), None

# transformers' attention functions, with `flex_attention_forward` for "flex_attention" in this instance only
ALL_ATTENTION_FUNCTIONS = AttentionInterface()
ALL_ATTENTION_FUNCTIONS["flex_attention"] = flex_attention_forward


def causal_memory_mask(
    query_length: int,
    memory_length: int,
    same_length: bool = False,
    same_length_span: int | None = None,
    device=None,
) -> torch.Tensor:
    """[q, m + q] boolean mask, True where query i (at position m + i) may not attend to key j: future keys (j > m + i)
    and, with `same_length` (Dai et al. App.), keys j <= i - s, s = `same_length_span` (default q), so that every
    query sees as many keys."""
    key_length = memory_length + query_length
    ones = torch.ones(query_length, key_length, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + memory_length)
    if same_length:
        span = query_length if same_length_span is None else same_length_span
        mask = mask | torch.tril(ones, diagonal=-span)
    return mask



class CrossEntropy(torch.autograd.Function):
    """`F.cross_entropy(..., reduction="none")` (-100 gives 0) with fewer [N, V] tensors (a training step's peak): the
    backward turns the saved log-probabilities into the gradient in place; `overwrite` writes them over the logits.
    d(-log p_t)/dx = softmax(x) - onehot(t)."""

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
