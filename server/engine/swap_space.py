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
    """What preempting a victim of k computed tokens costs each way, measured at start-up.

    recompute: k * recompute_s_per_token, the *marginal* prefill time per token (the slope
    between two prefill sizes). A victim's recompute is batched into steps that run
    anyway, so the fixed cost of a step is not its to pay; on a GPU a small prefill rides
    almost free on a launch-bound step, which the average time per token would hide.
    swap: swap_fixed_s + k * swap_s_per_token. A swap is a separate copy the step waits
    for, out and back in, so its fixed latency (launches, events, one gather per pool) is
    paid on every swap, however few tokens move.
    """

    recompute_s_per_token: float = 1.0
    swap_s_per_token: float = 0.0
    swap_fixed_s: float = 0.0
    prefill_tokens_per_s: float = 0.0
    copy_bytes_per_s: float = 0.0

    @property
    def measured(self) -> bool:
        """Whether these are a start-up measurement (the defaults are placeholders)."""
        return self.prefill_tokens_per_s > 0

    @property
    def swap_measured(self) -> bool:
        return self.copy_bytes_per_s > 0

    def recompute_cost(self, num_tokens: int) -> float:
        return num_tokens * self.recompute_s_per_token

    def swap_cost(self, num_tokens: int) -> float:
        return self.swap_fixed_s + num_tokens * self.swap_s_per_token


def fit_costs(
    prefill: tuple[tuple[int, float], tuple[int, float]],
    round_trip: tuple[tuple[int, float], tuple[int, float]] | None,
    kv_bytes_per_token: int,
) -> PreemptionCosts:
    """Costs from two timed prefills and two timed swap round trips, each (tokens, seconds).

    Slopes are taken between the two sizes; timer noise can make a slope tiny or
    negative, so each is kept at or above a tenth of the larger run's average rate.
    """
    (n1, t1), (n2, t2) = sorted(prefill)
    recompute_slope = max((t2 - t1) / max(n2 - n1, 1), 0.1 * t2 / n2)
    costs = PreemptionCosts(recompute_s_per_token=recompute_slope, prefill_tokens_per_s=n2 / t2)
    if round_trip is not None:
        (m1, u1), (m2, u2) = sorted(round_trip)
        swap_slope = max((u2 - u1) / max(m2 - m1, 1), 0.1 * u2 / m2)
        costs.swap_s_per_token = swap_slope
        costs.swap_fixed_s = max(u1 - m1 * swap_slope, 0.0)
        costs.copy_bytes_per_s = 2 * kv_bytes_per_token * m2 / u2
    return costs
