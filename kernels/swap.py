"""Block copy between the device KV pools and the CPU swap pools, by block-id lists.

Preempting a request by swapping moves its KV blocks out of the device pool into a CPU
pool (and back later). The choice, and why:

* **Batched indexing, not per-block copies.** For each pool (every layer's K and V) the
  listed blocks are gathered with one `index_select`, moved as one contiguous tensor and
  scattered with one `index_copy_`. Block ids are arbitrary (the allocator hands out
  whatever is free), so per-block `copy_` calls would be one tiny launch/DMA per block
  and layer; this is three operations per pool regardless of how many blocks move.
  No Triton kernel is needed: this is pure memory traffic that torch's indexing kernels
  and the copy engine already do at bandwidth.
* **Pinned staging + a side CUDA stream.** The host side of every device<->host move is
  a pinned (page-locked) staging tensor, so the copy is a true asynchronous DMA rather
  than a synchronous bounce through pageable memory. The moves are queued on a
  dedicated stream so they overlap with model compute on the current stream. Ordering
  is kept with events: the side stream first waits for the current stream (the blocks
  are final); for swap-in the current stream waits for the copy before the next kernel
  that may read those blocks; for swap-out the current stream waits for the gather, so
  the freed device blocks can be reused at once, while the DMA itself may still run.
* **The host scatter of a swap-out is deferred to `BlockCopy.wait()`**, which the engine
  calls before it next reads the CPU pool (at the latest before swapping those blocks
  back in). CPU-only copies (the CPU engine, tests) finish synchronously.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from llmservice.kernels.kv_quant import as_bytes


@dataclass
class BlockCopy:
    """An issued copy; `wait()` returns once every destination block holds its data."""

    _event: "torch.cuda.Event | None" = None
    _pending_host_scatter: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=list
    )
    _keepalive: list[torch.Tensor] = field(default_factory=list)

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        for dst, index, staged in self._pending_host_scatter:
            dst.index_copy_(0, index, staged)
        self._pending_host_scatter.clear()
        self._keepalive.clear()

    @property
    def done(self) -> bool:
        return self._event is None and not self._pending_host_scatter


_side_streams: dict[torch.device, "torch.cuda.Stream"] = {}


def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    if device not in _side_streams:
        _side_streams[device] = torch.cuda.Stream(device=device)
    return _side_streams[device]


def kv_pools(kv_caches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """The engine's per-layer (K, V) pools as one flat list, the unit `copy_blocks` moves."""
    return [pool for pair in kv_caches for pool in pair]


def copy_blocks(
    src_pools: Sequence[torch.Tensor],
    dst_pools: Sequence[torch.Tensor],
    src_block_ids: Sequence[int],
    dst_block_ids: Sequence[int],
) -> BlockCopy:
    """Copy block src_block_ids[i] of every src pool into block dst_block_ids[i] of its dst pool.

    Pools are [num_blocks, ...] tensors; src and dst pools pair up by position and must
    agree in everything but num_blocks and device.
    """
    assert len(src_pools) == len(dst_pools), "one destination pool per source pool"
    assert len(src_block_ids) == len(dst_block_ids), "one destination block per source block"
    handle = BlockCopy()
    if not src_block_ids or not src_pools:
        return handle
    # fp8 pools move as their bytes: torch has no float8 index_copy_ on CPU
    src_pools, dst_pools = [as_bytes(p) for p in src_pools], [as_bytes(p) for p in dst_pools]
    src_dev, dst_dev = src_pools[0].device, dst_pools[0].device
    if src_dev.type == "cuda" and dst_dev.type == "cpu":
        _device_to_host(src_pools, dst_pools, src_block_ids, dst_block_ids, handle)
    elif src_dev.type == "cpu" and dst_dev.type == "cuda":
        _host_to_device(src_pools, dst_pools, src_block_ids, dst_block_ids, handle)
    else:
        src_index = torch.tensor(src_block_ids, dtype=torch.int64, device=src_dev)
        dst_index = torch.tensor(dst_block_ids, dtype=torch.int64, device=dst_dev)
        for src, dst in zip(src_pools, dst_pools, strict=True):
            dst.index_copy_(0, dst_index, src.index_select(0, src_index).to(dst_dev))
    return handle


def _device_to_host(src_pools, dst_pools, src_ids, dst_ids, handle: BlockCopy) -> None:
    device = src_pools[0].device
    stream = _side_stream(device)
    current = torch.cuda.current_stream(device)
    src_index = torch.tensor(src_ids, dtype=torch.int64).to(device, non_blocking=True)
    dst_index = torch.tensor(dst_ids, dtype=torch.int64)
    gathered_event = torch.cuda.Event()
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        staged_dev = [src.index_select(0, src_index) for src in src_pools]
        gathered_event.record(stream)
        for dst, staged in zip(dst_pools, staged_dev, strict=True):
            host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
            host.copy_(staged, non_blocking=True)
            handle._pending_host_scatter.append((dst, dst_index, host))
        handle._keepalive.extend(staged_dev)
        handle._event = torch.cuda.Event()
        handle._event.record(stream)
    current.wait_event(gathered_event)  # the source blocks may be overwritten from now on


def _host_to_device(src_pools, dst_pools, src_ids, dst_ids, handle: BlockCopy) -> None:
    device = dst_pools[0].device
    stream = _side_stream(device)
    current = torch.cuda.current_stream(device)
    src_index = torch.tensor(src_ids, dtype=torch.int64)
    staged_host = []
    for src in src_pools:
        host = torch.empty((len(src_ids), *src.shape[1:]), dtype=src.dtype, pin_memory=True)
        torch.index_select(src, 0, src_index, out=host)
        staged_host.append(host)
    stream.wait_stream(current)
    with torch.cuda.stream(stream):
        dst_index = torch.tensor(dst_ids, dtype=torch.int64).to(device, non_blocking=True)
        for dst, host in zip(dst_pools, staged_host, strict=True):
            dst.index_copy_(0, dst_index, host.to(device, non_blocking=True))
        handle._event = torch.cuda.Event()
        handle._event.record(stream)
    current.wait_event(handle._event)  # later kernels on the compute stream see the blocks
    handle._keepalive.extend(staged_host)  # pinned buffers must outlive the DMA
