"""The block-size bench's yardstick: concurrency the workload's lengths allow under lazy allocation."""

import importlib.util
from pathlib import Path

# bench/ holds scripts, not a package: the module is loaded from its file
spec = importlib.util.spec_from_file_location(
    "block_size_estimate", Path(__file__).parents[3] / "bench" / "block_size_estimate.py")
estimate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(estimate)


def test_a_request_inside_one_block_holds_that_block_for_its_life():
    work = [([1] * 10, 7)]  # lengths 10..16: one block of 16, two of 8, one of 32
    assert estimate.lazy_allocation_estimate(work, 16, 1024) == 1024 / 16
    assert estimate.lazy_allocation_estimate(work, 8, 1024) == 1024 / 16
    assert estimate.lazy_allocation_estimate(work, 32, 1024) == 1024 / 32


def test_footprint_is_averaged_over_the_steps_a_request_runs():
    # lengths 15, 16, 17, 18: two steps in one block of 16, two in two blocks
    work = [([1] * 15, 4)]
    assert estimate.lazy_allocation_estimate(work, 16, 960) == 960 / 24
    # a second request of one step (prefill only) weighs one step, not half the mean
    work.append(([1] * 3, 1))
    assert estimate.lazy_allocation_estimate(work, 16, 960) == 960 / ((16 + 16 + 32 + 32 + 16) / 5)
