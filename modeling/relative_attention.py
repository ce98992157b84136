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
    decreasing order. Shifting row i left by i is a strided view (stride R-1 between rows, start `offset`), so no
    copy, pad or gather is needed (the "skewing" trick of Dai et al. App. B / Huang et al. 2018). Transformer-XL
    uses `offset = q - 1` (distances k-1 ... 0); XLNet `offset = q` (distances k ... -q+1). Entries that would
    read past the end of row i belong to future keys, which the causal mask removes.
    """
    scores = position_scores.contiguous()
    *batch_strides, row_stride, _ = scores.stride()
    shape = (*scores.shape[:-1], key_length)
    return scores.as_strided(shape, (*batch_strides, row_stride - 1, 1), scores.storage_offset() + offset)


def relative_position_scores(
    query: torch.Tensor,
    position_keys: torch.Tensor,
    position_bias: torch.Tensor | None,
    key_length: int,
    offset: int,
) -> torch.Tensor:
    """Terms (b)+(d), `(q_i + v)^T W_kR R_{i-j}`, for every (query, key) pair: [..., q, key_length], unscaled.

    - query [..., H, q, d]; position_bias (v) [H, d] or None;
    - position_keys [..., H, R, d]: `W_kR R` for the R relative distances in decreasing order, projected once for the
      whole batch (leading dims broadcast against the query's, e.g. [H, R, d] for every row, or one set per group);
    - key_length, offset: as in `relative_shift`.
    """
    if position_bias is not None:
        query = query + position_bias[:, None, :].to(query.dtype)
    if query.dim() == 4 and position_keys.dim() == 3:
        # Keys shared by every batch row: one [B*q, d] x [d, R] GEMM per head instead of B broadcast ones (which
        # would also copy the keys B times). Shifted in [H, B, q, R] layout, returned as a [B, H, q, k] view.
        batch, heads, length, dim = query.shape
        folded = query.transpose(0, 1).reshape(heads, batch * length, dim)
        scores = torch.matmul(folded, position_keys.transpose(-1, -2)).view(heads, batch, length, -1)
        return relative_shift(scores, key_length, offset).transpose(0, 1)
    scores = torch.matmul(query, position_keys.transpose(-1, -2))
    return relative_shift(scores, key_length, offset)


def relative_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    content_bias: torch.Tensor | None = None,
    score_bias: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    dropout: float = 0.0,
    output_attentions: bool = False,
    score_bias_scale: float | None = None,
):
    """softmax(((q + u) k^T + score_bias) / sqrt(d)) v, with masked pairs removed.

    - query [B, H, q, d], key / value [B, H, k, d]; content_bias (u) [H, d] or None;
    - score_bias: the unscaled position terms (b)+(d), already shifted, plus any other term (XLNet's segment
      term), broadcastable to [B, H, q, k], or None;
    - mask: boolean, True where a query may NOT attend, broadcastable to [B, H, q, k], or None;
    - score_bias_scale: the factor applied to score_bias, default 1/sqrt(d). Pass 1.0 for a bias that is already
      scaled (e.g. position scores of pre-scaled position keys): without a mask it then reaches the kernel as it is,
      the strided view of `relative_shift` included, so the [B, H, q, k] bias is never copied.

    The default path is torch's fused `scaled_dot_product_attention` with the scaled score bias as its float mask;
    `output_attentions=True` takes the eager path, which also returns the probabilities. Both give the same
    numbers. Masked scores get the dtype's most negative finite value rather than -inf, so a fully masked query
    row (a padding position) yields finite output instead of NaN.
    """
    scale = query.shape[-1] ** -0.5
    if content_bias is not None:
        query = query + content_bias[:, None, :].to(query.dtype)
    bias = None
    if score_bias is not None:
        bias = score_bias.to(query.dtype)
        factor = scale if score_bias_scale is None else score_bias_scale
        if factor != 1.0:
            bias = bias * factor
    if mask is not None:
        if bias is None:
            bias = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
        bias = bias.masked_fill(mask, torch.finfo(query.dtype).min)
    if not output_attentions:
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout, scale=scale)
        return output, None
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(F.dropout(probs, p=dropout, training=dropout > 0), value)
    return output, probs


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
