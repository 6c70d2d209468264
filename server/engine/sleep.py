"""Sleep mode (vLLM's `--enable-sleep-mode`): free the device's memory without ending the
process, and get back to serving in about the time of a host-to-device copy.

Level 1: the KV pool is freed (its contents are lost, so the prefix cache is emptied) and
the weights move to pinned host memory (CUDA); on CPU the device *is* host memory, so the
weights stay where they are and only the KV pool is freed. Level 2: the weights are
discarded too, and waking reads them from disk again (as vLLM's level 2).

Tensors are swapped through `tensor.data`, so every object that holds a weight or a KV
pool (the model, its fused decoder, the runner, CUDA graphs' inputs) sees the new storage
without being rebuilt. CUDA graphs captured on the old addresses are captured again on wake.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from llmservice.server.engine import zero_pages
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.model.fused_decoder import decoder_weights

log = logging.getLogger("llmservice.engine")

SLEEP_LEVELS = (1, 2)


def device_tensors(root: Any, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor on `device` reachable from `root` through object
    attributes, lists, tuples and dicts, each tensor once, in a deterministic order (two
    models built from the same files pair up by path; a sleeping model's emptied tensors
    keep their paths)."""
    seen: set[int] = set()

    def walk(obj: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type == device.type:
                yield path, obj
            return
        if isinstance(obj, dict):
            items = [(str(k), v) for k, v in obj.items()]
        elif isinstance(obj, (list, tuple)):
            items = [(str(i), v) for i, v in enumerate(obj)]
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.device, torch.dtype)):
            items = list(vars(obj).items())
        else:
            return
        for key, value in items:
            yield from walk(value, f"{path}.{key}")

    yield from walk(root, "")


def _empty_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=t.dtype, device=t.device)


@dataclass
class SleepState:
    """What a sleeping engine keeps so that it can wake."""

    level: int = 0  # 0: awake
    host_weights: dict[str, torch.Tensor] = field(default_factory=dict)  # level 1 on CUDA
    kv_shapes: list[tuple[torch.Tensor, torch.Size]] = field(default_factory=list)
    asleep_since: float = 0.0

    @property
    def sleeping(self) -> bool:
        return self.level > 0


def sleep(engine: Any, level: int) -> SleepState:
    """Put an idle engine to sleep; returns what wake() needs."""
    if level not in SLEEP_LEVELS:
        raise ValueError(f"sleep level must be one of {SLEEP_LEVELS}, got {level}")
    if engine.has_unfinished_requests():
        raise RuntimeError("the engine has requests in flight")
    state = SleepState(level=level, asleep_since=time.monotonic())
    device = engine.device
    for k, v in engine.runner.kv_caches:
        for pool in (k, v):
            state.kv_shapes.append((pool, pool.shape))
            pool.data = _empty_like(pool)
    _forget_kv_blocks(engine.block_manager)
    if level == 2:
        for _, t in device_tensors(engine.model, device):
            t.data = _empty_like(t)
        engine.model.fused_decoder = None  # it holds the old weights' addresses
    elif device.type == "cuda":
        for path, t in device_tensors(engine.model, device):
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t)
            state.host_weights[path] = host
            t.data = _empty_like(t)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    log.info("sleep level %d: KV pool freed%s", level,
             {1: ", weights kept on the host" if device.type == "cuda" else ", weights kept (CPU)",
              2: ", weights discarded"}[level])
    return state


def wake(engine: Any, state: SleepState, reload: Any = None) -> float:
    """Restore what sleep() freed; returns the seconds it took. `reload` (level 2) builds
    a fresh model from disk whose tensors pair up with the sleeping model's by path."""
    t0 = time.perf_counter()
    device = engine.device
    if state.level == 2:
        fresh = dict(device_tensors(reload(), device))
        for path, t in device_tensors(engine.model, device):
            if path in fresh:
                t.data = fresh[path].data
    elif state.host_weights:
        for path, t in device_tensors(engine.model, device):
            host = state.host_weights.get(path)
            if host is not None:
                t.data = host.to(device, non_blocking=True)
    if state.level == 2 and device.type == "cpu":
        engine.model.fused_decoder = decoder_weights(engine.model)
    for pool, shape in state.kv_shapes:
        pool.data = zero_pages.zeros(shape, pool.dtype, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        if getattr(engine.runner, "graphs", None) is not None:
            engine.runner.capture_graphs()
    state.level = 0
    state.host_weights.clear()
    state.kv_shapes.clear()
    seconds = time.perf_counter() - t0
    log.info("woke up in %.2f s", seconds)
    return seconds


def _forget_kv_blocks(bm: BlockManager) -> None:
    """Every block free and no prefix cached: the pool's contents are gone. In place,
    because the scheduler and engine hold this object."""
    bm.__dict__.update(BlockManager(bm.num_blocks, bm.block_size, bm.enable_prefix_caching).__dict__)
