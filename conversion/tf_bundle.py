"""Reading TF1 checkpoints (Saver V2, the "TensorBundle" format) with the standard library, torch and a CRC32C.

A checkpoint `<prefix>` is an index `<prefix>.index` and data shards `<prefix>.data-0000i-of-0000N`. The index is a
LevelDB table (an SSTable) mapping each variable name to a `BundleEntryProto`: dtype, shape, shard, byte offset and
size, and a masked CRC32C of the bytes. The data shards hold each tensor's raw little-endian row-major bytes.
Format sources: tensorflow/core/util/tensor_bundle/tensor_bundle.{h,cc} and tensor_bundle.proto,
tensorflow/core/lib/io/format.cc (table layout), tensorflow/core/lib/hash/crc32c.h (the mask).

Why not TensorFlow itself: reading needs about 300 lines, TensorFlow is a 1.6 GB install. Checksums use
`google-crc32c` (a small wheel with a C implementation): every block of the index and every tensor read is verified.
"""

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import torch


# DataType enum values (tensorflow/core/framework/types.proto) -> torch dtypes.
TORCH_DTYPES = {
    1: torch.float32,
    2: torch.float64,
    3: torch.int32,
    4: torch.uint8,
    5: torch.int16,
    6: torch.int8,
    9: torch.int64,
    10: torch.bool,
    14: torch.bfloat16,
    19: torch.float16,
}
DTYPE_NAMES = {7: "string", 8: "complex64", 18: "complex128", 17: "uint16", 22: "uint32", 23: "uint64"}
TABLE_MAGIC = 0xDB4775248B80FB57  # LevelDB table footer magic
FOOTER_SIZE = 48  # two block handles padded to 40 bytes, then the 8-byte magic
BLOCK_TRAILER_SIZE = 5  # compression type byte + masked CRC32C


class CheckpointError(ValueError):
    """The files are not a readable TF checkpoint (missing, truncated, corrupt, or an unsupported variant)."""


def _unmask(masked: int) -> int:
    """Inverse of TF's crc32c Mask: rot(crc, 15) + 0xa282ead8 (stored CRCs are masked so data can hold CRCs)."""
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise CheckpointError("a varint runs past the end of its record")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _proto_fields(data: bytes) -> dict[int, list]:
    """Protocol-buffer wire format -> {field number: [values]} (ints for varint / fixed, bytes for the rest)."""
    fields, pos = {}, 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = _varint(data, pos)
        elif wire_type == 1:
            value, pos = struct.unpack_from("<Q", data, pos)[0], pos + 8
        elif wire_type == 2:
            length, pos = _varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
        elif wire_type == 5:
            value, pos = struct.unpack_from("<I", data, pos)[0], pos + 4
        else:
            raise CheckpointError(f"unsupported protobuf wire type {wire_type}")
        fields.setdefault(number, []).append(value)
    return fields


