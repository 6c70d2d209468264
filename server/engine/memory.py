"""KV cache memory plan (pure): how many blocks fit, and what that means for concurrency.

The fourth batching mistake (docs/troubleshooting.md): a large max_model_len silently caps how many sequences fit. The plan
states it at start-up: 'N blocks, M concurrent sequences at max_model_len'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 1 << 30


@dataclass
class MemoryPlan:
    device: str
    budget_source: str
    weights_bytes: int
    kv_bytes_per_token: int
    block_size: int
    num_blocks: int
    max_model_len: int
    activation_peak_bytes: int = 0
    total_device_bytes: int = 0
    graph_bytes: int = 0  # CUDA graphs + their static inputs + the pad block, taken from the KV budget

    @property
    def kv_cache_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.kv_bytes_per_token

    @property
    def max_concurrent_at_max_len(self) -> int:
        blocks_per_seq = -(-self.max_model_len // self.block_size)
        return self.num_blocks // blocks_per_seq

    def describe(self) -> str:
        return (
            f"memory plan ({self.device}, {self.budget_source}): weights {self.weights_bytes / GIB:.2f} GiB, "
            f"KV {self.kv_bytes_per_token / 1024:.1f} KiB/token, {self.num_blocks} blocks x {self.block_size} tokens "
            f"= {self.kv_cache_bytes / GIB:.2f} GiB, max_model_len {self.max_model_len} -> "
            f"{self.max_concurrent_at_max_len} concurrent sequences at full length"
            + (f"; CUDA graphs {self.graph_bytes / GIB:.2f} GiB" if self.graph_bytes else "")
        )


def reserve_for_graphs(plan: MemoryPlan, graph_bytes: int) -> MemoryPlan:
    """The plan with `graph_bytes` (measured at capture) taken out of the KV pool, so
    graphs captured after the pool is allocated fit in the same utilization budget."""
    block_bytes = plan.kv_bytes_per_token * plan.block_size
    fewer = -(-graph_bytes // block_bytes) if graph_bytes > 0 else 0
    return replace(plan, num_blocks=max(0, plan.num_blocks - fewer), graph_bytes=plan.graph_bytes + graph_bytes)


def blocks_for_budget(kv_budget_bytes: int, kv_bytes_per_token: int, block_size: int) -> int:
    return max(0, kv_budget_bytes // (kv_bytes_per_token * block_size))


def plan_cpu(
    kv_cache_memory_gib: float, weights_bytes: int, kv_bytes_per_token: int, block_size: int, max_model_len: int
) -> MemoryPlan:
    return MemoryPlan(
        device="cpu",
        budget_source=f"--kv-cache-memory-gib {kv_cache_memory_gib}",
        weights_bytes=weights_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        block_size=block_size,
        num_blocks=blocks_for_budget(int(kv_cache_memory_gib * GIB), kv_bytes_per_token, block_size),
        max_model_len=max_model_len,
    )


def plan_cuda(
    total_bytes: int,
    gpu_memory_utilization: float,
    weights_bytes: int,
    activation_peak_bytes: int,
    kv_bytes_per_token: int,
    block_size: int,
    max_model_len: int,
) -> MemoryPlan:
    """total x utilization - weights - profiled activation peak goes to the KV cache."""
    budget = int(total_bytes * gpu_memory_utilization) - weights_bytes - activation_peak_bytes
    return MemoryPlan(
        device="cuda",
        budget_source=f"--gpu-memory-utilization {gpu_memory_utilization}",
        weights_bytes=weights_bytes,
        kv_bytes_per_token=kv_bytes_per_token,
        block_size=block_size,
        num_blocks=blocks_for_budget(budget, kv_bytes_per_token, block_size),
        max_model_len=max_model_len,
        activation_peak_bytes=activation_peak_bytes,
        total_device_bytes=total_bytes,
    )
