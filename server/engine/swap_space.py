"""The CPU swap pool's block allocator (`--swap-space` GiB) and the preemption cost model."""

from __future__ import annotations

from dataclasses import dataclass


class SwapSpace:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.free_ids: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks if self.num_blocks else 0.0

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free_ids):
            raise RuntimeError(f"swap space has {len(self.free_ids)} free blocks, {n} requested")
        return [self.free_ids.pop() for _ in range(n)]

    def free(self, ids: list[int]) -> None:
        self.free_ids.extend(ids)
        if len(self.free_ids) > self.num_blocks or len(set(self.free_ids)) != len(self.free_ids):
            raise RuntimeError("swap block freed twice")


@dataclass
class PreemptionCosts:
    """Seconds per token to recompute (prefill) vs to swap out and back in, measured at start-up."""

    recompute_s_per_token: float = 1.0
    swap_s_per_token: float = 0.0
    prefill_tokens_per_s: float = 0.0
    copy_bytes_per_s: float = 0.0