@dataclass(frozen=True)
class TensorEntry:
    """Where one variable lives (a decoded BundleEntryProto)."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None
    sliced: bool

    @property
    def dtype_name(self) -> str:
        torch_dtype = TORCH_DTYPES.get(self.dtype)
        return str(torch_dtype).removeprefix("torch.") if torch_dtype else DTYPE_NAMES.get(self.dtype, f"#{self.dtype}")


def _entry(name: str, value: bytes) -> TensorEntry:
    fields = _proto_fields(value)
    dims = []
    for dim in _proto_fields(fields.get(2, [b""])[0]).get(2, []):
        dims.append(_proto_fields(dim).get(1, [0])[0])
    return TensorEntry(
        name=name,
        dtype=fields.get(1, [0])[0],
        shape=tuple(dims),
        shard=fields.get(3, [0])[0],
        offset=fields.get(4, [0])[0],
        size=fields.get(5, [0])[0],
        crc32c=fields[6][0] if 6 in fields else None,
        sliced=7 in fields,
    )


class TFCheckpoint:
    """The variables of one TF1 checkpoint: `entries` (name -> TensorEntry) and `read(name)` -> torch tensor."""

    def __init__(self, prefix: str | os.PathLike):
        self.prefix = str(prefix)
        index_path = Path(self.prefix + ".index")
        if not index_path.is_file():
            raise CheckpointError(f"TF checkpoint: no index file {index_path}")
        self._index = index_path.read_bytes()
        header, self.entries = self._read_index(index_path.name)
        num_shards = _proto_fields(header).get(1, [1])[0] if header is not None else 1
        if _proto_fields(header or b"").get(2, [0])[0] != 0:
            raise CheckpointError(f"TF checkpoint {self.prefix}: big-endian checkpoints are not supported")
        self.shard_paths = [Path(f"{self.prefix}.data-{i:05d}-of-{num_shards:05d}") for i in range(num_shards)]
        self._check_shards()

    # ----- the index: a LevelDB table --------------------------------------------------------------------------

    def _block(self, offset: int, size: int, what: str) -> bytes:
        """One table block, its trailer checked: compression type 0 (TF writes bundles uncompressed) and CRC."""
        end = offset + size + BLOCK_TRAILER_SIZE
        if end > len(self._index) - FOOTER_SIZE:
            raise CheckpointError(f"TF checkpoint {self.prefix}.index is truncated or corrupt ({what} out of range)")
        block = self._index[offset : offset + size]
        kind, masked = self._index[offset + size], struct.unpack_from("<I", self._index, offset + size + 1)[0]
        if kind != 0:
            raise CheckpointError(f"TF checkpoint {self.prefix}.index: compressed table blocks are not supported")
        if google_crc32c.value(self._index[offset : offset + size + 1]) != _unmask(masked):
            raise CheckpointError(f"TF checkpoint {self.prefix}.index is corrupt (checksum mismatch in {what})")
        return block

    @staticmethod
    def _block_entries(block: bytes):
        """(key, value) pairs of a block: prefix-compressed keys, then restart offsets and their count."""
        num_restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
        end, pos, key = len(block) - 4 - 4 * num_restarts, 0, b""
        while pos < end:
            shared, pos = _varint(block, pos)
            unshared, pos = _varint(block, pos)
            value_length, pos = _varint(block, pos)
            key = key[:shared] + block[pos : pos + unshared]
            pos += unshared
            yield key, block[pos : pos + value_length]
            pos += value_length

    def _read_index(self, file_name: str):
        size = len(self._index)
        if size < FOOTER_SIZE or struct.unpack_from("<Q", self._index, size - 8)[0] != TABLE_MAGIC:
            raise CheckpointError(
                f"TF checkpoint: {file_name} is truncated or not a TF checkpoint index (no table footer)"
            )
        footer = self._index[-FOOTER_SIZE:]
        _, pos = _varint(footer, 0)  # the metaindex handle: TF writes no meta blocks
        _, pos = _varint(footer, pos)
        index_offset, pos = _varint(footer, pos)
        index_size, _ = _varint(footer, pos)
        header, entries = None, {}
        for _, handle in self._block_entries(self._block(index_offset, index_size, "the index block")):
            offset, pos = _varint(handle, 0)
            size, _ = _varint(handle, pos)
            for key, value in self._block_entries(self._block(offset, size, "a data block")):
                if key == b"":
                    header = value  # BundleHeaderProto
                elif not key.startswith(b"\x00"):  # keys starting with NUL describe slices of partitioned variables
                    name = key.decode("utf-8")
                    entries[name] = _entry(name, value)
        return header, entries

    # ----- the data shards --------------------------------------------------------------------------------------

    def _check_shards(self):
        """Every shard exists and holds every byte the index points to (catches truncated copies up front)."""
        for shard, path in enumerate(self.shard_paths):
            if not path.is_file():
                raise CheckpointError(f"TF checkpoint {self.prefix}: data file {path.name} is missing")
            size = path.stat().st_size
            for entry in self.entries.values():
                if entry.shard == shard and not entry.sliced and entry.offset + entry.size > size:
                    raise CheckpointError(
                        f"TF checkpoint {self.prefix}: {path.name} is truncated ({size} bytes; variable "
                        f"{entry.name!r} needs bytes {entry.offset}..{entry.offset + entry.size})"
                    )

    def read(self, name: str) -> torch.Tensor:
        """The variable's value as a torch tensor (its checksum verified)."""
        entry = self.entries[name]
        if entry.sliced:
            raise CheckpointError(f"TF checkpoint: {name!r} is a partitioned variable; these are not supported")
        dtype = TORCH_DTYPES.get(entry.dtype)
        if dtype is None:
            raise CheckpointError(f"TF checkpoint: {name!r} has dtype {entry.dtype_name}; expected a numeric tensor")
        numel = 1
        for dim in entry.shape:
            numel *= dim
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != entry.size:
            raise CheckpointError(
                f"TF checkpoint: {name!r} is recorded as {entry.size} bytes; shape {list(entry.shape)} of "
                f"{entry.dtype_name} needs {numel * itemsize}"
            )
        with open(self.shard_paths[entry.shard], "rb") as f:
            f.seek(entry.offset)
            data = f.read(entry.size)
        if entry.crc32c is not None and google_crc32c.value(data) != _unmask(entry.crc32c):
            raise CheckpointError(f"TF checkpoint: {name!r} is corrupt (checksum mismatch)")
        if not data:
            return torch.empty(entry.shape, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=dtype).reshape(entry.shape)  # a writable copy


def checkpoint_prefix(source: str | os.PathLike) -> str:
    """The checkpoint prefix named by `source`: a prefix (`.../model.ckpt-1000`), its `.index` file, or a folder with
    a `checkpoint` state file (whose paths may be absolute, from the machine that trained: if the named files are
    not there, the same file name inside the folder is used)."""
    path = Path(source)
    if path.is_dir():
        state = path / "checkpoint"
        if not state.is_file():
            indexes = sorted(p.name for p in path.glob("*.index"))
            raise CheckpointError(
                f"TF checkpoint: folder {path} has no `checkpoint` state file; pass a checkpoint prefix instead"
                + (f" (found {', '.join(indexes)})" if indexes else "")
            )
        named = None
        for line in state.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model_checkpoint_path":
                named = value.strip().strip('"')
        if not named:
            raise CheckpointError(f"TF checkpoint: {state} names no model_checkpoint_path")
        for candidate in (path / named, path / Path(named).name):  # `path / absolute` is the absolute path
            if Path(f"{candidate}.index").is_file():
                return str(candidate)
        raise CheckpointError(
            f"TF checkpoint: {state} names {named!r}, which is neither there nor in {path} "
            f"(no {Path(named).name}.index)"
        )
    text = str(path)
    if text.endswith(".index"):
        text = text[: -len(".index")]
    if not Path(text + ".index").is_file():
        raise CheckpointError(
            f"TF checkpoint: {source} is neither a folder with a `checkpoint` file nor a checkpoint prefix "
            f"(no {text}.index)"
        )
    return text
