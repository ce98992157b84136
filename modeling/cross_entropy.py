"""Cross-entropies whose gradient is made in the forward pass, for the large output layers of both models.

For logits z and a target t, -log softmax(z)_t = logsumexp(z) - z_t, and its gradient with respect to z is
softmax(z) - onehot(t). `F.cross_entropy` stores the full log-softmax, and its backward fills a zero tensor of the
logits' size, scatters into it and reads both again; at XLNet's 32000 words or Transformer-XL's 20000-word tail
cluster those are several fresh [N, vocabulary] tensors per step, each paid for in page faults as well as passes.

- `softmax_cross_entropy` (given logits: the classification heads, and compiled graphs) writes the log-softmax once
  and turns it into the gradient in place; that is all it stores, and its backward pass scales it in place.
- `linear_cross_entropy` (the language-model heads) goes one step further: it takes the output layer too, works in
  chunks of rows and multiplies each chunk's gradient through the output layer at once, so that it stores nothing of
  the logits' size at all.
"""

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .decoding_linear import is_differentiable, onednn_linear, uses_onednn
from .library_ops import define

IGNORE_INDEX = -100  # (transformers' label for "no target here")


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a softmax is computed in: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


class _SoftmaxCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, valid):
        # (log_softmax rather than logsumexp, whose decomposition torch.compile cannot trace over a data-dependent
        # number of rows; it is also F.cross_entropy's own first step, so the losses are the same numbers)
        log_p = torch.log_softmax(logits, -1)
        nll = -log_p.gather(1, target[:, None]).squeeze(1) * valid
        if ctx.needs_input_grad[0]:
            gradient = log_p.exp_()  # softmax, in the log-softmax's own storage
            gradient.scatter_add_(1, target[:, None], torch.full_like(nll[:, None], -1.0))
            ctx.save_for_backward(gradient, valid)
        return nll

    @staticmethod
    def backward(ctx, grad_nll):
        gradient, valid = ctx.saved_tensors
        # Scaled in place: a fresh tensor of the logits' size costs its page faults again. A second backward pass
        # through the same graph (retain_graph=True) gets autograd's error for a saved tensor modified in place.
        return gradient.mul_((grad_nll * valid)[:, None]), None, None


def softmax_cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """[N, C] logits, [N] targets -> [N] negative log-likelihoods, in fp32 or wider (0 where the target is
    `ignore_index`): the numbers of `F.cross_entropy(logits.float(), target, reduction="none", ...)`."""
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(
            f"softmax_cross_entropy: logits {tuple(logits.shape)} and targets {tuple(target.shape)}; expected [N, C] "
            "and [N]."
        )
    valid = target != ignore_index
    logits = logits.to(softmax_dtype(logits.dtype))
    return _SoftmaxCrossEntropy.apply(logits, target.where(valid, 0), valid.to(logits.dtype))


