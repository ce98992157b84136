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

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .library_ops import define


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
    views, which autograd and torch.compile handle like any slice (torch.export gets `_shifted_copy`). It needs
    `offset <= q` and `key_length < R` (one distance more than keys): Transformer-XL lists distances k-1 ... -1
    (`offset = q - 1`), XLNet k ... -q+1 or k ... 0 (`offset = q`). Entries that read the next row's start belong to
    future keys, which are masked.
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
    if torch.compiler.is_exporting():
        return _shifted_copy(position_scores, key_length, offset)
    flat = position_scores.reshape(*batch, length * distances)
    rows = flat[..., offset : offset + length * (distances - 1)].view(*batch, length, distances - 1)
    return rows[..., :key_length]


def _shifted_copy(position_scores: torch.Tensor, key_length: int, offset: int) -> torch.Tensor:
    """The same shift as a copy, for torch.export: the flattened scores cropped by a negative pad (`offset` from the
    start, `length - offset` from the end) instead of sliced. torch.export as torch.onnx.export runs it
    (size-oblivious) cannot bound a slice at an offset that depends on the length (GuardOnDataDependentSymNode),
    whereas the crop's size is exact; and no reshape infers a size, which would guard on divisibility."""
    *batch, length, distances = position_scores.shape
    flat = F.pad(position_scores.reshape(*batch, length * distances), (-offset, offset - length))
    return flat.view(*batch, length, distances - 1)[..., :key_length]


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
        return _unshift(grad, ctx.shape, ctx.key_length, ctx.offset), None, None


