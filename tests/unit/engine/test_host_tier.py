"""The prefix cache's host tier: accounting under random workloads (no leak, no double
use, shared honestly with swap preemption) and the evict / bring-back round trip."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llmservice.server.config import EngineConfig
from llmservice.server.engine.block_manager import _ROOT_HASH, BlockManager
from llmservice.server.engine.host_tier import HostTier, check_offload_fits
from llmservice.server.engine.request import Request
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.scheduler import Scheduler
from llmservice.server.engine.swap_space import SwapSpace

SHARED_PREFIX = list(range(1000, 1040))


def make_scheduler(num_blocks: int, block_size: int, pool_blocks: int, tier_blocks: int, swap: bool) -> Scheduler:
    cfg = EngineConfig(
        preemption_mode="swap" if swap else "recompute",
        block_size=block_size,
        max_model_len=256,
        max_num_batched_tokens=64,
        max_num_seqs=6,
        enable_prefix_caching=True,
    )
    space = SwapSpace(pool_blocks)
    bm = BlockManager(num_blocks, block_size, True)
    bm.host_tier = HostTier(space, tier_blocks)
    return Scheduler(cfg, bm, space)


class Contents:
    """What each device and host block holds, as the block key (parent hash, tokens) of
    the KV written there: the copies and forward passes replayed without a model."""

    def __init__(self) -> None:
        self.device: dict[int, tuple] = {}
        self.host: dict[int, tuple] = {}

    def step(self, sched: Scheduler, token: int) -> None:
        out = sched.schedule()
        bm = sched.bm
        for d, h in out.swap_out:  # the engine's order: swap-outs, then swap-ins, then the forward
            self.host[h] = self.device.get(d)
        for h, d in out.swap_in:
            self.device[d] = self.host.get(h)
        bs = bm.block_size
        for s in out.scheduled:
            req = sched.requests[s.request_id]
            hashes = bm.prompt_block_hashes(req)
            start, end = req.num_computed_tokens, req.num_computed_tokens + s.num_tokens
            held = bm.block_ids(req.request_id)
            for i in range(start // bs, min(end // bs, len(hashes), len(held))):
                parent = hashes[i - 1] if i else _ROOT_HASH
                self.device[held[i]] = (parent, tuple(req.all_token_ids[i * bs : (i + 1) * bs]))
        bm.host_tier.step_done()
        sched.update(out, {s.request_id: [token] for s in out.scheduled if s.sample})
        self.check(bm)

    def check(self, bm: BlockManager) -> None:
        for block_id in bm.cached.values():
            assert self.device.get(block_id) == bm.blocks[block_id].key, f"device block {block_id} holds other KV"
        for host_block, key in bm.host_tier.entries.values():
            assert self.host.get(host_block) == key, f"host block {host_block} holds other KV"


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 120), st.integers(1, 40), st.booleans()),
        st.tuples(st.just("turn"), st.integers(0, 30), st.integers(1, 40), st.integers(1, 20)),
        st.tuples(st.just("step"), st.integers(1, 4)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
    ),
    max_size=60,
)


@settings(max_examples=120, deadline=None)
@given(
    ops=ops,
    block_size=st.sampled_from([8, 16, 32]),
    extra_blocks=st.integers(0, 12),
    pool_blocks=st.sampled_from([1, 6, 40]),
    tier_share=st.sampled_from([0.5, 1.0]),
    swap=st.booleans(),
)
def test_random_workloads_never_leak_nor_lose_kv(ops, block_size, extra_blocks, pool_blocks, tier_share, swap):
    num_blocks = 256 // block_size + extra_blocks
    tier_blocks = max(1, int(pool_blocks * tier_share))
    sched = make_scheduler(num_blocks, block_size, pool_blocks, tier_blocks, swap)
    tier = sched.bm.host_tier
    contents = Contents()
    ids = itertools.count()
    added: list[Request] = []

    def check() -> None:
        sched.bm.check_invariants()
        tier.check_invariants()
        held_swap = sum(len(r.swap_blocks) for r in sched.swapped)
        assert held_swap + tier.num_entries + sched.swap_space.num_free == pool_blocks

    def add(prompt: list[int], max_tokens: int) -> None:
        req = Request(f"r{len(added)}", prompt, SamplingParams(max_tokens=max_tokens), max_tokens=min(max_tokens, 256 - len(prompt)))
        added.append(req)
        sched.add(req)

    for op in ops:
        if op[0] == "add":
            _, prompt_len, max_tokens, shared = op
            prompt = ((SHARED_PREFIX if shared else []) + [7 + (next(ids) % 5)] * prompt_len)[:200]
            add(prompt, max_tokens)
        elif op[0] == "turn" and added:  # the next turn of a chat: its whole history, then more
            _, which, more, max_tokens = op
            add((added[which % len(added)].all_token_ids + [11 + len(added)] * more)[:200], max_tokens)
        elif op[0] == "step":
            for _ in range(op[1]):
                contents.step(sched, token=3)
        elif added:
            sched.abort(added[op[1] % len(added)].request_id)
        check()
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        contents.step(sched, token=3)
    assert not sched.has_unfinished()
    check()
    assert sched.bm.num_free_blocks == num_blocks and not sched.bm.req_blocks
    assert sched.swap_space.num_free + tier.num_entries == pool_blocks


def _finish(bm: BlockManager, req: Request) -> None:
    assert bm.allocate_slots(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    bm.cache_blocks(req)
    bm.free(req)


def test_evicted_block_goes_to_host_and_comes_back():
    space = SwapSpace(8)
    bm = BlockManager(4, 16, True)
    bm.host_tier = HostTier(space, 8)
    a = Request("a", list(range(48)) + [1], SamplingParams(max_tokens=1), max_tokens=1)
    _finish(bm, a)  # 3 cached blocks + 1 plain
    other = Request("o", list(range(500, 564)), SamplingParams(max_tokens=1), max_tokens=1)
    assert bm.allocate_slots(other, 64)  # needs all 4: evicts a's 3 cached blocks
    offloads, _ = bm.take_copies()
    assert len(offloads) == 3 and not bm.cached
    written = {h for _, h in offloads}
    assert bm.host_tier.num_entries == 3
    bm.host_tier.step_done()
    bm.free(other)
    again = Request("a2", list(range(48)) + [2], SamplingParams(max_tokens=1), max_tokens=1)
    assert bm.restore_from_host(again) == 48
    offloads, restores = bm.take_copies()
    # the host blocks written at eviction are read back, into the blocks the lookup then finds
    assert {h for h, _ in restores} == written and not offloads
    hits, num_cached = bm.get_computed_blocks(again)
    assert num_cached == 48
    assert [d for _, d in restores] == hits
    bm.check_invariants()
    bm.host_tier.check_invariants()


def test_host_tier_evicts_least_recently_used():
    space = SwapSpace(2)
    tier = HostTier(space, 2)
    a, b = tier.offload(1, ("k1",)), tier.offload(2, ("k2",))
    tier.step_done()
    tier.restore(1)  # 1 is now the most recent
    tier.step_done()
    c = tier.offload(3, ("k3",))
    assert c == b and tier.lookup(2, ("k2",)) is None and tier.lookup(1, ("k1",)) == a
    assert tier.offload(1, ("k1",)) is None  # already held: no copy
    tier.check_invariants()


def test_pinned_blocks_are_not_reused_in_the_same_step():
    space = SwapSpace(1)
    tier = HostTier(space, 1)
    h = tier.offload(1, ("k1",))
    assert tier.offload(2, ("k2",)) is None  # the only block is being written this step
    tier.step_done()
    assert tier.offload(2, ("k2",)) == h
    tier.step_done()
    tier.restore(2)  # read back by this step: not given to another entry before the copy ran
    assert tier.offload(3, ("k3",)) is None and tier.lookup(2, ("k2",)) == h
    tier.step_done()
    assert tier.offload(3, ("k3",)) == h


def test_preemption_reclaims_host_tier_blocks():
    space = SwapSpace(3)
    tier = HostTier(space, 3)
    for i in range(3):
        tier.offload(i, (i,))
    tier.step_done()
    assert space.num_free == 0
    assert tier.reclaim(2) == 2 and space.num_free == 2 and tier.num_entries == 1


def test_offload_larger_than_host_memory_is_refused_with_numbers():
    with pytest.raises(ValueError, match=r"--kv-offloading-size 64 GiB .*65.00 GiB.*only 8.00 GiB"):
        check_offload_fits(64, 1, 8 << 30)
    check_offload_fits(4, 1, 8 << 30)


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("swap", [False, True])
def test_multi_turn_chats_come_back_from_the_host_tier_intact(block_size, swap):
    """Six chats of four turns on a device pool that holds about one history: later turns
    find their history on the host, and every restored block holds the KV it names."""
    pool_blocks = 64
    sched = make_scheduler(256 // block_size + 2, block_size, pool_blocks, 48, swap)
    contents = Contents()
    histories = [[100 + c] * 5 for c in range(6)]
    for turn in range(4):
        reqs = []
        for c, history in enumerate(histories):
            prompt = (history + [20 + turn + c] * 25)[-200:]
            req = Request(f"c{c}t{turn}", prompt, SamplingParams(max_tokens=6), max_tokens=6)
            sched.add(req)
            reqs.append(req)
        for _ in range(500):
            if not sched.has_unfinished():
                break
            contents.step(sched, token=50 + turn)
        histories = [r.all_token_ids for r in reqs]
        sched.bm.check_invariants()
        sched.bm.host_tier.check_invariants()
    tier = sched.bm.host_tier
    assert tier.offloaded_blocks > 0 and tier.restored_blocks > 0
    assert 0 < sched.stats.prefix_host_hits <= tier.restored_blocks * block_size
    assert sched.swap_space.num_free + tier.num_entries == pool_blocks
