"""CUDA graphs for pure-decode steps: which batch sizes are captured, how a step is padded
to one, and the capture itself.

A decode step on a GPU is launch-bound: Python dispatches ~15 kernels per layer while the
GPU reads the weights in a few ms. Replaying a captured graph launches them all at once.
A graph fixes its tensors' addresses and its launch sizes, so the runner keeps the step's
inputs in fixed buffers (static_inputs.py), pads the batch up to the next captured size,
and the graphed forward must read no host value that changes between replays (the split
count of decode attention is sized from a fixed bound, not from this step's lengths). fp8 KV pools need
nothing more: their scales are Python floats fixed at allocation, passed to the Triton
launches as constants, so a replay reads the same scales the capture saw.

Mixed prefill + decode steps, prefill-only steps, speculative verify steps and decode
batches larger than the largest captured size run eagerly.

The decisions (sizes, padding, which steps qualify) are pure functions; `DecodeGraphs`
is the only CUDA-only code, and it refuses to run anywhere else.
"""

from __future__ import annotations

import bisect
import gc
import logging
import time
from collections.abc import Sequence

import torch

log = logging.getLogger("llmservice.engine")

VLLM_MAX_CAPTURE_SIZE = 512  # vLLM's cap on its default max_cudagraph_capture_size
WARMUP_RUNS = 2  # eager runs per size before its capture: Triton compiles, cuBLAS picks kernels


def capture_sizes(max_size: int) -> list[int]:
    """vLLM's list: 1, 2, 4, then every 8 up to 256, then every 16 up to max_size."""
    if max_size < 1:
        raise ValueError(f"the largest CUDA graph batch size must be >= 1, got {max_size}")
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, max_size + 1, 16)]
    return [s for s in sizes if s <= max_size]


def default_max_capture_size(max_num_seqs: int) -> int:
    """vLLM's default: twice max-num-seqs, at most 512."""
    return min(2 * max_num_seqs, VLLM_MAX_CAPTURE_SIZE)


def sizes_to_capture(max_capture_size: int | None, max_num_seqs: int) -> list[int]:
    """The sizes worth capturing: a pure-decode step has at most max_num_seqs rows, so
    sizes past the first one that holds max_num_seqs would never be replayed."""
    limit = default_max_capture_size(max_num_seqs) if max_capture_size is None else max_capture_size
    sizes = capture_sizes(limit)
    cut = bisect.bisect_left(sizes, max_num_seqs)
    return sizes[: cut + 1]


def padded_batch_size(num_rows: int, sizes: Sequence[int]) -> int | None:
    """The smallest captured size that holds num_rows (None: too many, run eagerly)."""
    i = bisect.bisect_left(sizes, num_rows)
    return sizes[i] if i < len(sizes) and num_rows >= 1 else None


def is_pure_decode(query_lens: Sequence[int]) -> bool:
    """Every row computes one token: the only steps a graph (or the static path) runs."""
    return bool(query_lens) and all(q == 1 for q in query_lens)


def require_cuda(device: torch.device, what: str) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"{what} needs a CUDA device (got {device}); on CPU the static-input "
                           "path runs eagerly without capture")  # fmt: skip


class DecodeGraphs:
    """One captured `forward_hidden` per batch size, all in one memory pool (largest
    first, so the smaller graphs reuse its blocks, as vLLM does)."""

    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], static, sizes: Sequence[int],
                 seq_len_bound: int):  # fmt: skip
        require_cuda(model.device, "CUDA graph capture")
        self.model = model
        self.kv_caches = kv_caches
        self.static = static
        self.sizes = sorted(sizes)
        self.seq_len_bound = seq_len_bound
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0

    def capture(self) -> None:
        """Capture every size. The static buffers hold padding rows meanwhile (each
        writes the pad slot and reads only it), so warm-up and capture touch no KV block
        a request could own."""
        t0 = time.perf_counter()
        static = self.static
        static.reset_padding()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()  # warm-ups run on a side stream, as torch.cuda.graph's docs do
        torch.cuda.synchronize()
        for size in sorted(self.sizes, reverse=True):
            meta = static.graph_metadata(size, self.seq_len_bound)
            args = (static.input_ids[:size], static.positions[:size], meta, self.kv_caches)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self.model.forward_hidden(*args)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = self.model.forward_hidden(*args)
            self.graphs[size] = (graph, out)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - t0

    def replay(self, size: int) -> torch.Tensor:
        """Run the graph of `size` on what the static buffers hold now; its hidden states."""
        graph, out = self.graphs[size]
        graph.replay()
        return out


def measure_graph_bytes(model, block_size: int, max_model_len: int, sizes: Sequence[int]) -> int:
    """Device memory the graphs and their static buffers take, measured by capturing every
    size once on a scratch KV pool of one block (the graphs' memory depends on the batch
    shapes, not on the pool) and reading the device's free memory before and after. The
    engine subtracts it from the KV budget, then captures again on the real pool."""
    from llmservice.server.engine.runner import allocate_kv_caches
    from llmservice.server.engine.static_inputs import StaticDecodeInputs

    require_cuda(model.device, "measuring CUDA graph memory")
    caches = allocate_kv_caches(model, 1, block_size)
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info(model.device)[0]
    static = StaticDecodeInputs(max(sizes), -(-max_model_len // block_size), block_size, 0, model.device)
    graphs = DecodeGraphs(model, caches, static, sizes, max_model_len)
    graphs.capture()
    torch.cuda.synchronize()
    used = free_before - torch.cuda.mem_get_info(model.device)[0]
    log.info("CUDA graphs: %d sizes captured in %.1f s (measuring pass), %.1f MiB",
             len(sizes), graphs.capture_seconds, used / 2**20)  # fmt: skip
    del graphs, static, caches
    gc.collect()
    torch.cuda.empty_cache()
    return max(int(used), 0)
