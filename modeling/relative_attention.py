"""What Transformer-XL and XLNet share: sinusoidal relative encodings, the relative shift, relative attention with
the learned u / v biases, and attention masks. (The memory itself lives in memory_cache.py.)

Notation follows Dai et al. (2019), Sec. 3.3. For a query i and a key j the attention score is

    A_ij = (E_xi W_q + u)^T W_k E_xj   [(a) content + (c) global content bias u]
         + (E_xi W_q + v)^T W_kR R_i-j [(b) content-dependent position + (d) global position bias v]

Terms (a)+(c) are an ordinary dot product of the biased query `q + u` with the keys, so they run inside a fused
attention kernel. Terms (b)+(d) are computed against one row per relative distance and then re-indexed to
(query, key) pairs by the relative shift (App. B); they enter the kernel as an additive score bias.

All tensors here are batch-first: hidden states [batch, length, dim], heads [batch, heads, length, head_dim].
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F


def sinusoid_inverse_frequencies(dim: int) -> torch.Tensor:
    """1 / 10000^(2k/dim) for k < dim/2: the frequencies of the sinusoid encoding (Vaswani et al. 2017)."""
    return 1.0 / (10000 ** (torch.arange(0.0, dim, 2.0) / dim))


def sinusoid_encoding(positions: torch.Tensor, inverse_frequencies: torch.Tensor) -> torch.Tensor:
    """[..., len] positions -> [..., len, dim] encodings `cat(sin(p f), cos(p f))`, computed in fp32.

    Positions stay fp32 even in half-precision models: bf16 cannot represent integers above 256 exactly.
    """
    angles = positions.float()[..., None] * inverse_frequencies.float()
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def relative_shift(position_scores: torch.Tensor, key_length: int, offset: int) -> torch.Tensor:
    """Re-index per-distance scores to (query, key) pairs: `out[..., i, j] = position_scores[..., i, j + offset - i]`.

    Row i of `position_scores` [..., q, R] holds the scores of query i against the R relative distances listed in
    decreasing order. Shifting row i left by i is a view (the "skewing" trick of Dai et al. App. B / Huang et al.
    2018): flattened, element (i, j) sits at `i (R - 1) + j + offset`, so the shifted scores are the flat scores
    from `offset` on, read in rows of R - 1, first `key_length` columns. No copy, pad or gather, and only plain
    views, which autograd and torch.compile handle like any slice. It needs `offset <= q` and `key_length < R`
    (one distance more than keys): Transformer-XL lists distances k-1 ... -1 (`offset = q - 1`), XLNet k ... -q+1
    or k ... 0 (`offset = q`). Entries that read the next row's start belong to future keys, which are masked.
    """
    *batch, length, distances = position_scores.shape
    if key_length >= distances or not 0 <= offset <= length:
        raise ValueError(
            f"relative_shift: {distances} distances cannot be shifted to {key_length} keys with offset {offset} for "
            f"{length} queries; expected key_length < distances and 0 <= offset <= queries."
        )
    if torch.is_grad_enabled() and position_scores.requires_grad:
        return _RelativeShift.apply(position_scores, key_length, offset)
    return _shifted_view(position_scores, key_length, offset)


def _shifted_view(position_scores: torch.Tensor, key_length: int, offset: int) -> torch.Tensor:
    *batch, length, distances = position_scores.shape
    flat = position_scores.reshape(*batch, length * distances)
    rows = flat[..., offset : offset + length * (distances - 1)].view(*batch, length, distances - 1)
    return rows[..., :key_length]


class _RelativeShift(torch.autograd.Function):
    """The shift with a one-pass backward. Autograd's own backward of the view's slices fills a zero tensor of the
    scores' size per slice and copies the gradient into it (two or three passes over a [B, H, q, R] tensor per
    layer); the shifted cells are distinct, so the gradient is written through the same view and only the cells it
    does not cover are zeroed."""

    @staticmethod
    def forward(ctx, position_scores, key_length, offset):
        ctx.shape, ctx.key_length, ctx.offset = position_scores.shape, key_length, offset
        return _shifted_view(position_scores, key_length, offset)

    @staticmethod
    def backward(ctx, grad):
        *batch, length, distances = ctx.shape
        grad_scores = grad.new_empty(ctx.shape)
        flat = grad_scores.view(*batch, length * distances)
        end = ctx.offset + length * (distances - 1)
        flat[..., : ctx.offset].zero_()
        flat[..., end:].zero_()
        rows = flat[..., ctx.offset : end].view(*batch, length, distances - 1)
        rows[..., ctx.key_length :].zero_()
        rows[..., : ctx.key_length].copy_(grad)
        return grad_scores, None, None


def relative_position_scores(
    query: torch.Tensor,
    position_keys: torch.Tensor,
    position_bias: torch.Tensor | None,
    key_length: int,
    offset: int,
) -> torch.Tensor:
    """Terms (b)+(d), `(q_i + v)^T W_kR R_{i-j}`, for every (query, key) pair: [B, H, q, key_length].

    - query [B, H, q, d]; position_bias (v) [H, d] or None;
    - position_keys: `W_kR R` for the R relative distances in decreasing order, projected once for the whole batch
      and pre-scaled by 1/sqrt(d) if the scores are to be (`relative_attention` takes scaled score biases): [H, R, d]
      for every batch row, or [G, 1, H, R, d] for G equal groups of rows (XLNet's `bi_data`: forward and backward);
    - key_length, offset: as in `relative_shift`.
    """
    if position_bias is not None:
        query = query + position_bias[:, None, :].to(query.dtype)
    if position_keys.dim() == 5:
        grouped = query.unflatten(0, (position_keys.shape[0], -1))
        scores = torch.matmul(grouped, position_keys.transpose(-1, -2))
        return relative_shift(scores, key_length, offset).flatten(0, 1)
    # Keys shared by every batch row: one [B*q, d] x [d, R] GEMM per head instead of B broadcast ones (which would
    # also copy the keys B times). Shifted in [H, B, q, R] layout, returned as a [B, H, q, k] view.
    batch, heads, length, dim = query.shape
    folded = query.transpose(0, 1).reshape(heads, batch * length, dim)
    scores = torch.matmul(folded, position_keys.transpose(-1, -2)).view(heads, batch, length, -1)
    return relative_shift(scores, key_length, offset).transpose(0, 1)


class RelativePositions(NamedTuple):
    """Terms (b)+(d) of the scores, for `relative_attention` to compute block by block: the position keys and bias v
    and the shift offset of `relative_position_scores` for the whole query range."""

    keys: torch.Tensor
    bias: torch.Tensor | None
    offset: int


# Scores [B, H, rows, keys] are made for this many elements at a time (16 MiB in fp32): queries go through the
# attention in blocks of rows, so that no score-sized temporary is allocated whole. Fresh tensors of tens of MiB are
# mapped from the OS on every call and paid for in page faults on first touch, which cost as much as the passes
# over them on these CPUs; blocks come from the allocator's free lists.
SCORE_BLOCK_ELEMENTS = 1 << 22


def relative_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    content_bias: torch.Tensor | None = None,
    positions: RelativePositions | None = None,
    score_bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
    output_attentions: bool = False,
):
    """softmax((q + u) k^T / sqrt(d) + position terms + score_bias) v, with masked pairs removed: [B, H, q, d] and the
    probabilities [B, H, q, k] when `output_attentions`.

    - query [B, H, q, d], key / value [B, H, k, d]; content_bias (u) [H, d] or None;
    - positions: terms (b)+(d) (see RelativePositions), computed per block of queries, or None;
    - score_bias: any other score term, already scaled by 1/sqrt(d) (Transformer-XL's attn_type 1, XLNet's segment
      term), broadcastable to [B, H, q, k], or None;
    - mask: boolean, True where a query may NOT attend, broadcastable to [B, H, q, k], or None;
    - causal: every key after the last query's own position is masked (key j > k - q + i for query i), so a block of
      queries attends only to the keys up to its last row's position.

    Queries are processed in blocks of rows (`SCORE_BLOCK_ELEMENTS`). Query rows i0 <= i < i1 read the relative
    distances listed from column q - i1 on (those of the farthest key from the block's first row down), so a block is
    the same problem for fewer queries: position keys from that column, shift offset `offset - (q - i1) - i0`.
    """
    batch, heads, length, _ = query.shape
    key_length = key.shape[2]
    block = length if output_attentions else max(1, SCORE_BLOCK_ELEMENTS // (batch * heads * key_length))
    outputs, probs = [], None
    for start in range(0, length, block):
        end = min(length, start + block)
        keys = key_length - length + end if causal else key_length
        bias = None
        if positions is not None:
            first = length - end
            bias = relative_position_scores(
                query[:, :, start:end], positions.keys[..., first:, :], positions.bias, keys,
                positions.offset - first - start,
            )  # fmt: skip
        if score_bias is not None:
            rows = _rows(score_bias, start, end, keys)
            bias = rows if bias is None else bias + rows
        output, probs = _attention_block(
            query[:, :, start:end], key[:, :, :keys], value[:, :, :keys], content_bias, bias,
            None if mask is None else _rows(mask, start, end, keys), dropout, output_attentions,
        )  # fmt: skip
        outputs.append(output)
    return (torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]), probs


def _rows(scores: torch.Tensor, start: int, end: int, keys: int) -> torch.Tensor:
    """Query rows start:end and the first `keys` columns of a [..., q or 1, k or 1] score term or mask."""
    if scores.shape[-2] > 1:
        scores = scores[..., start:end, :]
    return scores[..., :keys] if scores.shape[-1] > 1 else scores


def _attention_block(query, key, value, content_bias, bias, mask, dropout, output_attentions):
    """One block of queries (see relative_attention); `bias` holds every score term but (a)+(c).

    Without gradients the scores go through torch's fused `scaled_dot_product_attention` with the bias as its float
    mask (without a mask the shifted view itself, never copied). With gradients, or `output_attentions=True`, the
    scores are computed explicitly: the fused CPU kernel cannot return a gradient for a float mask, and torch's
    fallback for one that needs it is several times slower and stores more. Both give the same numbers. Masked
    scores get the dtype's most negative finite value rather than -inf, so a fully masked query row (a padding
    position) yields finite output instead of NaN.
    """
    scale = query.shape[-1] ** -0.5
    if content_bias is not None:
        query = query + content_bias[:, None, :].to(query.dtype)
    bias = None if bias is None else bias.to(query.dtype)
    lowest = torch.finfo(query.dtype).min
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (query, key, value, bias)
    )
    if not (output_attentions or needs_grad):
        if mask is not None:
            bias = torch.zeros((), dtype=query.dtype, device=query.device) if bias is None else bias
            bias = torch.where(mask, lowest, bias)  # one pass: the mask applied while the bias is copied
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout, scale=scale)
        return output, None
    # One [B, H, q, k] score tensor, updated in place: the bias and the mask cost a pass each, and what autograd
    # keeps is the probabilities (for the softmax and the value products), nothing else of that size.
    scores = torch.matmul(query * scale, key.transpose(-1, -2))
    if bias is not None:
        scores = scores.add_(bias)
    if mask is not None:
        scores = scores.masked_fill_(mask, lowest)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(F.dropout(probs, p=dropout, training=dropout > 0), value)
    return output, probs if output_attentions else None


def causal_memory_mask(
    query_length: int,
    memory_length: int,
    same_length: bool = False,
    same_length_span: int | None = None,
    device=None,
) -> torch.Tensor:
    """[q, m + q] boolean mask, True where query i (at position m + i) may not attend to key j.

    Key j is masked when it lies in the future (j > m + i). With `same_length`, every query also drops its oldest
    keys so that all queries see the same number of keys (Dai et al. App. / `same_length` in the original code):
    keys with j <= i - s are masked, where `s = same_length_span` (defaults to q).
    """
    key_length = memory_length + query_length
    ones = torch.ones(query_length, key_length, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + memory_length)
    if same_length:
        span = query_length if same_length_span is None else same_length_span
        mask = mask | torch.tril(ones, diagonal=-span)
    return mask
