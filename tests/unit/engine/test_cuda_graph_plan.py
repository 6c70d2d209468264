"""The pure decisions behind CUDA graphs and overlapped scheduling: capture sizes, padding,
the memory reservation, when a step must wait, and the scheduler's placeholders."""

from __future__ import annotations

import pytest
from llmservice.server.config import EngineConfig
from llmservice.server.engine import memory, overlap
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.cuda_graphs import (
    capture_sizes,
    default_max_capture_size,
    is_pure_decode,
    padded_batch_size,
    sizes_to_capture,
)
from llmservice.server.engine.request import Request
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.scheduler import Scheduler
from llmservice.server.engine.static_inputs import pad_decode
from llmservice.server.engine.step import PLACEHOLDER_TOKEN, ScheduledRequest, SchedulerOutput


def test_capture_sizes_are_vllms_list():
    sizes = capture_sizes(512)
    assert sizes[:5] == [1, 2, 4, 8, 16]
    assert [s for s in sizes if 8 <= s <= 256] == list(range(8, 257, 8))
    assert [s for s in sizes if s > 256] == list(range(272, 513, 16))
    assert len(sizes) == 3 + 32 + 16
    assert capture_sizes(100)[-1] == 96 and capture_sizes(3) == [1, 2]
    with pytest.raises(ValueError):
        capture_sizes(0)


def test_default_and_useful_sizes():
    assert default_max_capture_size(128) == 256 and default_max_capture_size(400) == 512
    assert sizes_to_capture(None, 128)[-1] == 128  # nothing past max-num-seqs is ever replayed
    assert sizes_to_capture(None, 130)[-1] == 136  # the first size that holds 130 rows
    assert sizes_to_capture(64, 128)[-1] == 64  # the flag caps it: larger batches run eagerly
    assert sizes_to_capture(None, 1) == [1]


@pytest.mark.parametrize(("rows", "padded"), [(1, 1), (3, 4), (5, 8), (9, 16), (128, 128), (257, 272), (512, 512)])
def test_a_batch_pads_to_the_next_captured_size(rows, padded):
    assert padded_batch_size(rows, capture_sizes(512)) == padded


def test_no_padded_size_for_empty_or_too_large_batches():
    assert padded_batch_size(0, capture_sizes(512)) is None
    assert padded_batch_size(513, capture_sizes(512)) is None
    assert padded_batch_size(3, []) is None


def test_only_pure_decode_steps_qualify():
    assert is_pure_decode([1, 1, 1])
    assert not is_pure_decode([1, 5]) and not is_pure_decode([])


def test_padding_rows_write_and_read_only_the_pad_slot():
    batch = pad_decode([7, 8], [30, 4], [33, 65], [31, 5], [[2, 0], [4]], 4, pad_block=9, block_size=16)
    assert batch.size == 4
    assert batch.input_ids == [7, 8, 0, 0] and batch.positions == [30, 4, 0, 0]
    assert batch.slots == [33, 65, 9 * 16, 9 * 16]  # the pad block's first slot
    assert batch.seq_lens == [31, 5, 1, 1]  # a padding row attends to its own write only
    assert batch.tables == [[2, 0], [4, 9], [9, 9], [9, 9]]
    with pytest.raises(ValueError):
        pad_decode([1, 2, 3], [0, 0, 0], [0, 0, 0], [1, 1, 1], [[0]] * 3, 2, 9, 16)


def test_graph_memory_comes_out_of_the_kv_pool():
    plan = memory.plan_cuda(100 * memory.GIB, 0.9, 16 * memory.GIB, memory.GIB, 128 * 1024, 16, 8192)
    reserved = memory.reserve_for_graphs(plan, 3 * 128 * 1024 * 16 + 1)  # three blocks and a byte
    assert reserved.num_blocks == plan.num_blocks - 4
    assert reserved.graph_bytes == 3 * 128 * 1024 * 16 + 1
    assert "CUDA graphs" in reserved.describe() and "CUDA graphs" not in plan.describe()
    assert memory.reserve_for_graphs(plan, 0).num_blocks == plan.num_blocks


def _step(rid: str, sample: bool = True) -> ScheduledRequest:
    return ScheduledRequest(rid, [1], 0, 0, [], sample)


def test_steps_that_must_wait_for_the_step_in_flight():
    assert overlap.sync_reason(SchedulerOutput(scheduled=[_step("a")]), set()) is None
    assert overlap.sync_reason(SchedulerOutput(swap_out=[(1, 2)]), set()) == "swap"
    assert overlap.sync_reason(SchedulerOutput(swap_in=[(1, 2)]), set()) == "swap"
    assert overlap.sync_reason(SchedulerOutput(scheduled=[_step("g")]), {"g"}) == "grammar"
    # a constrained request's partial prefill chunk samples nothing: no mask, no wait
    assert overlap.sync_reason(SchedulerOutput(scheduled=[_step("g", sample=False)]), {"g"}) is None


def test_async_scheduling_defaults():
    assert overlap.resolve_async_scheduling(None, "cuda", False, 1)
    assert not overlap.resolve_async_scheduling(None, "cpu", False, 1)
    assert overlap.resolve_async_scheduling(True, "cpu", False, 1)
    assert not overlap.resolve_async_scheduling(None, "cuda", True, 1)  # speculative: drafts need host tokens
    with pytest.raises(ValueError):
        overlap.resolve_async_scheduling(True, "cuda", False, 2)


def _scheduler(max_model_len: int = 64) -> Scheduler:
    config = EngineConfig(max_model_len=max_model_len, max_num_batched_tokens=64, max_step_ms=0)
    return Scheduler(config, BlockManager(16, 16))


def test_the_next_step_plans_with_a_placeholder_for_the_token_in_flight():
    sched = _scheduler()
    req = Request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4), max_tokens=4)
    sched.add(req)
    first = sched.schedule()
    sched.launched(first)
    second = sched.schedule()  # planned before the first step's token is known
    (s,) = second.scheduled
    assert s.token_ids == [PLACEHOLDER_TOKEN] and s.start_position == 3 and s.output_index == 1 and s.sample
    sched.launched(second)
    assert sched.update(first, {"r": [42]}, launched=True)[0][1] == [42]
    assert req.all_token_ids == [5, 6, 7, 42] and req.num_computed_tokens == 4
    third = sched.schedule()
    assert third.scheduled[0].token_ids == [PLACEHOLDER_TOKEN] and third.scheduled[0].output_index == 2


def test_a_request_whose_pending_token_ends_it_is_not_planned_again():
    sched = _scheduler()
    req = Request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=1), max_tokens=1)
    sched.add(req)
    first = sched.schedule()
    sched.launched(first)
    assert sched.schedule().is_empty  # its one token is in flight: nothing left to compute
    sched.update(first, {"r": [42]}, launched=True)
    assert req.is_finished and sched.bm.num_free_blocks == 16


def test_a_token_for_a_request_that_stopped_meanwhile_is_dropped():
    sched = _scheduler()
    req = Request("r", [5, 6, 7], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[9]), max_tokens=8)
    sched.add(req)
    first = sched.schedule()
    sched.launched(first)
    second = sched.schedule()
    sched.launched(second)
    sched.update(first, {"r": [9]}, launched=True)  # the stop token: finished, blocks freed
    assert req.is_finished and sched.bm.num_free_blocks == 16
    assert sched.update(second, {"r": [11]}, launched=True) == []
    assert req.output_token_ids == [9]
