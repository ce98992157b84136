"""The recurrent memory as transformers `Cache`s for `generate()`: `MemoryCache` (default), `StaticMemoryCache`.

Each layer's input hidden states for the last `mem_len` tokens [B, m, d], their keys / values [B, H, m, D] and the
position keys, reused while the weights are frozen (eval, no gradient). `cache.mems` is the legacy time-major tuple:
views of a memory grown in place (`GrowingTensor`): clone them to keep them."""

import torch
from transformers.cache_utils import Cache, DynamicCache, StaticCache


def check_mems(mems, num_layers: int, batch_size: int, width: int, model: str, dtype: torch.dtype, device):
    """Validate legacy `mems` (one time-major [mem_len, batch, width] tensor per layer, one mem_len for all) on the
    device and in the dtype of the hidden states (or, under autocast, in its dtype)."""
    if len(mems) != num_layers:
        raise ValueError(f"{model}: `mems` has {len(mems)} entries; expected one per layer ({num_layers}).")
    device = torch.device(device)
    autocast_dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    for i, mem in enumerate(mems):
        if mem.dim() != 3 or mem.shape[1] != batch_size or mem.shape[2] != width:
            raise ValueError(
                f"{model}: `mems[{i}]` has shape {tuple(mem.shape)}; expected [mem_len, batch_size={batch_size}, "
                f"d_model={width}] (time-major, as returned in `outputs.mems`)."
            )
        if mem.device != device:
            raise ValueError(f"{model}: `mems[{i}]` is on device {mem.device}; expected {device}, the model's.")
        if mem.dtype not in (dtype, autocast_dtype):
            raise TypeError(
                f"{model}: `mems[{i}]` has dtype {mem.dtype}; expected {dtype}, the dtype of the hidden states"
                + (f" (or {autocast_dtype} under autocast)." if autocast_dtype else ".")
            )
    if any(mem.shape[0] != mems[0].shape[0] for mem in mems):  # (compared, not hashed: torch.export's sizes aren't)
        lengths = [mem.shape[0] for mem in mems]
        raise ValueError(f"{model}: `mems` entries have lengths {lengths}; expected the same mem_len for every layer.")


class GrowingTensor:
    """A tensor that grows along one axis into room reserved after its end: appending writes only the new positions
    (`torch.cat` would copy all at every step). `tensor` is a view of `buffer`; a buffer we did not allocate (a
    user's `mems`) is never written. Out of room, the positions move to a buffer twice their size: amortised O(1)."""

    def __init__(self, tensor: torch.Tensor, axis: int):
        self.buffer, self.axis, self.writable = tensor, axis, False
        self.start, self.length = 0, tensor.shape[axis]

    @property
    def tensor(self) -> torch.Tensor:
        return self.buffer.narrow(self.axis, self.start, self.length)

    def extended(self, new: torch.Tensor) -> torch.Tensor:
        """[tensor; new] along the axis, written into the room after `tensor` (whose own length is unchanged)."""
        count, end = new.shape[self.axis], self.start + self.length
        if torch.compiler.is_compiling():  # (a graph makes fresh tensors: plainly joined, no room kept)
            self.buffer, self.start, self.writable = torch.cat([self.tensor, new], self.axis), 0, False
            return self.buffer
        fits = (
            self.writable
            # a buffer made under torch.inference_mode can only be written there
            and (torch.is_inference_mode_enabled() or not self.buffer.is_inference())
            and end + count <= self.buffer.shape[self.axis]
            and new.shape[: self.axis] + new.shape[self.axis + 1 :]
            == self.buffer.shape[: self.axis] + self.buffer.shape[self.axis + 1 :]
            and (new.dtype, new.device) == (self.buffer.dtype, self.buffer.device)
        )
        if not fits:
            shape = list(new.shape)
            shape[self.axis] = (2 if self.writable else 1) * (self.length + count)
            buffer = new.new_empty(shape)
            buffer.narrow(self.axis, 0, self.length).copy_(self.tensor)
            self.buffer, self.start, self.writable = buffer, 0, True
        self.buffer.narrow(self.axis, self.start + self.length, count).copy_(new)
        return self.buffer.narrow(self.axis, self.start, self.length + count)

    def append(self, new: torch.Tensor):
        self.extended(new)
        self.length += new.shape[self.axis]

    def adopt(self, tensor: torch.Tensor) -> bool:
        """Take `tensor` as the new contents if it is a view of the buffer starting where `tensor` starts (a prefix
        of what `extended` returned): no copy. False when it is not."""
        offset = self.start * self.buffer.stride(self.axis) * self.buffer.element_size()
        if (
            tensor.data_ptr() != self.buffer.data_ptr() + offset
            or tensor.stride() != self.buffer.stride()
            or tensor.shape[self.axis] > self.buffer.shape[self.axis] - self.start
        ):
            return False
        self.length = tensor.shape[self.axis]
        return True

    def keep_last(self, length: int):
        dropped = max(self.length - length, 0)
        self.start, self.length = self.start + dropped, self.length - dropped

    def drop_newest(self, count: int):
        self.length -= count


