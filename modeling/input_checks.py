"""Input checks of both models: bad input fails before any computation, naming the argument, what it got and what
was expected. Values are checked without a host sync (`torch._assert_async`): a ValueError on CPU, a device-side
assert on an accelerator, a RuntimeError in a compiled graph."""

import torch

IGNORE_INDEX = -100  # the label value every loss skips (transformers' convention)


def check_all(model: str, argument: str, valid: torch.Tensor, values: torch.Tensor, expected: str):
    """Fail unless `valid` is all True, without a host sync; where that fails at once (CPU, eager), a ValueError gives
    the range of the invalid `values`. `expected` must not print a traced size (a sequence length): one recompilation
    per length."""
    try:
        torch._assert_async(valid.all(), f"{model}: `{argument}` has values out of range; expected {expected}.")
    except RuntimeError:  # (raised at once: CPU, eager; not in a graph, where the assertion is a node)
        invalid = values[~valid]
        lowest, highest = (value.item() for value in torch.aminmax(invalid))
        raise ValueError(
            f"{model}: `{argument}` has {invalid.numel()} value(s) out of range, in [{lowest}, {highest}]; expected "
            f"{expected}."
        ) from None


def check_shape(model: str, argument: str, tensor, expected: tuple, described: str, origin: str = ""):
    """`tensor` (when given) has shape `expected`; `described` names its dimensions, e.g. "[batch_size, seq_len]"."""
    if tensor is not None and tuple(tensor.shape) != tuple(expected):
        raise ValueError(
            f"{model}: `{argument}` has shape {tuple(tensor.shape)}; expected {described} = {tuple(expected)}{origin}."
        )


def check_integer(model: str, argument: str, tensor, what: str):
    """`tensor` holds integers (ids, positions, class indices), not floats or booleans."""
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise TypeError(f"{model}: `{argument}` has dtype {tensor.dtype}; expected integer {what} (torch.long).")


def check_values_in(model: str, argument: str, tensor, low, high, what: str, note="", ignore_index=None):
    """Every value of `tensor` lies in [low, high) (no upper bound when `high` is None) or equals `ignore_index`.
    `high` may be a size (a sequence length): it is printed only in eager mode (see `check_all`)."""
    if tensor.numel() == 0:
        return
    valid = tensor >= low if high is None else (tensor >= low) & (tensor < high)
    if ignore_index is not None:
        valid = valid | (tensor == ignore_index)
    if high is None:
        allowed = f">= {low}"
    elif isinstance(high, int):  # in eager mode always; while tracing unless the size is a symbol
        allowed = f"in [{low}, {high - 1}]"
    else:
        allowed = f">= {low} and below the size of the input"
    ignored = "" if ignore_index is None else f" or {ignore_index} (ignored)"
    check_all(model, argument, valid, tensor, f"{what} {allowed}{note}{ignored}")


