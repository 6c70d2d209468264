"""Block accounting with speculative rollbacks: random drafts of 0..6 tokens, random
acceptance, aborts, preemption (recompute and swap), prefix caching on and off. After
every step each request holds exactly the blocks its computed tokens need (rejected
positions' emptied blocks freed), and at the end nothing leaks and nothing was freed twice."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from llmservice.server.config import EngineConfig
from llmservice.server.engine.block_manager import BlockManager
from llmservice.server.engine.request import Request
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.scheduler import Scheduler
from llmservice.server.engine.swap_space import SwapSpace


def make_scheduler(
    num_blocks: int, block_size: int, prefix_caching: bool, swap_blocks: int
) -> Scheduler:
    cfg = EngineConfig(
        preemption_mode="swap" if swap_blocks else "recompute",
        block_size=block_size,
        max_model_len=256,
        max_num_batched_tokens=64,
        max_num_seqs=6,
        enable_prefix_caching=prefix_caching,
    )
    return Scheduler(
        cfg, BlockManager(num_blocks, block_size, prefix_caching), SwapSpace(swap_blocks)
    )


def spec_step(sched: Scheduler, rng: random.Random) -> None:
    for req in sched.running:
        if req.num_tokens - req.num_computed_tokens == 1:
            req.spec_token_ids = [rng.randrange(3, 9) for _ in range(rng.randint(0, 6))]
    out = sched.schedule()
    sampled = {}
    for s in out.scheduled:
        if s.sample:
            accepted = rng.randint(0, len(s.spec_token_ids))
            sampled[s.request_id] = s.spec_token_ids[:accepted] + [rng.randrange(3, 9)]
    sched.update(out, sampled)
    bs = sched.bm.block_size
    for s in out.scheduled:
        req = sched.requests.get(s.request_id)
        if req is not None and s.spec_token_ids:
            assert len(sched.bm.block_ids(req.request_id)) == -(-req.num_computed_tokens // bs)


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    steps=st.lists(st.sampled_from(["add", "step", "step", "step", "abort"]), max_size=50),
    block_size=st.sampled_from([8, 16, 32]),
    extra_blocks=st.integers(0, 16),
    prefix_caching=st.booleans(),
    swap_blocks=st.sampled_from([0, 40]),
)
def test_rollbacks_never_leak_or_double_free(
    seed, steps, block_size, extra_blocks, prefix_caching, swap_blocks
):
    rng = random.Random(seed)
    num_blocks = 256 // block_size + extra_blocks
    sched = make_scheduler(num_blocks, block_size, prefix_caching, swap_blocks)
    added: list[str] = []
    shared = [rng.randrange(100, 200) for _ in range(40)]
    for op in steps:
        if op == "add":
            prompt = (shared if rng.random() < 0.5 else []) + [
                rng.randrange(3, 9) for _ in range(rng.randint(1, 90))
            ]
            max_tokens = rng.randint(1, 60)
            rid = f"r{len(added)}"
            added.append(rid)
            sched.add(
                Request(
                    rid,
                    prompt,
                    SamplingParams(max_tokens=max_tokens),
                    max_tokens=min(max_tokens, 256 - len(prompt)),
                )
            )
        elif op == "step":
            spec_step(sched, rng)
        elif added:
            sched.abort(rng.choice(added))
        sched.bm.check_invariants()
    for _ in range(3000):
        if not sched.has_unfinished():
            break
        spec_step(sched, rng)
    assert not sched.has_unfinished()
    sched.bm.check_invariants()
    assert sched.bm.num_free_blocks == num_blocks and not sched.bm.req_blocks
    assert sched.swap_space.num_free == swap_blocks


def test_a_rejected_run_frees_the_block_it_emptied():
    sched = make_scheduler(16, 8, prefix_caching=True, swap_blocks=0)
    req = Request(
        "a", list(range(10, 17)), SamplingParams(max_tokens=40), max_tokens=40
    )  # 7 tokens
    sched.add(req)
    out = sched.schedule()
    sched.update(out, {"a": [1]})  # 8 tokens known, 7 computed: one block
    assert len(sched.bm.block_ids("a")) == 1
    req.spec_token_ids = [2, 3, 4, 5, 6, 7, 8, 9, 10]  # positions 7..16: three blocks
    out = sched.schedule()
    assert out.scheduled[0].num_tokens == 10 and len(sched.bm.block_ids("a")) == 3
    sched.update(out, {"a": [2, 99]})  # one draft kept, eight rejected
    assert req.num_computed_tokens == 9 and req.output_token_ids == [1, 2, 99]
    assert len(sched.bm.block_ids("a")) == 2  # block 3 emptied and freed
    assert sched.bm.num_free_blocks == 14
    sched.bm.check_invariants()
