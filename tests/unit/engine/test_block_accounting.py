"""Block accounting under random add / step / abort sequences (scheduler + block manager,
driven without a model: the runner's only effect on them is the sampled token)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from llmservice.server.config import EngineConfig
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.request import Request
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.scheduler import Scheduler
from llmservice.server.engine.swap_space import SwapSpace

SHARED_PREFIX = list(range(1000, 1040))  # 40 tokens: 2.5 blocks of 16


def make_scheduler(
    num_blocks: int, block_size: int, prefix_caching: bool, chunked: bool = True, swap_blocks: int = 0
) -> Scheduler:
    cfg = EngineConfig(
        preemption_mode="swap" if swap_blocks else "recompute",
        block_size=block_size,
        max_model_len=256,
        max_num_batched_tokens=64 if chunked else 256,
        max_num_seqs=6,
        enable_prefix_caching=prefix_caching,
        enable_chunked_prefill=chunked,
    )
    return Scheduler(cfg, BlockManager(num_blocks, block_size, prefix_caching), SwapSpace(swap_blocks))


def run_step(sched: Scheduler, token: int) -> None:
    out = sched.schedule()
    sampled = {s.request_id: [token] for s in out.scheduled if s.sample}
    sched.update(out, sampled)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 120), st.integers(1, 40), st.booleans()),
        st.tuples(st.just("step"), st.integers(1, 4)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
    ),
    max_size=60,
)


@settings(max_examples=120, deadline=None)
@given(
    ops=ops,
    block_size=st.sampled_from([8, 16, 32]),
    extra_blocks=st.integers(0, 24),
    prefix_caching=st.booleans(),
    chunked=st.booleans(),
    swap_blocks=st.sampled_from([0, 3, 40]),
)
def test_random_workloads_never_leak_or_double_free(ops, block_size, extra_blocks, prefix_caching, chunked, swap_blocks):
    num_blocks = 256 // block_size + extra_blocks  # the engine guarantees one max_model_len sequence fits
    sched = make_scheduler(num_blocks, block_size, prefix_caching, chunked, swap_blocks)
    ids = itertools.count()
    added: list[str] = []
    for op in ops:
        if op[0] == "add":
            _, prompt_len, max_tokens, shared = op
            prompt = (SHARED_PREFIX if shared else []) + [7 + (next(ids) % 50)] * prompt_len
            prompt = prompt[:200]
            rid = f"r{len(added)}"
            added.append(rid)
            sched.add(Request(rid, prompt, SamplingParams(max_tokens=max_tokens), max_tokens=min(max_tokens, 256 - len(prompt))))
        elif op[0] == "step":
            for _ in range(op[1]):
                run_step(sched, token=3)
        else:
            if added:
                sched.abort(added[op[1] % len(added)])
        sched.bm.check_invariants()
        assert len(sched.running) <= 6
        held_swap = sum(len(r.swap_blocks) for r in sched.swapped)
        assert held_swap + sched.swap_space.num_free == swap_blocks
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        run_step(sched, token=3)
    assert not sched.has_unfinished()
    sched.bm.check_invariants()
    assert sched.bm.num_free_blocks == num_blocks
    assert not sched.bm.req_blocks
    assert sched.swap_space.num_free == swap_blocks


def test_shared_prefix_blocks_are_shared_and_ref_counted():
    sched = make_scheduler(64, 16, prefix_caching=True)
    prefix = list(range(2000, 2064))  # exactly 4 blocks
    a = Request("a", prefix + [1, 2, 3], SamplingParams(max_tokens=4), max_tokens=4)
    sched.add(a)
    run_step(sched, 5)  # 64-token budget: a's prompt (67) needs 2 steps
    run_step(sched, 5)
    assert a.num_output_tokens == 1
    b = Request("b", prefix + [9, 9], SamplingParams(max_tokens=4), max_tokens=4)
    sched.add(b)
    out = sched.schedule()
    scheduled = {s.request_id: s.num_tokens for s in out.scheduled}
    assert b.num_cached_tokens == 64 and scheduled["b"] == 2  # only the suffix is computed
    shared = sched.bm.block_ids("a")[:4]
    assert sched.bm.block_ids("b")[:4] == shared
    assert all(sched.bm.blocks[x].ref_cnt == 2 for x in shared)
    sched.update(out, {"a": [5], "b": [5]})
    sched.abort("a")
    assert all(sched.bm.blocks[x].ref_cnt == 1 for x in shared)
    sched.abort("b")
    sched.bm.check_invariants()
    assert sched.bm.num_free_blocks == 64
    # the prefix stays cached after both finished, until its blocks are needed
    c = Request("c", prefix + [4], SamplingParams(max_tokens=1), max_tokens=1)
    assert sched.bm.get_computed_blocks(c) == (shared, 64)


def test_lru_evicts_unreferenced_cached_blocks_only_when_needed():
    bm = BlockManager(8, 16, enable_prefix_caching=True)
    a = Request("a", list(range(64)) + [1], SamplingParams(max_tokens=1), max_tokens=1)
    assert bm.allocate_slots(a, 65)
    a.num_computed_tokens = 65
    bm.cache_blocks(a)
    bm.free(a)
    assert len(bm.cached) == 4 and bm.num_free_blocks == 8
    big = Request("big", list(range(500, 500 + 16 * 5)), SamplingParams(max_tokens=1), max_tokens=1)
    assert bm.allocate_slots(big, 16 * 5)  # needs 5 blocks: 4 uncached free first, then 1 cached (LRU)
    assert len(bm.cached) == 3
    bm.check_invariants()
    assert not bm.allocate_slots(Request("x", list(range(64)), SamplingParams(), max_tokens=1), 16 * 4)


def test_prefix_of_1000_tokens_is_computed_once(make_engine):
    from llmservice.server.engine.sampling_params import SamplingParams as SP

    eng = make_engine(max_model_len=2048, max_num_batched_tokens=2048)
    prefix = [(i * 31) % 40000 + 100 for i in range(1000)]
    first = eng.add_request(prefix + [11, 12, 13], SP(temperature=0, max_tokens=3))
    out = eng.scheduler.schedule()
    assert {s.request_id: s.num_tokens for s in out.scheduled}[first.request_id] == 1003
    eng.scheduler.update(out, eng.runner.execute(out).tokens)
    second = eng.add_request(prefix + [21, 22], SP(temperature=0, max_tokens=3))
    out = eng.scheduler.schedule()
    computed = {s.request_id: s.num_tokens for s in out.scheduled}
    assert second.num_cached_tokens == 992  # 62 full blocks of 16; the rest is computed
    assert computed[second.request_id] == 1002 - 992
    shared = eng.block_manager.block_ids(first.request_id)[:62]
    assert eng.block_manager.block_ids(second.request_id)[:62] == shared
    assert all(eng.block_manager.blocks[b].ref_cnt == 2 for b in shared)
    eng.scheduler.update(out, eng.runner.execute(out).tokens)
    while eng.has_unfinished_requests():
        eng.step()
    eng.block_manager.check_invariants()
