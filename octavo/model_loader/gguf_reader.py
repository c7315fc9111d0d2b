"""A GGUF file's header, metadata and tensor directory, read straight from a memory map.

Why not ``gguf.GGUFReader``: it builds numpy views for every part of every metadata value, so
the default model's 49k-token vocabulary and 49k merges cost ~2.5 s of a ~5 s engine start and
~165 MB of heap, while the engine reads a dozen scalars and the chat template (its tokenizer is
converted once by transformers and cached). Here scalars and strings are decoded, arrays longer
than ``keep_items`` are stepped over and kept as :class:`SkippedArray` (type and length), and
tensor data stays in the map until :attr:`GGUFTensor.data` is asked for.

Layout (little-endian, versions 2 and 3): ``GGUF``, u32 version, u64 tensor count, u64 key
count; each key: string name, u32 value type, value (an array is u32 item type, u64 count,
items; a string is u64 length, UTF-8 bytes); each tensor: string name, u32 dimension count,
u64 dimensions (innermost first), u32 ggml type, u64 offset from the data section, which
starts at the next multiple of ``general.alignment`` (32 when absent).

A malformed file (truncated, counts or lengths larger than the file, unknown value or tensor
types, misaligned or overlapping-the-end tensors, duplicate names, invalid UTF-8) raises
:class:`GGUFFormatError`, a ``ValueError`` that names the file and the byte offset; nothing is
allocated from a count before the file is known to hold it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses more

# Metadata value types.
_STRING, _ARRAY, _BOOL = 8, 9, 7
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 10: "Q", 11: "q", 12: "d"}
_FIXED_SIZE = {t: struct.calcsize("<" + c) for t, c in _SCALARS.items()} | {_BOOL: 1}

# ggml tensor types: id -> (name, elements per block, bytes per block). The ids and sizes are
# the file format's (ggml.h); tests check them against the gguf package's table.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
# Element types whose data is exposed as numbers; every other type as rows of block bytes.
_ELEMENT_DTYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32,
                   27: np.int64, 28: np.float64}


class GGUFFormatError(ValueError):
    """The file is not a well-formed GGUF file."""


@dataclass(frozen=True)
class SkippedArray:
    """A metadata array longer than the reader keeps: its item type and length only."""

    item_type: int
    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's directory entry; ``data`` is a read-only view into the file's map."""

    name: str
    shape: tuple[int, ...]  # GGUF order: innermost (contiguous) dimension first
    tensor_type: int
    data_offset: int  # absolute, in bytes
    n_elements: int
    n_bytes: int
    _buffer: Any

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.tensor_type][0]

    @property
    def data(self) -> np.ndarray:
        """Numbers shaped like the tensor (outermost first) for float / integer types, else
        uint8 rows of block bytes: [outer dims..., bytes per innermost row]."""
        dims = tuple(reversed(self.shape))
        dtype = _ELEMENT_DTYPES.get(self.tensor_type)
        if dtype is None:
            if self.tensor_type == 30:  # BF16: no numpy dtype, the raw 16-bit words
                dtype = np.uint16
            else:
                _, per_block, block_bytes = GGML_TYPES[self.tensor_type]
                dims = dims[:-1] + (dims[-1] // per_block * block_bytes,)
                dtype = np.uint8
        count = self.n_bytes // np.dtype(dtype).itemsize
        return np.frombuffer(self._buffer, dtype, count, self.data_offset).reshape(dims)


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: Any, path: str):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def fail(self, what: str) -> GGUFFormatError:
        return GGUFFormatError(f"malformed GGUF file {self.path!r} at byte {self.pos}: {what}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(f"{what} needs {n} bytes, {self.size - self.pos} left")

    def scalar(self, code: str, what: str) -> Any:
        n = struct.calcsize("<" + code)
        self.need(n, what)
        (value,) = struct.unpack_from("<" + code, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.scalar("Q", f"{what} length")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"{what} is not UTF-8 ({e.reason} at byte {e.start})") from None

    def skip_strings(self, count: int, what: str) -> None:
        unpack, buf = struct.Struct("<Q").unpack_from, self.buf
        pos, size = self.pos, self.size
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                raise self.fail(f"{what}[{i}] length runs past the end")
            pos += 8 + unpack(buf, pos)[0]
            if pos > size:
                self.pos = pos
                raise self.fail(f"{what}[{i}] runs past the end")
        self.pos = pos


class GGUFReader:
    """The parsed header of one GGUF file: ``fields`` (key -> value) and ``tensors``."""

    def __init__(self, path: str, keep_items: int = 4096):
        self.path = path
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size == 0:
                raise GGUFFormatError(f"malformed GGUF file {path!r}: empty")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.keep_items = keep_items
        self.fields: dict[str, Any] = {}
        self.tensors: list[GGUFTensor] = []
        self._parse(_Cursor(self._map, path))

    # ------------------------------------------------------------------ parsing

    def _parse(self, c: _Cursor) -> None:
        c.need(4, "magic")
        if bytes(c.buf[:4]) != MAGIC:
            raise c.fail(f"magic {bytes(c.buf[:4])!r}, want {MAGIC!r}")
        c.pos = 4
        self.version = c.scalar("I", "version")
        if self.version not in VERSIONS:
            if self.version & 0xFFFF == 0:
                raise c.fail("big-endian GGUF files are not supported")
            raise c.fail(f"version {self.version} (supported: {VERSIONS})")
        n_tensors = c.scalar("Q", "tensor count")
        n_keys = c.scalar("Q", "metadata key count")
        # Every key takes at least 12 bytes, every tensor entry at least 24: a count the rest of
        # the file cannot hold is refused before any loop runs over it.
        if n_keys * 12 > c.size - c.pos:
            raise c.fail(f"metadata key count {n_keys} exceeds what the file can hold")
        if n_tensors * 24 > c.size - c.pos:
            raise c.fail(f"tensor count {n_tensors} exceeds what the file can hold")
        for _ in range(n_keys):
            key = c.string("metadata key")
            if key in self.fields:
                raise c.fail(f"duplicate metadata key {key!r}")
            value_type = c.scalar("I", f"type of {key!r}")
            self.fields[key] = self._value(c, value_type, key)
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0
                or alignment & (alignment - 1)):
            raise c.fail(f"general.alignment {alignment!r} is not a power of two")
        entries = [self._tensor_entry(c) for _ in range(n_tensors)]
        self.data_offset = -(-c.pos // alignment) * alignment
        names = set()
        for name, dims, type_id, offset in entries:
            if name in names:
                raise c.fail(f"duplicate tensor name {name!r}")
            names.add(name)
            self.tensors.append(self._tensor(c, name, dims, type_id, offset, alignment))

    def _value(self, c: _Cursor, value_type: int, key: str) -> Any:
        if value_type == _STRING:
            return c.string(f"value of {key!r}")
        if value_type == _BOOL:
            return c.scalar("B", f"value of {key!r}") != 0
        if value_type in _SCALARS:
            return c.scalar(_SCALARS[value_type], f"value of {key!r}")
        if value_type != _ARRAY:
            raise c.fail(f"unknown value type {value_type} of {key!r}")
        item_type = c.scalar("I", f"item type of {key!r}")
        count = c.scalar("Q", f"length of {key!r}")
        item_size = 8 if item_type == _STRING else _FIXED_SIZE.get(item_type)
        if item_size is None:
            raise c.fail(f"array {key!r} of unsupported item type {item_type}")
        if count * item_size > c.size - c.pos:
            raise c.fail(f"array {key!r} of {count} items exceeds what the file can hold")
        if count > self.keep_items:
            if item_type == _STRING:
                c.skip_strings(count, repr(key))
            else:
                c.pos += count * item_size
            return SkippedArray(item_type, count)
        if item_type == _STRING:
            return [c.string(f"{key!r}[{i}]") for i in range(count)]
        code = "B" if item_type == _BOOL else _SCALARS[item_type]
        items = list(struct.unpack_from(f"<{count}{code}", c.buf, c.pos))
        c.pos += count * item_size
        return [v != 0 for v in items] if item_type == _BOOL else items

    def _tensor_entry(self, c: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
        name = c.string("tensor name")
        n_dims = c.scalar("I", f"dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"tensor {name!r} has {n_dims} dimensions (1-{MAX_DIMS})")
        dims = tuple(c.scalar("Q", f"dimensions of {name!r}") for _ in range(n_dims))
        type_id = c.scalar("I", f"type of {name!r}")
        offset = c.scalar("Q", f"offset of {name!r}")
        return name, dims, type_id, offset

    def _tensor(self, c: _Cursor, name: str, dims: tuple[int, ...], type_id: int,
                offset: int, alignment: int) -> GGUFTensor:
        if type_id not in GGML_TYPES:
            raise c.fail(f"tensor {name!r} has unknown ggml type {type_id}")
        type_name, per_block, block_bytes = GGML_TYPES[type_id]
        if dims[0] % per_block:
            raise c.fail(f"tensor {name!r} ({type_name}) has {dims[0]} elements per row, "
                         f"not a multiple of its block of {per_block}")
        if offset % alignment:
            raise c.fail(f"tensor {name!r} offset {offset} is not a multiple of {alignment}")
        n_elements = 1
        for d in dims:
            n_elements *= d
        n_bytes = n_elements // per_block * block_bytes
        start = self.data_offset + offset
        if start + n_bytes > c.size:
            raise c.fail(f"tensor {name!r} ({n_bytes} bytes at {start}) runs past the end of "
                         f"the file ({c.size} bytes)")
        return GGUFTensor(name, dims, type_id, start, n_elements, n_bytes, self._map)

    # ------------------------------------------------------------------ pages

    def release_pages(self, tensor: GGUFTensor | None = None) -> None:
        """Drop the pages read so far (of ``tensor`` only, when given: the whole pages inside
        its bytes) from the resident set; they fault back in from the file when read again."""
        if not (hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED")):
            return
        start, length = 0, len(self._map)
        if tensor is not None:
            page = mmap.PAGESIZE
            start = -(-tensor.data_offset // page) * page
            length = (tensor.data_offset + tensor.n_bytes) // page * page - start
            if length <= 0:
                return
        try:
            self._map.madvise(mmap.MADV_DONTNEED, start, length)
        except (OSError, ValueError):  # advice only
            pass