def _unshift(grad: torch.Tensor, shape, key_length: int, offset: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The gradient of `relative_shift`: `grad` [..., q, key_length] written back to the unshifted [..., q, R]
    cells it was read from, zeros elsewhere, in one pass (into `out` [..., q, R] if given)."""
    *batch, length, distances = shape
    grad_scores = grad.new_empty(shape) if out is None else out
    flat = grad_scores.view(*batch, length * distances)
    end = offset + length * (distances - 1)
    flat[..., :offset].zero_()
    flat[..., end:].zero_()
    rows = flat[..., offset:end].view(*batch, length, distances - 1)
    rows[..., key_length:].zero_()
    rows[..., :key_length].copy_(grad)
    return grad_scores


def relative_position_scores(
    query: torch.Tensor,
    position_keys: torch.Tensor,
    position_bias: torch.Tensor | None,
    key_length: int,
    offset: int,
    masked_far: int | None = None,
    workspace: "Workspace | None" = None,
) -> torch.Tensor:
    """Terms (b)+(d), `(q_i + v)^T W_kR R_{i-j}`, for every (query, key) pair: [B, H, q, key_length].

    - query [B, H, q, d]; position_bias (v) [H, d] or None;
    - position_keys: `W_kR R` for the R relative distances in decreasing order, projected once for the whole batch
      and pre-scaled by 1/sqrt(d) if the scores are to be (`relative_attention` takes scaled score biases): [H, R, d]
      for every batch row, or [G, 1, H, R, d] for G equal groups of rows (XLNet's `bi_data`: forward and backward);
    - key_length, offset: as in `relative_shift`;
    - masked_far: None, or a causal mask folded into these scores (see `RelativePositions`);
    - workspace: where the unshifted scores are written without gradients (see `Workspace`), or None.
    """
    if position_bias is not None:
        query = query + position_bias[:, None, :].to(query.dtype)
    # (a traced graph must not branch on the length: torch.compile and torch.export take the general path)
    one_row = not torch.compiler.is_compiling() and query.shape[2] == 1 and not masked_far
    distances = _one_row_distances(position_keys, key_length, offset) if one_row else None
    if distances is not None:  # (a fresh output: a workspace pays for one block of one row less than it costs)
        return _batch_first(_unshifted_position_scores(query, distances), position_keys)
    scores = _unshifted_position_scores(query, position_keys, masked_far, workspace)
    return _batch_first(relative_shift(scores, key_length, offset), position_keys)


def _one_row_distances(position_keys: torch.Tensor, key_length: int, offset: int) -> torch.Tensor | None:
    """The position keys of one query row per sequence (a decoding step) where its shift is a slice: a row at or after
    the last key (offset 0 or 1, one distance more than keys) reads its keys' distances from column `offset` on, and
    has no future keys to mask. None for any other row."""
    if key_length < position_keys.shape[-2] and 0 <= offset <= 1:
        return position_keys[..., offset : offset + key_length, :]
    return None


def _unshifted_position_scores(query, position_keys, masked_far=None, workspace=None):
    """(q_i + v)^T W_kR R_r for every query and distance, in the keys' layout: [H, B, q, R] for keys shared by every
    row (one [B*q, d] x [d, R] GEMM per head instead of B broadcast ones, which would also copy the keys B times), or
    [G, B/G, H, q, R] for grouped keys.

    With `masked_far` (an int) the distance -1 and q - 1 more below it read the lowest value instead, and so do the
    first `masked_far` distances listed: [H, B, q, R - 1 + q]. The shift reads query i's future keys j > k - q + i
    from exactly those extra columns (at most q - 1 of them, the first query's), and the keys at the masked far
    distances from those first columns, so the shifted view is the masked scores, with no mask pass.

    Without gradients (and outside torch.compile, whose graphs take no out=) the products are written into
    `workspace` when one is given, else into a fresh tensor."""
    differentiable = torch.is_grad_enabled() and (query.requires_grad or position_keys.requires_grad)
    writable = not (differentiable or torch.compiler.is_compiling())  # (neither autograd nor a graph takes out=)
    workspace = workspace if writable else None
    product = _few_rows_product if writable else _keys_product
    if position_keys.dim() == 5:
        if masked_far is not None:
            raise ValueError("relative_position_scores: a folded mask needs position keys shared by every row.")
        grouped = query.unflatten(0, (position_keys.shape[0], -1))
        shape = (*grouped.shape[:-1], position_keys.shape[-2])
        return product(grouped, position_keys, out=_take(workspace, shape, query))
    batch, heads, length, dim = query.shape
    folded = query.transpose(0, 1).reshape(heads, batch * length, dim)
    if masked_far is None:
        shape = (heads, batch * length, position_keys.shape[-2])
        scores = product(folded, position_keys, out=_take(workspace, shape, query))
        return scores.view(heads, batch, length, -1)
    distances = position_keys.shape[-2] - 1  # (those at 0 and above)
    attended, lowest = slice(masked_far, distances), torch.finfo(query.dtype).min
    if not writable:
        scores = F.pad(torch.matmul(folded, position_keys[:, attended].transpose(-1, -2)), (masked_far, length),
                       value=lowest)  # fmt: skip
    else:  # (the product written into its columns: no padded copy)
        scores = (workspace or Workspace()).take((heads, batch * length, distances + length), query)
        product(folded, position_keys[:, attended], out=scores[..., attended])
        scores[..., :masked_far] = scores[..., distances:] = lowest
    return scores.view(heads, batch, length, -1)


def _keys_product(rows: torch.Tensor, keys: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """rows [..., N, d] x keys [..., R, d]^T -> [..., N, R], broadcast as torch.matmul does (into `out` if given)."""
    return torch.matmul(rows, keys.transpose(-1, -2), out=out)


# Query rows up to which a bf16 / fp16 product of `_few_rows_product` is computed in fp32 rather than asked of the
# reduced-precision GEMM
FEW_ROWS = 4


def _few_rows_product(rows: torch.Tensor, keys: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`_keys_product` without gradients. For a few bf16 / fp16 rows on CPU (a decoding step's) both sides are
    converted to fp32 and multiplied there instead: torch's reduced-precision CPU GEMM builds a oneDNN primitive for
    each new shape, and each decoding step's key length is new (about 1 ms a product, against 20-200 us for the
    conversions and the fp32 product over 80-1600 keys). The products of two bf16 numbers are exact in fp32 and
    summed there, as the GEMM does."""
    if rows.shape[-2] > FEW_ROWS or rows.dtype not in (torch.bfloat16, torch.float16) or rows.device.type != "cpu":
        return _keys_product(rows, keys, out)
    product = _keys_product(rows.float(), keys.float())
    return product.to(rows.dtype) if out is None else out.copy_(product)


class Workspace:
    """One buffer for a temporary that every block of an attention call makes anew (position scores, score
    gradients): on CPU a fresh tensor of tens of MiB is mapped from the OS at each call and paid for again in page
    faults on first touch, which cost as much as the passes over it. Blocks run widest first (`_blocks`), so the
    buffer is allocated once, by the first block, and later blocks use its beginning."""

    def __init__(self):
        self.buffer = None

    def take(self, shape, like: torch.Tensor) -> torch.Tensor:
        """A contiguous tensor of `shape` with `like`'s dtype and device, uninitialised."""
        size = math.prod(shape)
        buffer = self.buffer
        if buffer is None or buffer.numel() < size or buffer.dtype != like.dtype or buffer.device != like.device:
            buffer = self.buffer = like.new_empty(size)
        return buffer[:size].view(shape)


def _take(workspace: Workspace | None, shape, like: torch.Tensor) -> torch.Tensor | None:
    """A product's out=: `workspace.take(shape, like)`, or None (a fresh output) without a workspace."""
    return None if workspace is None else workspace.take(shape, like)


def _batch_first(scores, position_keys):
    """Scores in the position keys' layout (see `_unshifted_position_scores`) -> [B, H, q, k] (a view)."""
    return scores.flatten(0, 1) if position_keys.dim() == 5 else scores.transpose(0, 1)


def _keys_layout(scores, position_keys):
    """The inverse of `_batch_first`."""
    return scores.unflatten(0, (position_keys.shape[0], -1)) if position_keys.dim() == 5 else scores.transpose(0, 1)


class RelativePositions(NamedTuple):
    """Terms (b)+(d) of the scores, for `relative_attention` to compute block by block: the position keys and bias v
    and the shift offset of `relative_position_scores` for the whole query range. `masked_far`, unless None, folds
    a causal mask into them instead of a boolean mask (keys listed down to distance -1, Transformer-XL's): keys at
    negative distances score the lowest value, and so do those at the first `masked_far` distances listed, the
    farthest (`same_length`'s mask, which is the same distances for every query)."""

    keys: torch.Tensor
    bias: torch.Tensor | None
    offset: int
    masked_far: int | None = None

    def block(self, first: int, start: int) -> "RelativePositions":
        """The same terms for the block of queries from row `start` on, which reads the distances from column
        `first` on (see `_blocks`)."""
        masked_far = None if self.masked_far is None else max(0, self.masked_far - first)
        keys = self.keys[..., first:, :]
        return self._replace(keys=keys, offset=self.offset - first - start, masked_far=masked_far)


# Scores [B, H, rows, keys] are made for this many elements at a time (16 MiB in fp32): queries go through the
# attention in blocks of rows, so that no score-sized temporary is allocated whole. Fresh tensors of tens of MiB are
# mapped from the OS on every call and paid for in page faults on first touch, which cost as much as the passes
# over them on these CPUs; blocks come from the allocator's free lists.
SCORE_BLOCK_ELEMENTS = 1 << 22
# With gradients each block's probabilities are stored for the backward pass, and a causal block stores, for all its
# rows, the keys its last row sees: half-size blocks store less (the triangle they waste is halved), and measured
# faster for a training step too.
STORED_BLOCK_ELEMENTS = 1 << 21


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

    Queries are processed in blocks of rows (`SCORE_BLOCK_ELEMENTS`; see `_blocks`). Without gradients each block goes
    through torch's fused `scaled_dot_product_attention`, with the other terms as its float mask (without a mask the
    shifted view itself, never copied); with gradients through `_TrainingAttention`, whose backward pass is written
    out (see there). Under torch.compile both run as one custom operator (`attention_op`); torch.export (and so
    ONNX export, which has no translation for it) traces plain torch operations in one block instead.
    `output_attentions=True` computes the scores explicitly, in one block. Masked scores get the dtype's most negative
    finite value rather than -inf, so a fully masked query row (a padding position) yields finite output, not NaN.
    """
    if output_attentions:
        return _attention_in_blocks(query, key, value, content_bias, positions, score_bias, mask, causal, dropout, True)
    tensors = (query, key, value, content_bias, score_bias) + (() if positions is None else positions[:2])
    differentiable = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    if torch.compiler.is_exporting():  # (plain operations, which autograd and ONNX translation both take)
        return _attention_in_blocks(query, key, value, content_bias, positions, score_bias, mask, causal, dropout, False)
    if torch.compiler.is_compiling():
        return _compiled_attention(query, key, value, content_bias, positions, score_bias, mask, causal, dropout,
                                   differentiable), None  # fmt: skip
    if differentiable:
        return _training_attention(query, key, value, content_bias, positions, score_bias, mask, causal, dropout), None
    distances = _one_query_distances(query, key, positions, score_bias, mask, dropout)
    if distances is not None:
        return _one_query_attention(query, key, value, content_bias, positions.bias, distances), None
    return _attention_in_blocks(query, key, value, content_bias, positions, score_bias, mask, causal, dropout, False)


def _one_query_distances(query, key, positions, score_bias, mask, dropout) -> torch.Tensor | None:
    """The position keys `_one_query_attention` reads where the attention is a decoding step's it computes (one query
    row per sequence whose shift is a slice, see `_one_row_distances`; relative positions shared by every row, nothing
    masked, no other score term, no dropout), else None."""
    if (query.shape[2] != 1 or positions is None or positions.keys.dim() != 3 or positions.masked_far
            or score_bias is not None or mask is not None or dropout != 0):  # fmt: skip
        return None
    return _one_row_distances(positions.keys, key.shape[2], positions.offset)


def _one_query_attention(query, key, value, content_bias, position_bias, distances) -> torch.Tensor:
    """Attention of one query row per sequence (a decoding step): the scores of terms (a)+(c) and (b)+(d) as
    two products (`distances`: the position keys of the row's keys, from `_one_row_distances`), an explicit softmax,
    and the values' product. torch's fused kernel, for one row, spends more on its threads and buffers than the row
    costs: Transformer-XL's greedy decoding measured 1.06-1.11x faster this way (issue configuration, prompt 64; 1.16x
    after a 1024-token prompt). bf16 / fp16 tensors are multiplied in fp32 (exact conversions; the fused kernel sums
    in fp32 too, and torch's reduced-precision GEMM would build a oneDNN primitive for every new key length), the
    output rounded once: 1.31x faster than the fused kernel after a 1024-token prompt in bf16."""
    dtype = query.dtype
    exact = torch.promote_types(dtype, torch.float32)
    query, key, value = query.to(exact), key.to(exact), value.to(exact)
    scale = query.shape[-1] ** -0.5
    content_query = query if content_bias is None else query + content_bias[:, None, :].to(exact)
    scores = torch.matmul(content_query * scale, key.transpose(-1, -2))  # [B, H, 1, k]
    # (q + v) W_kR R, batch rows folded into each head's rows: [H, B, D] x [H, D, k] (the position keys are
    # pre-scaled, see `relative_position_scores`)
    position_query = query[:, :, 0].transpose(0, 1)
    if position_bias is not None:
        position_query = position_query + position_bias[:, None, :].to(exact)
    scores += torch.matmul(position_query, distances.to(exact).transpose(-1, -2)).transpose(0, 1)[:, :, None]
    return torch.matmul(torch.softmax(scores, dim=-1), value).to(dtype)


def _attention_in_blocks(query, key, value, content_bias, positions, score_bias, mask, causal, dropout,
                         output_attentions):  # fmt: skip
    """relative_attention without a written-out backward pass: blocks of queries through `_attention_block` (one
    block with `output_attentions`)."""
    length = query.shape[2]
    outputs, probs, workspace = [], None, Workspace()
    block = length if output_attentions else _block_rows(query, key, SCORE_BLOCK_ELEMENTS)
    for start, end, keys, first in _blocks(length, key.shape[2], block, causal):
        bias = None
        if positions is not None:
            block_positions = positions.block(first, start)
            bias = relative_position_scores(
                query[:, :, start:end], block_positions.keys, positions.bias, keys, block_positions.offset,
                block_positions.masked_far, workspace,
            )  # fmt: skip
        if score_bias is not None:
            rows = _rows(score_bias, start, end, keys)
            in_place = bias is not None and not (bias.requires_grad or rows.requires_grad)  # (the block's own scores)
            bias = rows if bias is None else bias.add_(rows) if in_place else bias + rows
        output, probs = _attention_block(
            query[:, :, start:end], key[:, :, :keys], value[:, :, :keys], content_bias, bias,
            None if mask is None else _rows(mask, start, end, keys), dropout, output_attentions,
        )  # fmt: skip
        outputs.append(output)
    return _in_order(outputs), probs


def _in_order(outputs: list[torch.Tensor]) -> torch.Tensor:
    """The blocks' outputs [B, H, rows, d], in the order `_blocks` gave them (last rows first), joined in row order."""
    return torch.cat(outputs[::-1], dim=2) if len(outputs) > 1 else outputs[0]


def _block_rows(query, key, elements: int) -> int:
    """Query rows per block for `elements` scores per block. (Never under torch.compile, which would specialise the
    graph on the number of blocks, hence on the length: a compiled graph runs the blocks inside `attention_op`.)"""
    return max(1, elements // (query.shape[0] * query.shape[1] * key.shape[2]))


def _blocks(length: int, key_length: int, block: int, causal: bool):
    """(start, end, keys, first) of each block of query rows start:end: the keys it attends to (:keys; with
    `causal`, none after its last row's position) and the first column of the position scores it reads.

    Query rows i0 <= i < i1 read the relative distances listed from column q - i1 on (those of the farthest key
    from the block's last row down), so a block is the same problem for fewer queries: position keys from that
    column, shift offset `offset - (q - i1) - i0`. The last rows come first: they read the most distances (and,
    causal, the most keys), so a `Workspace` is allocated at the first block's size once."""
    if block >= length:  # (no arithmetic on the length, which torch.compile keeps symbolic)
        yield 0, length, key_length, 0
        return
    for start in reversed(range(0, length, block)):
        end = min(length, start + block)
        yield start, end, (key_length - length + end if causal else key_length), length - end


def _rows(scores: torch.Tensor, start: int, end: int, keys: int) -> torch.Tensor:
    """Query rows start:end and the first `keys` columns of a [..., q or 1, k or 1] score term or mask."""
    if scores.shape[-2] > 1:
        scores = scores[..., start:end, :]
    return scores[..., :keys] if scores.shape[-1] > 1 else scores


def _attention_block(query, key, value, content_bias, bias, mask, dropout, output_attentions):
    """One block of queries without a hand-written backward (see relative_attention); `bias` holds every score
    term but (a)+(c). With `output_attentions` the scores are explicit (and differentiable by autograd)."""
    scale = query.shape[-1] ** -0.5
    if content_bias is not None:
        query = query + content_bias[:, None, :].to(query.dtype)
    bias = None if bias is None else bias.to(query.dtype)
    lowest = torch.finfo(query.dtype).min
    if not output_attentions:
        if mask is not None:
            bias = torch.zeros((), dtype=query.dtype, device=query.device) if bias is None else bias
            bias = torch.where(mask, lowest, bias)  # one pass: the mask applied while the bias is copied
        output = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout, scale=scale)
        return output, None
    scores = torch.matmul(query * scale, key.transpose(-1, -2))
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(mask, lowest)
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(query.dtype)
    return torch.matmul(F.dropout(probs, p=dropout, training=dropout > 0), value), probs


def _in_one_dtype(query, key, value, content_bias, positions, score_bias):
    """The tensors of an attention call in one dtype: the query's, or autocast's lower precision, in which autocast
    would have run the products (the written-out passes run with autocast off, so that backward sees the same
    dtypes): [query, key, value, content_bias, position_keys, position_bias, score_bias] (None where absent)."""
    device = query.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else query.dtype
    position_keys, position_bias = positions[:2] if positions is not None else (None, None)
    return [t if t is None else t.to(dtype) for t in (query, key, value, content_bias, position_keys, position_bias,
                                                      score_bias)]  # fmt: skip


def _training_attention(query, key, value, content_bias, positions, score_bias, mask, causal, dropout):
    """`_TrainingAttention` on inputs of one dtype (see `_in_one_dtype`)."""
    tensors = _in_one_dtype(query, key, value, content_bias, positions, score_bias)
    layout = None if positions is None else positions._replace(keys=None, bias=None)  # (tensors go in on their own)
    with torch.autocast(query.device.type, enabled=False):
        return _TrainingAttention.apply(*tensors, mask, layout, causal, dropout)


class _TrainingAttention(torch.autograd.Function):
    """relative_attention with gradients, block by block, with its backward pass written out (`_attention_forward`,
    `_attention_backward`), each block's probabilities kept in a tensor of its own."""

    @staticmethod
    def forward(ctx, query, key, value, content_bias, position_keys, position_bias, score_bias, mask, positions, causal,
                dropout):  # fmt: skip
        # (`positions`: RelativePositions' offset and folded mask; its tensors are inputs of their own, for autograd)
        positions = None if positions is None else positions._replace(keys=position_keys, bias=position_bias)
        stored = []

        def store(shape, dtype):
            stored.append(query.new_empty(shape, dtype=dtype))
            return stored[-1]

        output = _attention_forward(query, key, value, content_bias, positions, score_bias, mask, causal, dropout, store)
        ctx.save_for_backward(query, key, value, content_bias, position_keys, position_bias, *stored)
        ctx.score_bias_shape = None if score_bias is None else score_bias.shape
        ctx.positions = None if positions is None else positions._replace(keys=None, bias=None)
        ctx.causal, ctx.dropout = causal, dropout
        return output

    @staticmethod
    def backward(ctx, grad_output):
        query, key, value, content_bias, position_keys, position_bias, *stored = ctx.saved_tensors
        positions = None if ctx.positions is None else ctx.positions._replace(keys=position_keys, bias=position_bias)
        shape = ctx.score_bias_shape if ctx.needs_input_grad[6] else None
        stored = iter(stored)
        gradients = _attention_backward(grad_output, query, key, value, content_bias, positions, shape, ctx.causal,
                                        ctx.dropout, lambda shape, dtype: next(stored))  # fmt: skip
        return (*gradients, None, None, None, None)


def _attention_forward(query, key, value, content_bias, positions, score_bias, mask, causal, dropout, store):
    """relative_attention with gradients to come, block by block: [B, H, q, d]. `store(shape, dtype)` gives the
    tensor each block's probabilities (and, before them, its dropout mask) are kept in for `_attention_backward`.

    Per block: scores S = (q + u) k^T / sqrt(d) + shift((q + v) W_kR R) + score bias, masked; P = softmax(S), kept
    (the one score-sized tensor stored per block, plus the dropout mask if any); output P V."""
    length, key_length = query.shape[2], key.shape[2]
    lowest = torch.finfo(query.dtype).min
    outputs, score_workspace, position_workspace = [], Workspace(), Workspace()
    position_bias = None if positions is None else positions.bias
    for start, end, keys, first in _blocks(length, key_length, _block_rows(query, key, STORED_BLOCK_ELEMENTS), causal):
        content_query, position_query = _biased_queries(query[:, :, start:end], content_bias, position_bias)
        shape = (*query.shape[:2], end - start, keys)
        scores = torch.matmul(content_query, key[:, :, :keys].transpose(-1, -2),
                              out=score_workspace.take(shape, query))  # fmt: skip
        if positions is not None:  # (gradients are off in here: the shifted view, not _RelativeShift)
            block_positions = positions.block(first, start)
            scores.add_(relative_position_scores(
                position_query, block_positions.keys, None, keys, block_positions.offset,
                block_positions.masked_far, position_workspace,
            ))  # fmt: skip
        if score_bias is not None:
            scores.add_(_rows(score_bias, start, end, keys))
        if mask is not None:
            scores.masked_fill_(_rows(mask, start, end, keys), lowest)
        kept = None
        if dropout > 0:
            kept = torch.ge(torch.rand(shape, dtype=query.dtype, device=query.device), dropout,
                            out=store(shape, torch.bool))  # fmt: skip
        probs, exact = store(shape, query.dtype), torch.promote_types(query.dtype, torch.float32)
        if exact == query.dtype:
            torch.ops.aten._softmax.out(scores, -1, False, out=probs)
        else:
            probs.copy_(torch.softmax(scores, dim=-1, dtype=exact))
        outputs.append(torch.matmul(probs if kept is None else probs * kept / (1 - dropout), value[:, :, :keys]))
    return _in_order(outputs)


def _attention_backward(grad_output, query, key, value, content_bias, positions, score_bias_shape, causal, dropout,
                        stored):  # fmt: skip
    """Gradients of `_attention_forward` (query, key, value, content bias, position keys, position bias, score
    bias; None for those absent, and for the score bias without `score_bias_shape`); `stored(shape, dtype)` gives
    back, in the same order, what the forward pass stored.

    Per block: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)) (softmax's Jacobian), then dS is the
    gradient of every score term at once: dq = dS k / sqrt(d) + unshift(dS) W_kR R, dk = dS^T (q + u) / sqrt(d),
    d(W_kR R) = unshift(dS)^T (q + v). Autograd would do the same products, but around them it fills and adds
    full-length zero tensors for the key / value slices of every causal block, copies transposed key gradients and
    keeps the shifted view's buffers; here every gradient is accumulated in place into one tensor of its input's
    size."""
    position_keys, position_bias = (None, None) if positions is None else positions[:2]
    length, key_length, scale = query.shape[2], key.shape[2], query.shape[-1] ** -0.5
    grad_query = query.new_empty(query.shape)
    # (contiguous, unlike zeros_like of strided keys: _accumulate_product views them)
    grad_key, grad_value = key.new_zeros(key.shape), value.new_zeros(value.shape)
    grad_position = None if position_keys is None else query.new_empty(query.shape)
    grad_position_keys = None if position_keys is None else position_keys.new_zeros(position_keys.shape)
    grad_score_bias = None if score_bias_shape is None else grad_output.new_zeros(score_bias_shape)
    # (the score and position-score gradients of each block are consumed within it)
    score_workspace, position_workspace = Workspace(), Workspace()
    for start, end, keys, first in _blocks(length, key_length, _block_rows(query, key, STORED_BLOCK_ELEMENTS), causal):
        shape = (*query.shape[:2], end - start, keys)
        kept = stored(shape, torch.bool) if dropout > 0 else None
        probs = stored(shape, query.dtype)
        content_query, position_query = _biased_queries(query[:, :, start:end], content_bias, position_bias)
        d_out = grad_output[:, :, start:end]
        kept_probs = probs if kept is None else probs * kept / (1 - dropout)
        _accumulate_product(grad_value[:, :, :keys], kept_probs.transpose(-1, -2), d_out)
        d_probs = torch.matmul(d_out, value[:, :, :keys].transpose(-1, -2), out=score_workspace.take(shape, probs))
        if kept is not None:
            d_probs = d_probs.mul_(kept).div_(1 - dropout)
        # dS = P * (dP - rowsum(dP * P)), written over dP (masked cells: P = 0, dS = 0)
        d_scores = torch.ops.aten._softmax_backward_data.out(d_probs, probs, -1, probs.dtype, grad_input=d_probs)
        torch.matmul(d_scores, key[:, :, :keys], out=grad_query[:, :, start:end])
        _accumulate_product(grad_key[:, :, :keys], d_scores.transpose(-1, -2), content_query)
        if grad_score_bias is not None:
            _rows(grad_score_bias, start, end, keys).add_(_sum_to(d_scores, _rows(grad_score_bias, start, end, keys)))
        if position_keys is not None:
            block_positions = positions.block(first, start)
            d_shifted = _keys_layout(d_scores, position_keys)
            unshifted_shape = (*d_shifted.shape[:-1], block_positions.keys.shape[-2])
            d_unshifted = _unshift(d_shifted, unshifted_shape, keys, block_positions.offset,
                                   position_workspace.take(unshifted_shape, d_shifted))  # fmt: skip
            d_query, d_keys = _position_products_backward(d_unshifted, position_query, block_positions.keys)
            grad_position[:, :, start:end] = d_query
            grad_position_keys[..., first:, :] += d_keys
    grad_content = grad_query.mul_(scale)  # (the gradient of the content query (q + u) / sqrt(d), so far)
    grad_content_bias = grad_content.sum((0, 2)) if content_bias is not None else None
    grad_position_bias = grad_position.sum((0, 2)) if position_bias is not None else None
    if grad_position is not None:
        grad_query.add_(grad_position)
    return (grad_query, grad_key, grad_value, grad_content_bias, grad_position_keys, grad_position_bias,
            grad_score_bias)  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# The same passes as custom operators, for torch.compile: the compiler sees one operation with its gradient (and the
# shapes from the fake kernels), and runs the blocks above inside it instead of tracing them, which would specialise
# the graph on the number of blocks, hence on the length.


def _compiled_attention(query, key, value, content_bias, positions, score_bias, mask, causal, dropout, differentiable):
    """relative_attention inside a compiled graph, through `attention_op`."""
    offset, masked_far = (0, None) if positions is None else positions[2:]
    tensors = _in_one_dtype(query, key, value, content_bias, positions, score_bias)
    output, _, _ = attention_op(*tensors, mask, offset, masked_far, causal, dropout, differentiable)
    return output.transpose(1, 2)


def _attention_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    content_bias: Optional[torch.Tensor],
    position_keys: Optional[torch.Tensor],
    position_bias: Optional[torch.Tensor],
    score_bias: Optional[torch.Tensor],
    mask: Optional[torch.Tensor],
    offset: int,
    masked_far: Optional[int],
    causal: bool,
    dropout: float,
    stored: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """relative_attention on tensors of one dtype (`RelativePositions` given by its fields): the output, laid out
    [B, q, H, d] (the layout the output projection reads), and, if `stored` (gradients to come), what the backward
    pass needs: the blocks' probabilities and dropout masks, one block after the other in a flat tensor each."""
    positions = None if position_keys is None else RelativePositions(position_keys, position_bias, offset, masked_far)
    probs, kept = _stored_buffers(query, key, dropout, stored)
    with torch.autocast(query.device.type, enabled=False):
        if stored:
            pieces = _Pieces(probs, kept)
            output = _attention_forward(query, key, value, content_bias, positions, score_bias, mask, causal, dropout,
                                        pieces)  # fmt: skip
            pieces.zero_rest()  # (causal blocks leave the end unused: outputs hold numbers, not what memory held)
        else:
            output, _ = _attention_in_blocks(query, key, value, content_bias, positions, score_bias, mask, causal,
                                             dropout, False)  # fmt: skip
    return output.transpose(1, 2).contiguous(), probs, kept


def _attention_op_fake(query, key, value, content_bias, position_keys, position_bias, score_bias, mask, offset,
                       masked_far, causal, dropout, stored):  # fmt: skip
    batch, heads, length, _ = query.shape
    return (query.new_empty(batch, length, heads, value.shape[-1]), *_stored_buffers(query, key, dropout, stored))


def _stored_buffers(query, key, dropout, stored):
    """The flat probabilities and dropout masks of `_attention_op`: room for every (query, key) pair (causal blocks
    use less), or nothing."""
    size = query.shape[0] * query.shape[1] * query.shape[2] * key.shape[2] if stored else 0
    return query.new_empty(size), query.new_empty(size if dropout > 0 else 0, dtype=torch.bool)


class _Pieces:
    """Consecutive pieces of flat buffers, one buffer per dtype, in the order they are asked for: `store` and
    `stored` of `_attention_forward` and `_attention_backward`, which ask for the same pieces in the same order."""

    def __init__(self, *buffers):
        self.buffers, self.used = {buffer.dtype: buffer for buffer in buffers}, {}

    def __call__(self, shape, dtype):
        start, size = self.used.get(dtype, 0), math.prod(shape)
        self.used[dtype] = start + size
        return self.buffers[dtype][start : start + size].view(shape)

    def zero_rest(self):
        for dtype, buffer in self.buffers.items():
            buffer[self.used.get(dtype, 0) :].zero_()


def _setup_attention_op(ctx, inputs, output):
    query, key, value, content_bias, position_keys, position_bias, score_bias, _, *layout, stored = inputs
    ctx.save_for_backward(query, key, value, content_bias, position_keys, position_bias, *output[1:])
    ctx.score_bias_shape = [] if score_bias is None else list(score_bias.shape)
    ctx.layout, ctx.stored = layout, stored  # (layout: offset, masked_far, causal, dropout)


def _attention_op_backward(ctx, grad_output, _, __):
    if not ctx.stored:
        raise RuntimeError("relative_attention operator: a backward pass through a call with stored=False, which kept "
                           "nothing for it; expected stored=True for inputs that need gradients.")
    shape = ctx.score_bias_shape if ctx.needs_input_grad[6] else []
    gradients = attention_backward_op(grad_output.transpose(1, 2), *ctx.saved_tensors, shape, *ctx.layout)
    gradients = [gradient if needed else None for gradient, needed in zip(gradients, ctx.needs_input_grad)]
    return *gradients, None, None, None, None, None, None


def _attention_backward_op(
    grad_output: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    content_bias: Optional[torch.Tensor],
    position_keys: Optional[torch.Tensor],
    position_bias: Optional[torch.Tensor],
    probs: torch.Tensor,
    kept: torch.Tensor,
    score_bias_shape: list[int],
    offset: int,
    masked_far: Optional[int],
    causal: bool,
    dropout: float,
) -> list[torch.Tensor]:
    """`_attention_backward` for `_attention_op`: the gradients of its first seven inputs, empty where absent."""
    positions = None if position_keys is None else RelativePositions(position_keys, position_bias, offset, masked_far)
    with torch.autocast(query.device.type, enabled=False):
        gradients = _attention_backward(grad_output, query, key, value, content_bias, positions,
                                        score_bias_shape or None, causal, dropout, _Pieces(probs, kept))  # fmt: skip
    return [query.new_empty(0) if gradient is None else gradient for gradient in gradients]


def _attention_backward_op_fake(grad_output, query, key, value, content_bias, position_keys, position_bias, probs,
                                kept, score_bias_shape, offset, masked_far, causal, dropout):  # fmt: skip
    shapes = [query.shape, key.shape, value.shape] + [None if t is None else t.shape for t in
                                                      (content_bias, position_keys, position_bias)]  # fmt: skip
    return [query.new_empty(shape or 0) for shape in shapes + [score_bias_shape]]


attention_op = define(__package__ or __name__, "relative_attention", _attention_op, _attention_op_fake,
                      _attention_op_backward, _setup_attention_op)  # fmt: skip
attention_backward_op = define(__package__ or __name__, "relative_attention_backward", _attention_backward_op,
                               _attention_backward_op_fake)  # fmt: skip


def _biased_queries(query, content_bias, position_bias):
    """(content query (q + u) / sqrt(d), position query q + v) of some query rows (the biases may be None)."""
    content_query = (query if content_bias is None else query + content_bias[:, None, :]) * query.shape[-1] ** -0.5
    position_query = query if position_bias is None else query + position_bias[:, None, :]
    return content_query, position_query


def _accumulate_product(out, a, b):
    """out += a @ b for [B, H, m, n] operands, in place: `out`, a slice of a contiguous gradient, is viewed (never
    copied) as one batch of [m, n] matrices."""
    out.view(-1, *out.shape[2:]).baddbmm_(a.flatten(0, 1), b.flatten(0, 1))


def _position_products_backward(d_unshifted, query, position_keys):
    """Gradients of `_unshifted_position_scores(query, position_keys)` given the scores' gradient (keys' layout)."""
    if position_keys.dim() == 5:
        grouped = query.unflatten(0, (position_keys.shape[0], -1))
        d_query = torch.matmul(d_unshifted, position_keys).flatten(0, 1)
        d_keys = torch.matmul(d_unshifted.transpose(-1, -2), grouped).sum(1, keepdim=True)
        return d_query, d_keys
    heads, batch, length, distances = d_unshifted.shape
    folded = query.transpose(0, 1).reshape(heads, batch * length, -1)
    d_folded = d_unshifted.view(heads, batch * length, distances)
    d_query = torch.matmul(d_folded, position_keys).view(heads, batch, length, -1).transpose(0, 1)
    return d_query, torch.matmul(d_folded.transpose(-1, -2), folded)


def _sum_to(gradient, like):
    """`gradient` summed over the dimensions where `like` broadcasts (size 1)."""
    dims = [i for i, (g, t) in enumerate(zip(gradient.shape, like.shape)) if t == 1 and g != 1]
    return gradient.sum(dims, keepdim=True) if dims else gradient


def eager_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    **kwargs,
):
    """Relative attention written out, the reference the fused implementations ("sdpa", "flex_attention") match.

    The call convention is transformers' attention interface (`ALL_ATTENTION_FUNCTIONS`), with the relative terms
    riding along as `position_bias`, as transformers' own sdpa / flex functions take it:
    - query [B, H, q, D], already holding the content bias: `q + u`, so `query @ key` is terms (a)+(c);
    - key, value [B, H, k, D] over [memory; segment];
    - position_bias [B, H, q, k]: terms (b)+(d) after the relative shift (and XLNet's segment term), already scaled;
    - attention_mask: boolean [B or 1, 1, q, k], True where query i may attend to key j; or None.
    Returns (output [B, q, H, D], probabilities [B, H, q, k]).
    """
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (a) + (c), scaled
    if position_bias is not None:
        scores = scores + position_bias  # + (b) + (d) [+ segment term]
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


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
