"""Matmul, dequantize and row lookup on GGUF blocks kept packed in memory (CPU).

A `Packed` matrix is GGUF's own layout: [N, K] weights as N rows of K/32 blocks (Q4_0:
18 bytes, Q4_1: 20, Q8_0: 34). Three ways to multiply it by fp32 activations x [M, K]:

- `direct`: the C kernel turns each block into its 32 fp32 weights in registers and
  accumulates in fp32 (memory-bound batches: it reads 5-6x fewer bytes than fp32 weights);
- `tiled`: each weight block is unpacked once per chunk of activation rows into a small
  per-thread fp32 scratch and reused by every row of the chunk, a register tile of rows x
  weight rows at a time (compute-bound batches); same per-output summation order as
  `direct`, so the same bits;
- `dequant_gemm`: the C kernel writes the fp32 weights of a slab of rows into a reused
  scratch buffer and torch's GEMM multiplies it (another summation order: benchmarks only).

`choose_path` says which one the model uses (`direct` for few rows, `tiled` for many:
bit-identical, so batch invariance holds; docs/cpu.md has the measurements). All give the
reference dequantizer's exact weights; only the fp32 summation order differs from
dequantize-then-F.linear.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import torch
from llmservice.kernels import cpu_native

Q4_0, Q4_1, Q8_0 = 2, 3, 8  # GGMLQuantizationType values
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q8_0: 34}
QK = 32
DEQUANT_GEMM_MIN_ROWS = 64  # from here dequant_gemm ran as fast as direct (docs/cpu.md)
# From these activation rows on, tiled beats direct (bench/cpu_quant_paths.py, docs/cpu.md):
# direct takes up to 8 rows a pass, so at one thread tiled leads from the 9th; with more
# threads tiled's per-thread tiles split small batches less evenly and lead from 17.
TILED_MIN_ROWS = 9
TILED_MIN_ROWS_THREADED = 17
SLAB_ELEMENTS = 1 << 16  # dequant_gemm: rows per slab so a slab (256 KiB of fp32) stays in L2


@dataclass(frozen=True)
class Packed:
    """A [rows, cols] weight matrix in GGUF blocks: `data` is uint8 [rows, cols // 32 * block bytes]."""

    kind: int
    data: torch.Tensor
    cols: int

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_BYTES:
            raise ValueError(f"unsupported block type {self.kind} (Q4_0=2, Q4_1=3, Q8_0=8)")
        if self.cols % QK:
            raise ValueError(f"{self.cols} columns is not a multiple of the {QK}-element block")
        if self.data.dtype != torch.uint8 or self.data.dim() != 2 or not self.data.is_contiguous():
            raise ValueError("packed data must be a contiguous 2-D uint8 tensor")
        if self.data.shape[1] != self.cols // QK * BLOCK_BYTES[self.kind]:
            raise ValueError(f"row of {self.data.shape[1]} bytes does not hold {self.cols} columns")

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def select_rows(self, index: torch.Tensor) -> Packed:
        """Rows in the given order (a shard, GGUF's Q/K row permutation undone)."""
        return Packed(self.kind, self.data.index_select(0, index).contiguous(), self.cols)

    def narrow_cols(self, start: int, length: int) -> Packed:
        """Columns [start, start + length): whole blocks only (row-parallel shards)."""
        if start % QK or length % QK:
            raise ValueError(
                f"column slice [{start}, {start + length}) does not fall on {QK}-element blocks"
            )
        bb = BLOCK_BYTES[self.kind]
        return Packed(
            self.kind,
            self.data[:, start // QK * bb : (start + length) // QK * bb].contiguous(),
            length,
        )


def choose_path(m: int, threads: int | None = None) -> str:
    """'direct' below TILED_MIN_ROWS activation rows (TILED_MIN_ROWS_THREADED with more than
    one thread; default: torch's thread count), 'tiled' from there. Both sum each
    output in the same order (bit-identical results), so switching by M keeps the
    engine's exact-equality guarantees (a request's greedy tokens do not depend on what it
    was batched with, on chunking or on recompute preemption). 'dequant_gemm' is never
    chosen: torch's GEMM sums in another order, and switching to it by M flipped near-tied
    greedy tokens (docs/cpu.md); it stays available by name (benchmarks, `path=`)."""
    threads = torch.get_num_threads() if threads is None else threads
    return "tiled" if m >= (TILED_MIN_ROWS if threads <= 1 else TILED_MIN_ROWS_THREADED) else "direct"


_scratch = threading.local()


def _scratch_buffer(elements: int) -> torch.Tensor:
    """A per-thread fp32 buffer, grown (never shrunk) as needed: no allocation per call."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < elements:
        buf = torch.empty(elements, dtype=torch.float32)
        _scratch.buf = buf
    return buf[:elements]


def _check_x(w: Packed, x: torch.Tensor) -> torch.Tensor:
    """x as [M, K] with unit column stride. Cheap checks first: at batch 1 this wrapper
    runs ~120 times per token, so each microsecond here is a visible share of a decode."""
    if x.dtype != torch.float32 or not x.is_cpu:
        raise TypeError(f"packed matmul takes fp32 CPU activations, got {x.dtype} on {x.device}")
    if x.shape[-1] != w.cols:
        raise ValueError(f"activations have {x.shape[-1]} features, the weight {w.cols}")
    x2 = x if x.dim() == 2 else x.reshape(-1, w.cols)
    return x2 if x2.stride(1) == 1 else x2.contiguous()


_kernels: tuple | None = None


def _fns() -> tuple:
    """(qk_matmul, qk_matmul_tiled), the latter's argument types declared here, once."""
    global _kernels
    if _kernels is None:
        lib = cpu_native.library()
        tiled = lib.qk_matmul_tiled
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        tiled.argtypes = [i32, p, i64, i64, p, i64, i64, p, i64, p, i32]
        tiled.restype = i32
        _kernels = (lib.qk_matmul, tiled)
    return _kernels


def matmul(
    x: torch.Tensor, w: Packed, bias: torch.Tensor | None = None, path: str | None = None
) -> torch.Tensor:
    """x [..., K] fp32 @ W.T (+ bias) -> [..., N] fp32."""
    x2 = _check_x(w, x)
    m, n = x2.shape[0], w.data.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    if m:
        threads = torch.get_num_threads()
        chosen = path or choose_path(m, threads)
        if chosen == "dequant_gemm":
            _dequant_gemm(x2, w, bias, out)
        elif chosen in ("direct", "tiled"):
            _run(x2, w, bias, out, tiled=chosen == "tiled", threads=threads)
        else:
            raise ValueError(f"unknown path {chosen!r} (direct, tiled, dequant_gemm)")
    return out if x.dim() == 2 else out.view(*x.shape[:-1], n)


def _run(
    x: torch.Tensor, w: Packed, bias: torch.Tensor | None, out: torch.Tensor, tiled: bool,
    threads: int,
) -> None:
    """direct: blocks unpacked in registers, once per pass of up to 8 activation rows.
    tiled: each weight block unpacked once per chunk of rows into a per-thread scratch and
    reused by every row of the chunk. Same summation order per output, so the same bits."""
    direct, tiled_fn = _fns()
    b = None if bias is None else bias.contiguous()  # kept alive until the call returns
    args = (w.kind, w.data.data_ptr(), out.shape[1], w.cols, x.data_ptr(), x.shape[0],
            x.stride(0), out.data_ptr(), out.stride(0), None if b is None else b.data_ptr(),
            threads)  # fmt: skip
    if not tiled or tiled_fn(*args) != 0:  # tiled's scratch not allocated: direct, same bits
        direct(*args)


def _dequant_gemm(x: torch.Tensor, w: Packed, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """Slabs of rows small enough to stay in the core's L2 between the C dequantizer
    writing them and the GEMM reading them; each slab's product is a contiguous row range
    of out.T, copied into out once at the end."""
    lib = cpu_native.library()
    slab = max(1, min(w.rows, SLAB_ELEMENTS // w.cols))
    buf = _scratch_buffer(slab * w.cols)
    out_t = torch.empty((w.rows, x.shape[0]), dtype=torch.float32)
    bb = w.data.stride(0)
    threads = torch.get_num_threads()
    for start in range(0, w.rows, slab):
        n = min(slab, w.rows - start)
        dense = buf[: n * w.cols].view(n, w.cols)
        lib.qk_dequant(w.kind, w.data.data_ptr() + start * bb, n, w.cols, dense.data_ptr(), threads)
        torch.mm(dense, x.t(), out=out_t[start : start + n])
    out.copy_(out_t.t())
    if bias is not None:
        out.add_(bias)


def dequantize(w: Packed) -> torch.Tensor:
    """The fp32 weights [rows, cols] (tests, the fp32 fallback)."""
    out = torch.empty((w.rows, w.cols), dtype=torch.float32)
    cpu_native.library().qk_dequant(
        w.kind, w.data.data_ptr(), w.rows, w.cols, out.data_ptr(), torch.get_num_threads()
    )
    return out


def embedding(ids: torch.Tensor, w: Packed) -> torch.Tensor:
    """Rows `ids` of the weights as fp32 [..., cols] (an embedding lookup of packed rows)."""
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= w.rows):
        raise IndexError(f"token id out of range [0, {w.rows})")
    out = torch.empty((flat.numel(), w.cols), dtype=torch.float32)
    cpu_native.library().qk_rows(
        w.kind, w.data.data_ptr(), w.cols, flat.data_ptr(), flat.numel(), out.data_ptr()
    )
    return out.view(*ids.shape, w.cols)