def key_values_over(memory: torch.Tensor | None, key: torch.Tensor, value: torch.Tensor, project):
    """Keys and values [B, H, m + q, D] of [memory; segment]: the segment's own joined to `project(memory)`'s
    (joining the inputs instead would keep one more [B, m + q, d] copy for backward and leave the keys strided)."""
    if memory is None:
        return key, value
    memory_key, memory_value = project(memory)
    return torch.cat([memory_key, key], dim=2), torch.cat([memory_value, value], dim=2)


class MemoryLayer:
    """One layer's memory: hidden states [B, m, d] and, when known, their keys and values [B, H, m, D]; also the
    layer's projected position keys."""

    AXES = {"hidden": 1, "keys": 2, "values": 2}

    def __init__(self, hidden=None):
        self.sequences = {}  # name -> GrowingTensor, for the names in AXES that are known
        self.hidden = hidden
        self.position_keys = None  # [..., heads, span, d_head] for distances lowest+span-1 ... lowest
        self.lowest_distance = None

    def _get(self, name):
        sequence = self.sequences.get(name)
        return None if sequence is None else sequence.tensor

    def _set(self, name, tensor):
        if tensor is None:
            self.sequences.pop(name, None)
        else:
            self.sequences[name] = GrowingTensor(tensor, self.AXES[name])

    hidden = property(lambda self: self._get("hidden"), lambda self, tensor: self._set("hidden", tensor))
    keys = property(lambda self: self._get("keys"))
    values = property(lambda self: self._get("values"))

    def key_values_with(self, new_keys: torch.Tensor, new_values: torch.Tensor):
        """Keys and values of [memory; new], written after the memory's (no copy), which `store` adopts later."""
        return self.sequences["keys"].extended(new_keys), self.sequences["values"].extended(new_values)

    def append(self, hidden: torch.Tensor, keys=None, values=None):
        """Append hidden states; `keys` / `values` cover [memory; new] (from `key_values_with`: adopted, no copy).
        Without them the stored keys are dropped: they would no longer match."""
        if "hidden" in self.sequences:
            self.sequences["hidden"].append(hidden)
        else:
            self._set("hidden", hidden)
        for name, tensor in (("keys", keys), ("values", values)):
            if tensor is None or name not in self.sequences or not self.sequences[name].adopt(tensor):
                self._set(name, tensor)

    def map_batch(self, fn):
        """Every batch-first tensor replaced by `fn`'s (beam reordering, expansion, selection)."""
        for name, sequence in list(self.sequences.items()):
            self._set(name, fn(sequence.tensor))

    def keep_last(self, length: int):
        for sequence in self.sequences.values():
            sequence.keep_last(length)

    def drop_newest(self, count: int):
        for sequence in self.sequences.values():
            sequence.drop_newest(count)


