"""Answer spans from the beam outputs of `XLNetForQuestionAnswering` (the original `squad_utils` reading).

At inference (no `start_positions` / `end_positions`) the head returns the `start_n_top` most probable starts and,
for each, the `end_n_top` most probable ends given that start, as probabilities. The answer is the pair with the
highest p(start) * p(end | start) among those that form a span: start <= end < start + max_answer_length.
"""

import torch


def best_spans(start_top_log_probs, start_top_index, end_top_log_probs, end_top_index, max_answer_length=30):
    """`(starts, ends, scores)`, one per example, from the head's outputs (tensors or `Trainer.predict` arrays).

    `end_top_*` are [N, end_n_top * start_n_top] as the head lays them out: the e-th best end for the s-th start is
    at e * start_n_top + s. Where no candidate forms a span, start and end are -1 and the score is 0.
    """
    start_probs, starts = torch.as_tensor(start_top_log_probs), torch.as_tensor(start_top_index)
    batch, start_n_top = starts.shape
    if torch.as_tensor(end_top_index).shape[-1] % start_n_top:
        raise ValueError(
            f"best_spans: end_top_index has {torch.as_tensor(end_top_index).shape[-1]} columns; expected "
            f"end_n_top * start_n_top, a multiple of start_n_top = {start_n_top}."
        )
    # [N, end_n_top, start_n_top] -> [N, start_n_top, end_n_top]
    end_probs = torch.as_tensor(end_top_log_probs).reshape(batch, -1, start_n_top).transpose(1, 2)
    ends = torch.as_tensor(end_top_index).reshape(batch, -1, start_n_top).transpose(1, 2)
    scores = start_probs[:, :, None] * end_probs
    spans = (ends >= starts[:, :, None]) & (ends < starts[:, :, None] + max_answer_length)
    scores = scores.masked_fill(~spans, -1.0).flatten(1)
    best = scores.argmax(-1)
    found = scores.gather(1, best[:, None]).squeeze(1) >= 0
    best_starts = starts.gather(1, best[:, None] // ends.shape[2]).squeeze(1)
    best_ends = ends.flatten(1).gather(1, best[:, None]).squeeze(1)
    none = torch.full_like(best_starts, -1)
    return (
        torch.where(found, best_starts, none),
        torch.where(found, best_ends, none),
        torch.where(found, scores.gather(1, best[:, None]).squeeze(1), torch.zeros_like(scores[:, 0])),
    )


__all__ = ["best_spans"]
