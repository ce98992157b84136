"""Training with the memory carried across steps (Transformer-XL streams, XLNet permutation LM) and the demo.

`TextStream` serves a token stream as fixed contiguous rows, segment by segment; `MemoryTrainer` is Trainer with
the model's `mems` passed from each step to the next (see `memory_trainer` for the memory's life).
"""

from .memory_trainer import MemoryTrainer
from .streams import TextStream

__all__ = ["MemoryTrainer", "TextStream"]