class SegmentMemory(Cache):
    """Segment-level memory, one `MemoryLayer` per layer; `mem_len=None` keeps every position. For assisted decoding,
    `activate_past_recording()` keeps what `mem_len` would evict until the next `crop`: the rollback is exact."""

    def __init__(self, num_layers: int, mem_len: int | None):
        Cache.__init__(self, layers=[MemoryLayer() for _ in range(num_layers)])
        self.mem_len = mem_len
        self.seen_tokens = 0
        self.record_past = False
        self.last_stored = 0  # positions the last `store` appended, before `mem_len` evicted any

    @classmethod
    def from_mems(cls, mems, mem_len: int | None, batch_size: int | None = None):
        """Wrap a legacy tuple of time-major mems; repeat its rows when `batch_size` is a multiple (beams)."""
        cache = cls(len(mems), mem_len)
        for layer, mem in zip(cache.layers, mems):
            layer.hidden = mem.transpose(0, 1) if mem.shape[0] else None
        if batch_size is not None and cache.batch_size > 0 and batch_size != cache.batch_size:
            if batch_size % cache.batch_size:
                raise ValueError(
                    f"`mems` hold {cache.batch_size} sequences, which cannot be expanded to a batch of {batch_size}."
                )
            cache.batch_repeat_interleave(batch_size // cache.batch_size)
        return cache

    @classmethod
    def for_forward(
        cls, cache, mems, num_layers: int, mem_len: int | None, batch_size: int, width: int, model: str, dtype, device
    ):
        """The memory a forward attends to and updates: `cache`, `mems` wrapped or a new one, checked (`check_mems`)."""
        if cache is not None and mems is not None:
            raise ValueError(f"{model}: pass the memory either as `cache` or as `mems`, not both.")
        if mems is not None:
            check_mems(mems, num_layers, batch_size, width, model, dtype, device)
            cache = cls.from_mems(mems, mem_len)
        elif cache is None:
            cache = cls(num_layers, mem_len)
        elif cache.memory(0) is not None:
            check_mems(cache.mems, num_layers, batch_size, width, model, dtype, device)
        if cache.memory(0) is not None and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            cache._copy_inference_tensors()  # (dynamo cannot trace is_inference())
        return cache

    def _copy_inference_tensors(self):
        """Memory made under `torch.inference_mode` cannot be saved for backward: copied once (stored keys and values
        are read only without gradients)."""
        for layer in self.layers:
            if layer.hidden is not None and layer.hidden.is_inference():
                layer.hidden = layer.hidden.clone()

    @property
    def mems(self) -> tuple[torch.Tensor, ...] | None:
        """The legacy view: one time-major [mem_len, batch, d_model] tensor per layer (None while empty)."""
        if self.layers[0].hidden is None:
            return None
        return tuple(layer.hidden.transpose(0, 1) for layer in self.layers)

    @property
    def batch_size(self) -> int:
        hidden = self.layers[0].hidden
        return -1 if hidden is None else hidden.shape[0]

    def memory(self, layer_idx: int) -> torch.Tensor | None:
        return self.layers[layer_idx].hidden

    def known_key_values(self, layer_idx: int) -> MemoryLayer | None:
        """The layer's memory when its keys and values are stored, else None."""
        layer = self.layers[layer_idx]
        return None if layer.keys is None else layer

    def store(self, layer_idx: int, new_hidden: torch.Tensor, keys=None, values=None):
        """Append a segment's layer inputs (detached), keep the last `mem_len`; `keys` / `values`: see
        `MemoryLayer.append`."""
        layer = self.layers[layer_idx]
        keys, values = (None if tensor is None else tensor.detach() for tensor in (keys, values))
        keep = self.mem_len is not None and not self.record_past
        if keep and keys is None and not torch.compiler.is_compiling() and new_hidden.shape[1] >= self.mem_len:
            layer.sequences = {}  # (the segment fills the memory: kept as a view of it, not copied)
        layer.append(new_hidden.detach(), keys, values)
        if keep:
            layer.keep_last(self.mem_len)
        if layer_idx == 0:
            self.seen_tokens += new_hidden.shape[1]
            self.last_stored = new_hidden.shape[1]

    def position_keys(self, layer_idx: int, span: int, lowest_distance: int, project):
        """Projected position keys for the distances lowest+span-1 ... lowest, sliced from the layer's table;
        `project(n)` gives distances lowest+n-1 ... lowest. A miss projects at least twice as many: amortised O(1)."""
        layer = self.layers[layer_idx]
        stored = layer.position_keys
        if stored is None or layer.lowest_distance != lowest_distance or stored.shape[-2] < span:
            longer = 0 if stored is None or layer.lowest_distance != lowest_distance else 2 * stored.shape[-2]
            stored = project(max(span, longer))
            layer.position_keys, layer.lowest_distance = stored, lowest_distance
        return stored[..., stored.shape[-2] - span :, :]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1 if self.mem_len is None else self.mem_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        hidden = self.layers[layer_idx].hidden
        return (0 if hidden is None else hidden.shape[1]) + query_length, 0

    def reorder_cache(self, beam_idx: torch.LongTensor):
        for layer in self.layers:
            layer.map_batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int):
        for layer in self.layers:
            layer.map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor):
        for layer in self.layers:
            layer.map_batch(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the newest `-tokens_to_remove` positions (transformers' convention), keep the last `mem_len`: an
        exact rollback while `is_croppable`."""
        if tokens_to_remove > 0:
            raise ValueError(
                f"MemoryCache.crop: got {tokens_to_remove}; expected minus the number of positions to remove "
                "(transformers' convention, e.g. `crop(-2)`)."
            )
        held = 0 if self.layers[0].hidden is None else self.layers[0].hidden.shape[1]
        if -tokens_to_remove > held:
            raise ValueError(f"MemoryCache.crop: cannot remove {-tokens_to_remove} positions; the memory holds {held}.")
        for layer in self.layers:
            layer.drop_newest(-tokens_to_remove)
            if self.mem_len is not None:
                layer.keep_last(self.mem_len)
        self.seen_tokens = max(self.seen_tokens + tokens_to_remove, 0)  # a given memory may predate the inputs

    def activate_past_recording(self, recurrent_states_to_keep: int | None = None):
        """See the class; `recurrent_states_to_keep` (steps a recurrent layer rolls back) does not matter here."""
        self.record_past = True

    def reset(self):
        self.layers = [MemoryLayer() for _ in self.layers]
        self.seen_tokens = self.last_stored = 0

    @property
    def is_croppable(self) -> bool:
        """Whether `crop` is an exact rollback: past positions are recorded, or nothing was evicted yet."""
        hidden = self.layers[0].hidden
        return self.record_past or hidden is None or hidden.shape[1] == self.seen_tokens

    is_compileable = False

    @property
    def is_initialized(self) -> bool:
        return self.layers[0].hidden is not None

    @property
    def is_sliding(self) -> list[bool]:
        return [self.mem_len is not None] * len(self.layers)

    is_linear = is_dummy = property(lambda self: [False] * len(self.layers))

    def __repr__(self):
        return f"{type(self).__name__}(layers={len(self.layers)}, mem_len={self.mem_len}, seen={self.seen_tokens})"


class MemoryCache(SegmentMemory, DynamicCache):
    """The default cache, a `DynamicCache` to transformers."""


class RingLayer:
    """A `StaticMemoryCache` layer: hidden [B, R, d], keys / values [B, H, R, D] (position p in slot p % R), the
    projected distances; a step writes in `slots`."""

    def __init__(self, hidden, keys, values, position_keys, slots):
        self.hidden, self.keys, self.values, self.position_keys, self.slots = hidden, keys, values, position_keys, slots

    def key_values_with(self, new_keys: torch.Tensor, new_values: torch.Tensor):
        self.keys.index_copy_(2, self.slots, new_keys)
        self.values.index_copy_(2, self.slots, new_values)
        return self.keys, self.values

    def map_batch(self, fn):
        """In place: compiled steps and CUDA graphs read the buffers at their addresses."""
        for buffer in (self.hidden, self.keys, self.values):
            buffer.copy_(fn(buffer))


class StaticMemoryCache(SegmentMemory, StaticCache):
    """The memory as a `StaticCache`: steps of fixed shapes, for generate() to compile. After the prompt, `start_ring`
    moves it into `slot_count` slots (default mem_len + 1); a step writes `step_length` positions from `position` on
    and attends to every slot by its distance. The counters are 0-d tensors updated in place: data, not shapes."""

    def __init__(self, num_layers: int, mem_len: int | None, slot_count: int | None = None, step_length: int = 1):
        if slot_count is None and (not mem_len or mem_len < 1):
            raise ValueError(f"StaticMemoryCache: mem_len is {mem_len}; the static cache needs a memory (mem_len > 0).")
        super().__init__(num_layers, mem_len)
        self.slot_count = mem_len + 1 if slot_count is None else slot_count
        self.step_length = step_length
        self.ring = False

    def start_ring(self, position_keys, attendable: torch.Tensor | None = None, rewritten: int = 0):
        """Move the memory and its keys / values into the slots; `position_keys`: one table per layer; `attendable`
        [B, m]: False for padding, or None; `rewritten`: the newest remembered positions the first step writes again."""
        held, count = self.layers[0].hidden.shape[1], self.slot_count
        device = self.layers[0].hidden.device
        first = self.seen_tokens - rewritten  # what the next step writes first (< 0 after `mems` or zero slots)
        self.oldest = torch.tensor(min(self.seen_tokens - held, first), device=device)
        self.position = torch.tensor(first, device=device)
        self.step_offsets = torch.arange(self.step_length, device=device)
        self.slots = (self.position + self.step_offsets).remainder(count)
        slots = torch.arange(self.seen_tokens - held, self.seen_tokens, device=device).remainder(count)

        def ring(tensor, axis):
            shape = list(tensor.shape)
            shape[axis] = count
            buffer = tensor.new_zeros(shape).index_copy_(axis, slots, tensor)
            torch._dynamo.mark_static_address(buffer)
            return buffer

        self.attendable = None if attendable is None else ring(attendable, 1)
        self.layers = [
            RingLayer(ring(layer.hidden, 1), ring(layer.keys, 2), ring(layer.values, 2), table, self.slots)
            for layer, table in zip(self.layers, position_keys)
        ]
        for counter in (self.position, self.oldest, self.slots):
            torch._dynamo.mark_static_address(counter)
        self.ring = True

    @property
    def newest(self) -> torch.Tensor:
        """The last position the current step writes (0-d)."""
        return self.position + self.step_length - 1

    def slot_distances(self) -> torch.Tensor:
        """[R] (newest - slot) mod R: each slot's distance from the step's newest position."""
        return (self.newest - torch.arange(self.slot_count, device=self.position.device)).remainder(self.slot_count)

    def mark_attendable(self, attendable: torch.Tensor):
        self.attendable.index_copy_(1, self.slots, attendable)

    def store(self, layer_idx: int, new_hidden: torch.Tensor, keys=None, values=None):
        if not self.ring:
            return super().store(layer_idx, new_hidden, keys, values)
        self.layers[layer_idx].hidden.index_copy_(1, self.slots, new_hidden.detach())  # (keys: `key_values_with`)

    def advance(self):
        self.position.add_(1)
        self.slots.copy_((self.position + self.step_offsets).remainder(self.slot_count))

    @property
    def mems(self):
        """The legacy view, oldest first (a host sync: for inspection only)."""
        if not self.ring:
            return super().mems
        end = int(self.newest)  # (after a step: one past the positions written)
        held = end - int(self.oldest) if self.mem_len is None else min(end - int(self.oldest), self.mem_len)
        order = torch.arange(end - held, end).remainder(self.slot_count)
        return tuple(layer.hidden[:, order.to(layer.hidden.device)].transpose(0, 1) for layer in self.layers)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.newest) if self.ring else self.seen_tokens  # (a sync: generate() reads it once)

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.slot_count

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        if self.ring and self.attendable is not None:
            self.attendable.copy_(self.attendable.index_select(0, beam_idx.to(self.attendable.device)))

    def crop(self, tokens_to_remove: int) -> None:
        if self.ring:
            raise ValueError("StaticMemoryCache.crop: decoding has started; the default cache (MemoryCache) crops.")
        super().crop(tokens_to_remove)

    def reset(self):
        super().reset()
        self.ring = False

    @property
    def is_croppable(self) -> bool:
        return not self.ring and super().is_croppable

    is_compileable = True
