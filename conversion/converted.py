"""What every checkpoint reader hands to the shared writer: the model class, its config and its weights, plus a way
to run the source for the verification step."""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PretrainedConfig, PreTrainedModel


@dataclass
class ConvertedCheckpoint:
    model_class: type[PreTrainedModel]
    """Our head class the weights belong to (e.g. `TransfoXLLMHeadModel`, `XLNetForQuestionAnswering`)."""
    config: PretrainedConfig
    state_dict: dict[str, torch.Tensor]
    """Every parameter and buffer of `model_class(config)` under our names, nothing else."""
    source: str
    """Where the weights came from, in words, for the model card (e.g. "TF checkpoint model.ckpt-0 (XLNet)")."""
    compare_with_source: Callable[[PreTrainedModel], float] | None = None
    """Runs the source and the converted model on a sample input and returns the largest absolute difference of
    their outputs; None where the source cannot be run here."""
    compared_with: str = "the source model"
    """What `compare_with_source` runs, in words, for the verification line and the model card."""
    tokenizer_files: dict[str, str] = field(default_factory=dict)
    """Vocabulary files found beside the source, by kind ("vocab.pkl", "vocab.txt", "spiece.model", ...)."""
    license: str | None = None
    """The source's license where it says one (the `license` of its folder's model card), for the model card."""


def does_not_fit(what: str, model_class: type, problems: list[str], shown: int = 25) -> ValueError:
    """The error for weights that do not fit `model_class` with the given config: the problems one per line (names
    and shapes), the first `shown` of them (a wrong config can give hundreds)."""
    lines = problems[:shown] + ([f"... and {len(problems) - shown} more"] if len(problems) > shown else [])
    return ValueError(f"{what} does not fit {model_class.__name__} with this config:\n  " + "\n  ".join(lines))


def checkpoint_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """`model`'s weights under its checkpoints' names and layouts: XLNet's projections as transformers' XLNet holds
    them (`XLNetPreTrainedModel.checkpoint_state_dict`), Transformer-XL's as they are."""
    return model.checkpoint_state_dict() if hasattr(model, "checkpoint_state_dict") else model.state_dict()

