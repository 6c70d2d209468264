"""An HF directory's safetensors weights, read where the model keeps them.

`weights[name]` is a view of the shard's private file mapping (no copy: the pages come in
when first used, as safetensors' own `get_tensor` gives them). A fused weight (Q/K/V,
gate/up) is different: its parts are read with `preadv` straight into the rows of one
preallocated tensor, so no unfused copy is made and concatenated, and the parts' file
pages are never mapped into the process (they would stay in its RSS beside the fused
copy). The shard headers are parsed here (a JSON header after its 8-byte length), which
also skips safetensors' per-tensor storage slicing (0.6 s for a 1 GB model).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import struct
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from llmservice.server.model.loaded import UnsupportedModelError
from llmservice.server.model.parallel_weights import DenseWeight, LinearWeight, Part, TensorSource

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


class CorruptShardError(UnsupportedModelError):
    """A safetensors shard whose header or data does not match its size (a copy or
    download cut short)."""


def corrupt(file: Path, detail: str) -> CorruptShardError:
    return CorruptShardError(f"{file}: truncated or corrupt safetensors file ({detail}); copy or download it again")


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in its shard."""

    shard: Shard
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # from the start of the file
    nbytes: int


class Shard:
    """One open .safetensors file: its header, descriptor and (on first use) mapping."""

    def __init__(self, file: Path):
        self.file = file
        self.fd = os.open(file, os.O_RDONLY)
        try:
            self.entries = self._parse(os.fstat(self.fd).st_size)
        except BaseException:
            os.close(self.fd)
            raise
        self._map: mmap.mmap | None = None

    def _parse(self, size: int) -> dict[str, Entry]:
        head = os.pread(self.fd, 8, 0)
        if len(head) < 8:
            raise corrupt(self.file, f"{size} bytes, shorter than the header length")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise corrupt(self.file, f"header of {n} bytes in a file of {size}")
        try:
            header = json.loads(os.pread(self.fd, n, 8))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise corrupt(self.file, f"header is not JSON: {exc}") from None
        base = 8 + n
        entries = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in DTYPES:
                raise UnsupportedModelError(f"{self.file}: tensor {name} has dtype {info['dtype']}")
            start, end = info["data_offsets"]
            entries[name] = Entry(self, DTYPES[info["dtype"]], tuple(info["shape"]), base + start, end - start)
        if base + max((e.offset - base + e.nbytes for e in entries.values()), default=0) != size:
            raise corrupt(self.file, "incomplete metadata, file not fully covered")  # safetensors' words
        return entries

    def view(self, entry: Entry) -> torch.Tensor:
        """The tensor as a view of the file's private (copy-on-write) mapping."""
        if entry.nbytes == 0:
            return torch.empty(entry.shape, dtype=entry.dtype)
        if self._map is None:
            self._map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_COPY)
        # the kernel reads the pages in the background now, not page by page at the first step
        os.posix_fadvise(self.fd, entry.offset, entry.nbytes, os.POSIX_FADV_WILLNEED)
        flat = torch.frombuffer(self._map, dtype=entry.dtype, count=entry.nbytes // entry.dtype.itemsize,
                                offset=entry.offset)  # fmt: skip
        return flat.view(entry.shape)

    def read_into(self, dest: torch.Tensor, offset: int) -> None:
        """dest (contiguous, on CPU) <- dest.nbytes bytes of the file from `offset`."""
        buf = (ctypes.c_char * dest.nbytes).from_address(dest.data_ptr())
        view, done = memoryview(buf).cast("B"), 0
        while done < len(view):
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got <= 0:
                raise corrupt(self.file, f"read stopped at byte {offset + done}")
            done += got

    def close(self) -> None:
        os.close(self.fd)  # the mapping, if any, stays while a view uses it