def reduced_cross_entropy(logits, target, reduction: str = "mean", ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """`softmax_cross_entropy` summed or averaged over the targets that count."""
    return reduce_nll(softmax_cross_entropy(logits, target, ignore_index), target != ignore_index, reduction)


def reduce_nll(nll: torch.Tensor, counted: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Per-target NLL -> `F.cross_entropy`'s reductions over the `counted` targets (a mean over none is NaN, as
    there)."""
    if reduction == "none":
        return nll
    if reduction == "sum":
        return nll.sum()
    if reduction == "mean":
        return nll.sum() / counted.sum()
    raise ValueError(f"reduce_nll: reduction {reduction!r}; expected 'none', 'sum' or 'mean'.")


def loss_per_target(total: torch.Tensor, count) -> torch.Tensor:
    """A summed loss divided by its number of targets `count` (an int or a tensor, e.g. Trainer's
    `num_items_in_batch`); 0 when there is none (every label -100), where the plain quotient 0 / 0 is NaN and puts
    NaN into every gradient, which an optimizer step then writes into every weight. A sum over no target scores
    nothing, so its gradients are zero."""
    if torch.is_tensor(count):
        return total / count.to(total.device).clamp(min=1)
    return total / max(count, 1)


# ----------------------------------------------------------------------------------------------------------------
# Linear cross-entropy: the output layer and the loss in one pass, for the language-model heads


class SoftmaxPart(NamedTuple):
    """Classes `[start, end)` of one softmax: those rows of `weight` [*, d] and `bias` [*] (or None)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    start: int
    end: int


class Softmax(NamedTuple):
    """One softmax of a linear cross-entropy. It scores `hidden` [n, d] against its `parts` (the classes, in
    order: an adaptive softmax's head is the head words' rows of the output layer and then the cluster rows) and
    adds -log p(target) [n] to the NLL of `rows` [n] (None: rows 0 ... n-1). `logits` [n, classes], when the caller
    has them already (with their graph), stand in for the products in the forward pass. A target of -100
    (`IGNORE_INDEX`) scores nothing."""

    hidden: torch.Tensor
    target: torch.Tensor
    parts: tuple[SoftmaxPart, ...]
    rows: torch.Tensor | None = None
    logits: torch.Tensor | None = None


# Logits per chunk of rows: 8 MiB in fp32, reused by every chunk (fresh tensors cost their page faults on CPU), but
# at least 128 rows: every chunk adds into the whole weight gradient, a pass over it that fewer rows do not pay for
# (XLNet's 32000-word output layer and loss, forward + backward: 65 rows 1.0 s, 128 rows 0.80 s, 256 rows 0.74 s;
# more rows, more memory at the peak of a training step).
CHUNK_ELEMENTS, MIN_CHUNK_ROWS = 1 << 21, 128


def linear_cross_entropy(softmaxes: list[Softmax], num_rows: int) -> torch.Tensor:
    """[num_rows] NLL summed over the softmaxes that score each row: -log softmax(h W^T + b)_target, in fp32 or wider.

    The logits are made chunk by chunk of rows, and with gradients each chunk's gradient (softmax - onehot, times the
    output layer for the hidden states, times the hidden states for the weights) is accumulated during the forward
    pass, so that only gradients of the inputs' sizes are kept, never one of the logits' [N, vocabulary] size. The
    backward pass scales them by the incoming gradient when every scored row gets the same one (a sum or a mean of
    the NLL: the losses of language modelling); otherwise it recomputes them with each row's weight. Under
    torch.compile the same passes run as one custom operator (`linear_cross_entropy_op`)."""
    device = softmaxes[0].hidden.device.type
    if torch.is_autocast_enabled(device):  # (the products in autocast's dtype, as F.linear would run them)
        dtype = torch.get_autocast_dtype(device)
        softmaxes = [_cast(softmax, dtype) for softmax in softmaxes]
    tensors, layout = _tensor_layout(softmaxes)
    if torch.compiler.is_compiling():
        needs_gradients = [torch.is_grad_enabled() and tensor.requires_grad for tensor in tensors]
        targets, rows, logits = ([getattr(s, name) for s in layout] for name in ("target", "rows", "logits"))
        return linear_cross_entropy_op(tensors, targets, rows, logits, _encode(layout), num_rows, needs_gradients)[0]
    with torch.autocast(device, enabled=False):
        return _LinearCrossEntropy.apply(layout, num_rows, *tensors)


def _cast(softmax, dtype):
    parts = tuple(part._replace(weight=part.weight.to(dtype), bias=_to(part.bias, dtype)) for part in softmax.parts)
    return softmax._replace(hidden=softmax.hidden.to(dtype), parts=parts)


def _to(tensor, dtype):
    return None if tensor is None else tensor.to(dtype)


def _tensor_layout(softmaxes):
    """(the distinct tensors that may need gradients, the softmaxes with those tensors replaced by their index):
    autograd sees each tensor once, so that a weight shared by several softmaxes gets one gradient. (Found by `is`,
    not by `id()`: torch.compile guards a frame on the ids it reads, and the hidden states are new tensors at every
    step, so a frame that starts here, after Transformer-XL's graph break, was compiled again at every step.)"""
    tensors = []

    def slot(tensor):
        if tensor is None:
            return None
        for index, seen in enumerate(tensors):
            if seen is tensor:
                return index
        tensors.append(tensor)
        return len(tensors) - 1

    def slots(softmax):
        parts = tuple(part._replace(weight=slot(part.weight), bias=slot(part.bias)) for part in softmax.parts)
        return softmax._replace(hidden=slot(softmax.hidden), parts=parts)

    return tensors, [slots(softmax) for softmax in softmaxes]


class _LinearCrossEntropy(torch.autograd.Function):
    """`linear_cross_entropy` on the distinct tensors of `layout` (see `_tensor_layout`)."""

    @staticmethod
    def forward(ctx, layout, num_rows, *tensors):
        gradients = _zero_gradients(tensors, ctx.needs_input_grad[2:])
        nll = torch.zeros(num_rows, dtype=softmax_dtype(tensors[0].dtype), device=tensors[0].device)
        _accumulate(layout, tensors, nll, gradients if any(ctx.needs_input_grad[2:]) else None, row_weights=None)
        ctx.save_for_backward(*tensors)
        ctx.layout, ctx.gradients = [softmax._replace(logits=None) for softmax in layout], gradients
        return nll

    @staticmethod
    def backward(ctx, grad_nll):
        tensors, gradients = ctx.saved_tensors, ctx.gradients
        weight = _common_value(grad_nll, ctx.layout)
        if weight is not None and gradients is not None:
            ctx.gradients = None  # (scaled in place, so once: a second backward pass recomputes them)
            for gradient in gradients:
                if gradient is not None:
                    gradient.mul_(weight)
        else:
            gradients = _zero_gradients(tensors, ctx.needs_input_grad[2:])
            _accumulate(ctx.layout, tensors, None, gradients, row_weights=grad_nll)
        return None, None, *gradients


def _zero_gradients(tensors, needs_grad):
    return [torch.zeros_like(tensor) if need else None for tensor, need in zip(tensors, needs_grad)]


def _common_value(grad_nll, layout):
    """The incoming gradient of every scored row when they are all the same (a 0-dim tensor), else None."""
    scored = [grad_nll if softmax.rows is None else grad_nll[softmax.rows] for softmax in layout]
    first = scored[0].reshape(-1)[:1]
    if all(bool((values == first).all()) for values in scored):
        return first.squeeze(0) if first.numel() else grad_nll.new_zeros(())
    return None


def _accumulate(layout, tensors, nll, gradients, row_weights):
    """Score every softmax chunk by chunk of rows: add -log p(target) to `nll` (unless None) and, unless
    `gradients` is None, the gradient (softmax - onehot) [times each row's weight] through the output layer."""
    for softmax in layout:
        if softmax.logits is not None and gradients is not None:
            _accumulate_given_logits(softmax, tensors, nll, gradients, row_weights)
            continue
        hidden, target, parts = tensors[softmax.hidden], softmax.target, softmax.parts
        columns = _columns(parts)
        chunk = max(1, min(hidden.shape[0], max(MIN_CHUNK_ROWS, CHUNK_ELEMENTS // columns[-1][1])))
        buffer = torch.empty(chunk, columns[-1][1], dtype=softmax_dtype(tensors[0].dtype), device=hidden.device)
        for first in range(0, hidden.shape[0], chunk):
            last = min(first + chunk, hidden.shape[0])
            rows = slice(first, last) if softmax.rows is None else softmax.rows[first:last]
            log_p, chunk_target = buffer[: last - first], target[first:last, None]
            ignored = chunk_target == IGNORE_INDEX
            ignored = ignored if ignored.any() else None
            if ignored is not None:
                chunk_target = chunk_target.masked_fill(ignored, 0)
            if softmax.logits is not None:
                log_p.copy_(softmax.logits[first:last])
            else:
                for part, (left, right) in zip(parts, columns):
                    linear_into(log_p[:, left:right], hidden[first:last], _weight(tensors, part), _bias(tensors, part))
            torch.log_softmax(log_p, -1, out=log_p)  # (in place: the kernel works row by row)
            if nll is not None:
                target_log_p = log_p.gather(1, chunk_target)
                if ignored is not None:
                    target_log_p = target_log_p.masked_fill(ignored, 0)
                _add_rows(nll, rows, -target_log_p.squeeze(1))
            if gradients is None:
                continue
            gradient = log_p.exp_()  # dNLL / dlogits = softmax - onehot(target)
            gradient.scatter_add_(1, chunk_target, torch.full(chunk_target.shape, -1.0, dtype=gradient.dtype))
            if row_weights is not None:
                gradient.mul_(row_weights[rows, None])
            if ignored is not None:
                gradient.masked_fill_(ignored, 0.0)
            gradient = gradient.to(hidden.dtype)
            for part, (left, right) in zip(parts, columns):
                classes = slice(part.start, part.end)
                _backpropagate(gradients, tensors, softmax, part, slice(first, last), classes, gradient[:, left:right])


def _accumulate_given_logits(softmax, tensors, nll, gradients, row_weights):
    """`_accumulate` for a softmax whose logits the caller made (XLNet's), with gradients, in chunks of columns
    rather than rows: a chunk of rows adds its gradient into the whole [classes, d] weight gradient (a pass over it
    per chunk, and GEMMs whose inner dimension is the chunk's 128 rows), while a chunk of columns writes its own rows
    of the weight gradient with one GEMM over all N rows, and adds into the hidden states' gradient, [N, d], small
    enough to stay in cache. The softmax's normaliser logsumexp(z) comes first, from the logits in chunks of rows."""
    hidden, target, logits = tensors[softmax.hidden], softmax.target, softmax.logits
    count, dtype = hidden.shape[0], softmax_dtype(tensors[0].dtype)
    if count == 0:
        return
    rows = slice(0, count) if softmax.rows is None else softmax.rows
    ignored = target == IGNORE_INDEX
    target = target.masked_fill(ignored, 0)
    normaliser = _logsumexp_rows(logits, dtype)
    if nll is not None:  # -log p(target) = logsumexp(z) - z_target
        target_logits = logits.gather(1, target[:, None]).squeeze(1).to(dtype)
        _add_rows(nll, rows, (normaliser - target_logits).masked_fill(ignored, 0))
    row_factor = (~ignored).to(dtype) if row_weights is None else row_weights[rows].to(dtype).masked_fill(ignored, 0)
    width = max(1, CHUNK_ELEMENTS // count)
    buffer = torch.empty(count, min(width, logits.shape[1]), dtype=dtype, device=hidden.device)
    for part, (left, right) in zip(softmax.parts, _columns(softmax.parts)):
        for first in range(left, right, width):
            last = min(first + width, right)
            gradient = torch.sub(logits[:, first:last], normaliser[:, None], out=buffer[:, : last - first]).exp_()
            targeted = ((target >= first) & (target < last)).nonzero().squeeze(1)  # softmax - onehot(target)
            gradient.index_put_((targeted, target[targeted] - first), gradient.new_tensor(-1.0), accumulate=True)
            gradient = gradient.mul_(row_factor[:, None]).to(hidden.dtype)
            classes = slice(part.start + first - left, part.start + last - left)
            _backpropagate(gradients, tensors, softmax, part, slice(0, count), classes, gradient)


def _logsumexp_rows(logits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """logsumexp(z) of every row of `logits` [N, C], in `dtype`, chunk by chunk of rows through one buffer:
    `torch.logsumexp` makes a fresh [rows, C] temporary per call, which on CPU is mapped from the OS and paid for
    in page faults (XLNet's 32000 words: 90 ms of a training step)."""
    step = max(1, CHUNK_ELEMENTS // logits.shape[1])
    buffer = torch.empty(min(step, logits.shape[0]), logits.shape[1], dtype=dtype, device=logits.device)
    normaliser = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
    for first in range(0, logits.shape[0], step):
        rows = logits[first : first + step]
        highest = rows.amax(-1, keepdim=True).to(dtype)
        highest.masked_fill_(highest.isinf(), 0)  # (as torch.logsumexp: a row of -inf gives -inf, not NaN)
        shifted = torch.sub(rows, highest, out=buffer[: rows.shape[0]]).exp_()  # (exp(z - max) <= 1: no overflow)
        torch.add(highest.squeeze(-1), shifted.sum(-1).log_(), out=normaliser[first : first + step])
    return normaliser


def _backpropagate(gradients, tensors, softmax, part, rows, classes, gradient):
    """Add the logits' gradient [rows, classes] of one part through the output layer: into those rows of the hidden
    states' gradient and those classes (rows of the full tensors) of the weight's and bias's gradients."""
    if gradients[softmax.hidden] is not None:
        gradients[softmax.hidden][rows].addmm_(gradient, tensors[part.weight][classes])
    if gradients[part.weight] is not None:
        gradients[part.weight][classes].addmm_(gradient.t(), tensors[softmax.hidden][rows])
    if part.bias is not None and gradients[part.bias] is not None:
        gradients[part.bias][classes].add_(gradient.sum(0))


def _columns(parts):
    """[(first, last column)] of each part in the softmax's logits."""
    columns, left = [], 0
    for part in parts:
        columns.append((left, left + part.end - part.start))
        left += part.end - part.start
    return columns


def _weight(tensors, part):
    return tensors[part.weight][part.start : part.end]


def _bias(tensors, part):
    return None if part.bias is None else tensors[part.bias][part.start : part.end]


def linear_into(out, hidden, weight, bias=None):
    """out = hidden weight^T + bias, by the GEMM itself when the dtypes allow (else a copy of the product); `out` may
    be a column slice of a wider tensor."""
    if not out.dtype == hidden.dtype == weight.dtype:
        return out.copy_(F.linear(hidden, weight, bias))
    if uses_onednn(hidden, weight, bias) and not is_differentiable(hidden, weight):  # (faster than the copy)
        return out.copy_(onednn_linear(hidden, weight, bias))
    if bias is None:
        return torch.mm(hidden, weight.t(), out=out)
    return torch.addmm(bias, hidden, weight.t(), out=out)


def _add_rows(nll, rows, values):
    if isinstance(rows, slice):
        nll[rows] += values
    else:
        nll.index_add_(0, rows, values)


# ----------------------------------------------------------------------------------------------------------------
# The same passes as custom operators, for torch.compile (which cannot trace chunks over data-dependent rows)


def _encode(layout) -> list[int]:
    """The tensor indices of `_tensor_layout`'s softmaxes as integers: per softmax its hidden states and number of
    parts, then per part its weight, bias (-1: none), first and last class."""
    codes = []
    for softmax in layout:
        codes += [softmax.hidden, len(softmax.parts)]
        for part in softmax.parts:
            codes += [part.weight, -1 if part.bias is None else part.bias, part.start, part.end]
    return codes


def _decode(codes, targets, rows, logits):
    """The inverse of `_encode`, with each softmax's targets, rows and logits (None where absent)."""
    layout, position = [], 0
    for target, softmax_rows, softmax_logits in zip(targets, rows, logits):
        hidden, count = codes[position : position + 2]
        parts = []
        for first in range(position + 2, position + 2 + 4 * count, 4):
            weight, bias, start, end = codes[first : first + 4]
            parts.append(SoftmaxPart(weight, None if bias < 0 else bias, start, end))
        layout.append(Softmax(hidden, target, tuple(parts), softmax_rows, softmax_logits))
        position += 2 + 4 * count
    return layout


def _linear_cross_entropy_op(
    tensors: list[torch.Tensor],
    targets: list[torch.Tensor],
    rows: list[Optional[torch.Tensor]],
    logits: list[Optional[torch.Tensor]],
    codes: list[int],
    num_rows: int,
    needs_gradients: list[bool],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """linear_cross_entropy on `_tensor_layout`'s tensors and `_encode`'s codes: the NLL and the gradients of the
    tensors that need them (empty for the others), made in the forward pass as in eager mode."""
    gradients = _zero_gradients(tensors, needs_gradients)
    nll = torch.zeros(num_rows, dtype=softmax_dtype(tensors[0].dtype), device=tensors[0].device)
    with torch.autocast(tensors[0].device.type, enabled=False):
        _accumulate(_decode(codes, targets, rows, logits), tensors, nll, gradients if any(needs_gradients) else None,
                    row_weights=None)  # fmt: skip
    return nll, _or_empty(gradients, tensors)


def _linear_cross_entropy_op_fake(tensors, targets, rows, logits, codes, num_rows, needs_gradients):
    nll = tensors[0].new_empty(num_rows, dtype=softmax_dtype(tensors[0].dtype))
    return nll, [t.new_empty(t.shape if need else 0) for t, need in zip(tensors, needs_gradients)]


def _or_empty(gradients, tensors):
    return [tensor.new_empty(0) if gradient is None else gradient for gradient, tensor in zip(gradients, tensors)]


def _setup_linear_cross_entropy_op(ctx, inputs, output):
    tensors, targets, rows, logits, codes, num_rows, needs_gradients = inputs
    ctx.save_for_backward(*tensors, *output[1], *targets, *(r for r in rows if r is not None))
    ctx.counts = len(tensors), len(targets), [r is not None for r in rows]
    ctx.codes, ctx.num_rows, ctx.needs_gradients = codes, num_rows, needs_gradients
    # (autograd wants no gradient for each: a list of None for a list of tensors, one None for a list with a None)
    ctx.no_rows_gradient, ctx.no_logits_gradient = (
        None if any(t is None for t in x) else [None] * len(x) for x in (rows, logits)
    )


def _linear_cross_entropy_op_backward(ctx, grad_nll, _):
    count, softmaxes, has_rows = ctx.counts
    saved = iter(ctx.saved_tensors)
    tensors, gradients, targets = ([next(saved) for _ in range(n)] for n in (count, count, softmaxes))
    rows = [next(saved) if present else None for present in has_rows]
    gradients = linear_cross_entropy_backward_op(grad_nll, gradients, tensors, targets, rows, ctx.codes,
                                                 ctx.needs_gradients)  # fmt: skip
    gradients = [g if need else None for g, need in zip(gradients, ctx.needs_gradients)]
    return gradients, [None] * softmaxes, ctx.no_rows_gradient, ctx.no_logits_gradient, None, None, None


def _linear_cross_entropy_backward_op(
    grad_nll: torch.Tensor,
    gradients: list[torch.Tensor],
    tensors: list[torch.Tensor],
    targets: list[torch.Tensor],
    rows: list[Optional[torch.Tensor]],
    codes: list[int],
    needs_gradients: list[bool],
) -> list[torch.Tensor]:
    """The backward pass of `_linear_cross_entropy_op`, as `_LinearCrossEntropy.backward` (out of place: an
    operator's outputs are its own tensors)."""
    layout = _decode(codes, targets, rows, [None] * len(targets))
    weight = _common_value(grad_nll, layout)
    if weight is not None:
        return [gradient * weight for gradient in gradients]
    gradients = _zero_gradients(tensors, needs_gradients)
    with torch.autocast(tensors[0].device.type, enabled=False):
        _accumulate(layout, tensors, None, gradients, row_weights=grad_nll)
    return _or_empty(gradients, tensors)


def _linear_cross_entropy_backward_op_fake(grad_nll, gradients, tensors, targets, rows, codes, needs_gradients):
    return [torch.empty_like(gradient) for gradient in gradients]


linear_cross_entropy_op = define(__package__ or __name__, "linear_cross_entropy", _linear_cross_entropy_op,
                                 _linear_cross_entropy_op_fake, _linear_cross_entropy_op_backward,
                                 _setup_linear_cross_entropy_op)  # fmt: skip
linear_cross_entropy_backward_op = define(__package__ or __name__, "linear_cross_entropy_backward",
                                          _linear_cross_entropy_backward_op, _linear_cross_entropy_backward_op_fake)
