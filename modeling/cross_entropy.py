"""Softmax cross-entropy whose gradient is made in the forward pass, for the large output layers of both models.

For logits z and a target t, -log softmax(z)_t = logsumexp(z) - z_t, and its gradient with respect to z is
softmax(z) - onehot(t). `F.cross_entropy` stores the full log-softmax, and its backward fills a zero tensor of the
logits' size, scatters into it and reads both again; at XLNet's 32000 words or Transformer-XL's 20000-word tail
cluster those are several fresh [N, vocabulary] tensors per step, each paid for in page faults as well as passes. Here
the forward pass writes the log-softmax once and turns it into the gradient in place; that is all it stores, and the
backward pass scales it in place by each row's incoming gradient.
"""

import torch


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


def softmax_cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """[N, C] logits, [N] targets -> [N] negative log-likelihoods, in fp32 or wider (0 where the target is
    `ignore_index`): the numbers of `F.cross_entropy(logits.float(), target, reduction="none", ...)`."""
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(
            f"softmax_cross_entropy: logits {tuple(logits.shape)} and targets {tuple(target.shape)}; expected [N, C] "
            "and [N]."
        )
    valid = target != ignore_index
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return _SoftmaxCrossEntropy.apply(logits, target.where(valid, 0), valid.to(logits.dtype))


def reduced_cross_entropy(logits, target, reduction: str = "mean", ignore_index: int = -100) -> torch.Tensor:
    """`softmax_cross_entropy` summed or averaged over the targets that count (`F.cross_entropy`'s reductions: a mean
    over no targets is NaN, as there)."""
    nll = softmax_cross_entropy(logits, target, ignore_index)
    if reduction == "none":
        return nll
    if reduction == "sum":
        return nll.sum()
    if reduction == "mean":
        return nll.sum() / (target != ignore_index).sum()
    raise ValueError(f"reduced_cross_entropy: reduction {reduction!r}; expected 'none', 'sum' or 'mean'.")
