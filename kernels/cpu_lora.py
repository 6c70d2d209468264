"""The LoRA delta on CPU as one C call per projection (kernels/cpu_lora.c).

The torch path was a loop over adapters per projection and layer (gather the rows, two
small GEMMs, an index_add_ into a column slice): on the embedded model with 8 adapters
that loop, not the arithmetic, held decode to half the base model's speed. `LoRAStacks`
holds the C structs over a slot pool's stacks (built once per pool; the structs point
into its tensors, which loading a slot fills in place), `rows` makes a step's row table,
and `add` runs one projection's delta for the Python layer loop. The one-call decoder
(cpu_decoder.py) takes the same stacks and rows and calls the same C function after each
of its matmuls, so the two paths give the same bits.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from llmservice.kernels import cpu_native

_p, _i64 = ctypes.c_void_p, ctypes.c_int64
MAX_MODULES = 3  # cpu_lora.c's QL_MAX_MODULES: q/k/v share one projection
GROUPS_PER_LAYER = 4  # qkv, o, gate_up, down: the decoder's order


class _Group(ctypes.Structure):
    _fields_ = [
        ("a", _p),
        ("bt", _p),
        ("ranks", _p),
        ("fan_in", _i64),
        ("n", _i64),
        ("widths", _i64 * MAX_MODULES),
    ]


class _Rows(ctypes.Structure):
    _fields_ = [("rank", _i64), ("slots", _i64), ("row_slots", _p), ("scalings", _p), ("t", _p)]


@dataclass(frozen=True)
class GroupStacks:
    """One fused projection's stacks in a layer: its modules side by side."""

    a: torch.Tensor  # [slots, n * R, in]
    bt: torch.Tensor  # [slots, R, sum(widths)]: B transposed, rank terms as rows
    ranks: torch.Tensor  # int32 [slots, n]: a slot's rank per module, 0 = not targeted
    widths: tuple[int, ...]


def _check(t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> int:
    if t.dtype != dtype or not t.is_cpu or not t.is_contiguous() or tuple(t.shape) != shape:
        raise ValueError(
            f"{what}: expected contiguous {dtype} CPU {shape}, got {tuple(t.shape)} {t.dtype}"
        )
    return t.data_ptr()


class StepRows:
    """A step's slot per flat row (-1: the base model) as the kernels read it."""

    def __init__(self, stacks: LoRAStacks, row_slots: Sequence[int]):
        if any(s >= stacks.num_slots for s in row_slots):
            raise IndexError(
                f"an adapter slot of {list(row_slots)} is outside the pool ({stacks.num_slots} slots)"
            )
        self.stacks, self.num_rows = stacks, len(row_slots)
        self.slots = torch.tensor(list(row_slots), dtype=torch.int32)
        self.work = torch.empty(
            max(len(row_slots), 1) * MAX_MODULES * stacks.rank, dtype=torch.float32
        )
        self.struct = _Rows(stacks.rank, stacks.num_slots, self.slots.data_ptr(), stacks.scalings.data_ptr(),
                            self.work.data_ptr())  # fmt: skip


class LoRAStacks:
    """The C structs over a slot pool: `layers[l]` is layer l's four GroupStacks (qkv,
    o, gate_up, down); `scalings` [slots] fp32, updated in place as slots load."""

    def __init__(self, layers: Sequence[Sequence[GroupStacks]], scalings: torch.Tensor, rank: int):
        self.num_slots, self.rank, self.num_layers = scalings.shape[0], rank, len(layers)
        _check(scalings, torch.float32, (self.num_slots,), "LoRA scalings")
        self.scalings = scalings
        self.structs = (_Group * (GROUPS_PER_LAYER * len(layers)))()
        self._held = tuple(layers)  # the structs point into these tensors
        shapes = []
        for i, groups in enumerate(layers):
            if len(groups) != GROUPS_PER_LAYER:
                raise ValueError(
                    f"layer {i}: {len(groups)} LoRA groups, expected {GROUPS_PER_LAYER}"
                )
            for j, g in enumerate(groups):
                n, fan_in, width = len(g.widths), g.a.shape[-1], sum(g.widths)
                if not 1 <= n <= MAX_MODULES:
                    raise ValueError(f"layer {i} group {j}: {n} modules (1 to {MAX_MODULES})")
                what = f"layer {i} group {j} LoRA"
                c = self.structs[i * GROUPS_PER_LAYER + j]
                c.a = _check(g.a, torch.float32, (self.num_slots, n * rank, fan_in), f"{what} A")
                c.bt = _check(
                    g.bt, torch.float32, (self.num_slots, rank, width), f"{what} B (transposed)"
                )
                c.ranks = _check(g.ranks, torch.int32, (self.num_slots, n), f"{what} ranks")
                c.fan_in, c.n = fan_in, n
                for k, w in enumerate(g.widths):
                    c.widths[k] = w
                shapes.append((fan_in, tuple(g.widths)))
        # (in, widths) of each group: what the decoder's layers must match
        self.shapes = tuple(shapes)

    def rows(self, row_slots: Sequence[int]) -> StepRows:
        return StepRows(self, row_slots)

    def group_pointer(self, index: int = 0) -> int:
        return ctypes.addressof(self.structs) + index * ctypes.sizeof(_Group)

    def add(
        self, layer: int, group: int, rows: StepRows, x: torch.Tensor, out: torch.Tensor
    ) -> bool:
        """out[r] += row r's delta for one projection; False (nothing done) for tensors
        the kernel cannot read as they are (the caller runs the torch loop)."""
        fan_in, widths = self.shapes[layer * GROUPS_PER_LAYER + group]
        m = rows.num_rows
        if (x.dtype != torch.float32 or out.dtype != torch.float32 or x.dim() != 2 or out.dim() != 2
                or tuple(x.shape) != (m, fan_in) or tuple(out.shape) != (m, sum(widths))
                or (m and (x.stride(1) != 1 or out.stride(1) != 1)) or not x.is_cpu or not out.is_cpu):  # fmt: skip
            return False
        lib = cpu_native.library("cpu_decoder")
        rc = lib.ql_add(self.group_pointer(layer * GROUPS_PER_LAYER + group), ctypes.byref(rows.struct),
                        x.data_ptr(), x.stride(0), m, out.data_ptr(), out.stride(0), torch.get_num_threads())  # fmt: skip
        if rc != 0:
            raise IndexError(f"LoRA kernel refused the step (code {rc})")
        return True


def available() -> bool:
    return cpu_native.available("cpu_decoder")
