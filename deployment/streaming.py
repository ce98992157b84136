"""The model as a function of token ids and memory, the form an exported graph needs.

`StreamingModel(model)(input_ids, memory)` returns the head's outputs and the layer inputs over [memory; segment],
in the time-major layout of `mems` stacked over the layers: [n_layer, memory + segment, batch, d_model]. It keeps
them all: which of them the next segment remembers (the last `mem_len`) is a slice whose length is
min(memory + segment, mem_len), a shape torch.export can only trace on one side of that boundary, whereas an ONNX
`Slice` computes it in the graph (see onnx_export). Everything else, including the memory length itself, is a free
dimension of the graph.
"""

import torch
from torch import nn
from torch.export import Dim

from ..modeling.memory_cache import MemoryCache
from ..modeling.modeling_transfo_xl import TransfoXLPreTrainedModel
from ..modeling.modeling_xlnet import XLNetForMultipleChoice, XLNetForQuestionAnswering, XLNetPreTrainedModel

OUTPUT_FIELDS_LEFT_OUT = ("mems", "cache", "loss", "losses", "hidden_states", "attentions")


def check_exportable(model: nn.Module):
    """Raise a one-line ValueError for a model or setting that has no exported form."""
    name = type(model).__name__
    if not isinstance(model, (TransfoXLPreTrainedModel, XLNetPreTrainedModel)):
        raise ValueError(f"{name} has no export here; expected one of transformers-xl's Transformer-XL or XLNet "
                         "classes.")
    config = model.config
    if model.training and getattr(config, "sample_softmax", 0) > 0:
        raise ValueError(
            f"{name} is in training mode with a sampled softmax (sample_softmax={config.sample_softmax}), a training "
            "loss that has no exported form; call model.eval() to export the exact softmax."
        )
    if model.training and (config.dropout > 0 or getattr(config, "dropatt", 0) > 0):
        raise ValueError(f"{name} is in training mode (dropout); call model.eval() to export it.")
    if isinstance(model, TransfoXLPreTrainedModel) and not config.mem_len > 0:
        raise ValueError(f"{name}: mem_len={config.mem_len} keeps no memory; expected mem_len > 0 for a streaming "
                         "graph.")


class StreamingModel(nn.Module):
    """(input_ids, memory) -> (head outputs..., layer inputs over [memory; segment]); see the module docstring."""

    def __init__(self, model: nn.Module):
        super().__init__()
        check_exportable(model)
        self.model = model
        self.is_xlnet = isinstance(model, XLNetPreTrainedModel)

    def forward(self, input_ids: torch.Tensor, memory: torch.Tensor):
        cache = MemoryCache.from_mems(memory.unbind(0), mem_len=None)  # (keeps every position: see the docstring)
        extra = {"use_mems": True} if self.is_xlnet else {}
        outputs = self.model(input_ids, cache=cache, return_dict=True, **extra)
        heads = tuple(value for name, value in outputs.items() if name not in OUTPUT_FIELDS_LEFT_OUT)
        return *heads, torch.stack(cache.mems)

    def output_names(self, example_input_ids: torch.Tensor, example_memory: torch.Tensor) -> list[str]:
        """The names of forward's outputs: the head's fields, then "states"."""
        with torch.no_grad():
            outputs = self.model(example_input_ids, mems=tuple(example_memory.unbind(0)), return_dict=True)
        return [name for name, value in outputs.items() if name not in OUTPUT_FIELDS_LEFT_OUT] + ["states"]

    def example_inputs(self, batch_size: int, segment_length: int, memory_length: int, seed: int = 0):
        """Random ids [batch, (choices,) segment] and memory [n_layer, memory, batch (x choices), d_model]."""
        config = self.model.config
        rows = (batch_size, 2) if isinstance(self.model, XLNetForMultipleChoice) else (batch_size,)
        generator = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(0, config.vocab_size, (*rows, segment_length), generator=generator)
        parameter = next(self.model.parameters())
        memory = torch.randn(config.n_layer, memory_length, rows[0] * (rows[1:] or (1,))[0], config.d_model,
                             generator=generator).to(parameter.dtype)  # fmt: skip
        return input_ids, memory

    def shortest_segment(self) -> int:
        """The shortest segment the model's shapes are defined for: XLNetForQuestionAnswering's beam search takes the
        top start_n_top / end_n_top positions of a segment."""
        if isinstance(self.model, XLNetForQuestionAnswering):
            return max(1, self.model.start_n_top, self.model.end_n_top)
        return 1

    def dynamic_shapes(self, dynamic_batch_and_length: bool):
        """torch.export's `dynamic_shapes` for (input_ids, memory): the memory length always free (a stream's memory
        grows from empty to mem_len); the batch size and segment length too with `dynamic_batch_and_length`."""
        memory = Dim("memory", min=0)
        if not dynamic_batch_and_length:
            return {"input_ids": None, "memory": {1: memory}}
        batch, segment = Dim("batch", min=1), Dim("segment", min=self.shortest_segment())
        if isinstance(self.model, XLNetForMultipleChoice):  # (memory rows: batch x choices, fixed choices)
            return {"input_ids": {0: batch, 2: segment}, "memory": {1: memory, 2: Dim.AUTO}}
        return {"input_ids": {0: batch, 1: segment}, "memory": {1: memory, 2: batch}}
