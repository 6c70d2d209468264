"""A GGUF file's metadata as Python values and its tensors as views of the file mapping.

`gguf.GGUFReader` keeps a numpy view per metadata item: a 49k-token vocabulary with its
merges is ~250k views (0.9 s of start-up on a quiet 2-core machine, 4 s on a loaded
one), paid in the API process and again in the engine. Serving reads each value once, so
this parser decodes them straight from the mapping (a string array in one loop over
bytes) and indexes the tensors as gguf's reader does (same dtypes and shapes, zero-copy).
Little-endian files only, as llama.cpp writes them.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# GGUF value types -> struct format (scalars) and numpy dtype (arrays)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_ARRAY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
# tensor types kept as their numbers (as gguf's reader); every other type is bytes
_ELEMENT = {
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGML order: the fastest dimension first
    n_elements: int
    data: np.ndarray  # a read-only view of the mapping


class GGUFFile:
    """`fields`: every metadata key -> its value (str, int, float, bool or list)."""

    def __init__(self, path: str | Path):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._buf = memoryview(self._map)
        if self._buf[:4] != MAGIC:
            raise ValueError(f"{path}: not a GGUF file")
        (version,) = struct.unpack_from("<I", self._buf, 4)
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"{path}: GGUF version {version} (big-endian or too old) is not supported")
        n_tensors, n_fields = struct.unpack_from("<QQ", self._buf, 8)
        offset = 24
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key, offset = self._string(offset)
            (kind,) = struct.unpack_from("<I", self._buf, offset)
            self.fields[key], offset = self._value(kind, offset + 4)
        infos = []
        for _ in range(n_tensors):
            name, offset = self._string(offset)
            (n_dims,) = struct.unpack_from("<I", self._buf, offset)
            dims = struct.unpack_from(f"<{n_dims}Q", self._buf, offset + 4)
            kind, start = struct.unpack_from("<IQ", self._buf, offset + 4 + 8 * n_dims)
            offset += 4 + 8 * n_dims + 12
            infos.append((name, dims, GGMLQuantizationType(kind), start))
        alignment = int(self.fields.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-offset // alignment) * alignment
        self.tensors = [self._tensor(name, dims, kind, data_start + start) for name, dims, kind, start in infos]

    def _string(self, offset: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._buf, offset)
        end = offset + 8 + n
        return str(self._buf[offset + 8 : end], "utf-8"), end

    def _value(self, kind: int, offset: int) -> tuple[Any, int]:
        if kind == STRING:
            return self._string(offset)
        if kind == ARRAY:
            item_kind, count = struct.unpack_from("<IQ", self._buf, offset)
            offset += 12
            if item_kind in _ARRAY:
                dtype = np.dtype(_ARRAY[item_kind])
                values = np.frombuffer(self._buf, dtype, count, offset).tolist()
                return values, offset + dtype.itemsize * count
            items = []
            for _ in range(count):
                item, offset = self._value(item_kind, offset)
                items.append(item)
            return items, offset
        fmt = _SCALAR[kind]
        return struct.unpack_from(fmt, self._buf, offset)[0], offset + struct.calcsize(fmt)

    def _tensor(self, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType, offset: int) -> GGUFTensor:
        n_elements = int(np.prod(dims, dtype=np.int64))
        shape = tuple(reversed(dims))
        if kind in _ELEMENT:
            dtype, count = np.dtype(_ELEMENT[kind]), n_elements
        else:
            block, type_size = GGML_QUANT_SIZES[kind]
            dtype, count = np.dtype(np.uint8), n_elements * type_size // block
            shape = quant_shape_to_byte_shape(shape, kind)
        data = np.frombuffer(self._buf, dtype, count, offset).reshape(shape)
        return GGUFTensor(name, kind, dims, n_elements, data)