def check_inputs(model: str, input_ids, inputs_embeds, vocab_size: int, d_model: int) -> tuple[int, int]:
    """Exactly one of `input_ids` [batch_size, seq_len] (integer ids in the vocabulary) and `inputs_embeds`
    [batch_size, seq_len, d_model], with at least one token. Returns (batch_size, seq_len)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"{model}: pass exactly one of `input_ids` and `inputs_embeds`.")
    if input_ids is not None:
        check_integer(model, "input_ids", input_ids, "token ids")
        if input_ids.dim() != 2:
            raise ValueError(f"{model}: `input_ids` has shape {tuple(input_ids.shape)}; expected [batch_size, seq_len].")
        argument, shape = "input_ids", tuple(input_ids.shape)
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != d_model:
            raise ValueError(
                f"{model}: `inputs_embeds` has shape {tuple(inputs_embeds.shape)}; expected "
                f"[batch_size, seq_len, d_model={d_model}]."
            )
        argument, shape = "inputs_embeds", tuple(inputs_embeds.shape)
    if 0 in shape[:2]:
        raise ValueError(f"{model}: `{argument}` has shape {shape}; expected at least one sequence of one token or more.")
    if input_ids is not None:
        check_values_in(model, "input_ids", input_ids, 0, vocab_size, "token ids", f" (vocab_size={vocab_size})")
    return shape[0], shape[1]


def inputs_shape(input_ids, inputs_embeds) -> tuple[int, int] | None:
    """(batch_size, seq_len) of inputs of the right rank, else None. Heads check their labels against it before the
    forward pass; the base model then reports anything wrong with the inputs themselves (`check_inputs`)."""
    if input_ids is not None and inputs_embeds is None and input_ids.dim() == 2:
        return tuple(input_ids.shape)
    if inputs_embeds is not None and input_ids is None and inputs_embeds.dim() == 3:
        return tuple(inputs_embeds.shape[:2])
    return None


def check_token_labels(model: str, labels, expected, described, origin, num_classes: int, what: str, note: str,
                       argument: str = "labels"):
    """Per-token labels (language modelling, token classification): integer, shape `expected` (unchecked when
    None), in [0, num_classes) or -100. `argument`: their name in the errors (`labels`, `shift_labels`)."""
    if labels is None:
        return
    check_integer(model, argument, labels, what)
    if expected is not None:
        check_shape(model, argument, labels, expected, described, origin)
    check_values_in(model, argument, labels, 0, num_classes, what, note, ignore_index=IGNORE_INDEX)


def problem_type(config, labels) -> str:
    """`config.problem_type`, inferred from the labels when unset and then stored, as transformers' sequence
    classification losses do: one label -> regression, integer labels -> single-label, else multi-label."""
    if config.problem_type is None:
        if config.num_labels == 1:
            config.problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    return config.problem_type


def check_one_per_sequence(model: str, argument: str, tensor, batch_size: int, origin: str = ""):
    """One value per sequence: [batch_size], or a [batch_size, 1] column."""
    if tuple(tensor.shape) not in ((batch_size,), (batch_size, 1)):
        check_shape(model, argument, tensor, (batch_size,), "[batch_size] (or [batch_size, 1])", origin)


def check_class_ids(model: str, labels, batch_size: int, num_classes: int, what: str, note: str):
    """One class index per sequence (a label, a choice): integers in [0, num_classes) or -100."""
    check_integer(model, "labels", labels, what)
    check_one_per_sequence(model, "labels", labels, batch_size)
    check_values_in(model, "labels", labels, 0, num_classes, what, note, ignore_index=IGNORE_INDEX)


def check_sequence_labels(model: str, config, labels, batch_size: int):
    """Sequence classification labels for `config.problem_type` (inferred when unset): class ids [batch_size] in
    [0, num_labels) or -100; regression targets [batch_size] or [batch_size, num_labels]; multi-label ones in [0, 1]."""
    if labels is None:
        return
    num_labels, kind = config.num_labels, problem_type(config, labels)
    if kind == "single_label_classification":
        check_class_ids(model, labels, batch_size, num_labels, "class ids", f" (num_labels={num_labels})")
    elif kind == "regression" and num_labels == 1:
        check_one_per_sequence(model, "labels", labels, batch_size, " for regression")
    elif kind == "regression":
        check_shape(model, "labels", labels, (batch_size, num_labels), "[batch_size, num_labels]", " for regression")
    elif kind == "multi_label_classification":
        check_shape(model, "labels", labels, (batch_size, num_labels), "[batch_size, num_labels]",
                    " (a 0 / 1 target per label for multi-label classification)")  # fmt: skip
        check_all(model, "labels", (labels >= 0) & (labels <= 1), labels, "multi-label targets in [0, 1]")
    else:
        raise ValueError(
            f"{model}: `config.problem_type` is {kind!r}; expected 'regression', 'single_label_classification' or "
            "'multi_label_classification'."
        )


def check_span_positions(model: str, argument: str, positions, batch_size: int, seq_len: int, ignore_beyond: bool):
    """Answer-span positions [batch_size]: integers in [0, seq_len). With `ignore_beyond`, positions at or past the end
    pass (transformers' simple QA head ignores them); negative ones never (transformers would clamp them to 0)."""
    if positions is None:
        return
    check_integer(model, argument, positions, "token positions")
    check_one_per_sequence(model, argument, positions, batch_size)
    if ignore_beyond:
        note = " (positions past the end of the sequence are ignored, as in transformers)"
        check_values_in(model, argument, positions, 0, None, "token positions", note)
    else:
        check_values_in(model, argument, positions, 0, seq_len, "token positions")