class SafetensorsWeights(MutableMapping):
    """HF-named weights of a directory's shards; `weights[name]` a view of the file in
    `dtype` on `device` (a copy only where either differs from the file's)."""

    def __init__(self, files: Sequence[Path], device: torch.device | str, dtype: torch.dtype):
        self.device, self.dtype = torch.device(device), dtype
        self.shards = [Shard(f) for f in files]
        self.entries = {name: e for s in self.shards for name, e in s.entries.items()}
        self.replaced: dict[str, torch.Tensor] = {}  # set by a caller: kept as given

    def copy(self) -> SafetensorsWeights:
        """Another index over the same open files (taking from it leaves this one whole)."""
        other = object.__new__(SafetensorsWeights)
        other.device, other.dtype, other.shards = self.device, self.dtype, self.shards
        other.entries, other.replaced = dict(self.entries), dict(self.replaced)
        return other

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.replaced:
            return self.replaced[name]
        entry = self.entries[name]
        return entry.shard.view(entry).to(device=self.device, dtype=self.dtype)

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        self.entries.pop(name, None)
        self.replaced[name] = value

    def __delitem__(self, name: str) -> None:
        if name in self.replaced:
            del self.replaced[name]
        else:
            del self.entries[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.replaced
        yield from self.entries

    def __len__(self) -> int:
        return len(self.replaced) + len(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.replaced[name].shape) if name in self.replaced else self.entries[name].shape

    def fill(self, name: str, dest: torch.Tensor) -> None:
        """dest <- the tensor `name` (same shape), read from the file without an
        intermediate copy when dest is a contiguous CPU tensor of the file's dtype."""
        entry = self.entries.get(name)
        if entry is None:
            dest.copy_(self.replaced[name])
        elif dest.device.type == "cpu" and dest.dtype == entry.dtype and dest.is_contiguous():
            entry.shard.read_into(dest, entry.offset)
        else:  # another dtype or device: one converting copy from the mapping
            dest.copy_(entry.shard.view(entry))

    @property
    def nbytes(self) -> int:
        """Bytes of the weights in the serving dtype (nothing is read to count them)."""
        size = self.dtype.itemsize
        return sum(t.numel() * t.element_size() for t in self.replaced.values()) + sum(
            e.nbytes // e.dtype.itemsize * size for e in self.entries.values()
        )

    def close(self) -> None:
        for shard in self.shards:
            shard.close()
        self.shards = []


class SafetensorsWeightsSource(TensorSource):
    """The model's source over `SafetensorsWeights`: a single tensor is the file's view;
    a fused weight is filled part by part in place (`SafetensorsWeights.fill`)."""

    weights: SafetensorsWeights

    def __init__(self, weights: SafetensorsWeights, device: torch.device | str, dtype: torch.dtype, consume: bool):
        super().__init__({}, device, dtype, consume=True)
        self.owned = consume
        self.weights = weights if consume else weights.copy()

    def linear(self, parts: Sequence[Part], bias: Sequence[Part] = ()) -> LinearWeight:
        whole = all(p.shard is None or (p.dim == 0 and self._whole(p)) for p in (*parts, *bias))
        if len(parts) == 1 or not whole:
            return super().linear(parts, bias)
        return DenseWeight(self._fused(parts), self._fused(bias) if bias else None)

    def _whole(self, part: Part) -> bool:
        shard = part.shard
        return shard is not None and shard.start == 0 and shard.length == self.weights.shape(part.name)[0]

    def _fused(self, parts: Sequence[Part]) -> torch.Tensor:
        shapes = [self.weights.shape(p.name) for p in parts]
        out = torch.empty((sum(s[0] for s in shapes), *shapes[0][1:]), dtype=self.dtype, device=self.device)
        row = 0
        for part, shape in zip(parts, shapes, strict=True):
            self.weights.fill(part.name, out.narrow(0, row, shape[0]))
            del self.weights[part.name]
            row += shape[0]
        return out

    def release(self) -> None:
        """Drop what is left (the views the model kept hold their mapping); close the
        files when the weights were handed over."""
        self.weights.entries.clear()
        self.weights.replaced.clear()
        if self.owned:
            self.weights.close()
