"""The start-up profile that seeds the step cost model (cost_model.py).

A handful of real steps through the engine's own runner, on its own KV pool before any
request holds a block: a prefill of P tokens and of P/4, a decode batch of N sequences at
context P and of N/4, and N decodes mixed with a P/2 chunk. Each is run twice and the
faster run is kept: the first also warms up (first use compiles kernels, per shape on
CUDA), and a run slowed by a neighbour is not taken for the machine's speed (the cost
model's seed also leaves out a sample the others contradict). P and N are small on CPU
(the whole profile is about a second: every engine start, tests included, pays it) and
larger on CUDA, where small shapes only measure launch overhead. The profile is bounded
(PROFILE_BUDGET_S): shapes past the budget are left out, so a starved machine starts
late by seconds, not minutes. The online fit takes over from the first served steps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from llmservice.server.config import EngineConfig
from llmservice.server.engine.cost_model import StepShape
from llmservice.server.engine.measure_key import measurement_key
from llmservice.server.engine.runner import ModelRunner
from llmservice.server.engine.sampling_params import SamplingParams
from llmservice.server.engine.step import ScheduledRequest, SchedulerOutput

log = logging.getLogger("llmservice.engine")

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1)
PROFILE_BUDGET_S = {"cpu": 15.0, "cuda": 60.0}  # wall time for the whole profile


def profile_shapes(
    config: EngineConfig, cuda: bool, num_blocks: int
) -> list[list[tuple[int, int]]]:
    """Each step as (tokens, first position) per request, sized to the config and the pool
    (a shape whose blocks the pool cannot hold is left out)."""
    cap = int(config.max_num_batched_tokens)
    max_len = int(config.max_model_len)
    bs = config.block_size
    p = max(4, min(512 if cuda else 64, cap // 2, max_len - 1))
    n = max(1, min(64 if cuda else 8, config.max_num_seqs, cap - p // 2))
    while n > 1 and n * -(-(p + 1) // bs) + -(-p // bs) > num_blocks:
        n //= 2
    decodes = [(1, p)] * n
    shapes = [[(p, 0)], [(p // 4, 0)], decodes, decodes[: max(1, n // 4)], decodes + [(p // 2, 0)]]
    return [s for s in shapes if blocks_needed(s, bs) <= num_blocks]


def blocks_needed(requests: list[tuple[int, int]], block_size: int) -> int:
    """KV blocks one profiled step writes (each request's blocks up to its last token)."""
    return sum(-(-(start + k) // block_size) for k, start in requests)


def _step(
    requests: list[tuple[int, int]], block_size: int, first: bool, vocab_size: int,
    block_ids: list[int] | None = None,
) -> SchedulerOutput:
    """Scratch requests of arbitrary tokens; ids stay inside the model's vocabulary (the
    hub tests' tiny models have a few hundred). `block_ids`: the pool's blocks to write
    (free blocks that hold no cached prefix); by default the first ones."""
    out = SchedulerOutput()
    low = 10 if vocab_size > 1010 else 0
    span = min(1000, vocab_size - low)
    next_block = 0
    for i, (num_tokens, start) in enumerate(requests):
        rid = f"__profile-{i}"
        nblocks = -(-(start + num_tokens) // block_size)
        out.scheduled.append(
            ScheduledRequest(
                request_id=rid,
                token_ids=[(7919 * (start + k + 1)) % span + low for k in range(num_tokens)],
                start_position=start,
                block_table_start=0,
                new_block_ids=[block_ids[b] if block_ids is not None else b
                               for b in range(next_block, next_block + nblocks)],
                sample=True,
            )
        )
        next_block += nblocks
        if first:
            out.new_requests[rid] = _GREEDY
    return out


def profile_step_costs(
    runner: ModelRunner, config: EngineConfig, num_blocks: int
) -> list[tuple[StepShape, float]]:
    """(shape, seconds) of each profiled step; the runner forgets the scratch requests.
    Measured once per process for a model shape, device, dtype, threads and step shapes:
    engines built again in one process (tests, benchmarks) reuse it."""
    cuda = runner.device.type == "cuda"
    shapes = profile_shapes(config, cuda, num_blocks)
    key = measurement_key(runner.model, repr(shapes))
    if key not in _MEASURED:
        _MEASURED[key] = _measure(runner, config, shapes, cuda)
    return list(_MEASURED[key])


_MEASURED: dict[tuple, list[tuple[StepShape, float]]] = {}


def _measure(
    runner: ModelRunner,
    config: EngineConfig,
    shapes: list[list[tuple[int, int]]],
    cuda: bool,
    clock: Callable[[], float] = time.perf_counter,
    block_ids: list[int] | None = None,
) -> list[tuple[StepShape, float]]:
    """Each shape's faster of two runs, by `clock` (injectable so tests set the durations),
    on `block_ids` of the pool (see `_step`)."""
    samples: list[tuple[StepShape, float]] = []
    known: set[str] = set()
    budget = PROFILE_BUDGET_S["cuda" if cuda else "cpu"]
    deadline = clock() + budget
    for requests in shapes:
        if clock() > deadline:
            log.warning("step profile: over its %.0f s budget after %d of %d shapes; the rest are left out",
                        budget, len(samples), len(shapes))  # fmt: skip
            break
        out = _step(
            requests, config.block_size, first=True, vocab_size=runner.model.config.vocab_size,
            block_ids=block_ids,
        )
        out.new_requests = {rid: p for rid, p in out.new_requests.items() if rid not in known}
        known |= set(out.new_requests)
        best = float("inf")
        for _ in range(2):  # the first run also warms up; the faster is the machine's speed
            if cuda:
                torch.cuda.synchronize()
            t0 = clock()
            runner.execute(out)
            if cuda:
                torch.cuda.synchronize()
            best = min(best, clock() - t0)
            out.new_requests = {}
        samples.append((StepShape.of(requests), best))
    if known:
        runner.execute(SchedulerOutput(finished_request_ids=sorted(known)))
    return samples
