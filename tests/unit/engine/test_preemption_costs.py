"""auto preemption: the cost model fitted from start-up timings, and the per-victim choice."""

from __future__ import annotations

import pytest
from llmservice.server.engine.policy import choose_preemption
from llmservice.server.engine.swap_space import PreemptionCosts, fit_costs

KV_BYTES_8B = 131072  # Llama-3-8B, bf16: 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes


def test_fit_takes_slopes_and_the_swap_fixed_latency():
    costs = fit_costs(((128, 0.386), (16, 0.050)), ((16, 0.002), (256, 0.0044)), KV_BYTES_8B)
    assert costs.recompute_s_per_token == pytest.approx(0.336 / 112)
    assert costs.prefill_tokens_per_s == pytest.approx(128 / 0.386)
    assert costs.swap_s_per_token == pytest.approx(0.0024 / 240)
    assert costs.swap_fixed_s == pytest.approx(0.002 - 16 * 0.0024 / 240)
    assert costs.copy_bytes_per_s == pytest.approx(2 * KV_BYTES_8B * 256 / 0.0044)


def test_launch_bound_gpu_prefill_costs_its_slope_not_its_average():
    # 128 tokens take 15 ms, 1024 take 23 ms: the average (22 us/token) is mostly launch
    # overhead that a recompute batched into a running step does not add
    costs = fit_costs(((128, 0.015), (1024, 0.023)), None, KV_BYTES_8B)
    assert costs.recompute_s_per_token == pytest.approx(0.008 / 896)
    assert costs.swap_s_per_token == 0.0 and costs.swap_fixed_s == 0.0  # no swap pool measured


def test_noisy_timings_never_give_a_free_or_negative_slope():
    costs = fit_costs(((128, 0.020), (1024, 0.019)), ((16, 0.003), (4096, 0.0029)), KV_BYTES_8B)
    assert costs.recompute_s_per_token == pytest.approx(0.1 * 0.019 / 1024)
    assert costs.swap_s_per_token == pytest.approx(0.1 * 0.0029 / 4096)
    assert costs.swap_fixed_s >= 0.0


def _gpu_like() -> PreemptionCosts:
    # prefill slope 8.9 us/token; swap 1.2 ms fixed + 5.2 us/token (128 KiB/token out
    # and back in over a 50 GB/s link)
    return fit_costs(((128, 0.015), (1024, 0.023)), ((16, 0.0012838), (4096, 0.0225)), KV_BYTES_8B)


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [(60, "recompute"), (200, "recompute"), (2500, "swap"), (12000, "swap")],
)
def test_auto_recomputes_short_victims_and_swaps_long_ones(tokens, expected):
    """The seed's two claims as a consequence of the measured costs, not a rule."""
    costs = _gpu_like()
    assert choose_preemption("auto", tokens, costs, swap_blocks_needed=1, swap_blocks_free=10) == expected


def test_auto_on_a_cpu_like_machine_always_swaps():
    # prefill 3 ms/token dwarfs a 2 ms copy latency from the first token on
    costs = fit_costs(((16, 0.050), (128, 0.386)), ((16, 0.002), (256, 0.0044)), 36864)
    for tokens in (1, 16, 3000):
        assert choose_preemption("auto", tokens, costs, 1, 10) == "swap"


def test_fixed_modes_and_fallbacks():
    costs = _gpu_like()
    assert choose_preemption("swap", 60, costs, 1, 10) == "swap"  # the user asked for swap
    assert choose_preemption("recompute", 12000, costs, 1, 10) == "recompute"
    assert choose_preemption("swap", 12000, costs, 11, 10) == "recompute"  # swap pool full
    assert choose_preemption("auto", 12000, costs, 11, 10) == "recompute"
    assert choose_preemption("swap", 0, costs, 0, 10) == "recompute"  # nothing computed yet
